//! The application's calls (`try_acquire`, `acquire`, `with_lock`, …) on any shared backend
//! handle, for code that holds the trait object; [`Locks`](crate::Locks) offers each as its own
//! method.

use std::future::Future;

use crate::backend::{DistributedLock, LockHandle};
use crate::critical::CriticalSection;
use crate::election::Election;
use crate::error::{Error, Result};
use crate::inspect::Holding;
use crate::key::LockKey;
use crate::lease::Lease;
use crate::multi::MultiLease;
use crate::options::LockOptions;
use crate::rwlock::RwLock;
use crate::semaphore::Semaphore;
use crate::state::LeaseWatch;

/// The application's calls on every [`LockHandle`]: on the trait object a backend author, a
/// layer or a test holds. An application holds a [`Locks`](crate::Locks), which offers the same
/// calls as its own methods and none of the backend's. Do not implement it: the blanket
/// implementation covers every backend.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock_core::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use dlock_core::{DistributedLock, DistributedLockExt, InMemoryLock, LockOptions};
///
/// let locks: Arc<dyn DistributedLock> = Arc::new(InMemoryLock::new());
/// let opts = LockOptions::new(Duration::from_secs(5)).with_wait(Duration::from_secs(1));
///
/// let lease = locks.acquire("invoices/42", &opts).await?;
/// assert!(locks.try_acquire("invoices/42", &opts).await?.is_none()); // busy
/// println!("writing with fencing token {}", lease.fencing_token());
/// lease.release().await?;
/// # Ok(()) }
/// ```
pub trait DistributedLockExt: LockHandle {
    /// One attempt: `Some(lease)` if the lock was free, `None` if it is busy.
    ///
    /// Answers after one round trip. `opts.wait` is ignored; the attempt gives up (with
    /// [`Error::Timeout`]) if the answer takes longer than the lease's validity, since such a lease
    /// would be useless.
    ///
    /// # Cancel safety
    /// Cancel safe in effect: if dropped after the request was sent, whatever it may have taken
    /// is released in the background by owner token.
    fn try_acquire(
        &self,
        key: &str,
        opts: &LockOptions,
    ) -> impl Future<Output = Result<Option<Lease>>> + Send {
        crate::acquire::try_acquire(self.shared(), LockKey::new(key), opts)
    }

    /// Waits until the lock is held, or until `opts.wait` has passed ([`Error::Timeout`]).
    ///
    /// Never returns a lease whose validity is already over: a grant that arrives too late is
    /// released and the acquire tries again while time is left. Errors from the backend are
    /// returned at once rather than retried.
    ///
    /// # Cancel safety
    /// Cancel safe in effect: if dropped while a request is in flight, whatever it may have taken
    /// is released in the background by owner token, so nothing stays held until its TTL.
    fn acquire(&self, key: &str, opts: &LockOptions) -> impl Future<Output = Result<Lease>> + Send {
        crate::acquire::acquire(self.shared(), LockKey::new(key), opts)
    }

    /// Whether `key` is held right now, and by which fencing token where the backend can tell,
    /// without taking it ([`DistributedLock::inspect`]).
    ///
    /// Fails with [`Error::InvalidInput`] for a bad key (nothing is sent) and with
    /// [`Error::Unsupported`] where the backend cannot look without taking the lock.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    fn holding(&self, key: &str) -> impl Future<Output = Result<Holding>> + Send {
        let handle = self.shared();
        let key = LockKey::new(key);
        async move { handle.inspect(&key?).await }
    }

    /// Takes every key in `keys`, or none: waits up to `opts.wait` in all, and on a timeout or
    /// error gives back the keys it took before returning. Each key gets a lease with its own
    /// fencing token ([`MultiLease`]).
    ///
    /// Keys are taken one at a time in one global order (byte order), whatever order they are
    /// named in, so clients naming overlapping sets cannot deadlock. A key taken early is held
    /// while later ones are awaited: take them with
    /// [`auto-renew`](LockOptions::with_auto_renew) when the wait may outlast the TTL. An empty
    /// list, a key named twice or more than [`MAX_KEYS`](crate::limits::MAX_KEYS) keys is
    /// [`Error::InvalidInput`], and nothing is sent.
    ///
    /// # Cancel safety
    /// Cancel safe in effect: keys a dropped call took are released in the background.
    fn acquire_all(
        &self,
        keys: &[&str],
        opts: &LockOptions,
    ) -> impl Future<Output = Result<MultiLease>> + Send {
        let handle = self.shared();
        async move {
            match crate::multi::acquire_all(handle, keys, opts, true).await? {
                Some(all) => Ok(all),
                None => Err(Error::Timeout {
                    key: keys.join(", "),
                    waited: opts.wait.unwrap_or_default(),
                }),
            }
        }
    }

    /// One attempt at every key in `keys`: all of them, or `None` (with nothing held) if any is
    /// busy.
    fn try_acquire_all(
        &self,
        keys: &[&str],
        opts: &LockOptions,
    ) -> impl Future<Output = Result<Option<MultiLease>>> + Send {
        crate::multi::acquire_all(self.shared(), keys, opts, false)
    }

    /// The semaphore `name` of `permits` permits ([`Semaphore`]). Fails with
    /// [`Error::InvalidInput`] for a bad name or permits and [`Error::Unsupported`] where the
    /// backend has no semaphore; nothing is sent.
    fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        Semaphore::new(self.shared().as_ref(), name, permits)
    }

    /// The read-write lock `name` ([`RwLock`]).
    fn rw(&self, name: &str) -> Result<RwLock> {
        RwLock::new(self.shared().as_ref(), name)
    }

    /// The election `name` ([`Election`]).
    fn election(&self, name: &str) -> Result<Election> {
        Election::new(self.shared(), name)
    }

    /// Acquires `key`, runs `work` with a view of the lease, and releases.
    ///
    /// `work` is cancelled (dropped) if the lease is lost first; see [`Lease::run`]. Returns the
    /// output (if the work finished) and how the lease ended.
    ///
    /// # Cancel safety
    /// Dropping the returned future cancels the work and releases the lock in the background.
    fn with_lock<F, Fut>(
        &self,
        key: &str,
        opts: &LockOptions,
        work: F,
    ) -> impl Future<Output = Result<CriticalSection<Fut::Output>>> + Send
    where
        F: FnOnce(LeaseWatch) -> Fut + Send,
        Fut: Future + Send,
        Fut::Output: Send,
    {
        async move {
            let lease = self.acquire(key, opts).await?;
            let watch = lease.watch();
            Ok(lease.run(work(watch)).await)
        }
    }
}

impl<S: LockHandle + ?Sized> DistributedLockExt for S {}
