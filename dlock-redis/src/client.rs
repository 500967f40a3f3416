//! The Redis backend: dlock's implementor contract on one Redis server.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::clock::{ClockReading, ClockWatch};
use dlock_core::backend::{
    Attempt, Capabilities, ExtendRequest, Extension, FencingGuarantee, Grant, LeaseRef, LockKey,
    LockRequest, Primitive, Primitives,
};
use dlock_core::inspect::{Eviction, HeldLock, Holding};
use dlock_core::{Backoff, DistributedLock, Error, FencingToken, Owner, Released, Result};
use tokio::time::Instant;

use crate::builder::RedisLockBuilder;
use crate::cluster::{self, ClusterInfo, RedisConnection};
use crate::connection::Connection;
use crate::error::BACKEND;
use crate::primitives::RedisView;
use crate::protocol::keys::{self, KeyLayout, LockKeys};
use crate::protocol::scripts::{
    self, AcquireCall, AcquireReply, Publish, Queueing, ReleaseCall, Timed,
};
use crate::replicas::{Acknowledged, Acks};
use crate::waiting::{self, Listeners, Round};
use crate::wakeups::Wakeups;

/// Runs `$body` (which uses the connection `$con`) on the client's connection, with `WAIT`
/// behind it when the client has `min_replicas`; evaluates to `Result<(answer, acknowledged)>`.
macro_rules! on_server {
    ($lock:expr, $op:expr, |$con:ident| $body:expr) => {{
        match $lock.inner.acks {
            None => {
                $lock
                    .inner
                    .connection
                    .run(
                        $op,
                        |mut $con| async move { $body.map(|answer| (answer, None)) },
                    )
                    .await
            }
            Some(acks) => {
                $lock
                    .acknowledged($op, &acks, |mut $con| async move {
                        let answer = $body;
                        answer.map(|answer| (answer, $con.acknowledged))
                    })
                    .await
            }
        }
    }};
}
pub(crate) use on_server;

/// How many leases one [`EXTEND_MANY`](scripts::EXTEND_MANY) call renews at most: large enough
/// that 10,000 leases take a handful of round trips, small enough that one call keeps the server
/// busy for about a millisecond at most.
pub const EXTEND_BATCH: usize = 500;

/// How many locks `list` reads at a time, pipelined on the one connection.
const LIST_READS: usize = 64;

/// Locks on one Redis server (a standalone server or a primary with asynchronous replicas).
///
/// Clones share one multiplexed connection and one subscriber connection; make one per process
/// and share it, usually as `Arc<dyn DistributedLock>`. Dropping the last clone closes both.
/// See the [crate docs](crate) for the key layout, the fencing guarantee and how waiting works.
#[derive(Clone)]
pub struct RedisLock {
    pub(crate) inner: Arc<Inner>,
}

/// What a client is made of; built by [`RedisLockBuilder::connect`] (and the cluster's).
pub(crate) struct Inner {
    pub(crate) connection: Connection,
    pub(crate) layout: KeyLayout,
    pub(crate) wakeups: Wakeups,
    /// The server (or Sentinel service) without passwords.
    pub(crate) endpoint: String,
    pub(crate) fence_ttl: Option<Duration>,
    /// Replica acknowledgement of every write; `None`: no `WAIT`.
    pub(crate) acks: Option<Acks>,
    /// Set for a client of a Redis Cluster.
    pub(crate) cluster: Option<ClusterInfo>,
    /// Who takes locks through this client: every grant leaves its record.
    pub(crate) owner: Owner,
    /// The server's clock at the last renewal, compared with the next (per hash slot on a
    /// cluster).
    pub(crate) clock: ClockWatch,
}

impl RedisLock {
    /// What a Redis client declares about itself ([`DistributedLock::capabilities`]): tokens
    /// ordered while the server keeps its data, releases that wake waiters in arrival order from
    /// a queue on the server, every primitive.
    pub const CAPABILITIES: Capabilities =
        Capabilities::new(FencingGuarantee::MonotonicWhileDataSurvives)
            .with_notifications()
            .with_fair_queue()
            .with_primitives(Primitives::ALL);

    /// Connects to the server at `url` with the default settings (see [`RedisLockBuilder`]).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is left behind but a closed connection.
    pub async fn connect(url: &str) -> Result<Self> {
        RedisLockBuilder::new(url).connect().await
    }

    /// Settings for the server at `url`, to adjust before [`connect`](RedisLockBuilder::connect).
    pub fn builder(url: impl Into<String>) -> RedisLockBuilder {
        RedisLockBuilder::new(url)
    }

    pub(crate) fn new(inner: Inner) -> Self {
        RedisLock {
            inner: Arc::new(inner),
        }
    }

    /// How lock names map to Redis keys for this client.
    pub fn layout(&self) -> &KeyLayout {
        &self.inner.layout
    }

    /// The Redis names of the lock `name`.
    pub fn keys(&self, name: &LockKey) -> LockKeys {
        self.inner.layout.keys(name)
    }

    /// A handle on the multiplexed connection this client's lock operations use, e.g. to run a
    /// fenced write in a script of your own next to them. Requests on it are not bounded by the
    /// request timeout. For a cluster client it routes each command to the node of its keys.
    pub fn connection(&self) -> RedisConnection {
        self.inner.connection.manager()
    }

    /// The server's URL (for a cluster, the seeds) with the password hidden.
    pub fn endpoint(&self) -> &str {
        match &self.inner.cluster {
            Some(cluster) => cluster.redacted(),
            None => &self.inner.endpoint,
        }
    }

    /// Whether this client talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.inner.cluster.is_some()
    }

    /// The channel a release of `lock` is announced on: in a cluster, one of the lock key's
    /// slot (see [`cluster::release_channel`]).
    pub(crate) fn release_channel(&self, lock: &str) -> String {
        if self.is_cluster() {
            cluster::release_channel(lock)
        } else {
            keys::release_channel(lock)
        }
    }

    /// How this client announces releases: `SPUBLISH` in a cluster.
    pub(crate) fn publish(&self) -> Publish {
        if self.is_cluster() {
            Publish::Sharded
        } else {
            Publish::Plain
        }
    }

    /// How an attempt with queue entry lifetime `entry_lifetime` (zero: a `try_lock`) of the
    /// lock key `lock` uses the queue, announcing on `channel`.
    pub(crate) fn queueing<'a>(
        &'a self,
        channel: &'a str,
        entry_lifetime: Duration,
    ) -> Queueing<'a> {
        Queueing {
            entry_lifetime,
            arrival: None,
            channel,
            publish: self.publish(),
            wake_tag: self.wakeups().tag(),
        }
    }

    /// The bound on every request.
    pub fn request_timeout(&self) -> Duration {
        self.inner.connection.request_timeout()
    }

    /// The expiry each grant gives the key's fencing counter; `None`: counters never expire
    /// (see [`RedisLockBuilder::with_fence_ttl`]).
    pub fn fence_ttl(&self) -> Option<Duration> {
        self.inner.fence_ttl
    }

    /// The answer of a renewal of `key`, with what the clock watch found comparing the server's
    /// clock it carries with the last one of the same server (see [`Self::clock_ahead`]).
    pub(crate) fn watch_clock(&self, key: &str, timed: Timed<Extension>) -> Extension {
        let ahead = self.clock_ahead(key, timed.clock);
        timed.answer.with_clock_ahead(ahead)
    }

    /// How far the server that holds `key` (its hash slot's on a cluster) ran ahead of this
    /// client since the clock watch's last reading of it.
    fn clock_ahead(&self, key: &str, clock: ClockReading) -> Option<Duration> {
        let server = if self.is_cluster() {
            u64::from(keys::hash_slot(key.as_bytes()))
        } else {
            0
        };
        self.inner.clock.observe(server, clock)
    }

    pub(crate) fn wakeups(&self) -> &Wakeups {
        &self.inner.wakeups
    }

    /// Who takes locks through this client (see [`RedisLockBuilder::with_owner`]).
    pub fn owner(&self) -> &Owner {
        &self.inner.owner
    }

    /// One run of the acquire script.
    pub(crate) async fn attempt(&self, call: AcquireCall<'_>) -> Result<AcquireReply> {
        let (reply, acknowledged) = on_server!(self, "acquire", |con| call.run(&mut con).await)?;
        if let (AcquireReply::Granted(_), Some(acks)) = (&reply, self.inner.acks) {
            if let Err(unacknowledged) = acks.check("acquire", acknowledged) {
                let release = ReleaseCall {
                    lock_key: call.lock_key,
                    owner: call.owner,
                    channel: call.queue.channel,
                    publish: call.queue.publish,
                    wake_tag: call.queue.wake_tag,
                    keep_place: None,
                };
                let release = |mut con| async move { release.run(&mut con).await };
                return Err(self.take_back(unacknowledged, release).await);
            }
        }
        Ok(reply)
    }

    /// A grant the replicas did not acknowledge is never returned as held: `release` takes it
    /// back (a failed release leaves it to its TTL), and the caller returns `unacknowledged`.
    pub(crate) async fn take_back<T, F, Fut>(&self, unacknowledged: Error, release: F) -> Error
    where
        F: FnOnce(RedisConnection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        if let Err(error) = self.inner.connection.run("release", release).await {
            tracing::warn!(%error, "redis: an unacknowledged grant could not be released; it expires with its TTL");
        }
        unacknowledged
    }

    /// What the server holds for the lock key `lock` ([`scripts::peek`]).
    async fn peek(&self, lock: String) -> Result<scripts::Peek> {
        let fence = keys::fence_key(&lock);
        self.inner
            .connection
            .run("inspect", |mut con| async move {
                scripts::peek(&mut con, &lock, &fence).await
            })
            .await
    }

    /// The lock keys starting with `start` that have an owner record, found by `SCAN` page by
    /// page (on each primary of a cluster); a key may show up twice if a slot moves meanwhile.
    async fn scan_owner_records(&self, start: &str) -> Result<Vec<String>> {
        let nodes: Vec<Option<u16>> = if self.is_cluster() {
            self.inner
                .connection
                .run("list", |mut con| async move {
                    cluster::primaries(&mut con).await
                })
                .await?
                .into_iter()
                .map(Some)
                .collect()
        } else {
            vec![None]
        };
        let mut locks = Vec::new();
        for node in nodes {
            let mut cursor = 0;
            loop {
                let (next, names): (u64, Vec<String>) = self
                    .inner
                    .connection
                    .run("list", |mut con| async move {
                        let page = scripts::scan_owner_records(cursor);
                        cluster::run_on(&mut con, node, page).await
                    })
                    .await?;
                locks.extend(keys::lock_keys_under(&names, start));
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        locks.sort_unstable();
        locks.dedup();
        Ok(locks)
    }

    /// Runs `call` on the connection with `WAIT` behind each of its commands
    /// ([`Acknowledged`]), bounded by the request timeout plus the replica timeout.
    pub(crate) async fn acknowledged<T, F, Fut>(
        &self,
        op: &'static str,
        acks: &Acks,
        call: F,
    ) -> Result<T>
    where
        F: FnOnce(Acknowledged<RedisConnection>) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        self.inner
            .connection
            .run_longer(op, acks.timeout, |con| call(Acknowledged::new(con, acks)))
            .await
    }
}

#[async_trait]
impl DistributedLock for RedisLock {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Self::CAPABILITIES
    }

    /// A semaphore, read-write lock or election on this client's connection; see
    /// [`protocol::primitives`](crate::protocol::primitives) for the layout.
    fn primitive(&self, primitive: &Primitive) -> Result<Arc<dyn DistributedLock>> {
        primitive.validate()?;
        Ok(Arc::new(RedisView::new(self.clone(), primitive.clone())))
    }

    /// One attempt that never enqueues; it does not jump the queue either (a free lock with
    /// waiters is busy).
    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        let names = AttemptNames::new(self, req);
        let sent = Instant::now();
        Ok(
            match self
                .attempt(names.call(self, req.ttl, Duration::ZERO))
                .await?
            {
                AcquireReply::Granted(token) => Attempt::Acquired(Grant::new(token, sent)),
                AcquireReply::Busy { pttl, .. } => Attempt::Busy { retry_after: pttl },
            },
        )
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        let lock = self.inner.layout.lock_key(lease.key);
        let owner = lease.owner.to_hex();
        let Some(acks) = self.inner.acks else {
            let timed = self
                .inner
                .connection
                .run("extend", |mut con| {
                    let (lock, owner) = (&lock, &owner);
                    async move { scripts::extend(&mut con, lock, owner, ttl).await }
                })
                .await?;
            return Ok(self.watch_clock(&lock, timed));
        };
        let (timed, acknowledged) = self
            .acknowledged("extend", &acks, |mut con| {
                let (lock, owner) = (&lock, &owner);
                async move {
                    let extension = scripts::extend(&mut con, lock, owner, ttl).await;
                    extension.map(|e| (e, con.acknowledged))
                }
            })
            .await?;
        let extension = self.watch_clock(&lock, timed);
        if extension.is_extended() {
            acks.check("extend", acknowledged)?;
        }
        Ok(extension)
    }

    /// One [`EXTEND_MANY`](scripts::EXTEND_MANY) script per [`EXTEND_BATCH`] leases on the
    /// shared connection, instead of one request per lease.
    async fn extend_many(&self, requests: &[ExtendRequest<'_>]) -> Vec<Result<Extension>> {
        let lock_keys: Vec<String> = requests
            .iter()
            .map(|r| self.inner.layout.lock_key(r.lease.key))
            .collect();
        // A cluster runs one script per slot; one server takes them in order.
        let batches: Vec<Vec<usize>> = if self.is_cluster() {
            cluster::slot_batches(&lock_keys, EXTEND_BATCH)
        } else {
            let all: Vec<usize> = (0..requests.len()).collect();
            all.chunks(EXTEND_BATCH).map(<[usize]>::to_vec).collect()
        };
        let mut answers: Vec<Option<Result<Extension>>> = requests.iter().map(|_| None).collect();
        for chunk in batches {
            let locks: Vec<(String, String, Duration)> = chunk
                .iter()
                .map(|&i| {
                    let r = &requests[i];
                    (lock_keys[i].clone(), r.lease.owner.to_hex(), r.ttl)
                })
                .collect();
            let acks = self.inner.acks;
            let result = self
                .inner
                .connection
                .run_longer(
                    "extend",
                    acks.map_or(Duration::ZERO, |a| a.timeout),
                    |con| async move {
                        let triples: Vec<(&str, &str, Duration)> = locks
                            .iter()
                            .map(|(lock, owner, ttl)| (lock.as_str(), owner.as_str(), *ttl))
                            .collect();
                        let Some(acks) = acks else {
                            let mut con = con;
                            return scripts::extend_many(&mut con, &triples).await;
                        };
                        let mut con = Acknowledged::new(con, &acks);
                        let codes = scripts::extend_many(&mut con, &triples).await?;
                        if acks.check("extend", con.acknowledged).is_ok() {
                            return Ok(codes);
                        }
                        Err(redis::RedisError::from(std::io::Error::other(format!(
                            "extend: acknowledged by {} of the {} replica(s) required within {:?}",
                            con.acknowledged.unwrap_or(0),
                            acks.replicas,
                            acks.timeout
                        ))))
                    },
                )
                .await;
            match result {
                Ok(timed) => {
                    // A chunk is one script on one server (one slot of a cluster).
                    let ahead = chunk
                        .first()
                        .and_then(|&i| self.clock_ahead(&lock_keys[i], timed.clock));
                    for (&i, code) in chunk.iter().zip(timed.answer) {
                        answers[i] = Some(Ok(code.with_clock_ahead(ahead)));
                    }
                }
                Err(error) => {
                    // The whole chunk failed alike: each lease gets the same error.
                    let (temporary, message) = (error.is_temporary(), error.to_string());
                    let mut first = Some(error);
                    for &i in &chunk {
                        answers[i] = Some(Err(first.take().unwrap_or_else(|| {
                            dlock_core::Error::backend(BACKEND, temporary, message.clone())
                        })));
                    }
                }
            }
        }
        answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    Err(dlock_core::Error::backend(
                        BACKEND,
                        false,
                        "extend: the server answered fewer leases than asked",
                    ))
                })
            })
            .collect()
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        let lock = self.inner.layout.lock_key(lease.key);
        let channel = self.release_channel(&lock);
        let owner = lease.owner.to_hex();
        let release = ReleaseCall {
            lock_key: &lock,
            owner: &owner,
            channel: &channel,
            publish: self.publish(),
            wake_tag: self.wakeups().tag(),
            keep_place: None,
        };
        let (released, acknowledged) =
            on_server!(self, "release", |con| release.run(&mut con).await)?;
        if let (Released::Released, Some(acks)) = (released, self.inner.acks) {
            acks.check("release", acknowledged)?;
        }
        Ok(released)
    }

    /// Reads the lock key, its remaining TTL and its owner record with [`scripts::peek`]. The
    /// holder's fencing token and owner come from the owner record when its owner token is the
    /// lock key's value (the grant that wrote both); a holder without one — another client's
    /// plain `SET NX`, which does not count — has neither. The number of waiting acquires is the
    /// size of the lock's queue (`ZCARD`; an entry of a crashed waiter counts until it lapses
    /// and an attempt prunes it); their order is not reported.
    async fn inspect(&self, key: &LockKey) -> Result<Holding> {
        let lock = self.inner.layout.lock_key(key);
        let queue = keys::queue_key(&lock);
        let seen = self.peek(lock).await?;
        let waiting: usize = self
            .inner
            .connection
            .run("inspect", |mut con| async move {
                redis::cmd("ZCARD").arg(&queue).query_async(&mut con).await
            })
            .await?;
        Ok(match seen.holder {
            Some(_) => Holding::Held(seen.holder_view().with_waiting(waiting)),
            None => Holding::Free,
        })
    }

    /// Scans the owner records (`SCAN … MATCH dlock:owner:*`, page by page, on every primary of
    /// a cluster), keeps those of lock keys under this client's prefix and `prefix`, and looks
    /// at each lock as [`inspect`](Self::inspect) does; a record whose lock is gone or held by
    /// someone else (a record outlives its lock by at most a moment) is not listed.
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let ours = self.inner.layout.prefix();
        let start = format!("{ours}{prefix}");
        let locks = self.scan_owner_records(&start).await?;
        let mut held = Vec::new();
        // A few reads in flight at a time on the multiplexed connection.
        for chunk in locks.chunks(LIST_READS) {
            let seen = futures::future::try_join_all(chunk.iter().map(|l| self.peek(l.clone())));
            for (lock, seen) in chunk.iter().zip(seen.await?) {
                let name = lock.strip_prefix(ours).unwrap_or(lock);
                if seen.holders_record().is_some() {
                    held.push(HeldLock::new(name, seen.holder_view()));
                }
            }
        }
        Ok(held)
    }

    /// One [`EVICT`](scripts::EVICT) script: compares the expected token with the owner
    /// record's, deletes the lock and its record, and announces it on the release channel as a
    /// release does. The fencing counter stays, so the next grant's token is greater; the
    /// evicted lease finds its key gone (or another owner's) at its next renewal and turns lost.
    async fn evict(&self, key: &LockKey, expected: Option<FencingToken>) -> Result<Eviction> {
        let lock = self.inner.layout.lock_key(key);
        let channel = self.release_channel(&lock);
        let sharded = self.is_cluster();
        let Some(acks) = self.inner.acks else {
            let reply = self
                .inner
                .connection
                .run("evict", |mut con| async move {
                    scripts::evict(&mut con, &lock, expected, &channel, sharded).await
                })
                .await?;
            return Ok(reply);
        };
        // With `min_replicas`, an eviction the replicas did not acknowledge is an error, as a
        // release is: a failover could bring the holder back.
        let (reply, acknowledged) = self
            .acknowledged("evict", &acks, |mut con| async move {
                let reply = scripts::evict(&mut con, &lock, expected, &channel, sharded).await;
                reply.map(|r| (r, con.acknowledged))
            })
            .await?;
        if matches!(reply, Eviction::Evicted(_)) {
            acks.check("evict", acknowledged)?;
        }
        Ok(reply)
    }

    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        let channel = self.release_channel(&self.inner.layout.lock_key(key));
        let registration = self.wakeups().register(&channel, None);
        let notified = registration.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        self.wakeups().subscribed(&registration, until).await;
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep_until(until) => {}
        }
        Ok(())
    }

    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        let names = AttemptNames::new(self, req);
        // One record for the whole wait: `since` is when the lock was requested.
        let call = names.call(self, req.ttl, req.ttl);
        let wakeups = [self.wakeups()];
        let listeners = Listeners {
            wakeups: &wakeups,
            quorum: 1,
            subscribe_within: self.request_timeout(),
            channel: &names.channel,
            owner: &names.owner,
        };
        let attempt = || async move {
            let sent = Instant::now();
            Ok(round(self.attempt(call).await?, sent))
        };
        waiting::wait_for_lock(self, req, deadline, retry, &listeners, attempt).await
    }
}

/// A waiting acquire's view of an attempt's reply: the head comes back at the holder's expiry
/// and polls a holder whose release is not announced; the second in line comes back when the
/// head's entry lapses.
fn round(reply: AcquireReply, sent: Instant) -> Round {
    match reply {
        AcquireReply::Granted(token) => Round::Granted(Grant::new(token, sent)),
        AcquireReply::Busy {
            pttl,
            head,
            foreign,
            head_lapses_in,
        } => Round::Busy {
            come_back_in: if head { pttl } else { head_lapses_in },
            poll: head && (foreign || pttl.is_none()),
        },
    }
}

/// The names one acquire of a lock uses, made once per `lock()` or `try_lock()`.
pub(crate) struct AttemptNames {
    pub(crate) lock: String,
    pub(crate) fence: String,
    pub(crate) owner: String,
    /// The owner record's JSON: `since` is when the lock was requested.
    pub(crate) record: String,
    pub(crate) channel: String,
}

impl AttemptNames {
    pub(crate) fn new(client: &RedisLock, req: &LockRequest<'_>) -> Self {
        let lock = client.layout().lock_key(req.key);
        AttemptNames {
            fence: keys::fence_key(&lock),
            owner: req.owner.to_hex(),
            record: client.owner().record().to_json(),
            channel: client.release_channel(&lock),
            lock,
        }
    }

    /// An attempt with a lease of `ttl` whose queue entry lives `entry_lifetime` (zero: never
    /// enqueue).
    pub(crate) fn call<'a>(
        &'a self,
        client: &'a RedisLock,
        ttl: Duration,
        entry_lifetime: Duration,
    ) -> AcquireCall<'a> {
        AcquireCall {
            lock_key: &self.lock,
            fence_key: &self.fence,
            owner: &self.owner,
            record: &self.record,
            ttl,
            fence_ttl: client.fence_ttl(),
            least_start: None,
            queue: client.queueing(&self.channel, entry_lifetime),
        }
    }
}

impl fmt::Debug for RedisLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLock")
            .field("endpoint", &self.endpoint())
            .field("prefix", &self.inner.layout.prefix())
            .field("request_timeout", &self.request_timeout())
            .field("fence_ttl", &self.inner.fence_ttl)
            .field("min_replicas", &self.inner.acks.map_or(0, |a| a.replicas))
            .finish()
    }
}
