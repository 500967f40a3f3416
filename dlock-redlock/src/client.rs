//! The Redlock backend: dlock's implementor contract on N independent Redis masters.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use dlock_core::backend::clock::ClockWatch;
use dlock_core::backend::{
    Attempt, Capabilities, ExtendRequest, Extension, FencingGuarantee, Grant, LeaseRef, LockKey,
    LockRequest, Primitive, Primitives,
};
use dlock_core::inspect::{Eviction, HeldLock, Holding};
use dlock_core::{
    Backoff, DistributedLock, Drift, Error, FencingToken, Owner, OwnerToken, Released, Result,
};
use dlock_redis::protocol::keys::{self, KeyLayout};
use dlock_redis::protocol::scripts::{
    self, AcquireCall, AcquireReply, FenceRaise, Peek, Publish, Queueing, ReleaseCall, Timed,
};
use dlock_redis::waiting::{self, Listeners};
use dlock_redis::EXTEND_BATCH;
use redis::aio::MultiplexedConnection;
use redis::RedisResult;
use tokio::time::Instant;

use crate::builder::{RedlockBuilder, MAX_DERIVED_NODE_TIMEOUT, MIN_DERIVED_NODE_TIMEOUT};
use crate::extension::{batch_timeout, Tally};
use crate::inspect;
use crate::node::Node;
use crate::primitives::RedlockView;
use crate::quorum::{gather, watch_clocks, Progress, QuorumFailure, Reply};

/// The backend's name in errors and tracing.
pub(crate) const BACKEND: &str = "redlock";

/// How many locks `list` looks at together, each on every master.
const LIST_LOOKS: usize = 16;

/// The Redis names and the owner of one request, shared by its per-master calls (which may
/// outlive the request, see [`gather`]).
#[derive(Clone)]
pub(crate) struct Names {
    pub(crate) lock: Arc<str>,
    fence: Arc<str>,
    pub(crate) owner: Arc<str>,
    /// Where the masters announce the head of the lock's queue of waiters.
    pub(crate) channel: Arc<str>,
    /// The client's wake tag, which the owner's queue entries carry (`""`: none).
    wake_tag: Arc<str>,
}

impl Names {
    pub(crate) fn new(settings: &Settings, key: &LockKey, owner: OwnerToken) -> Self {
        let lock = settings.layout.lock_key(key);
        Names {
            fence: keys::fence_key(&lock).into(),
            channel: keys::release_channel(&lock).into(),
            lock: lock.into(),
            owner: owner.to_hex().into(),
            wake_tag: settings.wake_tag.clone(),
        }
    }
}

/// What one attempt on every master came to.
#[derive(Debug)]
pub(crate) enum Round {
    /// A quorum granted the lock in time.
    Granted(Grant),
    /// Not granted; any partial grant was given back, and the caller still stands in the queue
    /// of every master that answered busy.
    Busy {
        /// When a quorum of the masters may be free: the quorum-th shortest of the holders'
        /// remaining TTLs (a master that granted counts as free now), if known.
        free_in: Option<Duration>,
        /// When a waiter may take a quorum without being told: the quorum-th shortest, over the
        /// masters, of the holder's remaining TTL where the caller heads the queue, and of the
        /// time until the head's entry lapses where it is second in line (the head may have
        /// crashed).
        come_back_in: Option<Duration>,
        /// Poll: the caller heads a quorum of the queues but a holder's release will not be
        /// announced (a foreign client's key, or a key without a TTL), or masters that did not
        /// answer would make a quorum with those that granted.
        poll: bool,
    },
}

/// The checked settings a client runs with.
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) layout: KeyLayout,
    pub(crate) quorum: usize,
    pub(crate) node_timeout: Option<Duration>,
    pub(crate) drift: Drift,
    pub(crate) retry_jitter: Duration,
    pub(crate) fencing: bool,
    pub(crate) delayed_restart: Option<Duration>,
    pub(crate) fence_ttl: Option<Duration>,
    /// Who takes locks through this client: every grant leaves its record on every master.
    pub(crate) owner: Owner,
    /// The client's wake tag, the same on every master (see [`dlock_redis::Wakeups::tag`]).
    pub(crate) wake_tag: Arc<str>,
}

impl Settings {
    /// How long after its start a master stays out of quorums: the longest TTL plus its drift
    /// allowance, so that a slightly fast clock on the master cannot shorten it.
    pub(crate) fn restart_window(&self) -> Option<Duration> {
        self.delayed_restart
            .map(|max_ttl| max_ttl + self.drift.allowance(max_ttl))
    }

    /// The per-node timeout of a request that has no TTL of its own (release, inspect): the
    /// configured one, or the longest derived one.
    pub(crate) fn untimed_node_timeout(&self) -> Duration {
        self.node_timeout.unwrap_or(MAX_DERIVED_NODE_TIMEOUT)
    }

    /// The per-node timeout for a request with `ttl`.
    fn node_timeout(&self, ttl: Duration) -> Duration {
        self.node_timeout.unwrap_or_else(|| {
            (ttl / 200).clamp(MIN_DERIVED_NODE_TIMEOUT, MAX_DERIVED_NODE_TIMEOUT)
        })
    }

    /// Checks a request's TTL against these settings; returns the per-node timeout and the
    /// validity (`ttl − drift allowance`, counted from before the first request).
    pub(crate) fn plan(&self, ttl: Duration) -> Result<(Duration, Duration)> {
        if let Some(max_ttl) = self.delayed_restart {
            if ttl > max_ttl {
                return Err(Error::invalid(
                    "ttl",
                    format!(
                        "{ttl:?} exceeds the delayed-restart maximum of {max_ttl:?} this client was built with"
                    ),
                ));
            }
        }
        let allowance = self.drift.allowance(ttl);
        if allowance >= ttl {
            return Err(Error::invalid(
                "drift",
                format!(
                    "the client's drift allowance {allowance:?} leaves nothing of the ttl {ttl:?}"
                ),
            ));
        }
        let validity = ttl - allowance;
        let timeout = self.node_timeout(ttl);
        // Acquire may take two rounds (the grant, then the fencing write-back).
        if timeout * 2 >= validity {
            return Err(Error::invalid(
                "request_timeout",
                format!(
                    "{timeout:?} is too long for the ttl {ttl:?}: two rounds must fit in its validity {validity:?}"
                ),
            ));
        }
        Ok((timeout, validity))
    }
}

/// Locks on N independent Redis masters with the Redlock algorithm, fencing tokens included.
///
/// Clones share the connections; make one per process and share it, usually as
/// `Arc<dyn DistributedLock>`. See the [crate docs](crate) for the algorithm, the fencing argument
/// and its assumptions, and the delayed-restart rule.
#[derive(Clone)]
pub struct RedlockLock {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) nodes: Vec<Arc<Node>>,
    pub(crate) settings: Arc<Settings>,
    /// Each master's clock at the last renewal, by the master's position.
    pub(crate) clock: ClockWatch,
}

impl RedlockLock {
    /// What a Redlock client declares about itself with fencing on, as it is by default
    /// ([`DistributedLock::capabilities`]): tokens ordered while the masters keep their data,
    /// waiters served in arrival order and woken by the masters' releases, the read-write lock and
    /// the election but no semaphore (not sound by majority quorum).
    pub const CAPABILITIES: Capabilities =
        Capabilities::new(FencingGuarantee::MonotonicWhileDataSurvives)
            .with_notifications()
            .with_fair_queue()
            .with_primitives(Primitives::ALL.without_semaphore());

    /// Connects to the masters at `urls` with the default settings (see [`RedlockBuilder`]).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is left behind but closed connections.
    pub async fn connect<S: AsRef<str>>(urls: &[S]) -> Result<Self> {
        RedlockBuilder::from_urls(urls.iter().map(|u| u.as_ref().to_owned()))
            .connect()
            .await
    }

    /// Settings for the masters at `urls`, to adjust before [`connect`](RedlockBuilder::connect).
    pub fn builder<I, S>(urls: I) -> RedlockBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedlockBuilder::from_urls(urls)
    }

    pub(crate) fn new(nodes: Vec<Arc<Node>>, settings: Arc<Settings>) -> Self {
        RedlockLock {
            inner: Arc::new(Inner {
                nodes,
                settings,
                clock: ClockWatch::new(BACKEND),
            }),
        }
    }

    /// The masters' URLs, passwords hidden, in the order given.
    pub fn endpoints(&self) -> Vec<&str> {
        self.inner.nodes.iter().map(|n| n.endpoint()).collect()
    }

    /// How many masters must agree.
    pub fn quorum(&self) -> usize {
        self.inner.settings.quorum
    }

    /// The masters (by position) left out of quorums right now by the delayed-restart rule.
    pub fn excluded(&self) -> Vec<usize> {
        (0..self.inner.nodes.len())
            .filter(|&i| !self.inner.nodes[i].counts())
            .collect()
    }

    /// The per-node timeout a request with `ttl` uses.
    pub fn node_timeout(&self, ttl: Duration) -> Duration {
        self.inner.settings.node_timeout(ttl)
    }

    pub(crate) fn all(&self) -> std::ops::Range<usize> {
        0..self.inner.nodes.len()
    }

    /// Releases a lease on every master with `call` (one master's release script: the lock's or
    /// a primitive's), decided by a quorum: released where a quorum released it, taken over where
    /// a master shows another holder, expired where a quorum answered otherwise.
    pub(crate) async fn release_with<F, Fut>(&self, call: F) -> Result<Released>
    where
        F: Fn(MultiplexedConnection) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = RedisResult<Released>> + Send + 'static,
    {
        let quorum = self.inner.settings.quorum;
        let replies = self
            .release_everywhere(call, |p| {
                counted(p.replies, |r| *r == Released::Released) >= quorum
            })
            .await;
        if counted(&replies, |r| *r == Released::Released) >= quorum {
            return Ok(Released::Released);
        }
        if counted(&replies, |r| *r == Released::TakenOver) > 0 {
            return Ok(Released::TakenOver);
        }
        if answered(&replies) >= quorum {
            return Ok(Released::Expired);
        }
        Err(QuorumFailure::of("release", &replies, &self.inner.nodes, quorum).into_error())
    }

    /// Runs `call` (one master's release script) on every master, each within the timeout of a
    /// request that must go out whatever TTL it was for, listening until `done`.
    async fn release_everywhere<F, Fut>(
        &self,
        call: F,
        done: impl FnMut(Progress<'_, Released>) -> bool,
    ) -> Vec<Reply<Released>>
    where
        F: Fn(MultiplexedConnection) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = RedisResult<Released>> + Send + 'static,
    {
        let timeout = self.inner.settings.untimed_node_timeout();
        gather(
            &self.inner.nodes,
            self.all(),
            "release",
            timeout,
            call,
            done,
        )
        .await
    }

    /// Gives back a failed attempt on every master — also those whose answer was lost — then
    /// returns `outcome`. Waits only for as many answers as the attempt got, so a master that
    /// did not answer it does not delay the outcome again.
    async fn abandon<T, R>(
        &self,
        names: &Names,
        timeout: Duration,
        first: &[Reply<R>],
        outcome: T,
    ) -> T {
        let names = names.clone();
        let call = move |con| release_script(con, names.clone(), None);
        self.give_back_with(self.all().collect(), timeout, first, call)
            .await;
        outcome
    }

    /// Gives an attempt back with `call` (one master's release script: the lock's or a
    /// primitive's) on the masters at `targets`, listening for as many answers as the attempt
    /// (`first`) got from them.
    pub(crate) async fn give_back_with<R, F, Fut>(
        &self,
        targets: Vec<usize>,
        timeout: Duration,
        first: &[Reply<R>],
        call: F,
    ) where
        F: Fn(MultiplexedConnection) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = RedisResult<Released>> + Send + 'static,
    {
        let responsive = first
            .iter()
            .filter(|r| r.result.is_ok() && targets.contains(&r.index))
            .count();
        gather(&self.inner.nodes, targets, "release", timeout, call, |p| {
            p.replies.iter().filter(|r| r.result.is_ok()).count() >= responsive
        })
        .await;
    }

    /// Extends a lease on every master with `call` (one master's extension script), decided by
    /// a quorum of answers in time for the lease's validity, each master's clock watched: the
    /// lock's and the primitives' extension alike.
    pub(crate) async fn extend_with<F, Fut>(&self, ttl: Duration, call: F) -> Result<Extension>
    where
        F: Fn(MultiplexedConnection) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = RedisResult<Timed<Extension>>> + Send + 'static,
    {
        let settings = &self.inner.settings;
        let (timeout, validity) = settings.plan(ttl)?;
        let quorum = settings.quorum;
        let nodes = &self.inner.nodes;
        let sent = Instant::now();
        let replies = gather(
            nodes,
            self.all(),
            "extend",
            timeout,
            call,
            |p: Progress<'_, Timed<Extension>>| {
                Tally::of(p.replies, |r| Some(r.answer)).settled(p.pending, quorum)
            },
        )
        .await;
        let replies = watch_clocks(&self.inner.clock, replies, Extension::with_clock_ahead);
        let in_time = sent.elapsed() < validity;
        Tally::of(&replies, |r| Some(*r))
            .outcome(quorum, in_time)
            .ok_or_else(|| QuorumFailure::of("extend", &replies, nodes, quorum).into_error())
    }

    /// Settles a round a quorum granted, the lock's or a primitive's place: its token is the
    /// greatest any master granted; with fencing on, the call `raise` makes for that token (its
    /// script) raises the counters of the granted masters below it, until a quorum holds the
    /// grant at it; and the grant must still be in time for its `validity`, counted from
    /// `sent`. An error says why the grant cannot be returned as held: the caller gives it back.
    /// `raise` is called only when a write-back is needed, so that the common grant, already at
    /// the greatest token on a quorum, clones nothing for it.
    pub(crate) async fn settle<F, Fut>(
        &self,
        grants: &[(usize, bool, FencingToken)],
        (sent, validity, timeout): (Instant, Duration, Duration),
        raise: impl FnOnce(FencingToken) -> F,
    ) -> Result<FencingToken>
    where
        F: Fn(MultiplexedConnection) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = RedisResult<FenceRaise>> + Send + 'static,
    {
        let settings = &self.inner.settings;
        let quorum = settings.quorum;
        let token = grants
            .iter()
            .map(|(_, _, t)| *t)
            .max()
            .unwrap_or(FencingToken(0));
        let at_max = grants
            .iter()
            .filter(|(_, counts, t)| *counts && *t == token)
            .count();
        let behind: Vec<usize> = grants
            .iter()
            .filter(|(_, _, t)| *t < token)
            .map(|(i, _, _)| *i)
            .collect();
        if settings.fencing {
            let mut replies = Vec::new();
            if at_max < quorum && !behind.is_empty() {
                replies = gather(
                    &self.inner.nodes,
                    behind,
                    "raise_fence",
                    timeout,
                    raise(token),
                    |p: Progress<'_, FenceRaise>| {
                        let raised = counted(p.replies, |r| *r == FenceRaise::Raised);
                        at_max + raised >= quorum || at_max + raised + p.pending < quorum
                    },
                )
                .await;
            }
            let confirmed = at_max + counted(&replies, |r| *r == FenceRaise::Raised);
            if confirmed < quorum {
                let failure = QuorumFailure {
                    reached: confirmed,
                    ..QuorumFailure::of("fencing write-back", &replies, &self.inner.nodes, quorum)
                };
                return Err(failure.into_error());
            }
        }
        let granted = grants.iter().filter(|(_, counts, _)| *counts).count();
        match too_late(sent, validity, granted, quorum) {
            Some(late) => Err(late),
            None => Ok(token),
        }
    }
}

/// One master's release of `names` (by owner token: a grant is deleted, and the queue entry
/// withdrawn, or kept with `keep_place`; see [`ReleaseCall`]), which announces the next waiter
/// where the lock is free.
async fn release_script(
    mut con: MultiplexedConnection,
    names: Names,
    keep_place: Option<(u64, Duration)>,
) -> RedisResult<Released> {
    ReleaseCall {
        lock_key: &names.lock,
        owner: &names.owner,
        channel: &names.channel,
        publish: Publish::Plain,
        wake_tag: &names.wake_tag,
        keep_place,
    }
    .run(&mut con)
    .await
}

/// How far ahead of the client's clock a new fencing counter starts at the least (1 s, in µs):
/// more than the masters' clocks are ahead of the client's and a request takes to reach them, so
/// that every master of a fresh key starts its counter at the client's value, not at its own
/// clock. Tokens stay above those before a lost counter while no clock, the masters' or the
/// clients', lags the one that started it by more than the time since (see
/// `dlock_redis::protocol::scripts`).
const NEW_COUNTER_LEAD_MICROS: u64 = 1_000_000;

/// One least start for a counter no master has yet, the same on every master of an attempt
/// (`dlock_redis::protocol::scripts::AcquireCall::least_start`): the client's clock, ahead by
/// [`NEW_COUNTER_LEAD_MICROS`].
pub(crate) fn new_counter_start() -> Option<u64> {
    Some(micros_now().saturating_add(NEW_COUNTER_LEAD_MICROS))
}

/// Now on the client's clock, in microseconds since the Unix epoch (exact in a sorted set's or
/// Lua's double until the year 2255).
pub(crate) fn micros_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
        })
}

impl RedlockLock {
    /// One attempt on every master. With `arrival` (a waiting `lock()`), the caller stands in
    /// each master's queue of waiters at that score (the same on every master, so that they
    /// order waiters alike) for the lease's TTL, unless granted; without, it never enqueues.
    ///
    /// The grant is unchanged by the queue: a quorum of `SET NX` within the validity, with the
    /// greatest token written back. A master grants only to the head of its queue (or when
    /// nobody waits), which only ever refuses more. Short of a quorum, the grants are given back
    /// — on every master that granted or did not answer, not where the caller stands in the
    /// queue; a waiter keeps its place in every queue, put back at its score where it gives a
    /// grant back. A refused `try_lock` stops listening once a quorum refused; a waiter listens to
    /// every master (each within the per-node timeout), so that it gives back only where it was
    /// granted or got no answer at all.
    pub(crate) async fn attempt(
        &self,
        req: &LockRequest<'_>,
        names: &Names,
        arrival: Option<u64>,
    ) -> Result<Round> {
        let settings = &self.inner.settings;
        let (timeout, validity) = settings.plan(req.ttl)?;
        let quorum = settings.quorum;
        let (ttl, fence_ttl) = (req.ttl, settings.fence_ttl);
        let entry_lifetime = if arrival.is_some() {
            ttl
        } else {
            Duration::ZERO
        };
        // One record for every master, so that they agree on who holds the lock.
        let record: Arc<str> = settings.owner.record().to_json().into();
        let least_start = new_counter_start();
        let call = {
            let names = names.clone();
            move |mut con| {
                let (n, record) = (names.clone(), record.clone());
                async move {
                    AcquireCall {
                        lock_key: &n.lock,
                        fence_key: &n.fence,
                        owner: &n.owner,
                        record: &record,
                        ttl,
                        fence_ttl,
                        least_start,
                        queue: Queueing {
                            entry_lifetime,
                            arrival,
                            channel: &n.channel,
                            publish: Publish::Plain,
                            wake_tag: &n.wake_tag,
                        },
                    }
                    .run(&mut con)
                    .await
                }
            }
        };
        let sent = Instant::now();
        let replies = gather(
            &self.inner.nodes,
            self.all(),
            "acquire",
            timeout,
            call,
            |p: Progress<'_, AcquireReply>| {
                let granted = counted(p.replies, |r| matches!(r, AcquireReply::Granted(_)));
                let refused = granted + p.pending < quorum && answered(p.replies) >= quorum;
                // A waiter hears every master out: giving back where no answer came yet would
                // also take it out of that master's queue, where the next in line (often the
                // releaser, queued again) would then head the queue and split the masters.
                granted >= quorum || (refused && (arrival.is_none() || p.pending == 0))
            },
        )
        .await;
        let (grants, granted) = grants_of(&replies, |r| match r {
            AcquireReply::Granted(token) => Some(*token),
            AcquireReply::Busy { .. } => None,
        });
        if granted < quorum {
            if answered(&replies) < quorum {
                let failure = QuorumFailure::of("acquire", &replies, &self.inner.nodes, quorum);
                let error = failure.into_error();
                return Err(self.abandon(names, timeout, &replies, error).await);
            }
            let busy = busy(&replies, quorum);
            // Where the caller is queued, it keeps its place; everywhere else (a grant, a lost
            // answer, a master not heard yet) it gives back.
            let queued_at = |i: usize| {
                replies
                    .iter()
                    .any(|r| r.index == i && matches!(r.result, Ok(AcquireReply::Busy { .. })))
            };
            let elsewhere: Vec<usize> = self.all().filter(|&i| !queued_at(i)).collect();
            if !elsewhere.is_empty() {
                // A waiter keeps its place where it gives a grant back, so that the next in line
                // cannot take those masters meanwhile and split them.
                let keep_place = arrival.map(|arrival| (arrival, entry_lifetime));
                let names = names.clone();
                let call = move |con| release_script(con, names.clone(), keep_place);
                self.give_back_with(elsewhere, timeout, &replies, call)
                    .await;
            }
            return Ok(busy);
        }
        let raise = |token| {
            let named = names.clone();
            move |mut con| {
                let n = named.clone();
                async move {
                    scripts::raise_fence(&mut con, &n.lock, &n.fence, &n.owner, token, fence_ttl)
                        .await
                }
            }
        };
        match self.settle(&grants, (sent, validity, timeout), raise).await {
            Ok(token) => Ok(Round::Granted(Grant::new(token, sent))),
            Err(error) => Err(self.abandon(names, timeout, &replies, error).await),
        }
    }

    /// What a quorum of the masters shows for `key` (see [`inspect`](DistributedLock::inspect)),
    /// and the value they show, if a quorum shows one.
    async fn look(&self, key: &LockKey) -> Result<(Holding, Option<Vec<u8>>)> {
        let settings = &self.inner.settings;
        let (quorum, fenced) = (settings.quorum, settings.fencing);
        let lock: Arc<str> = settings.layout.lock_key(key).into();
        let fence: Arc<str> = keys::fence_key(&lock).into();
        let call = move |mut con| {
            let (lock, fence) = (lock.clone(), fence.clone());
            async move { scripts::peek(&mut con, &lock, &fence).await }
        };
        let replies = gather(
            &self.inner.nodes,
            self.all(),
            "inspect",
            settings.untimed_node_timeout(),
            call,
            |p: Progress<'_, Peek>| inspect::decide(p.replies, p.pending, quorum, fenced).is_some(),
        )
        .await;
        let holding = inspect::decide(&replies, 0, quorum, fenced).ok_or_else(|| {
            QuorumFailure::of("inspect", &replies, &self.inner.nodes, quorum).into_error()
        })?;
        Ok((holding, inspect::quorum_value(&replies, quorum)))
    }

    /// The lock keys starting with `start` that have an owner record on a master, scanned on
    /// every master at once (each page bounded by the request timeout); fails unless all but
    /// `quorum - 1` masters were scanned to the end.
    async fn scan_owner_records(&self, start: &str) -> Result<Vec<String>> {
        let settings = &self.inner.settings;
        let timeout = settings.untimed_node_timeout();
        let scans = self.inner.nodes.iter().map(|node| async move {
            let mut locks = Vec::new();
            let mut cursor = 0;
            loop {
                let page = node.run("list", move |mut con| async move {
                    scripts::scan_owner_records(cursor)
                        .query_async::<(u64, Vec<String>)>(&mut con)
                        .await
                });
                let (next, names) = match tokio::time::timeout(timeout, page).await {
                    Ok(Ok(page)) => page,
                    Ok(Err(_)) | Err(_) => return None,
                };
                locks.extend(keys::lock_keys_under(&names, start));
                if next == 0 {
                    return Some(locks);
                }
                cursor = next;
            }
        });
        let scanned: Vec<Option<Vec<String>>> = futures::future::join_all(scans).await;
        let complete = scanned.iter().filter(|s| s.is_some()).count();
        let needed = self.inner.nodes.len() + 1 - settings.quorum;
        if complete < needed {
            return Err(Error::Unavailable {
                reached: complete,
                needed,
                source: Some("list: too few masters scanned to find every held lock".into()),
            });
        }
        let mut locks: Vec<String> = scanned.into_iter().flatten().flatten().collect();
        locks.sort_unstable();
        locks.dedup();
        Ok(locks)
    }

    /// [`extend_many`](DistributedLock::extend_many) for at most [`EXTEND_BATCH`] leases: one
    /// script to every master, then each lease decided as a single `extend` would be. A lease
    /// whose TTL the settings refuse is answered at once and not sent.
    async fn extend_chunk(&self, chunk: &[ExtendRequest<'_>]) -> Vec<Result<Extension>> {
        let settings = &self.inner.settings;
        let quorum = settings.quorum;
        let plans: Vec<Result<(Duration, Duration)>> =
            chunk.iter().map(|r| settings.plan(r.ttl)).collect();
        // The leases that go out: their position in `chunk`, their validity, their script input.
        let mut sent_leases: Vec<(usize, Duration)> = Vec::with_capacity(chunk.len());
        let mut locks: Vec<(String, String, Duration)> = Vec::with_capacity(chunk.len());
        let mut base = Duration::ZERO;
        let mut shortest = Duration::MAX;
        for (position, (request, plan)) in chunk.iter().zip(&plans).enumerate() {
            if let Ok((timeout, validity)) = plan {
                base = base.max(*timeout);
                shortest = shortest.min(*validity);
                sent_leases.push((position, *validity));
                locks.push((
                    settings.layout.lock_key(request.lease.key),
                    request.lease.owner.to_hex(),
                    request.ttl,
                ));
            }
        }
        let mut answers: Vec<Result<Extension>> = plans
            .into_iter()
            .map(|plan| plan.map(|_| Extension::Expired))
            .collect();
        if locks.is_empty() {
            return answers;
        }
        let timeout = batch_timeout(base, locks.len(), shortest);
        let count = locks.len();
        let locks: Arc<[(String, String, Duration)]> = locks.into();
        let call = move |mut con| {
            let locks = locks.clone();
            async move {
                let triples: Vec<(&str, &str, Duration)> = locks
                    .iter()
                    .map(|(lock, owner, ttl)| (lock.as_str(), owner.as_str(), *ttl))
                    .collect();
                scripts::extend_many(&mut con, &triples).await
            }
        };
        let sent = Instant::now();
        let replies = gather(
            &self.inner.nodes,
            self.all(),
            "extend_many",
            timeout,
            call,
            |p: Progress<'_, Timed<Vec<Extension>>>| {
                (0..count).all(|i| {
                    Tally::of(p.replies, |codes| codes.answer.get(i).copied())
                        .settled(p.pending, quorum)
                })
            },
        )
        .await;
        let replies = watch_clocks(&self.inner.clock, replies, |codes, ahead| {
            codes
                .into_iter()
                .map(|code| code.with_clock_ahead(ahead))
                .collect::<Vec<_>>()
        });
        let elapsed = sent.elapsed();
        for (i, (position, validity)) in sent_leases.into_iter().enumerate() {
            let outcome = Tally::of(&replies, |codes| codes.get(i).copied())
                .outcome(quorum, elapsed < validity)
                .ok_or_else(|| {
                    QuorumFailure::of("extend_many", &replies, &self.inner.nodes, quorum)
                        .into_error()
                });
            if let Some(answer) = answers.get_mut(position) {
                *answer = outcome;
            }
        }
        answers
    }
}

/// The busy outcome of an attempt's `replies` (see [`Round::Busy`]).
fn busy(replies: &[Reply<AcquireReply>], quorum: usize) -> Round {
    let mut free: Vec<Duration> = Vec::with_capacity(replies.len());
    let mut back: Vec<Duration> = Vec::with_capacity(replies.len());
    let (mut heads, mut unannounced) = (0, false);
    // Grants given back, and masters that did not answer: those announce nothing to this
    // waiter, and may grant as soon as they answer again (a master that restarted empty).
    let (mut granted, mut unanswered) = (0, 0);
    for reply in replies.iter().filter(|r| r.counts) {
        match reply.result {
            Ok(AcquireReply::Granted(_)) => {
                heads += 1;
                granted += 1;
                free.push(Duration::ZERO);
                back.push(Duration::ZERO);
            }
            Ok(AcquireReply::Busy {
                pttl,
                head,
                foreign,
                head_lapses_in,
            }) => {
                free.extend(pttl);
                if head {
                    heads += 1;
                    unannounced |= foreign || pttl.is_none();
                    back.extend(pttl);
                } else if let Some(lapse) = head_lapses_in {
                    // Not later, even while a holder's key lasts longer: its release announces
                    // the head, which may have crashed.
                    back.push(lapse);
                }
            }
            Err(_) => unanswered += 1,
        }
    }
    let nth = |mut times: Vec<Duration>| {
        times.sort_unstable();
        quorum.checked_sub(1).and_then(|i| times.get(i)).copied()
    };
    Round::Busy {
        free_in: nth(free),
        come_back_in: nth(back),
        poll: (heads >= quorum && unannounced) || granted + unanswered >= quorum,
    }
}

/// The masters that granted — their position, whether they count, the token — and how many of
/// them count, from an attempt's `replies`; `token` reads a grant's token from an answer.
pub(crate) fn grants_of<T>(
    replies: &[Reply<T>],
    token: impl Fn(&T) -> Option<FencingToken>,
) -> (Vec<(usize, bool, FencingToken)>, usize) {
    let grants: Vec<(usize, bool, FencingToken)> = replies
        .iter()
        .filter_map(|r| {
            let token = token(r.result.as_ref().ok()?)?;
            Some((r.index, r.counts, token))
        })
        .collect();
    let granted = grants.iter().filter(|(_, counts, _)| *counts).count();
    (grants, granted)
}

/// The error of a grant by `granted` masters that came too late: at or past its `validity`,
/// counted from `sent`; `None` if it is in time.
fn too_late(sent: Instant, validity: Duration, granted: usize, quorum: usize) -> Option<Error> {
    let elapsed = sent.elapsed();
    (elapsed >= validity).then(|| Error::Unavailable {
        reached: granted,
        needed: quorum,
        source: Some(
            format!(
                "acquire: a quorum answered after {elapsed:?}, past the validity of {validity:?}"
            )
            .into(),
        ),
    })
}

/// How many counting masters answered with `pred` true.
pub(crate) fn counted<T>(replies: &[Reply<T>], pred: impl Fn(&T) -> bool) -> usize {
    replies
        .iter()
        .filter(|r| r.counts && r.result.as_ref().is_ok_and(&pred))
        .count()
}

/// How many counting masters answered at all.
pub(crate) fn answered<T>(replies: &[Reply<T>]) -> usize {
    replies
        .iter()
        .filter(|r| r.counts && r.result.is_ok())
        .count()
}

#[async_trait]
impl DistributedLock for RedlockLock {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    /// Waiters are served in arrival order, woken by the masters' release notifications (see
    /// the crate's README, "Redlock: waiting in a fair queue"). The read-write lock and the election
    /// are served; the semaphore is not (see [the crate docs](crate#primitives)). The views of
    /// the primitives declare neither the fair queue nor notifications: their waiters poll.
    /// [`RedlockLock::CAPABILITIES`], with no fencing guarantee when fencing is switched off.
    fn capabilities(&self) -> Capabilities {
        let mut capabilities = Self::CAPABILITIES;
        if !self.inner.settings.fencing {
            capabilities.fencing = FencingGuarantee::None;
        }
        capabilities
    }

    fn primitive(&self, primitive: &Primitive) -> Result<Arc<dyn DistributedLock>> {
        primitive.validate()?;
        if !self.capabilities().primitives.serves(primitive) {
            return Err(Error::Unsupported {
                backend: BACKEND,
                what: "a semaphore by quorum (N + 1 holders can each hold a majority)",
            });
        }
        Ok(Arc::new(RedlockView::new(self.clone(), primitive.clone())))
    }

    /// One attempt that never stands in the queue of waiters: granted only where nobody waits
    /// (a master grants only to the head of its queue of waiters).
    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        let names = Names::new(&self.inner.settings, req.key, req.owner);
        Ok(match self.attempt(req, &names, None).await? {
            Round::Granted(grant) => Attempt::Acquired(grant),
            Round::Busy { free_in, .. } => Attempt::Busy {
                retry_after: free_in,
            },
        })
    }

    /// Waits in the masters' queues of waiters, woken by their release notifications, in
    /// arrival order: the loop of [`dlock_redis::waiting`], with a quorum of the masters.
    ///
    /// A waiter enters every master's queue with one arrival score of its own choosing (the
    /// client's clock, in microseconds since the Unix epoch, ties broken by owner token), so
    /// that all masters order waiters alike and the head of one is the head of all. An attempt
    /// waits for every master's answer (each within the per-node timeout). Short of a quorum it
    /// gives its grants back but keeps its place in every queue: where it gives a grant back,
    /// the same script puts it back in the queue at its score, so the next in line cannot take
    /// that master meanwhile and split the masters between them. It comes back by itself when
    /// it heads a quorum of the queues at the holders' expiry, and when it is second in line
    /// when the head's entries lapse (see `Round::Busy` in the source).
    ///
    /// # Cancel safety
    /// Not cancel safe on its own: an attempt may have reached the masters. Core releases by
    /// owner token when an acquire is dropped, which also withdraws the queue entries.
    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        let names = Names::new(&self.inner.settings, req.key, req.owner);
        // The arrival score: now on the client's clock.
        let arrival = Some(micros_now());
        let wakeups: Vec<&dlock_redis::Wakeups> =
            self.inner.nodes.iter().map(|node| node.wakeups()).collect();
        let listeners = Listeners {
            wakeups: &wakeups,
            quorum: self.inner.settings.quorum,
            subscribe_within: self.inner.settings.untimed_node_timeout(),
            channel: &names.channel,
            owner: &names.owner,
        };
        let attempt = || async {
            Ok(match self.attempt(req, &names, arrival).await? {
                Round::Granted(grant) => waiting::Round::Granted(grant),
                Round::Busy {
                    come_back_in, poll, ..
                } => waiting::Round::Busy { come_back_in, poll },
            })
        };
        waiting::wait_for_lock(self, req, deadline, retry, &listeners, attempt).await
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        let names = Names::new(&self.inner.settings, lease.key, lease.owner);
        self.extend_with(ttl, move |mut con| {
            let n = names.clone();
            async move { scripts::extend(&mut con, &n.lock, &n.owner, ttl).await }
        })
        .await
    }

    /// One [`EXTEND_MANY`](scripts::EXTEND_MANY) script per [`EXTEND_BATCH`] leases to every
    /// master in parallel, instead of one round per lease; each lease is then decided by the
    /// rules of [`extend`](Self::extend).
    ///
    /// The chunks go one after another, as on a single Redis. Sent together, they would queue on
    /// each master's connection: the client's other requests (an acquire, a release) would wait
    /// behind all of them, and the last chunks' time limits would run out while the masters were
    /// still working through the first ones, retiring the connections. One at a time, another
    /// request waits behind one chunk at most, and each chunk's limit covers that chunk alone.
    /// A master that does not answer still costs one limit, not one per chunk: its connection is
    /// retired by the first timeout, and the following chunks fail on it at once.
    async fn extend_many(&self, requests: &[ExtendRequest<'_>]) -> Vec<Result<Extension>> {
        let mut answers = Vec::with_capacity(requests.len());
        for chunk in requests.chunks(EXTEND_BATCH) {
            answers.extend(self.extend_chunk(chunk).await);
        }
        answers
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        let names = Names::new(&self.inner.settings, lease.key, lease.owner);
        self.release_with(move |con| release_script(con, names.clone(), None))
            .await
    }

    /// Reads the key and its counter on every master and reports what a quorum shows; see
    /// [the crate docs](crate#looking-at-a-lock) for when it is "unknown" and when the holder's
    /// fencing token is reported.
    async fn inspect(&self, key: &LockKey) -> Result<Holding> {
        Ok(self.look(key).await?.0)
    }

    /// Scans the owner records on every master (`SCAN … MATCH dlock:owner:*`, page by page),
    /// then looks at each lock found under this client's prefix and `prefix` as
    /// [`inspect`](Self::inspect) does, listing those a quorum shows held by a holder with an
    /// owner record. A lock held on a quorum has records on a quorum, so the scan needs all but
    /// `quorum - 1` masters to find every one; with fewer it fails as unavailable.
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let settings = &self.inner.settings;
        let ours = settings.layout.prefix();
        let start = format!("{ours}{prefix}");
        let locks = self.scan_owner_records(&start).await?;
        let mut held = Vec::new();
        for chunk in locks.chunks(LIST_LOOKS) {
            let looks = chunk.iter().map(|lock| async move {
                let name = lock.strip_prefix(ours).unwrap_or(lock);
                // A record of a name no client could lock is not a lock.
                let Ok(key) = LockKey::new(name) else {
                    return Ok((name, Holding::Free));
                };
                Ok::<_, Error>((name, self.inspect(&key).await?))
            });
            for (name, holding) in futures::future::try_join_all(looks).await? {
                if let Holding::Held(holder) = holding {
                    if holder.owner.is_some() {
                        held.push(HeldLock::new(name, holder));
                    }
                }
            }
        }
        Ok(held)
    }

    /// Looks at the lock as [`inspect`](Self::inspect) does, then removes the value a quorum
    /// shows — the holder's owner token — from every master with the release script (a
    /// compare-and-delete of the key and its owner record on each). The holder is evicted once a
    /// quorum of masters answered: none of them keeps its key any more, so it can no longer
    /// renew (its lease turns lost at its next renewal) and the next grant, whose quorum meets
    /// one of them, gets a greater token (no counter is touched). With fewer answers the
    /// eviction fails as unavailable: the masters that answered dropped the key, the others keep
    /// it until its TTL, and evicting again finishes the job.
    ///
    /// `expected` is compared with the token a quorum of the masters agree on; a holder without
    /// one (no fencing, another library's client, masters too few to agree) is only evicted
    /// without `expected`. Masters that disagree on the holder ([`Holding::Unknown`]) are an
    /// error: look again once the lock settles.
    async fn evict(&self, key: &LockKey, expected: Option<FencingToken>) -> Result<Eviction> {
        let settings = &self.inner.settings;
        let quorum = settings.quorum;
        let (holding, value) = self.look(key).await?;
        let holder = match holding {
            Holding::Free => return Ok(Eviction::Free),
            Holding::Held(holder) => holder,
            _ => {
                return Err(Error::backend(
                    BACKEND,
                    true,
                    "evict: the masters disagree on the holder; look again",
                ))
            }
        };
        if expected.is_some_and(|token| holder.fencing != Some(token)) {
            return Ok(Eviction::Changed(holder));
        }
        let Some(value) = value.and_then(|v| String::from_utf8(v).ok()) else {
            return Err(Error::backend(
                BACKEND,
                false,
                "evict: the holder's value is not text",
            ));
        };
        let lock = settings.layout.lock_key(key);
        let names = Names {
            channel: keys::release_channel(&lock).into(),
            lock: lock.into(),
            fence: Arc::from(""),
            owner: value.into(),
            wake_tag: Arc::from(""),
        };
        let call = move |con| release_script(con, names.clone(), None);
        let replies = self.release_everywhere(call, |_| false).await;
        if answered(&replies) >= quorum {
            return Ok(Eviction::Evicted(holder));
        }
        Err(QuorumFailure::of("evict", &replies, &self.inner.nodes, quorum).into_error())
    }

    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        let _ = key;
        // Wake up a random bit early, so that contenders refused together do not come back
        // together and split the masters between them again.
        let now = Instant::now();
        let room = until.saturating_duration_since(now);
        let jitter = self
            .inner
            .settings
            .retry_jitter
            .min(room)
            .mul_f64(rand::random::<f64>());
        tokio::time::sleep_until(until - jitter).await;
        Ok(())
    }
}

impl fmt::Debug for RedlockLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockLock")
            .field("endpoints", &self.endpoints())
            .field("settings", &self.inner.settings)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::NodeFailure;

    fn reply(index: usize, result: Option<AcquireReply>) -> Reply<AcquireReply> {
        Reply {
            index,
            counts: true,
            result: result.ok_or_else(|| NodeFailure {
                endpoint: format!("redis://m{index}"),
                error: Arc::new(Error::unreachable("down")),
            }),
        }
    }

    fn queued(pttl: Option<u64>, head: bool, head_lapses_in: Option<u64>) -> Option<AcquireReply> {
        Some(AcquireReply::Busy {
            pttl: pttl.map(Duration::from_millis),
            head,
            foreign: false,
            head_lapses_in: head_lapses_in.map(Duration::from_millis),
        })
    }

    fn ms(millis: u64) -> Option<Duration> {
        Some(Duration::from_millis(millis))
    }

    #[test]
    fn the_head_comes_back_when_a_quorum_of_the_holders_keys_ran_out() {
        // Granted on one master (given back), head behind holders on three, one down.
        let replies = [
            reply(0, Some(AcquireReply::Granted(FencingToken(9)))),
            reply(1, queued(Some(30), true, None)),
            reply(2, queued(Some(10), true, None)),
            reply(3, queued(Some(20), true, None)),
            reply(4, None),
        ];
        let Round::Busy {
            free_in,
            come_back_in,
            poll,
        } = busy(&replies, 3)
        else {
            panic!("busy expected");
        };
        assert_eq!(free_in, ms(20), "free: 0, 10, 20, 30: the third");
        assert_eq!(come_back_in, ms(20));
        assert!(!poll);
    }

    #[test]
    fn a_waiter_polls_where_masters_that_did_not_answer_would_complete_a_quorum() {
        // Granted on two masters (given back), one down, a holder's long key on two: the down
        // master may grant as soon as it is back, and will not announce it.
        let replies = [
            reply(0, queued(Some(15_000), true, None)),
            reply(1, queued(Some(15_000), true, None)),
            reply(2, None),
            reply(3, Some(AcquireReply::Granted(FencingToken(9)))),
            reply(4, Some(AcquireReply::Granted(FencingToken(9)))),
        ];
        let Round::Busy {
            come_back_in, poll, ..
        } = busy(&replies, 3)
        else {
            panic!("busy expected");
        };
        assert_eq!(come_back_in, ms(15_000));
        assert!(poll);
    }

    #[test]
    fn the_second_in_line_comes_back_when_the_heads_entries_lapse() {
        let replies = [
            reply(0, queued(Some(5), false, Some(40))),
            reply(1, queued(Some(5), false, Some(50))),
            reply(2, queued(Some(70), false, Some(60))),
            reply(3, queued(None, false, None)),
            reply(4, queued(Some(5), false, None)),
        ];
        let Round::Busy {
            come_back_in, poll, ..
        } = busy(&replies, 3)
        else {
            panic!("busy expected");
        };
        assert_eq!(
            come_back_in,
            ms(60),
            "40, 50, 60: not the holder's 70, whose release would name the head"
        );
        assert!(!poll);
    }

    #[test]
    fn a_waiter_behind_others_only_refreshes_and_a_foreign_holder_is_polled() {
        let behind = [
            reply(0, queued(Some(5), false, None)),
            reply(1, queued(Some(5), false, None)),
            reply(2, queued(Some(5), true, None)),
        ];
        let Round::Busy {
            free_in,
            come_back_in,
            poll,
        } = busy(&behind, 2)
        else {
            panic!("busy expected");
        };
        assert_eq!(free_in, ms(5));
        assert_eq!(come_back_in, None, "heads only one queue of three");
        assert!(!poll);
        let foreign = AcquireReply::Busy {
            pttl: ms(5),
            head: true,
            foreign: true,
            head_lapses_in: None,
        };
        let heading = [
            reply(0, Some(foreign)),
            reply(1, queued(Some(5), true, None)),
            reply(2, None),
        ];
        assert!(matches!(busy(&heading, 2), Round::Busy { poll: true, .. }));
    }
}
