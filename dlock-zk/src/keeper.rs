//! The TTL keeper: deletes the node of every lease whose TTL ran out without an extend, and
//! finishes deletes that could not be done when they were asked for.
//!
//! ZooKeeper has no per-node expiry for ephemeral nodes (TTL nodes are persistent and need a
//! server flag), so the TTL a caller asks for is kept here, on the client's monotonic clock —
//! the same clock the lease measures its validity on. The node is deleted no earlier than the
//! grant's send time plus the TTL, which is after the lease's validity deadline. If the client
//! cannot delete it (it is cut off, or the process died), the session timeout bounds the hold
//! instead.

use std::sync::Arc;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::client::{Inner, WeakInner};
use crate::error::Failure;
use crate::recipe::{delete_node, list_queue};
use crate::stats::Counters;

/// Runs until the backend is dropped.
pub(crate) async fn run(inner: WeakInner, wake: Arc<Notify>) {
    loop {
        let next = match inner.upgrade() {
            Some(inner) => inner.registry().next_deadline(),
            None => return,
        };
        match next {
            Some(at) => {
                tokio::select! {
                    _ = wake.notified() => {}
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
            None => wake.notified().await,
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let due = inner.registry().take_due(Instant::now());
        for held in due {
            Counters::bump(&inner.counters.ttl_deletions);
            tracing::debug!(
                backend = crate::error::BACKEND,
                "lease TTL ran out without an extend: deleting its lock node"
            );
            let (generation, path) = (held.generation, held.path.clone());
            held.retire();
            delete_in_background(inner.clone(), generation, path);
        }
    }
}

/// Deletes the node at `path` of session `generation` in the background, repeating after lost
/// connections, until it is gone or its session has ended (which removes it anyway).
///
/// Deleting by path is safe at any later time: the name embeds a random owner token, so no other
/// contender's node can ever have it.
pub(crate) fn delete_in_background(inner: Arc<Inner>, generation: u64, path: String) {
    spawn(async move {
        let Some(session) = inner.current().filter(|s| s.generation == generation) else {
            return;
        };
        loop {
            let until = Instant::now() + session.timeout;
            match delete_node(&inner, &session, &path, until).await {
                Ok(_) => return,
                Err(f) if f.session_ended() => return,
                Err(Failure::NotConnected(_) | Failure::NoAnswer(_) | Failure::OutOfTime) => {}
                Err(f) => {
                    tracing::warn!(
                        backend = crate::error::BACKEND,
                        error = %f.into_error("delete a lock node"),
                        "giving up a background delete; the session timeout frees the lock"
                    );
                    return;
                }
            }
        }
    });
}

/// Deletes whatever node named `prefix…` an owner may have in `parent` (an acquire abandoned
/// before it knew its node's name), in the background.
pub(crate) fn delete_owned_in_background(
    inner: Arc<Inner>,
    generation: u64,
    parent: String,
    prefix: String,
) {
    spawn(async move {
        let Some(session) = inner.current().filter(|s| s.generation == generation) else {
            return;
        };
        loop {
            let until = Instant::now() + session.timeout;
            match list_queue(&inner, &session, &parent, until).await {
                Ok(children) => {
                    if let Some(name) = children.into_iter().find(|c| c.starts_with(&prefix)) {
                        delete_in_background(inner.clone(), generation, format!("{parent}/{name}"));
                    }
                    return;
                }
                Err(f) if f.session_ended() => return,
                Err(Failure::NotConnected(_) | Failure::NoAnswer(_) | Failure::OutOfTime) => {}
                Err(_) => return,
            }
        }
    });
}

/// Spawns on the current runtime, if there is one (there is none only while a runtime shuts
/// down, when the session closes and removes the nodes anyway).
fn spawn(task: impl std::future::Future<Output = ()> + Send + 'static) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(task);
    }
}
