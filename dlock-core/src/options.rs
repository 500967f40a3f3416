//! Per-acquire options and their validation, in one place for every backend, and the macro that
//! writes the `with_*` setters of every settings builder in dlock.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::retry::Backoff;

/// Writes the `with_*` setters of a settings builder, one line each, so that every builder in
/// dlock ([`LockOptions`], each backend's `…Builder`) has setters of one shape: `with_` and the
/// setting's name, `self` by value, one field set, `self` returned for chaining.
///
/// Each entry is `setter(argument: Type) => field = value;` after the setter's doc comments:
/// the setter becomes an inherent method of the builder (callers import nothing, and
/// `Builder::with_x` still serves as a plain function), documented by those comments, and stores
/// `value`, an expression of `argument`, in `field`. Setters that do more than set one field
/// (append an endpoint, take a user and a password) stay hand-written beside it.
///
/// Why a macro and not a builder-generating crate (`derive_builder`, `bon`): in dlock the
/// builders are the public types themselves, each with its own constructors (`new`, `from_url`,
/// `from_urls`), validation that names the field at fault, and a `Debug` that hides passwords.
/// A derive would add a second struct of `Option`s (or type-state generics, with which
/// `Builder::with_x` is no longer one function) and an error type of its own between the fields
/// and that validation; what repeats across the builders is only the setters, and that is all
/// this writes.
///
/// ```
/// use std::time::Duration;
///
/// #[derive(Default)]
/// pub struct ExampleBuilder {
///     prefix: String,
///     timeout: Option<Duration>,
/// }
///
/// dlock_core::backend::setters! {
///     ExampleBuilder {
///         /// Puts `prefix` before every lock name.
///         with_prefix(prefix: impl Into<String>) => prefix = prefix.into();
///         /// Bounds every request (none by default).
///         with_timeout(timeout: Duration) => timeout = Some(timeout);
///     }
/// }
///
/// let builder = ExampleBuilder::default()
///     .with_prefix("billing:")
///     .with_timeout(Duration::from_secs(1));
/// assert_eq!(builder.prefix, "billing:");
/// assert_eq!(builder.timeout, Some(Duration::from_secs(1)));
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! setters {
    ($builder:ty {
        $( $(#[$attr:meta])* $setter:ident($arg:ident: $ty:ty) => $field:ident = $value:expr; )*
    }) => {
        impl $builder {
            $(
                $(#[$attr])*
                pub fn $setter(mut self, $arg: $ty) -> Self {
                    self.$field = $value;
                    self
                }
            )*
        }
    };
}

/// The shortest TTL accepted. Shorter leases expire before a network round trip completes.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The longest TTL accepted (30 days). Jobs that run longer should hold a shorter lease and renew
/// it ([`LockOptions::auto_renew`]), so that a crashed holder does not block everyone for a month.
pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// The longest wait accepted for one acquire (one year); use `None` to wait without limit.
pub const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// How much of a lease's TTL the client gives up to cover clock drift between it and the server.
///
/// The allowance is `ttl × factor + fixed`: a lease is considered valid until
/// `sent + ttl − allowance`, where `sent` is the client's monotonic time just before the acquiring
/// request was sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drift {
    /// Proportional part, from 0 (inclusive) to 1 (exclusive). Default 0.01.
    pub factor: f64,
    /// Fixed part. Default 2 ms.
    pub fixed: Duration,
}

impl Default for Drift {
    fn default() -> Self {
        Drift {
            factor: 0.01,
            fixed: Duration::from_millis(2),
        }
    }
}

impl Drift {
    /// The allowance for a lease of `ttl`.
    pub fn allowance(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.factor) + self.fixed
    }

    /// How long a lease of `ttl` counts as valid on the client: `ttl − allowance`.
    pub fn validity(&self, ttl: Duration) -> Duration {
        ttl.saturating_sub(self.allowance(ttl))
    }

    /// Checks the drift settings against `ttl`.
    pub fn validate(&self, ttl: Duration) -> Result<()> {
        if !self.factor.is_finite() || !(0.0..1.0).contains(&self.factor) {
            return Err(Error::invalid(
                "drift.factor",
                format!("{} must be at least 0 and below 1", self.factor),
            ));
        }
        let allowance = self.allowance(ttl);
        if allowance >= ttl {
            return Err(Error::invalid(
                "drift",
                format!("allowance {allowance:?} (ttl × factor + fixed) must be smaller than the ttl {ttl:?}"),
            ));
        }
        Ok(())
    }
}

/// Opt-in automatic renewal of a lease.
///
/// The backend handle's renewal scheduler extends the lease every `interval` (default a third of
/// the TTL) through the backend's ownership-checked extend, together with every other lease of the
/// handle that is due: one timer and one [`extend_many`](crate::DistributedLock::extend_many) call
/// per tick, however many leases are held. A failed renewal marks the lease
/// [uncertain](crate::LeaseState::Uncertain) and retries; if it cannot be confirmed before its
/// validity ends the lease becomes [lost](crate::LeaseState::Lost). Renewal stops on release, on
/// drop, and once `max_hold` has passed since the acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AutoRenew {
    /// Time between renewals; `None` means a third of the TTL.
    pub interval: Option<Duration>,
    /// Stop renewing after this long in total, so a stuck job cannot hold a lock forever. The lease
    /// then runs out at the end of its last TTL.
    pub max_hold: Option<Duration>,
}

impl AutoRenew {
    /// The renewal interval for a lease with this TTL and drift allowance.
    pub fn interval_for(&self, ttl: Duration) -> Duration {
        self.interval.unwrap_or(ttl / 3)
    }
}

/// Options for one acquire.
///
/// Fields are public for struct-update syntax; the `with_*` methods read better in a chain:
///
/// ```
/// use std::time::Duration;
/// use dlock_core::LockOptions;
///
/// let opts = LockOptions::new(Duration::from_secs(10))
///     .with_wait(Duration::from_secs(3))
///     .with_auto_renew();
/// assert_eq!(opts.ttl, Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct LockOptions {
    /// How long the server keeps the lock if the holder goes silent. Default 30 s.
    pub ttl: Duration,
    /// How long [`acquire`](crate::DistributedLockExt::acquire) may wait; `None` waits until held.
    /// Ignored by `try_acquire`.
    pub wait: Option<Duration>,
    /// Backoff between attempts of a waiting acquire.
    pub retry: Backoff,
    /// Clock-drift allowance subtracted from the validity.
    pub drift: Drift,
    /// Automatic renewal; off by default.
    pub auto_renew: Option<AutoRenew>,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(30),
            wait: None,
            retry: Backoff::default(),
            drift: Drift::default(),
            auto_renew: None,
        }
    }
}

impl LockOptions {
    /// Default options with the given TTL.
    pub fn new(ttl: Duration) -> Self {
        LockOptions {
            ttl,
            ..LockOptions::default()
        }
    }

    /// Turns on auto-renew with its defaults.
    pub fn with_auto_renew(mut self) -> Self {
        self.auto_renew = Some(AutoRenew::default());
        self
    }

    /// Checks every option, returning [`Error::InvalidInput`] naming the first field at fault.
    pub fn validate(&self) -> Result<()> {
        validate_ttl(self.ttl)?;
        self.drift.validate(self.ttl)?;
        if let Some(wait) = self.wait {
            if wait > MAX_WAIT {
                return Err(Error::invalid(
                    "wait",
                    format!(
                        "{wait:?} exceeds the maximum of {MAX_WAIT:?}; use no wait limit instead"
                    ),
                ));
            }
        }
        self.retry.validate()?;
        if let Some(renew) = &self.auto_renew {
            let validity = self.drift.validity(self.ttl);
            let interval = renew.interval_for(self.ttl);
            if interval.is_zero() || interval >= validity {
                return Err(Error::invalid(
                    "auto_renew.interval",
                    format!(
                        "{interval:?} must be greater than zero and shorter than the lease's validity {validity:?}"
                    ),
                ));
            }
            if let Some(max_hold) = renew.max_hold {
                if max_hold.is_zero() || max_hold > MAX_TTL {
                    return Err(Error::invalid(
                        "auto_renew.max_hold",
                        format!("{max_hold:?} must be greater than zero and at most {MAX_TTL:?}"),
                    ));
                }
            }
        }
        Ok(())
    }
}

crate::setters! {
    LockOptions {
        /// Sets the TTL.
        with_ttl(ttl: Duration) => ttl = ttl;
        /// Limits how long `acquire` waits.
        with_wait(wait: Duration) => wait = Some(wait);
        /// Sets the backoff between attempts.
        with_retry(retry: Backoff) => retry = retry;
        /// Sets the drift allowance.
        with_drift(drift: Drift) => drift = drift;
        /// Turns on auto-renew with the given settings.
        with_renewal(renew: AutoRenew) => auto_renew = Some(renew);
    }
}

/// Checks a TTL against [`MIN_TTL`] and [`MAX_TTL`].
pub fn validate_ttl(ttl: Duration) -> Result<()> {
    if ttl < MIN_TTL {
        return Err(Error::invalid(
            "ttl",
            format!("{ttl:?} is below the minimum of {MIN_TTL:?}"),
        ));
    }
    if ttl > MAX_TTL {
        return Err(Error::invalid(
            "ttl",
            format!("{ttl:?} exceeds the maximum of {MAX_TTL:?}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(opts: &LockOptions) -> &'static str {
        match opts.validate() {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("{opts:?} gave {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        assert!(LockOptions::default().validate().is_ok());
        assert!(LockOptions::default().with_auto_renew().validate().is_ok());
        assert!(LockOptions::new(MIN_TTL).validate().is_ok());
        assert!(LockOptions::new(MAX_TTL).validate().is_ok());
    }

    #[test]
    fn every_bad_option_names_its_field() {
        let base = LockOptions::default();
        assert_eq!(field_of(&base.clone().with_ttl(Duration::ZERO)), "ttl");
        assert_eq!(
            field_of(&base.clone().with_ttl(Duration::from_millis(9))),
            "ttl"
        );
        assert_eq!(
            field_of(&base.clone().with_ttl(MAX_TTL + Duration::from_secs(1))),
            "ttl"
        );
        assert_eq!(field_of(&base.clone().with_ttl(Duration::MAX)), "ttl");
        assert_eq!(
            field_of(&base.clone().with_wait(MAX_WAIT + Duration::from_secs(1))),
            "wait"
        );
        assert_eq!(field_of(&base.clone().with_wait(Duration::MAX)), "wait");
        let drift_too_big = base
            .clone()
            .with_ttl(Duration::from_millis(10))
            .with_drift(Drift {
                factor: 0.01,
                fixed: Duration::from_millis(10),
            });
        assert_eq!(field_of(&drift_too_big), "drift");
        for factor in [1.0, -0.1, f64::NAN, f64::INFINITY] {
            let o = base.clone().with_drift(Drift {
                factor,
                fixed: Duration::ZERO,
            });
            assert_eq!(field_of(&o), "drift.factor");
        }
        let o = base.clone().with_retry(Backoff {
            initial: Duration::ZERO,
            ..Backoff::default()
        });
        assert_eq!(field_of(&o), "retry.initial");
        let o = base.clone().with_renewal(AutoRenew {
            interval: Some(Duration::ZERO),
            max_hold: None,
        });
        assert_eq!(field_of(&o), "auto_renew.interval");
        let o = base.clone().with_renewal(AutoRenew {
            interval: Some(Duration::from_secs(30)),
            max_hold: None,
        });
        assert_eq!(field_of(&o), "auto_renew.interval");
        let o = base.clone().with_renewal(AutoRenew {
            interval: None,
            max_hold: Some(Duration::ZERO),
        });
        assert_eq!(field_of(&o), "auto_renew.max_hold");
    }

    #[test]
    fn messages_name_the_limit() {
        let err = LockOptions::new(Duration::ZERO).validate().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid ttl: 0ns is below the minimum of 10ms"
        );
        let err = LockOptions::new(Duration::from_millis(10))
            .with_drift(Drift {
                factor: 0.0,
                fixed: Duration::from_millis(10),
            })
            .validate()
            .unwrap_err();
        assert!(
            err.to_string().contains("must be smaller than the ttl"),
            "{err}"
        );
    }

    #[test]
    fn drift_allowance_follows_the_formula() {
        let d = Drift::default();
        assert_eq!(
            d.allowance(Duration::from_secs(10)),
            Duration::from_millis(102)
        );
        assert_eq!(
            d.validity(Duration::from_secs(10)),
            Duration::from_millis(9898)
        );
    }
}
