//! Layers: wrappers around a lock service that change a few of its calls and pass on the rest.
//!
//! Counting requests, freezing renewals, delaying replies, tracing: each is a wrapper around
//! another backend. Written by hand, such a wrapper must forward every method of
//! [`DistributedLock`], and one that forgets a method — or was written before the method existed
//! — silently runs the trait's default instead of the wrapped backend's (a batched
//! `extend_many` turned into single extends, an `inspect` answering "unsupported"). A [`Layer`]
//! forwards every call by default, so it overrides only what it changes, and a method the trait
//! gains later reaches every layer by construction.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::{
    Attempt, Capabilities, DistributedLock, ExtendRequest, Extension, Grant, LeaseRef, LockRequest,
    Released,
};
use crate::error::Result;
use crate::inspect::{Eviction, HeldLock, Holding};
use crate::key::LockKey;
use crate::primitive::Primitive;
use crate::retry::Backoff;
use crate::token::FencingToken;

mod metered;
mod traced;

pub use metered::Metered;
pub use traced::Traced;

/// A wrapper around another lock service: implement [`inner`](Layer::inner) and override the
/// calls the layer changes; every other call goes to the inner service unchanged. Every `Layer` is
/// a [`DistributedLock`].
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use async_trait::async_trait;
/// use dlock_core::backend::{Attempt, LockRequest};
/// use dlock_core::layer::Layer;
/// use dlock_core::{DistributedLock, InMemoryLock, Result};
///
/// /// Counts lock attempts; everything else passes through.
/// #[derive(Debug)]
/// struct CountAttempts {
///     inner: Arc<dyn DistributedLock>,
///     attempts: AtomicU64,
/// }
///
/// #[async_trait]
/// impl Layer for CountAttempts {
///     fn inner(&self) -> &dyn DistributedLock {
///         self.inner.as_ref()
///     }
///
///     async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
///         self.attempts.fetch_add(1, Ordering::Relaxed);
///         self.inner.try_lock(req).await
///     }
/// }
///
/// let locks: Arc<dyn DistributedLock> = Arc::new(CountAttempts {
///     inner: Arc::new(InMemoryLock::new()),
///     attempts: AtomicU64::new(0),
/// });
/// # let _ = locks;
/// ```
#[async_trait]
pub trait Layer: Send + Sync + std::fmt::Debug + 'static {
    /// The wrapped service.
    fn inner(&self) -> &dyn DistributedLock;

    /// [`DistributedLock::backend_name`]; forwarded by default.
    fn backend_name(&self) -> &'static str {
        self.inner().backend_name()
    }

    /// [`DistributedLock::capabilities`]; forwarded by default.
    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }

    /// [`DistributedLock::try_lock`]; forwarded by default.
    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        self.inner().try_lock(req).await
    }

    /// [`DistributedLock::extend`]; forwarded by default.
    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        self.inner().extend(lease, ttl).await
    }

    /// [`DistributedLock::extend_many`]; forwarded by default.
    async fn extend_many(&self, requests: &[ExtendRequest<'_>]) -> Vec<Result<Extension>> {
        self.inner().extend_many(requests).await
    }

    /// [`DistributedLock::release`]; forwarded by default.
    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        self.inner().release(lease).await
    }

    /// [`DistributedLock::wait_for_release`]; forwarded by default.
    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        self.inner().wait_for_release(key, until).await
    }

    /// [`DistributedLock::inspect`]; forwarded by default.
    async fn inspect(&self, key: &LockKey) -> Result<Holding> {
        self.inner().inspect(key).await
    }

    /// [`DistributedLock::list`]; forwarded by default.
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        self.inner().list(prefix).await
    }

    /// [`DistributedLock::evict`]; forwarded by default.
    async fn evict(&self, key: &LockKey, expected: Option<FencingToken>) -> Result<Eviction> {
        self.inner().evict(key, expected).await
    }

    /// [`DistributedLock::primitive`]; forwarded by default, which leaves this layer out of the
    /// view: a layer that should also wrap the primitives (tracing, metrics) overrides it.
    fn primitive(&self, primitive: &Primitive) -> Result<Arc<dyn DistributedLock>> {
        self.inner().primitive(primitive)
    }

    /// [`DistributedLock::lock`]; forwarded by default (to the inner service's own waiting loop,
    /// which calls the inner `try_lock`, not the layer's).
    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        self.inner().lock(req, deadline, retry).await
    }
}

#[async_trait]
impl<L: Layer> DistributedLock for L {
    fn backend_name(&self) -> &'static str {
        Layer::backend_name(self)
    }

    fn capabilities(&self) -> Capabilities {
        Layer::capabilities(self)
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        Layer::try_lock(self, req).await
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        Layer::extend(self, lease, ttl).await
    }

    async fn extend_many(&self, requests: &[ExtendRequest<'_>]) -> Vec<Result<Extension>> {
        Layer::extend_many(self, requests).await
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        Layer::release(self, lease).await
    }

    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        Layer::wait_for_release(self, key, until).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Holding> {
        Layer::inspect(self, key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        Layer::list(self, prefix).await
    }

    async fn evict(&self, key: &LockKey, expected: Option<FencingToken>) -> Result<Eviction> {
        Layer::evict(self, key, expected).await
    }

    fn primitive(&self, primitive: &Primitive) -> Result<Arc<dyn DistributedLock>> {
        Layer::primitive(self, primitive)
    }

    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        Layer::lock(self, req, deadline, retry).await
    }
}

/// A boxed service is a [`Layer`] that changes nothing. (Not a forwarding impl
/// like `Arc`'s: every layer is a lock service, and a box of a local type counts as local
/// elsewhere, so the two impls could meet.)
impl Layer for Box<dyn DistributedLock> {
    fn inner(&self) -> &dyn DistributedLock {
        self.as_ref()
    }
}

impl<T: DistributedLock> Layer for Box<T> {
    fn inner(&self) -> &dyn DistributedLock {
        self.as_ref()
    }
}
