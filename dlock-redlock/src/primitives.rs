//! The read-write lock and the election by quorum: the scripts of
//! `dlock_redis::protocol::primitives` run on every master, decided like the lock.
//!
//! A place (a read hold, the write hold, the leadership) is granted when a quorum of masters
//! granted it within the validity; the token is the maximum over every master that granted
//! (the client waits for each counting master's answer, at most the per-node timeout), written
//! back to the granted masters that are behind, as for the lock. A refused attempt is given back on every
//! master. A writer waiting in `lock()` leaves its intent on every master it reached (where it was
//! busy, and where it was granted but the quorum was not), so that new readers cannot gather a
//! quorum while it waits; giving up withdraws it everywhere.
//!
//! The semaphore is not served: each master admits up to N holders, and N + 1 clients can each
//! be admitted by a different majority (with N = 2 and three masters: A and B on the first, B
//! and C on the second, A and C on the third), so N + 1 would hold it at once.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{
    Attempt, Capabilities, Extension, Grant, LeaseRef, LockKey, LockRequest, Primitive, Waiting,
};
use dlock_core::inspect::Holding;
use dlock_core::{Backoff, DistributedLock, Released, Result};
use dlock_redis::protocol::primitives::{
    self, Family, GroupView, Mode, PrimitiveKeys, PrimitiveReply,
};
use redis::aio::MultiplexedConnection;
use redis::RedisResult;
use tokio::time::Instant;

use crate::client::{answered, counted, grants_of, new_counter_start, RedlockLock, BACKEND};
use crate::quorum::{gather, Progress, QuorumFailure, Reply};

/// A read-write lock side or an election candidate (or observer) on a Redlock client.
#[derive(Clone)]
pub(crate) struct RedlockView {
    lock: RedlockLock,
    primitive: Primitive,
    family: Family,
}

impl RedlockView {
    pub(crate) fn new(lock: RedlockLock, primitive: Primitive) -> Self {
        RedlockView {
            family: Family::of(&primitive),
            lock,
            primitive,
        }
    }

    fn keys(&self, key: &LockKey) -> Arc<PrimitiveKeys> {
        let lock_key = self.lock.inner.settings.layout.lock_key(key);
        Arc::new(PrimitiveKeys::new(&lock_key, self.family))
    }

    /// Gives a failed attempt back on every master (keeping a waiting writer's intent), waiting
    /// for as many answers as the attempt got.
    async fn abandon<T, R>(
        &self,
        keys: &Arc<PrimitiveKeys>,
        owner: &Arc<str>,
        intent: Option<Duration>,
        first: &[Reply<R>],
        outcome: T,
    ) -> T {
        let timeout = self.lock.inner.settings.untimed_node_timeout();
        let (keys, owner) = (keys.clone(), owner.clone());
        let call = move |con| release_place(con, keys.clone(), owner.clone(), intent);
        self.lock
            .give_back_with(self.lock.all().collect(), timeout, first, call)
            .await;
        outcome
    }

    /// One attempt by quorum; `intent` makes a busy writer leave its intent behind.
    async fn attempt(&self, req: &LockRequest<'_>, intent: Option<Duration>) -> Result<Attempt> {
        let value: Option<Arc<str>> = match &self.primitive {
            Primitive::Election { .. } => Some(self.primitive.value()?.clone()),
            _ => None,
        };
        let settings = &self.lock.inner.settings;
        let (timeout, validity) = settings.plan(req.ttl)?;
        let keys = self.keys(req.key);
        let owner: Arc<str> = req.owner.to_hex().into();
        let quorum = settings.quorum;
        let (ttl, fence_ttl) = (req.ttl, settings.fence_ttl);
        let record: Arc<str> = settings.owner.record().to_json().into();
        let write = self.primitive == Primitive::Write;
        let least_start = new_counter_start();
        let call = {
            let (keys, owner) = (keys.clone(), owner.clone());
            move |mut con| {
                let (keys, owner, record, value) =
                    (keys.clone(), owner.clone(), record.clone(), value.clone());
                async move {
                    let mode = match (&value, write) {
                        (Some(value), _) => Mode::Election(value),
                        (None, true) => Mode::Write(intent),
                        (None, false) => Mode::Read,
                    };
                    primitives::acquire(
                        &mut con,
                        &keys,
                        mode,
                        &owner,
                        &record,
                        ttl,
                        fence_ttl,
                        least_start,
                    )
                    .await
                }
            }
        };
        let sent = Instant::now();
        let nodes = &self.lock.inner.nodes;
        let replies = gather(
            nodes,
            self.lock.all(),
            "acquire",
            timeout,
            call,
            // Unlike the lock's, a grant waits for every counting master (at most the per-node
            // timeout), so that the token is the maximum over every master that granted and no
            // late grant shows a greater one (see `agreed`).
            |p: Progress<'_, PrimitiveReply>| {
                let granted = counted(p.replies, |r| matches!(r, PrimitiveReply::Granted(_)));
                (granted >= quorum && p.pending == 0)
                    || (granted + p.pending < quorum && answered(p.replies) >= quorum)
            },
        )
        .await;
        let (grants, granted) = grants_of(&replies, |r| match r {
            PrimitiveReply::Granted(token) => Some(*token),
            _ => None,
        });
        if granted < quorum {
            if answered(&replies) < quorum {
                let error = QuorumFailure::of("acquire", &replies, nodes, quorum).into_error();
                return Err(self.abandon(&keys, &owner, intent, &replies, error).await);
            }
            let retry_after = replies
                .iter()
                .filter_map(|r| match r.result {
                    Ok(PrimitiveReply::Busy { pttl }) => pttl,
                    _ => None,
                })
                .min();
            let busy = Attempt::Busy { retry_after };
            return Ok(self.abandon(&keys, &owner, intent, &replies, busy).await);
        }
        let raise = |token| {
            let (place, holder) = (keys.clone(), owner.clone());
            move |mut con| {
                let (keys, owner) = (place.clone(), holder.clone());
                async move { primitives::raise_fence(&mut con, &keys, &owner, token, fence_ttl).await }
            }
        };
        match self
            .lock
            .settle(&grants, (sent, validity, timeout), raise)
            .await
        {
            Ok(token) => Ok(Attempt::Acquired(Grant::new(token, sent))),
            Err(error) => Err(self.abandon(&keys, &owner, intent, &replies, error).await),
        }
    }
}

/// One master's release of `owner`'s place and its writer intent (with `keep_intent`, the
/// intent stays for that long instead).
async fn release_place(
    mut con: MultiplexedConnection,
    keys: Arc<PrimitiveKeys>,
    owner: Arc<str>,
    keep_intent: Option<Duration>,
) -> RedisResult<Released> {
    primitives::release(&mut con, &keys, &owner, "", keep_intent).await
}

/// What a quorum of masters shows of a group: free, its earliest holder, or unknown. With
/// fencing on, the holder is reported only once a quorum shows the greatest token any master
/// shows for it (the write-back finished): before, its term is not settled, and it is unknown.
fn agreed(
    replies: &[Reply<Option<GroupView>>],
    quorum: usize,
    family: Family,
    fencing: bool,
) -> Holding {
    if counted(replies, Option::is_none) >= quorum {
        return Holding::Free;
    }
    let mut by_owner: HashMap<&[u8], Vec<&GroupView>> = HashMap::new();
    for reply in replies.iter().filter(|r| r.counts) {
        if let Ok(Some(view)) = &reply.result {
            by_owner.entry(&view.owner).or_default().push(view);
        }
    }
    let Some(views) = by_owner.into_values().find(|views| views.len() >= quorum) else {
        return Holding::Unknown;
    };
    let greatest = views.iter().filter_map(|view| view.fencing).max();
    let showing = views
        .iter()
        .filter(|view| greatest.is_some() && view.fencing == greatest)
        .count();
    let token = greatest.filter(|_| showing >= quorum);
    if fencing && token.is_none() {
        return Holding::Unknown;
    }
    let Some(first) = views.iter().min_by_key(|view| view.pttl) else {
        return Holding::Unknown;
    };
    let mut shown = (*first).clone();
    shown.fencing = token;
    shown.count = views.iter().map(|view| view.count).min().unwrap_or(1);
    Holding::Held(shown.holder(family))
}

#[async_trait]
impl DistributedLock for RedlockView {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    /// The lock's, but without its queue of waiters: a primitive's waiters poll, each with its
    /// own backoff.
    fn capabilities(&self) -> Capabilities {
        let mut capabilities = self.lock.capabilities();
        capabilities.fair_queue = false;
        capabilities.notifies_waiters = false;
        capabilities
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        self.attempt(req, None).await
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        let keys = self.keys(lease.key);
        let owner: Arc<str> = lease.owner.to_hex().into();
        self.lock
            .extend_with(ttl, move |mut con| {
                let (keys, owner) = (keys.clone(), owner.clone());
                async move { primitives::extend(&mut con, &keys, &owner, ttl).await }
            })
            .await
    }

    /// Gives the place back on every master, with a waiting writer's intent.
    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        let keys = self.keys(lease.key);
        let owner: Arc<str> = lease.owner.to_hex().into();
        let call = move |con| release_place(con, keys.clone(), owner.clone(), None);
        self.lock.release_with(call).await
    }

    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        self.lock.wait_for_release(key, until).await
    }

    /// What a quorum of masters shows: free, the earliest holder a quorum agrees on (with the
    /// token a quorum shows), or unknown (see [`agreed`]).
    async fn inspect(&self, key: &LockKey) -> Result<Holding> {
        let settings = &self.lock.inner.settings;
        let quorum = settings.quorum;
        let keys = self.keys(key);
        let call = move |mut con| {
            let keys = keys.clone();
            async move { primitives::peek(&mut con, &keys).await }
        };
        let nodes = &self.lock.inner.nodes;
        let replies = gather(
            nodes,
            self.lock.all(),
            "inspect",
            settings.untimed_node_timeout(),
            call,
            |_: Progress<'_, Option<GroupView>>| false,
        )
        .await;
        if answered(&replies) < quorum {
            return Err(QuorumFailure::of("inspect", &replies, nodes, quorum).into_error());
        }
        Ok(agreed(&replies, quorum, self.family, settings.fencing))
    }

    /// The core's waiting loop; a writer re-arms its intent with every attempt (lasting the
    /// request's TTL, attempts at most a third of that apart) and withdraws it when it gives up.
    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        let intent = (self.primitive == Primitive::Write).then_some(req.ttl);
        let mut waiting = Waiting::new(req.key, deadline, retry);
        let result = async {
            loop {
                let sent = Instant::now();
                let retry_after = match self.attempt(req, intent).await? {
                    Attempt::Acquired(grant) => return Ok(grant.sent_no_later_than(sent)),
                    Attempt::Busy { retry_after } => retry_after,
                };
                let now = waiting.check()?;
                let until = dlock_redis::waiting::next_poll(&mut waiting, now, retry_after, intent);
                self.wait_for_release(req.key, until).await?;
            }
        }
        .await;
        if intent.is_some() && result.is_err() {
            dlock_redis::waiting::withdraw(self, req).await;
        }
        result
    }
}

impl fmt::Debug for RedlockView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockView")
            .field("primitive", &self.primitive)
            .field("client", &self.lock)
            .finish()
    }
}
