//! Fencing: how a resource rejects the writes of a holder whose lease already ended.
//!
//! A lease can expire while its holder is paused (a GC pause, a swapped-out VM, a slow disk): when
//! the holder resumes it still believes it holds the lock. No lock service can prevent that; the
//! resource can. Every write carries the writer's [`FencingToken`], and the resource admits a
//! token only if it is not older than the newest it has seen.
//!
//! [`Fence`] does this for a resource living in one process. A real store does the same in its
//! own transaction, so that the check and the write are atomic:
//!
//! ```sql
//! -- one row per guarded resource, with the highest token admitted so far
//! UPDATE accounts
//!    SET balance = balance - $amount,
//!        fence   = $token
//!  WHERE id = $id
//!    AND fence <= $token;   -- use `<` to admit each holder exactly once
//! -- 0 rows updated: the writer's lease is stale; abort and report it.
//! ```
//!
//! Object stores and key-value stores offer the same through conditional writes (a compare on a
//! version column or a metadata field holding the token).

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::token::FencingToken;

/// Whether a fence admits the same token more than once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FenceMode {
    /// Admit tokens `≥` the highest seen: one holder may write many times. The default.
    #[default]
    AllowEqual,
    /// Admit tokens `>` the highest seen: each holder writes at most once.
    StrictlyGreater,
}

/// The error of a write presented with a stale token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {presented}: a holder with token {highest} has already been admitted")]
pub struct StaleToken {
    /// The token that was rejected.
    pub presented: FencingToken,
    /// The highest token admitted so far.
    pub highest: FencingToken,
}

/// Remembers the highest fencing token admitted and rejects older ones.
#[derive(Debug, Default)]
pub struct Fence {
    mode: FenceMode,
    highest: Mutex<Option<FencingToken>>,
}

impl Fence {
    /// A fence that admits tokens `≥` the highest seen.
    pub fn new() -> Self {
        Fence::default()
    }

    /// A fence with the given mode.
    pub fn with_mode(mode: FenceMode) -> Self {
        Fence {
            mode,
            highest: Mutex::new(None),
        }
    }

    /// Admits `token` if it is not stale, remembering it as the highest.
    pub fn admit(&self, token: FencingToken) -> Result<(), StaleToken> {
        let mut highest = self.lock();
        check(self.mode, &mut highest, token)
    }

    /// The highest token admitted so far.
    pub fn highest(&self) -> Option<FencingToken> {
        *self.lock()
    }

    fn lock(&self) -> MutexGuard<'_, Option<FencingToken>> {
        // The guarded value is a plain number that is never left half-written.
        self.highest.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn check(
    mode: FenceMode,
    highest: &mut Option<FencingToken>,
    token: FencingToken,
) -> Result<(), StaleToken> {
    if let Some(h) = *highest {
        let admitted = match mode {
            FenceMode::AllowEqual => token >= h,
            FenceMode::StrictlyGreater => token > h,
        };
        if !admitted {
            return Err(StaleToken {
                presented: token,
                highest: h,
            });
        }
    }
    *highest = Some(token);
    Ok(())
}

/// A value guarded by a fence: a write is applied only if its token is admitted, atomically with
/// the check. A small stand-in for a fenced store, for tests and single-process resources.
#[derive(Debug, Default)]
pub struct Fenced<T> {
    mode: FenceMode,
    inner: Mutex<(Option<FencingToken>, T)>,
}

impl<T> Fenced<T> {
    /// Guards `value` with a fence admitting tokens `≥` the highest seen.
    pub fn new(value: T) -> Self {
        Fenced::with_mode(value, FenceMode::AllowEqual)
    }

    /// Guards `value` with a fence of the given mode.
    pub fn with_mode(value: T, mode: FenceMode) -> Self {
        Fenced {
            mode,
            inner: Mutex::new((None, value)),
        }
    }

    /// Applies `write` to the value if `token` is admitted; the check and the write are atomic.
    pub fn write<R>(
        &self,
        token: FencingToken,
        write: impl FnOnce(&mut T) -> R,
    ) -> Result<R, StaleToken> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let (highest, value) = &mut *inner;
        check(self.mode, highest, token)?;
        Ok(write(value))
    }

    /// Reads the value.
    pub fn read<R>(&self, read: impl FnOnce(&T) -> R) -> R {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        read(&inner.1)
    }

    /// The highest token admitted so far.
    pub fn highest(&self) -> Option<FencingToken> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rejects_older_tokens_with_a_clear_error() {
        let fence = Fence::new();
        assert_eq!(fence.highest(), None);
        fence.admit(FencingToken(5)).unwrap();
        fence.admit(FencingToken(5)).unwrap();
        let err = fence.admit(FencingToken(4)).unwrap_err();
        assert_eq!(
            err,
            StaleToken {
                presented: FencingToken(4),
                highest: FencingToken(5)
            }
        );
        assert_eq!(
            err.to_string(),
            "stale fencing token 4: a holder with token 5 has already been admitted"
        );
        fence.admit(FencingToken(9)).unwrap();
        assert_eq!(fence.highest(), Some(FencingToken(9)));
    }

    #[test]
    fn strict_mode_admits_each_token_once() {
        let fence = Fence::with_mode(FenceMode::StrictlyGreater);
        fence.admit(FencingToken(0)).unwrap();
        assert!(fence.admit(FencingToken(0)).is_err());
        fence.admit(FencingToken(1)).unwrap();
    }

    #[test]
    fn fenced_value_skips_stale_writes() {
        let v = Fenced::new(Vec::new());
        v.write(FencingToken(1), |v| v.push(1)).unwrap();
        v.write(FencingToken(3), |v| v.push(3)).unwrap();
        assert!(v.write(FencingToken(2), |v| v.push(2)).is_err());
        assert_eq!(v.read(|v| v.clone()), vec![1, 3]);
        assert_eq!(v.highest(), Some(FencingToken(3)));
    }

    proptest! {
        #[test]
        fn admitted_tokens_never_decrease(tokens in proptest::collection::vec(0u64..50, 0..100)) {
            let fence = Fence::new();
            let mut admitted = Vec::new();
            for t in tokens {
                let before = fence.highest();
                match fence.admit(FencingToken(t)) {
                    Ok(()) => admitted.push(t),
                    Err(e) => prop_assert!(Some(e.highest) == before && t < e.highest.0),
                }
            }
            prop_assert!(admitted.windows(2).all(|w| w[0] <= w[1]));
        }
    }
}
