//! A client connected through a proxy, keeping the proxy alive as long as the client.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{
    Attempt, Capabilities, Extension, Grant, LeaseRef, LockKey, LockRequest, Primitive,
};
use dlock_core::layer::Layer;
use dlock_core::{Backoff, DistributedLock, Released, Result};
use dlock_zk::ZkLock;
use tokio::time::Instant;

/// A [`ZkLock`] plus whatever must live as long as it (a proxy it connects through).
pub struct Proxied<P> {
    pub lock: Arc<ZkLock>,
    keep: Arc<P>,
}

impl<P> Proxied<P> {
    pub fn new(lock: Arc<ZkLock>, keep: P) -> Self {
        Proxied {
            lock,
            keep: Arc::new(keep),
        }
    }
}

/// A primitive's view of a [`Proxied`] client, keeping the proxy alive as long as it.
struct KeptView<P> {
    view: Arc<dyn DistributedLock>,
    _keep: Arc<P>,
}

impl<P> fmt::Debug for KeptView<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("KeptView").field(&self.view).finish()
    }
}

impl<P: Send + Sync + 'static> Layer for KeptView<P> {
    fn inner(&self) -> &dyn DistributedLock {
        self.view.as_ref()
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

    fn primitive(&self, primitive: &Primitive) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(KeptView {
            view: self.lock.primitive(primitive)?,
            _keep: self.keep.clone(),
        }))
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
