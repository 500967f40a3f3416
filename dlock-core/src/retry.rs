//! Backoff between the attempts of a waiting acquire.
//!
//! Waiting prefers a backend's notification (a release wakes the waiter); the backoff is the
//! fallback that bounds how long a lost notification can cost, and its jitter keeps contenders
//! that were refused together from retrying together.

use std::time::Duration;

use crate::error::{Error, Result};

/// Jittered, capped exponential backoff.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The first delay. Default 10 ms.
    pub initial: Duration,
    /// The largest delay. Default 500 ms.
    pub max: Duration,
    /// Growth per attempt, at least 1. Default 2.
    pub multiplier: f64,
    /// Fraction of each delay that is randomised, from 0 (none) to 1 (anywhere in `0..=delay`).
    /// Default 0.5: a delay `d` becomes a uniform value in `[d/2, d]`.
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(500),
            multiplier: 2.0,
            jitter: 0.5,
        }
    }
}

impl Backoff {
    /// Checks that the settings make sense, naming the field that does not.
    pub fn validate(&self) -> Result<()> {
        if self.initial.is_zero() {
            return Err(Error::invalid("retry.initial", "must be greater than zero"));
        }
        if self.max < self.initial {
            return Err(Error::invalid(
                "retry.max",
                format!(
                    "{:?} is smaller than retry.initial {:?}",
                    self.max, self.initial
                ),
            ));
        }
        if self.max > MAX_BACKOFF {
            return Err(Error::invalid(
                "retry.max",
                format!("{:?} exceeds the maximum of {MAX_BACKOFF:?}", self.max),
            ));
        }
        if !self.multiplier.is_finite() || self.multiplier < 1.0 {
            return Err(Error::invalid(
                "retry.multiplier",
                format!("{} must be a finite number ≥ 1", self.multiplier),
            ));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(Error::invalid(
                "retry.jitter",
                format!("{} must be between 0 and 1", self.jitter),
            ));
        }
        Ok(())
    }

    /// The delay before retry number `attempt` (0-based), before jitter.
    pub fn base_delay(&self, attempt: u32) -> Duration {
        let factor = self.multiplier.powi(attempt.min(64) as i32);
        let secs = self.initial.as_secs_f64() * factor;
        if !secs.is_finite() || secs >= self.max.as_secs_f64() {
            self.max
        } else {
            Duration::from_secs_f64(secs)
        }
    }

    /// The jittered delay before retry number `attempt` (0-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        let base = self.base_delay(attempt);
        if self.jitter <= 0.0 {
            return base;
        }
        let keep = 1.0 - self.jitter * rand::random::<f64>();
        base.mul_f64(keep.clamp(0.0, 1.0))
    }
}

/// The largest `retry.max` accepted: waiting longer between checks only hides a lost notification.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn grows_then_caps() {
        let b = Backoff {
            jitter: 0.0,
            ..Backoff::default()
        };
        assert_eq!(b.delay(0), Duration::from_millis(10));
        assert_eq!(b.delay(1), Duration::from_millis(20));
        assert_eq!(b.delay(5), Duration::from_millis(320));
        assert_eq!(b.delay(6), Duration::from_millis(500));
        assert_eq!(b.delay(u32::MAX), Duration::from_millis(500));
    }

    #[test]
    fn every_bad_setting_is_named() {
        let with = |change: fn(&mut Backoff)| {
            let mut b = Backoff::default();
            change(&mut b);
            b
        };
        let cases = [
            (with(|b| b.initial = Duration::ZERO), "retry.initial"),
            (with(|b| b.max = Duration::from_millis(1)), "retry.max"),
            (with(|b| b.max = Duration::from_secs(3600)), "retry.max"),
            (with(|b| b.multiplier = 0.5), "retry.multiplier"),
            (with(|b| b.multiplier = f64::NAN), "retry.multiplier"),
            (with(|b| b.jitter = 1.5), "retry.jitter"),
            (with(|b| b.jitter = -0.1), "retry.jitter"),
        ];
        for (b, field) in cases {
            match b.validate() {
                Err(Error::InvalidInput { field: f, .. }) => assert_eq!(f, field, "{b:?}"),
                other => panic!("{b:?} gave {other:?}"),
            }
        }
        assert!(Backoff::default().validate().is_ok());
    }

    proptest! {
        #[test]
        fn jittered_delay_stays_within_bounds(
            initial_ms in 1u64..1000,
            extra_ms in 0u64..5000,
            multiplier in 1.0f64..10.0,
            jitter in 0.0f64..=1.0,
            attempt in 0u32..100,
        ) {
            let b = Backoff {
                initial: Duration::from_millis(initial_ms),
                max: Duration::from_millis(initial_ms + extra_ms),
                multiplier,
                jitter,
            };
            prop_assert!(b.validate().is_ok());
            let base = b.base_delay(attempt);
            let d = b.delay(attempt);
            prop_assert!(base <= b.max);
            prop_assert!(d <= base);
            prop_assert!(d >= base.mul_f64(1.0 - jitter) - Duration::from_nanos(1));
        }
    }
}
