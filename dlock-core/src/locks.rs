//! [`Locks`]: the handle an application holds, a backend plus the defaults for each acquire.
//!
//! Applications call the lock and its primitives through it and never see the backend's own
//! calls ([`DistributedLock`]: `try_lock`, `extend`, `release` of a [`LeaseRef`](crate::backend::LeaseRef), …).

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use crate::admin::Admin;
use crate::backend::url::redact_password;
use crate::backend::{DistributedLock, LockHandle};
use crate::critical::CriticalSection;
use crate::election::Election;
use crate::error::Result;
use crate::ext::DistributedLockExt;
use crate::inspect::Holding;
use crate::lease::Lease;
use crate::multi::MultiLease;
use crate::options::LockOptions;
use crate::rwlock::RwLock;
use crate::semaphore::Semaphore;
use crate::state::LeaseWatch;

/// The handle an application holds: a shared backend with its per-acquire defaults.
///
/// `dlock::connect(url)` returns one for the backend a URL names, with the URL's defaults;
/// [`Locks::from`] makes one from a backend value (`Locks::from(InMemoryLock::new())`), with the
/// default [`LockOptions`]. It offers the calls an application makes and none of the backend's
/// own (those are [`DistributedLock`]'s, for backend authors and layers). It is cheap to clone (clones share the backend) and offers every call of
/// [`DistributedLockExt`](crate::DistributedLockExt) as its own method, so no trait needs
/// importing: [`try_acquire`](Self::try_acquire), [`acquire`](Self::acquire),
/// [`holding`](Self::holding), [`with_lock`](Self::with_lock), [`acquire_all`](Self::acquire_all),
/// [`try_acquire_all`](Self::try_acquire_all), [`semaphore`](Self::semaphore), [`rw`](Self::rw)
/// and [`election`](Self::election) (a test keeps the two lists the same). Pass
/// [`options`](Self::options) to them to use the URL's `ttl`, `wait` and `drift`, or any
/// [`LockOptions`] of your own.
///
/// Beside the lock it serves the primitives of every backend that declares them
/// ([`Capabilities::primitives`](crate::backend::Capabilities::primitives)):
/// [`semaphore`](Self::semaphore), [`rw`](Self::rw), [`election`](Self::election) and
/// [`acquire_all`](Self::acquire_all). A backend that does not serve one answers
/// [`Error::Unsupported`](crate::Error::Unsupported) naming the backend and the primitive,
/// before anything is sent. A name used as a lock, a semaphore, a read-write lock and an election
/// names four independent things.
///
/// It is not the trait object itself because a URL's `ttl`, `wait` and `drift` are defaults for
/// each acquire, not settings of the backend; they need a place to live, and an application
/// needs none of the backend's calls. [`backend`](Self::backend) gives the trait object, for
/// tools that wrap or drive a backend.
#[derive(Clone)]
pub struct Locks {
    backend: Arc<dyn DistributedLock>,
    options: LockOptions,
    url: String,
}

impl Locks {
    /// The operator's handle on the same backend: list the held locks, evict a stuck holder.
    pub fn admin(&self) -> Admin {
        Admin::new(&self.backend)
    }

    /// A handle on `backend` with `options` as the defaults; `url` names it in `Debug` and
    /// [`url`](Self::url), with its password hidden.
    pub fn new(backend: Arc<dyn DistributedLock>, options: LockOptions, url: &str) -> Self {
        Locks {
            backend,
            options,
            url: redact_password(url),
        }
    }

    /// The backend, as the trait object that layers wrap and backend authors drive.
    pub fn backend(&self) -> &Arc<dyn DistributedLock> {
        &self.backend
    }

    /// The per-acquire defaults from the URL (`ttl`, `wait`, `drift`, `drift_factor`), the
    /// core's defaults where the URL says nothing.
    pub fn options(&self) -> &LockOptions {
        &self.options
    }

    /// The URL this handle was made from, with its password hidden; for a handle made
    /// [`from`](Self::from) a backend value, the backend's name and `://` (`memory://`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// One attempt: `Some(lease)` if the lock `key` was free, `None` if it is busy
    /// ([`DistributedLockExt::try_acquire`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock_core::Result<()> {
    /// let locks = dlock_core::Locks::from(dlock_core::InMemoryLock::new());
    /// let lease = locks.try_acquire("reports/daily", locks.options()).await?;
    /// assert!(lease.is_some());
    /// assert!(locks.try_acquire("reports/daily", locks.options()).await?.is_none()); // busy
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe in effect, as [`DistributedLockExt::try_acquire`] says.
    pub async fn try_acquire(&self, key: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        DistributedLockExt::try_acquire(self, key, opts).await
    }

    /// Waits until the lock `key` is held, or until `opts.wait` has passed
    /// ([`Error::Timeout`](crate::Error::Timeout)); see [`DistributedLockExt::acquire`].
    ///
    /// # Cancel safety
    /// Cancel safe in effect, as [`DistributedLockExt::acquire`] says.
    pub async fn acquire(&self, key: &str, opts: &LockOptions) -> Result<Lease> {
        DistributedLockExt::acquire(self, key, opts).await
    }

    /// Whether `key` is held right now, and by whom where the backend can tell, without taking
    /// it ([`DistributedLockExt::holding`]).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn holding(&self, key: &str) -> Result<Holding> {
        DistributedLockExt::holding(self, key).await
    }

    /// Acquires `key`, runs `work` with a view of the lease, and releases
    /// ([`DistributedLockExt::with_lock`]): `work` is dropped if the lease is lost first.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock_core::Result<()> {
    /// let locks = dlock_core::Locks::from(dlock_core::InMemoryLock::new());
    /// let done = locks
    ///     .with_lock("reports/daily", locks.options(), |_lease| async { 42 })
    ///     .await?;
    /// assert_eq!(done.output, Some(42));
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Dropping the returned future cancels the work and releases the lock in the background.
    pub async fn with_lock<F, Fut>(
        &self,
        key: &str,
        opts: &LockOptions,
        work: F,
    ) -> Result<CriticalSection<Fut::Output>>
    where
        F: FnOnce(LeaseWatch) -> Fut + Send,
        Fut: Future + Send,
        Fut::Output: Send,
    {
        DistributedLockExt::with_lock(self, key, opts, work).await
    }

    /// The semaphore `name` of `permits` permits ([`Semaphore`]): up to `permits` holders at
    /// once, each with a lease and a fencing token of its own. Every client of the name must
    /// pass the same `permits`; while the name is in use, another number is refused with
    /// [`Error::Mismatch`](crate::Error::Mismatch).
    ///
    /// Fails with [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad name or
    /// `permits` outside 1 to [`MAX_PERMITS`](crate::limits::MAX_PERMITS), and with
    /// [`Error::Unsupported`](crate::Error::Unsupported) where the backend has no
    /// semaphore; nothing is sent.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock_core::Result<()> {
    /// let locks = dlock_core::Locks::from(dlock_core::InMemoryLock::new());
    /// let crawlers = locks.semaphore("crawlers", 2)?;
    /// let one = crawlers.acquire(locks.options()).await?;
    /// let two = crawlers.acquire(locks.options()).await?;
    /// assert!(crawlers.try_acquire(locks.options()).await?.is_none()); // both permits are out
    /// assert_ne!(one.fencing_token(), two.fencing_token());
    /// one.release().await?;
    /// assert!(crawlers.try_acquire(locks.options()).await?.is_some());
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        DistributedLockExt::semaphore(self, name, permits)
    }

    /// The read-write lock `name` ([`RwLock`]): any number of readers, or one writer. A writer
    /// that waits holds back the readers that arrive after it, and a writer's fencing token is
    /// greater than that of every reader granted before it.
    ///
    /// Fails with [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad name and
    /// with [`Error::Unsupported`](crate::Error::Unsupported) where the backend has no
    /// read-write lock; nothing is sent.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock_core::Result<()> {
    /// let locks = dlock_core::Locks::from(dlock_core::InMemoryLock::new());
    /// let config = locks.rw("config")?;
    /// let a = config.read(locks.options()).await?;
    /// let b = config.read(locks.options()).await?; // readers share
    /// assert!(config.try_write(locks.options()).await?.is_none());
    /// let last_read = b.fencing_token();
    /// a.release().await?;
    /// b.release().await?;
    /// let writer = config.write(locks.options()).await?;
    /// assert!(writer.fencing_token() > last_read);
    /// # Ok(()) }
    /// ```
    pub fn rw(&self, name: &str) -> Result<RwLock> {
        DistributedLockExt::rw(self, name)
    }

    /// The election `name` ([`Election`]): [`campaign`](Election::campaign) to lead with a
    /// value, [`leader`](Election::leader) and [`observe`](Election::observe) to see who leads;
    /// a leadership's term is its fencing token, strictly greater for every later leader.
    ///
    /// Fails with [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad name and
    /// with [`Error::Unsupported`](crate::Error::Unsupported) where the backend has no
    /// election; nothing is sent.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock_core::Result<()> {
    /// let locks = dlock_core::Locks::from(dlock_core::InMemoryLock::new());
    /// let election = locks.election("scheduler")?;
    /// let opts = locks.options().clone().with_auto_renew();
    /// let leadership = election.campaign("10.0.0.7:8080", &opts).await?;
    /// let leader = election.leader().await?.expect("someone leads");
    /// assert_eq!(leader.value.as_deref(), Some("10.0.0.7:8080"));
    /// assert_eq!(leader.term, Some(leadership.term()));
    /// leadership.resign().await?;
    /// assert!(election.leader().await?.is_none());
    /// # Ok(()) }
    /// ```
    pub fn election(&self, name: &str) -> Result<Election> {
        DistributedLockExt::election(self, name)
    }

    /// Takes every lock in `keys`, or none ([`MultiLease`]): waits up to `opts.wait` in all and
    /// gives back the keys it took on a timeout or an error. Keys are taken in one global order
    /// (byte order), whatever order they are named in, so clients naming overlapping sets do
    /// not deadlock; each key's lease has its own fencing token. See
    /// [`DistributedLockExt::acquire_all`].
    ///
    /// An empty list, a key named twice or more than [`MAX_KEYS`](crate::limits::MAX_KEYS) keys is
    /// [`Error::InvalidInput`](crate::Error::InvalidInput), and nothing is sent.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock_core::Result<()> {
    /// let locks = dlock_core::Locks::from(dlock_core::InMemoryLock::new());
    /// let both = locks.acquire_all(&["accounts/7", "accounts/3"], locks.options()).await?;
    /// assert!(locks.try_acquire("accounts/3", locks.options()).await?.is_none());
    /// let token = both.fencing_token("accounts/7").expect("one of the keys");
    /// println!("writing to accounts/7 with fencing token {token}");
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe in effect: keys a dropped call took are released in the background.
    pub async fn acquire_all(&self, keys: &[&str], opts: &LockOptions) -> Result<MultiLease> {
        DistributedLockExt::acquire_all(self, keys, opts).await
    }

    /// One attempt at every lock in `keys`: all of them, or `None` (with nothing held) if any
    /// is busy. See [`acquire_all`](Self::acquire_all).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock_core::Result<()> {
    /// let locks = dlock_core::Locks::from(dlock_core::InMemoryLock::new());
    /// let first = locks.try_acquire_all(&["a", "b"], locks.options()).await?;
    /// assert!(first.is_some());
    /// // "b" is busy, so "c" is not kept either.
    /// assert!(locks.try_acquire_all(&["b", "c"], locks.options()).await?.is_none());
    /// assert!(locks.try_acquire_all(&["c"], locks.options()).await?.is_some());
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe in effect, like [`acquire_all`](Self::acquire_all).
    pub async fn try_acquire_all(
        &self,
        keys: &[&str],
        opts: &LockOptions,
    ) -> Result<Option<MultiLease>> {
        DistributedLockExt::try_acquire_all(self, keys, opts).await
    }
}

impl LockHandle for Locks {
    fn shared(&self) -> Arc<dyn DistributedLock> {
        self.backend.clone()
    }
}

impl<B: DistributedLock> From<B> for Locks {
    /// A handle on `backend` with the default [`LockOptions`]:
    /// `Locks::from(InMemoryLock::new())`.
    fn from(backend: B) -> Self {
        let url = format!("{}://", backend.backend_name());
        Locks::new(Arc::new(backend), LockOptions::default(), &url)
    }
}

impl From<Locks> for Arc<dyn DistributedLock> {
    fn from(locks: Locks) -> Self {
        locks.backend
    }
}

impl fmt::Debug for Locks {
    /// The URL without its password, the backend's name and the defaults.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locks")
            .field("url", &self.url)
            .field("backend", &self.backend.backend_name())
            .field("options", &self.options)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    /// The names of the functions declared between `start` and the end of its block (a line
    /// that is exactly `}`), at the indentation of a trait's or an impl's items.
    fn calls(file: &str, start: &str, prefix: &str) -> BTreeSet<String> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let text = std::fs::read_to_string(&path).expect("the source is readable");
        let block = text.split(start).nth(1).expect("the block is found");
        let block = block.split("\n}\n").next().unwrap_or_default();
        block
            .lines()
            .filter_map(|line| line.strip_prefix(prefix))
            .map(|rest| {
                rest.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect()
            })
            .collect()
    }

    #[test]
    fn locks_offers_every_call_of_the_extension_trait() {
        let ext = calls("src/ext.rs", "pub trait DistributedLockExt", "    fn ");
        assert!(ext.len() >= 9, "the trait's calls were not found: {ext:?}");
        let mut locks = calls("src/locks.rs", "impl Locks {", "    pub fn ");
        locks.extend(calls("src/locks.rs", "impl Locks {", "    pub async fn "));
        let missing: Vec<_> = ext.difference(&locks).collect();
        assert!(missing.is_empty(), "Locks lacks {missing:?} of {ext:?}");
    }
}
