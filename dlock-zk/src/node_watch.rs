//! The holder's watch on its own node: a lease learns at once that someone else deleted its node
//! (an operator's eviction, `zkCli delete`, kazoo), not only at its next extend.
//!
//! Every held lock has one task that sets a one-shot `exists` watch on the lock's node and waits.
//! When the node is deleted while the lock is still registered here, the lease is lost as taken
//! over. The client's own deletes never read so: a release, the TTL keeper and an extend take the
//! lock out of the registry before they delete, and the task looks there first. Session events are
//! left to the session watchdog: a disconnection does not fire a one-shot watch (the library sets
//! it again on the next connection, and the server then reports a delete it missed), and the one
//! terminal event (expired, closed) ends the task.
//!
//! The task is owned by the registry entry ([`NodeWatch`]) and aborted with it, so it never
//! outlives the lock or the handle. It holds the handle weakly, and the handle and the session
//! only while a request is out: a one-shot watcher receives the session's terminal event before
//! the library drops it, so waiting on one is safe for as long as the session task runs.

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::client::{Inner, WeakInner};
use crate::error::{Failure, BACKEND};
use crate::request::read;
use crate::stats::Counters;

/// How long the watch waits before asking again after a request that got no answer.
const RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// The watch task of one held lock, aborted when dropped (with the lock's registry entry).
#[derive(Debug)]
pub(crate) struct NodeWatch(JoinHandle<()>);

impl Drop for NodeWatch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts watching `owner`'s node at `path`, of session `generation`.
///
/// The `exists` goes out when the task first runs, not before the grant returns: an acquire costs
/// no extra round trip, and a node deleted in between is found missing, which reads the same.
pub(crate) fn spawn(
    inner: &Arc<Inner>,
    owner: u128,
    generation: u64,
    path: String,
) -> Option<NodeWatch> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let task = runtime.spawn(run(Arc::downgrade(inner), owner, generation, path));
    Some(NodeWatch(task))
}

async fn run(inner: WeakInner, owner: u128, generation: u64, path: String) {
    loop {
        let watcher = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let Some(session) = inner.current().filter(|s| s.generation == generation) else {
                return;
            };
            let until = Instant::now() + inner.config.operation_timeout;
            match read(&inner, &session, until, |c| c.check_and_watch_stat(&path)).await {
                Ok((Some(_), watcher)) => watcher,
                Ok((None, _)) => {
                    taken_over(&inner, owner, &path);
                    return;
                }
                Err(f) if f.session_ended() => return,
                // The session lives on: watch again once a server answers (a pause, so that a
                // link that is down fails fast without spinning).
                Err(Failure::NotConnected(_) | Failure::NoAnswer(_) | Failure::OutOfTime) => {
                    tokio::time::sleep(RETRY_PAUSE).await;
                    continue;
                }
                Err(f) => {
                    tracing::warn!(
                        backend = BACKEND,
                        error = %f.into_error("watch the own lock node"),
                        "not watching a held lock's node: its next extend checks it"
                    );
                    return;
                }
            }
        };
        let event = watcher.changed().await;
        match event.event_type {
            zk::EventType::NodeDeleted => {
                if let Some(inner) = inner.upgrade() {
                    taken_over(&inner, owner, &path);
                }
                return;
            }
            // Terminal (expired, closed, authentication failed): the watchdog ends the leases.
            zk::EventType::Session => return,
            // The data was changed: the node is still there, watch it again.
            _ => {}
        }
    }
}

/// The node at `path` is gone: if `owner` still holds it here (no release, TTL or extend of
/// ours took it out of the registry first), someone else deleted it and the lease is lost.
fn taken_over(inner: &Inner, owner: u128, path: &str) {
    let Some(held) = inner.registry().remove_at(owner, path) else {
        return;
    };
    Counters::bump(&inner.counters.taken_over);
    tracing::warn!(
        backend = BACKEND,
        path,
        "a held lock's node was deleted by another client (evicted?): its lease is lost"
    );
    held.take_over();
}
