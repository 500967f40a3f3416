//! Freezing the client side: a holder that stops renewing and keeps working.
//!
//! A garbage-collection pause, a swapped-out VM or a stopped container freezes the holder's
//! process: its renewals stop, its lease runs out on the server, and another client takes the
//! lock, while the holder itself notices nothing until it wakes. [`Freezable`] reproduces that for
//! any backend: while frozen, the wrapped client's extend calls (the renewals) do not reach the
//! server.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{
    Attempt, Backoff, Capabilities, DistributedLock, Extension, Grant, LeaseRef, LockKey,
    LockRequest, Released, Result,
};
use tokio::sync::watch;
use tokio::time::Instant;

/// A client whose renewals can be frozen and thawed.
#[derive(Debug, Clone)]
pub struct Freezable {
    inner: Arc<dyn DistributedLock>,
    frozen: Arc<watch::Sender<bool>>,
}

impl Freezable {
    /// Wraps `inner`, initially running.
    pub fn new(inner: Arc<dyn DistributedLock>) -> Self {
        Freezable {
            inner,
            frozen: Arc::new(watch::channel(false).0),
        }
    }

    /// Stops the client's renewals from reaching the server until [`thaw`](Self::thaw).
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Lets held-up and later renewals through again.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    async fn wait_thawed(&self) {
        let mut rx = self.frozen.subscribe();
        // An error means the sender is gone, which cannot happen while `self` lives.
        let _ = rx.wait_for(|frozen| !*frozen).await;
    }
}

impl crate::control::Freeze for Freezable {
    fn freeze(&self) {
        Freezable::freeze(self);
    }

    fn thaw(&self) {
        Freezable::thaw(self);
    }
}

#[async_trait]
impl DistributedLock for Freezable {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        self.inner.try_lock(req).await
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        self.wait_thawed().await;
        self.inner.extend(lease, ttl).await
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        self.inner.release(lease).await
    }

    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        self.inner.wait_for_release(key, until).await
    }

    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        self.inner.lock(req, deadline, retry).await
    }
}
