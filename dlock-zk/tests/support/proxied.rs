//! A client connected through a proxy, keeping the proxy alive as long as the client.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{
    Attempt, Backoff, Capabilities, DistributedLock, Extension, Grant, LeaseRef, LockKey,
    LockRequest, Released, Result,
};
use dlock_zk::ZkLock;
use tokio::time::Instant;

/// A [`ZkLock`] plus whatever must live as long as it (a proxy it connects through).
pub struct Proxied<P> {
    pub lock: Arc<ZkLock>,
    _keep: P,
}

impl<P> Proxied<P> {
    pub fn new(lock: Arc<ZkLock>, keep: P) -> Self {
        Proxied { lock, _keep: keep }
    }
}

impl<P> fmt::Debug for Proxied<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Proxied").field(&self.lock).finish()
    }
}

#[async_trait]
impl<P: Send + Sync + 'static> DistributedLock for Proxied<P> {
    fn backend_name(&self) -> &'static str {
        self.lock.backend_name()
    }

    fn capabilities(&self) -> Capabilities {
        self.lock.capabilities()
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        self.lock.try_lock(req).await
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        self.lock.extend(lease, ttl).await
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        self.lock.release(lease).await
    }

    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        self.lock.wait_for_release(key, until).await
    }

    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        self.lock.lock(req, deadline, retry).await
    }
}
