//! A semaphore: up to N holders of a name at once, each with a fenced lease of its own.

use std::sync::Arc;

use crate::backend::DistributedLock;
use crate::error::Result;
use crate::inspect::Holding;
use crate::key::LockKey;
use crate::lease::Lease;
use crate::options::LockOptions;
use crate::primitive::Primitive;

/// A named semaphore of a fixed number of permits, from
/// [`DistributedLockExt::semaphore`](crate::DistributedLockExt::semaphore).
///
/// Each permit is a [`Lease`]: it has its own owner and fencing token, follows the same
/// held/uncertain/lost states, can auto-renew, and returns to the semaphore when released,
/// dropped, or (for a crashed holder) when its TTL runs out. Never more than `permits` leases
/// are held at once. Every client of one name must use the same number of permits: while the
/// name is in use, a client that asks with another number is refused with
/// [`Error::Mismatch`](crate::Error::Mismatch).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock_core::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use dlock_core::{DistributedLock, DistributedLockExt, InMemoryLock, LockOptions};
///
/// let locks: Arc<dyn DistributedLock> = Arc::new(InMemoryLock::new());
/// let crawlers = locks.semaphore("crawlers", 2)?;
/// let opts = LockOptions::new(Duration::from_secs(10));
/// let one = crawlers.acquire(&opts).await?;
/// let two = crawlers.acquire(&opts).await?;
/// assert!(crawlers.try_acquire(&opts).await?.is_none()); // both permits are out
/// assert_ne!(one.fencing_token(), two.fencing_token());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    view: Arc<dyn DistributedLock>,
    name: LockKey,
    permits: u32,
}

impl Semaphore {
    pub(crate) fn new(backend: &dyn DistributedLock, name: &str, permits: u32) -> Result<Self> {
        let name = LockKey::new(name)?;
        Ok(Semaphore {
            view: backend.primitive(&Primitive::semaphore(permits))?,
            name,
            permits,
        })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// How many permits it has.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Waits for a permit, up to `opts.wait` ([`Error::Timeout`](crate::Error::Timeout)), as
    /// [`DistributedLockExt::acquire`](crate::DistributedLockExt::acquire) waits for a lock.
    ///
    /// # Cancel safety
    /// Cancel safe in effect: a permit taken by a dropped call is given back in the background.
    pub async fn acquire(&self, opts: &LockOptions) -> Result<Lease> {
        crate::acquire::acquire(self.view.clone(), Ok(self.name.clone()), opts).await
    }

    /// One attempt: a permit if one is free, `None` if every permit is held.
    pub async fn try_acquire(&self, opts: &LockOptions) -> Result<Option<Lease>> {
        crate::acquire::try_acquire(self.view.clone(), Ok(self.name.clone()), opts).await
    }

    /// Who holds permits now: the earliest holder, and how many hold one
    /// ([`Holder::holders`](crate::inspect::Holder::holders)).
    pub async fn holding(&self) -> Result<Holding> {
        self.view.inspect(&self.name).await
    }
}
