//! [`Locks`]: the handle `dlock::connect` returns, a backend plus the URL's defaults.

use std::fmt;
use std::sync::Arc;

use dlock_core::url::redact_password;
use dlock_core::{DistributedLock, LockHandle, LockOptions};

/// A shared handle to the backend a URL names, with the per-acquire defaults the URL set.
///
/// It is cheap to clone (clones share the backend) and has every operation of
/// [`DistributedLockExt`](dlock_core::DistributedLockExt) — `try_acquire`, `acquire`,
/// `with_lock`, `holding` — through [`LockHandle`]. Pass [`options`](Self::options) to them to
/// use the URL's `ttl`, `wait` and `drift`, or any [`LockOptions`] of your own.
///
/// `connect` returns this rather than a bare `Arc<dyn DistributedLock>` because a URL's `ttl`,
/// `wait` and `drift` are defaults for each acquire, not settings of the backend; they need a
/// place to live. [`backend`](Self::backend) gives the trait object itself.
#[derive(Clone)]
pub struct Locks {
    backend: Arc<dyn DistributedLock>,
    options: LockOptions,
    url: String,
}

impl Locks {
    /// A handle on `backend` with `options` as the defaults; `url` names it in `Debug` and
    /// [`url`](Self::url), with its password hidden.
    pub fn new(backend: Arc<dyn DistributedLock>, options: LockOptions, url: &str) -> Self {
        Locks {
            backend,
            options,
            url: redact_password(url),
        }
    }

    /// The backend, as the trait object services keep.
    pub fn backend(&self) -> &Arc<dyn DistributedLock> {
        &self.backend
    }

    /// The per-acquire defaults from the URL (`ttl`, `wait`, `drift`, `drift_factor`), the
    /// core's defaults where the URL says nothing.
    pub fn options(&self) -> &LockOptions {
        &self.options
    }

    /// The URL this handle was made from, with its password hidden.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl LockHandle for Locks {
    fn shared(&self) -> Arc<dyn DistributedLock> {
        self.backend.clone()
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
