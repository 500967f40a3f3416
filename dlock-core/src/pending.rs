//! Cancellation of an acquire, handled once for every backend.
//!
//! Dropping an `acquire` future is a normal thing to do (`tokio::select!`, a timeout, a shutdown),
//! but the request may already have reached the server and been granted. Before any request is
//! sent, the acquire arms a [`PendingAcquire`]; only turning the grant into a
//! [`Lease`](crate::Lease), or an answer that proves nothing was taken, disarms it. If the future is
//! dropped or fails with an unknown outcome while armed, the guard spawns a release by owner
//! token, which frees the lock if it was taken and touches nothing otherwise.

use std::sync::Arc;

use crate::backend::DistributedLock;
use crate::key::LockKey;
use crate::lease::release_in_background;
use crate::token::OwnerToken;

/// Releases `owner`'s hold on `key` when dropped, unless disarmed.
pub(crate) struct PendingAcquire {
    backend: Option<Arc<dyn DistributedLock>>,
    key: LockKey,
    owner: OwnerToken,
}

impl PendingAcquire {
    pub(crate) fn arm(
        backend: &Arc<dyn DistributedLock>,
        key: &LockKey,
        owner: OwnerToken,
    ) -> Self {
        PendingAcquire {
            backend: Some(backend.clone()),
            key: key.clone(),
            owner,
        }
    }

    /// Nothing is left to clean up: the grant became a lease, the server said busy, or the
    /// backend's wait timed out (which withdraws its own queue entry, by the `lock` contract).
    pub(crate) fn disarm(mut self) {
        self.backend = None;
    }
}

impl Drop for PendingAcquire {
    fn drop(&mut self) {
        if let Some(backend) = self.backend.take() {
            tracing::debug!(key = %self.key, "acquire abandoned: releasing whatever it may have taken");
            release_in_background(backend, self.key.clone(), self.owner, None);
        }
    }
}
