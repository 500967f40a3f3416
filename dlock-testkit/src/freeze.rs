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
use dlock_core::{DistributedLock, ExtendRequest, Extension, Layer, LeaseRef, Result};
use tokio::sync::watch;

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
impl Layer for Freezable {
    fn inner(&self) -> &dyn DistributedLock {
        self.inner.as_ref()
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        self.wait_thawed().await;
        self.inner.extend(lease, ttl).await
    }

    async fn extend_many(&self, requests: &[ExtendRequest<'_>]) -> Vec<Result<Extension>> {
        self.wait_thawed().await;
        self.inner.extend_many(requests).await
    }
}
