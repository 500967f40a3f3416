//! The Redis backend: dlock's implementor contract on one Redis server.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{
    Attempt, Backoff, Capabilities, DistributedLock, ExtendRequest, Extension, FencingGuarantee,
    Grant, Holding, LeaseRef, LockKey, LockRequest, Released, Result,
};
use tokio::time::Instant;

use crate::builder::RedisLockBuilder;
use crate::cluster::{self, ClusterInfo, RedisConnection};
use crate::connection::Connection;
use crate::endpoint::Endpoint;
use crate::error::BACKEND;
use crate::protocol::keys::{self, KeyLayout, LockKeys};
use crate::protocol::scripts::{self, AcquireReply};
use crate::wakeups::Wakeups;

/// How many leases one [`EXTEND_MANY`](scripts::EXTEND_MANY) call renews at most: large enough
/// that 10,000 leases take a handful of round trips, small enough that one call keeps the server
/// busy for about a millisecond at most.
pub const EXTEND_BATCH: usize = 500;

/// Locks on one Redis server (a standalone server or a primary with asynchronous replicas).
///
/// Clones share one multiplexed connection and one subscriber connection; make one per process
/// and share it, usually as `Arc<dyn DistributedLock>`. Dropping the last clone closes both.
/// See the [crate docs](crate) for the key layout, the fencing guarantee and how waiting works.
#[derive(Clone)]
pub struct RedisLock {
    inner: Arc<Inner>,
}

struct Inner {
    connection: Connection,
    layout: KeyLayout,
    wakeups: Wakeups,
    endpoint: Endpoint,
    fence_ttl: Option<Duration>,
    /// Set for a client of a Redis Cluster.
    cluster: Option<ClusterInfo>,
}

impl RedisLock {
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

    pub(crate) fn new(
        connection: Connection,
        layout: KeyLayout,
        wakeups: Wakeups,
        endpoint: Endpoint,
        fence_ttl: Option<Duration>,
        cluster: Option<ClusterInfo>,
    ) -> Self {
        RedisLock {
            inner: Arc::new(Inner {
                connection,
                layout,
                wakeups,
                endpoint,
                fence_ttl,
                cluster,
            }),
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
            None => self.inner.endpoint.redacted(),
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

    /// The bound on every request.
    pub fn request_timeout(&self) -> Duration {
        self.inner.connection.request_timeout()
    }

    /// The expiry each grant gives the key's fencing counter; `None`: counters never expire
    /// (see [`RedisLockBuilder::with_fence_ttl`]).
    pub fn fence_ttl(&self) -> Option<Duration> {
        self.inner.fence_ttl
    }

    pub(crate) fn wakeups(&self) -> &Wakeups {
        &self.inner.wakeups
    }

    /// One run of the acquire script on `lock` and its counter `fence`.
    pub(crate) async fn attempt(
        &self,
        lock: &str,
        fence: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<AcquireReply> {
        let fence_ttl = self.inner.fence_ttl;
        self.inner
            .connection
            .run("acquire", |mut con| async move {
                scripts::acquire(&mut con, lock, fence, owner, ttl, fence_ttl).await
            })
            .await
    }
}

#[async_trait]
impl DistributedLock for RedisLock {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(FencingGuarantee::MonotonicWhileDataSurvives).with_notifications()
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        let lock = self.inner.layout.lock_key(req.key);
        let fence = keys::fence_key(&lock);
        let owner = req.owner.to_hex();
        let sent = Instant::now();
        Ok(match self.attempt(&lock, &fence, &owner, req.ttl).await? {
            AcquireReply::Granted(token) => Attempt::Acquired(Grant::new(token, sent)),
            AcquireReply::Busy { pttl } => Attempt::Busy { retry_after: pttl },
        })
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        let lock = self.inner.layout.lock_key(lease.key);
        let owner = lease.owner.to_hex();
        self.inner
            .connection
            .run("extend", |mut con| async move {
                scripts::extend(&mut con, &lock, &owner, ttl).await
            })
            .await
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
            let result = self
                .inner
                .connection
                .run("extend", |mut con| async move {
                    let triples: Vec<(&str, &str, Duration)> = locks
                        .iter()
                        .map(|(lock, owner, ttl)| (lock.as_str(), owner.as_str(), *ttl))
                        .collect();
                    scripts::extend_many(&mut con, &triples).await
                })
                .await;
            match result {
                Ok(codes) => {
                    for (&i, code) in chunk.iter().zip(codes) {
                        answers[i] = Some(Ok(code));
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
        let sharded = self.is_cluster();
        self.inner
            .connection
            .run("release", |mut con| async move {
                if sharded {
                    scripts::release_sharded(&mut con, &lock, &owner, &channel).await
                } else {
                    scripts::release(&mut con, &lock, &owner, &channel).await
                }
            })
            .await
    }

    /// Reads the lock key and its remaining TTL with [`scripts::peek`]. The holder's fencing
    /// token is reported as unknown: the counter holds the token of the last grant by a dlock
    /// client, but the lock may since have been taken by another client with a plain `SET NX`
    /// (which does not count), and its value cannot tell: redis-py's tokens, for one, look like
    /// ours.
    async fn inspect(&self, key: &LockKey) -> Result<Holding> {
        let keys = self.keys(key);
        let seen = self
            .inner
            .connection
            .run("inspect", |mut con| async move {
                scripts::peek(&mut con, &keys.lock, &keys.fence).await
            })
            .await?;
        if seen.holder.is_none() {
            return Ok(Holding::Free);
        }
        Ok(Holding::Held {
            fencing: None,
            expires_in: seen.pttl,
        })
    }

    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        let channel = self.release_channel(&self.inner.layout.lock_key(key));
        let registration = self.wakeups().register(&channel);
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
        self.wait_for_lock(req, deadline, retry).await
    }
}

impl fmt::Debug for RedisLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLock")
            .field("endpoint", &self.endpoint())
            .field("prefix", &self.inner.layout.prefix())
            .field("request_timeout", &self.request_timeout())
            .field("fence_ttl", &self.inner.fence_ttl)
            .finish()
    }
}
