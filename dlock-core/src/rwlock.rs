//! A read-write lock: any number of readers, or one writer.

use std::sync::Arc;

use crate::backend::DistributedLock;
use crate::error::Result;
use crate::inspect::Holding;
use crate::key::LockKey;
use crate::lease::Lease;
use crate::options::LockOptions;
use crate::primitive::Primitive;

/// A named read-write lock, from [`DistributedLockExt::rw`](crate::DistributedLockExt::rw).
///
/// Readers share the name with each other and never with a writer; a writer holds it alone.
/// Every hold is a [`Lease`] with its own fencing token, and tokens come from one sequence per
/// name, so a writer's token is greater than the token of every reader granted before it (and a
/// fenced resource that readers and writers both touch can order them).
///
/// **Writers are not starved.** A writer that waits ([`write`](RwLock::write)) holds back readers
/// that arrive after it: they wait until it has been served or has given up, so a stream of
/// readers cannot keep a writer out. A [`try_write`](RwLock::try_write) does not wait and holds
/// nobody back.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock_core::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use dlock_core::{DistributedLock, DistributedLockExt, InMemoryLock, LockOptions};
///
/// let locks: Arc<dyn DistributedLock> = Arc::new(InMemoryLock::new());
/// let config = locks.rw("config")?;
/// let opts = LockOptions::new(Duration::from_secs(10));
/// let a = config.read(&opts).await?;
/// let b = config.read(&opts).await?; // readers share
/// assert!(config.try_write(&opts).await?.is_none());
/// a.release().await?;
/// b.release().await?;
/// let writer = config.try_write(&opts).await?.expect("free once the readers left");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RwLock {
    read: Arc<dyn DistributedLock>,
    write: Arc<dyn DistributedLock>,
    name: LockKey,
}

impl RwLock {
    pub(crate) fn new(backend: &dyn DistributedLock, name: &str) -> Result<Self> {
        let name = LockKey::new(name)?;
        Ok(RwLock {
            read: backend.primitive(&Primitive::Read)?,
            write: backend.primitive(&Primitive::Write)?,
            name,
        })
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// Waits to read, up to `opts.wait`.
    ///
    /// # Cancel safety
    /// Cancel safe in effect, like [`DistributedLockExt::acquire`](crate::DistributedLockExt::acquire).
    pub async fn read(&self, opts: &LockOptions) -> Result<Lease> {
        crate::acquire::acquire(self.read.clone(), Ok(self.name.clone()), opts).await
    }

    /// One attempt to read: `None` while a writer holds or waits.
    pub async fn try_read(&self, opts: &LockOptions) -> Result<Option<Lease>> {
        crate::acquire::try_acquire(self.read.clone(), Ok(self.name.clone()), opts).await
    }

    /// Waits to write, up to `opts.wait`, holding back readers that arrive meanwhile.
    ///
    /// # Cancel safety
    /// Cancel safe in effect: a dropped wait stops holding readers back and leaves nothing held.
    pub async fn write(&self, opts: &LockOptions) -> Result<Lease> {
        crate::acquire::acquire(self.write.clone(), Ok(self.name.clone()), opts).await
    }

    /// One attempt to write: `None` while anyone holds the lock.
    pub async fn try_write(&self, opts: &LockOptions) -> Result<Option<Lease>> {
        crate::acquire::try_acquire(self.write.clone(), Ok(self.name.clone()), opts).await
    }

    /// Who holds the lock now: the writer, or the earliest reader and how many read
    /// ([`Holder::holders`](crate::inspect::Holder::holders) is set for readers only).
    pub async fn holding(&self) -> Result<Holding> {
        self.read.inspect(&self.name).await
    }
}
