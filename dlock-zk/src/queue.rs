//! The implementor contract of dlock-core, on top of the recipe: [`Queue`], to which a
//! [`ZkLock`](crate::ZkLock) forwards every call.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{
    Attempt, Capabilities, Extension, Grant, LeaseRef, LockKey, LockRequest, Primitive, Primitives,
};
use dlock_core::inspect::{Eviction, HeldLock, Holding};
use dlock_core::{Backoff, DistributedLock, FencingToken, Released, Result};
use tokio::time::Instant;

use crate::client::Inner;
use crate::error::BACKEND;
use crate::naming::queue;
use crate::recipe::list_queue;
use crate::request::call;

/// The lock calls on one handle's shared state, which a [`ZkLock`](crate::ZkLock) forwards to.
/// It holds the `Arc` because the calls hand it to background clean-ups.
#[derive(Clone)]
pub(crate) struct Queue(pub(crate) Arc<Inner>);

/// The handle's `Debug` shows the state; this one only names it.
impl fmt::Debug for Queue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue").finish_non_exhaustive()
    }
}

#[async_trait]
impl DistributedLock for Queue {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    /// Fencing tokens are creation zxids, which grow with every write to the ensemble, so they
    /// are ordered for as long as the ensemble exists; a release wakes the next waiter through
    /// its watch; leases live in the ZooKeeper session.
    fn capabilities(&self) -> Capabilities {
        crate::ZkLock::CAPABILITIES
    }

    /// A view serving `primitive` in kazoo's layout (see [`crate::primitives`]).
    fn primitive(&self, primitive: &Primitive) -> Result<Arc<dyn DistributedLock>> {
        primitive.validate()?;
        if !Primitives::ALL.serves(primitive) {
            return Err(dlock_core::Error::Unsupported {
                backend: BACKEND,
                what: primitive.name(),
            });
        }
        Ok(Arc::new(crate::primitives::View {
            inner: self.0.clone(),
            primitive: primitive.clone(),
            capabilities: self.capabilities(),
        }))
    }

    /// Creates the own node and lists the queue: held if it is the lowest, otherwise the node is
    /// deleted again and the answer is busy (with no `retry_after`: ZooKeeper locks have no
    /// remaining TTL a waiter could read).
    ///
    /// # Cancel safety
    /// Not cancel safe on its own: the node may have been created. dlock-core's acquire then
    /// releases by owner token, which finds the node by its owner prefix.
    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        crate::acquire::try_once(&self.0, req).await
    }

    /// Confirms the own node on the server and moves its TTL to `ttl` from now. The session, the
    /// lock's server-side bound, is kept alive by the client library and is not changed.
    ///
    /// # Cancel safety
    /// If cancelled after the check, the TTL may or may not have moved; the lease keeps its old
    /// deadline either way.
    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        crate::extend::extend(&self.0, lease, ttl).await
    }

    /// Deletes the own node, found by owner token.
    ///
    /// # Cancel safety
    /// The node may or may not have been deleted; repeating the release is harmless.
    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        crate::release::release(&self.0, lease).await
    }

    /// Reads the queue: the lowest contender node holds the lock, and its creation zxid is the
    /// fencing token, also for a holder using kazoo's or Curator's recipe on the same path; the
    /// other contenders wait in sequence order. Each node's data is its contender's owner record
    /// (a peer's data reads as none). The remaining time is not told: the node lives as long as
    /// its holder's session, and its TTL is kept by the holder's client.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    async fn inspect(&self, key: &LockKey) -> Result<Holding> {
        crate::inspect::holding(&self.0, key).await
    }

    /// Lists the children of the base path (one node per lock key, named by
    /// [`encode_key`](crate::encode_key)) and looks at each whose name starts with `prefix`; a
    /// lock is listed when its holder's node carries a dlock owner record.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        crate::inspect::list(&self.0, prefix).await
    }

    /// Deletes the holder's node (with the version it was read at, and only if its creation
    /// zxid is `expected` when given). The next waiter's watch fires as on a release; the next
    /// holder's node is created later, so its zxid (the fencing token) is greater. The evicted
    /// client watches its node and loses its lease at once (taken over). If the holder that was
    /// read leaves before the delete lands, the answer is about whoever holds the
    /// lock then ([`Eviction::Changed`] or [`Eviction::Free`]): an eviction never removes a
    /// holder the caller was not shown.
    ///
    /// # Cancel safety
    /// The node may or may not have been deleted.
    async fn evict(&self, key: &LockKey, expected: Option<FencingToken>) -> Result<Eviction> {
        crate::inspect::evict(&self.0, key, expected).await
    }

    /// Returns when the current holder's node changes (or at `until`); at once if nobody holds
    /// the lock.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads and watches.
    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        let inner = &self.0;
        let session = inner.open_session(until).await?;
        let parent = inner.parent_path(key);
        let children = match list_queue(inner, &session, &parent, until).await {
            Ok(children) => children,
            Err(_) if Instant::now() >= until => return Ok(()),
            Err(f) => return Err(f.into_error("list the lock's queue")),
        };
        let Some(holder) = queue(&children)
            .first()
            .map(|c| format!("{parent}/{}", c.name))
        else {
            return Ok(());
        };
        let watched = call(inner, &session, until, |c| c.check_and_watch_stat(&holder)).await;
        match watched {
            Ok((Some(_), watcher)) => {
                let _ = tokio::time::timeout_at(until, watcher.changed()).await;
                Ok(())
            }
            Ok((None, _)) => Ok(()),
            Err(_) if Instant::now() >= until => Ok(()),
            Err(f) => Err(f.into_error("watch the holder")),
        }
    }

    /// Queues for the lock: creates the own node once and waits on its predecessor only, until
    /// the node is the lowest, `deadline` passes ([`Error::Timeout`](dlock_core::Error::Timeout)),
    /// or the session ends (an error, so that a waiter never waits forever). `retry` is unused:
    /// waiting is driven by watches, not by polling. A wait that runs out deletes its node before
    /// it returns (bounded; then in the background), so it stands in nobody's way.
    ///
    /// # Cancel safety
    /// Not cancel safe on its own: if dropped, the own node is deleted in the background (and
    /// dlock-core also releases by owner token).
    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        crate::acquire::wait_in_queue(&self.0, req, deadline, retry).await
    }
}
