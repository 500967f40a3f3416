//! Operator calls: list the held locks and evict a stuck holder.
//!
//! They live on their own handle rather than beside `acquire` because a service that takes locks
//! should never evict one by accident: code that holds an [`Admin`] was given it on purpose (the
//! `dlock` command line's `list` and `unlock --force`, an operations endpoint).

use std::sync::Arc;

use crate::backend::DistributedLock;
use crate::backend::LockHandle;
use crate::check::check_len;
use crate::error::Result;
use crate::inspect::{Eviction, HeldLock};
use crate::key::{LockKey, MAX_KEY_LEN};
use crate::token::FencingToken;

/// The operator's handle on a lock service.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock_core::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use dlock_core::{Admin, DistributedLock, DistributedLockExt, InMemoryLock, LockOptions};
/// use dlock_core::inspect::Eviction;
///
/// let locks: Arc<dyn DistributedLock> = Arc::new(InMemoryLock::new());
/// let stuck = locks.acquire("reports/daily", &LockOptions::new(Duration::from_secs(60))).await?;
///
/// let admin = Admin::new(&locks);
/// let held = admin.list("reports/").await?;
/// let shown = held[0].holder.fencing; // what the operator was shown
/// assert!(matches!(admin.force_unlock("reports/daily", shown).await?, Eviction::Evicted(_)));
///
/// let next = locks.acquire("reports/daily", &LockOptions::new(Duration::from_secs(60))).await?;
/// assert!(next.fencing_token() > stuck.fencing_token()); // the fence rejects the evicted holder
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Admin {
    backend: Arc<dyn DistributedLock>,
}

impl Admin {
    /// The operator's handle on the service behind `handle`.
    pub fn new(handle: &impl LockHandle) -> Self {
        Admin {
            backend: handle.shared(),
        }
    }

    /// The locks held now whose names start with `prefix` (every one for `""`), with their
    /// holders ([`DistributedLock::list`]), sorted by name.
    ///
    /// Fails with [`Error::InvalidInput`](crate::Error::InvalidInput) for a prefix longer than a
    /// key and with [`Error::Unsupported`](crate::Error::Unsupported) where the backend cannot
    /// list.
    pub async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        check_len("prefix", prefix, MAX_KEY_LEN)?;
        let mut held = self.backend.list(prefix).await?;
        held.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(held)
    }

    /// Removes the holder of `key` — only if its fencing token is `expected`, when given — so
    /// that the next grant gets a greater fencing token and the evicted holder's lease turns
    /// lost ([`DistributedLock::evict`]).
    ///
    /// Pass the token of the holder you decided to evict (from [`list`](Self::list) or
    /// [`holding`](crate::DistributedLockExt::holding)): if the lock changed hands since, the
    /// answer is [`Eviction::Changed`] and nothing is removed.
    pub async fn force_unlock(
        &self,
        key: &str,
        expected: Option<FencingToken>,
    ) -> Result<Eviction> {
        let key = LockKey::new(key)?;
        self.backend.evict(&key, expected).await
    }
}
