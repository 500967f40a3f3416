//! Taking a lock: one attempt (`try_lock`) and the waiting queue (`lock`).
//!
//! Both create the contender's own ephemeral sequential node and list the parent. The lowest
//! sequence holds the lock. A waiter watches only its immediate predecessor and lists again when
//! that node changes, so a release wakes exactly one waiter (no herd). A single attempt that finds
//! itself behind someone deletes its node again and answers busy.

use std::sync::Arc;

use dlock_core::backend::{
    withdraw, Attempt, Grant, LockRequest, SessionWatch, Waiting, WITHDRAW_BOUND,
};
use dlock_core::{Backoff, Error, FencingToken, Result};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::client::Inner;
use crate::error::{Failure, BACKEND};
use crate::keeper::{delete_in_background, delete_owned_in_background};
use crate::naming::{is_kazoo_writer, kazoo_queue, owner_prefix, queue};
use crate::recipe::{create_node, delete_node, list_queue, OwnNode};
use crate::registry::{lease_state, Held};
use crate::request::call;
use crate::session::{Link, Session};
use crate::stats::Counters;

/// Which earlier contenders a node waits behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// The lock: every sequential child, whatever its recipe; the first holds.
    Lock,
    /// kazoo's `Lock` and `Election`: the `__lock__` children; the first holds.
    KazooLock,
    /// kazoo's `WriteLock`: every earlier `__lock__` and `__rlock__` child.
    KazooWrite,
    /// kazoo's `ReadLock`, as the ZooKeeper recipe for shared locks says: the earlier
    /// `__lock__` children only.
    KazooRead,
}

impl Rule {
    /// The contender the node `own` waits behind among `children`: `Some(None)` when it holds,
    /// `None` when `own` is not among them.
    pub(crate) fn blocker<'a>(self, children: &'a [String], own: &str) -> Option<Option<&'a str>> {
        let contenders = match self {
            Rule::Lock => queue(children),
            Rule::KazooLock => kazoo_queue(children, false),
            Rule::KazooWrite | Rule::KazooRead => kazoo_queue(children, true),
        };
        let index = contenders.iter().position(|c| c.name == own)?;
        let ahead = &contenders[..index];
        let blocker = match self {
            Rule::KazooRead => ahead.iter().rev().find(|c| is_kazoo_writer(c.name)),
            Rule::Lock | Rule::KazooLock | Rule::KazooWrite => ahead.last(),
        };
        Some(blocker.map(|c| c.name))
    }
}

/// Where and how a contender queues: its parent, its node's name prefix and data, and whom it
/// waits behind.
#[derive(Debug, Clone)]
pub(crate) struct Spot {
    pub(crate) parent: String,
    pub(crate) prefix: String,
    pub(crate) data: Vec<u8>,
    pub(crate) rule: Rule,
}

impl Spot {
    /// The lock's own queue for `req`, under the configured naming, with the owner record
    /// (stamped now: `since` is when this contender asked for the lock).
    fn lock(inner: &Inner, req: &LockRequest<'_>) -> Spot {
        Spot {
            parent: inner.parent_path(req.key),
            prefix: owner_prefix(inner.config.naming, req.owner),
            data: inner.config.owner.record().to_json().into_bytes(),
            rule: Rule::Lock,
        }
    }
}

/// One attempt: held now, or busy.
pub(crate) async fn try_once(inner: &Arc<Inner>, req: &LockRequest<'_>) -> Result<Attempt> {
    try_in(inner, req, &Spot::lock(inner, req)).await
}

/// One attempt in the queue `spot`: held now, or busy (the node is then deleted again).
pub(crate) async fn try_in(
    inner: &Arc<Inner>,
    req: &LockRequest<'_>,
    spot: &Spot,
) -> Result<Attempt> {
    let until = Instant::now() + inner.config.operation_timeout;
    let session = inner.open_session(until).await?;
    let parent = spot.parent.as_str();
    let mut cleanup = Cleanup::new(inner, &session, parent, &spot.prefix);
    let sent = Instant::now();
    let own = create_node(inner, &session, parent, &spot.prefix, &spot.data, until)
        .await
        .map_err(|f| f.into_error("create the lock node"))?;
    cleanup.node(&own.path);
    let children = list_queue(inner, &session, parent, until)
        .await
        .map_err(|f| f.into_error("list the lock's queue"))?;
    match spot.rule.blocker(&children, &own.name) {
        Some(None) => {
            let grant = grant(inner, &session, req, &own, sent)?;
            cleanup.disarm();
            Ok(Attempt::Acquired(grant))
        }
        Some(Some(_)) => {
            // Someone is ahead: take the node back now, so that it does not stand in a later
            // contender's way; if that fails, the cleanup guard deletes it in the background.
            if delete_node(inner, &session, &own.path, until).await.is_ok() {
                cleanup.disarm();
            }
            Ok(Attempt::Busy { retry_after: None })
        }
        None => Err(vanished(&session)),
    }
}

/// Waits in the queue until the own node is the lowest, until `deadline` (the node is then
/// withdrawn before the timeout is returned), or until the session ends.
///
/// Only opening a session is bounded by the operation timeout. Once queued, the waiter rides out
/// disconnections (its watch survives them) for as long as the session lives: the client
/// library gives a session up at most 7/5 of its timeout after the last answer, so even without
/// a deadline the wait ends with an error when the session is gone, never hangs.
pub(crate) async fn wait_in_queue(
    inner: &Arc<Inner>,
    req: &LockRequest<'_>,
    deadline: Option<Instant>,
    retry: &Backoff,
) -> Result<Grant> {
    wait_in(inner, req, &Spot::lock(inner, req), deadline, retry).await
}

/// [`wait_in_queue`] in the queue `spot`.
pub(crate) async fn wait_in(
    inner: &Arc<Inner>,
    req: &LockRequest<'_>,
    spot: &Spot,
    deadline: Option<Instant>,
    retry: &Backoff,
) -> Result<Grant> {
    // `retry` is not used to back off: waiting is driven by the predecessor's watch.
    let waiting = Waiting::new(req.key, deadline, retry);
    let started = waiting.started();
    // The first pass (session, create, list) is bounded by the operation timeout, never by the
    // caller's deadline: the deadline is checked between steps, so a free key is taken even with a
    // zero wait. Later requests may run until the deadline, or the first pass's bound if later.
    let first_pass_by = started + inner.config.operation_timeout;
    let until = deadline.map_or_else(far_future, |d| d.max(first_pass_by));
    // A request cut short by the caller's deadline reads as a timeout, not as an outage.
    let fail = |f: Failure, op: &'static str| {
        if matches!(f, Failure::OutOfTime) && waiting.is_over(Instant::now()) {
            waiting.timeout()
        } else {
            f.into_error(op)
        }
    };
    let session = inner
        .session(first_pass_by)
        .await
        .map_err(|f| fail(f, "open a ZooKeeper session"))?;
    let parent = spot.parent.as_str();
    let mut cleanup = Cleanup::new(inner, &session, parent, &spot.prefix);
    let queued: Result<Grant> = async {
        let mut own = create_node(inner, &session, parent, &spot.prefix, &spot.data, until)
            .await
            .map_err(|f| fail(f, "create the lock node"))?;
        cleanup.node(&own.path);
        // The first look at the queue counts from before the create: a node that is lowest at
        // once was granted by the create itself, so its validity starts before that request.
        let mut first_look = Some(started);
        loop {
            if first_look.is_none() {
                waiting.check()?;
            }
            let sent = first_look.take().unwrap_or_else(Instant::now);
            let children = list_queue(inner, &session, parent, until)
                .await
                .map_err(|f| fail(f, "list the lock's queue"))?;
            let Some(blocker) = spot.rule.blocker(&children, &own.name) else {
                if session.link() == Link::Ended {
                    return Err(vanished(&session));
                }
                // Deleted by someone else (an operator, another recipe): queue again.
                tracing::warn!(backend = BACKEND, key = %req.key, "own lock node vanished while waiting: queueing again");
                own = create_node(inner, &session, parent, &spot.prefix, &spot.data, until)
                    .await
                    .map_err(|f| fail(f, "create the lock node"))?;
                cleanup.node(&own.path);
                continue;
            };
            let Some(blocker) = blocker else {
                let grant = grant(inner, &session, req, &own, sent)?;
                cleanup.disarm();
                return Ok(grant);
            };
            let predecessor = format!("{parent}/{blocker}");
            let watched = call(inner, &session, until, |c| {
                c.check_and_watch_stat(&predecessor)
            })
            .await;
            let watcher = match watched {
                Ok((Some(_), watcher)) => watcher,
                // Gone already: look again.
                Ok((None, _)) => continue,
                Err(f) if f.connection_failed() => continue,
                Err(f) => return Err(fail(f, "watch the predecessor")),
            };
            let event = match deadline {
                Some(d) => tokio::select! {
                    event = watcher.changed() => event,
                    _ = tokio::time::sleep_until(d) => return Err(waiting.timeout()),
                },
                None => watcher.changed().await,
            };
            if event.event_type == zk::EventType::Session {
                // Expired, closed or failed authentication: the own node is gone with the session.
                return Err(Failure::SessionEnded.into_error("wait for the predecessor"));
            }
            Counters::bump(&inner.counters.wakeups);
        }
    }
    .await;
    if matches!(queued, Err(Error::Timeout { .. })) {
        cleanup.withdraw(&session, req).await;
    }
    queued
}

/// Records the held lock and builds the grant: fenced by the node's creation zxid, valid from
/// `sent`, following the session.
pub(crate) fn grant(
    inner: &Arc<Inner>,
    session: &Session,
    req: &LockRequest<'_>,
    own: &OwnNode,
    sent: Instant,
) -> Result<Grant> {
    let token = u64::try_from(own.czxid)
        .ok()
        .filter(|t| *t > 0)
        .ok_or_else(|| {
            Error::backend(
                BACKEND,
                false,
                "the server did not report the lock node's creation zxid (ZooKeeper 3.4 or older?)",
            )
        })?;
    let watch = register(inner, session, own.path.clone(), sent, req);
    Ok(Grant::new(FencingToken(token), sent).with_session(watch))
}

/// Adds the lock to the registry, so that the keeper enforces its TTL, the session watchdog
/// keeps its lease informed, and a watch on the node tells the lease when someone else deletes
/// it (see [`crate::node_watch`]).
fn register(
    inner: &Arc<Inner>,
    session: &Session,
    path: String,
    sent: Instant,
    req: &LockRequest<'_>,
) -> SessionWatch {
    // The node lives until `delete_at` on this clock; the lease itself claims less (its drift
    // allowance), which dlock-core applies.
    let delete_at = sent + req.ttl;
    let state = lease_state(session.link(), session.vouched_until());
    let (mut held, watch) = Held::new(path.clone(), session.generation, delete_at, state);
    let owner = req.owner.as_u128();
    let wakes_keeper = {
        let mut registry = inner.registry();
        // The keeper sleeps until the earliest deadline; it only needs waking for an earlier one.
        let earlier = registry.next_deadline().is_none_or(|next| delete_at < next);
        // Started under the registry's lock, so that the watch finds the lock registered.
        held.node_watch = crate::node_watch::spawn(inner, owner, session.generation, path);
        registry.insert(owner, held);
        earlier
    };
    if let Err(error) = inner.ensure_keeper() {
        tracing::warn!(backend = BACKEND, %error, "no keeper: the session timeout bounds this lock");
    }
    if wakes_keeper {
        inner.keeper.notify_one();
    }
    // The session may have ended between the answer and the insert, after the watchdog swept
    // the registry: end the lease here then.
    if session.link() == Link::Ended {
        if let Some(held) = inner.registry().remove(owner) {
            held.end();
        }
    }
    watch
}

/// A time no wait without deadline reaches (the session ends long before).
pub(crate) fn far_future() -> Instant {
    Instant::now() + std::time::Duration::from_secs(365 * 24 * 3600)
}

pub(crate) fn vanished(session: &Session) -> Error {
    if session.link() == Link::Ended {
        Failure::SessionEnded.into_error("take the lock")
    } else {
        Error::backend(
            BACKEND,
            true,
            "the own lock node vanished right after it was created (deleted by another client?)",
        )
    }
}

/// Deletes what an acquire created unless it ends with a grant or a clean busy answer: on
/// errors, timeouts, and when the acquire future is dropped mid-flight.
///
/// The library sends requests in the order they are made, so a cleanup that looks the node up
/// by owner prefix is answered after the create it cleans up after.
pub(crate) struct Cleanup {
    inner: Option<Arc<Inner>>,
    generation: u64,
    parent: String,
    /// The name prefix of the node, by which it is found when its name is not known.
    prefix: String,
    node: Option<String>,
}

impl Cleanup {
    pub(crate) fn new(inner: &Arc<Inner>, session: &Session, parent: &str, prefix: &str) -> Self {
        Cleanup {
            inner: Some(inner.clone()),
            generation: session.generation,
            parent: parent.to_owned(),
            prefix: prefix.to_owned(),
            node: None,
        }
    }

    pub(crate) fn node(&mut self, path: &str) {
        self.node = Some(path.to_owned());
    }

    /// The node's path, while the guard is armed and knows it.
    pub(crate) fn path(&self) -> Option<String> {
        self.inner.as_ref().and(self.node.clone())
    }

    pub(crate) fn disarm(&mut self) {
        self.inner = None;
    }

    /// Takes the own node back before a wait that ran out returns, as the `lock` contract asks,
    /// within dlock-core's withdrawal bound; past it the guard finishes in the background.
    pub(crate) async fn withdraw(&mut self, session: &Session, req: &LockRequest<'_>) {
        let Some(inner) = self.inner.clone() else {
            return;
        };
        let until = Instant::now() + WITHDRAW_BOUND;
        let deletion = async {
            let path = match &self.node {
                Some(path) => path.clone(),
                // The create got no answer in time: find the node by its owner prefix. Requests
                // are answered in order, so the list comes after the create.
                None => {
                    let children = list_queue(&inner, session, &self.parent, until).await?;
                    match children.into_iter().find(|c| c.starts_with(&self.prefix)) {
                        Some(name) => format!("{}/{name}", self.parent),
                        None => return Ok(()),
                    }
                }
            };
            delete_node(&inner, session, &path, until).await.map(drop)
        };
        let withdrawn = async {
            match deletion.await {
                // A session that ended took the node with it.
                Err(f) if !f.session_ended() => Err(f.into_error("withdraw the lock node")),
                _ => Ok(()),
            }
        };
        if withdraw(req.key, withdrawn).await {
            self.disarm();
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        match self.node.take() {
            Some(path) => delete_in_background(inner, self.generation, path),
            None => delete_owned_in_background(
                inner,
                self.generation,
                std::mem::take(&mut self.parent),
                std::mem::take(&mut self.prefix),
            ),
        }
    }
}
