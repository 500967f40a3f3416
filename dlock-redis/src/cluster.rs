//! Locks on a Redis Cluster: the settings, the command connection, the release channel of a
//! lock's shard and the listener that subscribes to it.
//!
//! * **One slot per lock.** Every script touches the lock key and, for a grant, its fencing
//!   counter; the counter's name is built to hash to the lock key's slot (see
//!   [`keys::fence_key`]), so each script runs on one node, as Redis Cluster requires. The
//!   key layout is the single server's, unchanged.
//! * **Redirects and migrations** are followed by the `redis` crate's cluster client: `MOVED`
//!   updates its slot map, `ASK` sends the one request to the importing node, and `TRYAGAIN`
//!   (a script whose two keys are split by a migration in progress) is retried after a short
//!   pause — all within the request timeout. A migration moves both keys of a lock in one
//!   `MIGRATE`, and the server refuses a script whose keys are split, so a grant never sees half
//!   a lock.
//! * **Replica acknowledgement** (`min_replicas`): the lock script and its `WAIT` go as one
//!   pipeline, which the cluster client routes by the script's key (`WAIT` names no key) to the
//!   primary that owns the lock's slot, on its one connection to that node: the count `WAIT`
//!   answers is for that write, as on a single server (see [`crate::replicas`]).
//! * **Release notifications are sharded** (`SPUBLISH` / `SSUBSCRIBE`, Redis 7): a sharded
//!   message stays on the shard that owns its channel's slot instead of being broadcast to every
//!   node, and a script may only publish on a channel of its own slot. So in a cluster the
//!   release channel carries the lock key's hash tag ([`release_channel`]), and the release
//!   script publishes with `SPUBLISH` ([`scripts::RELEASE`]).
//! * **The listener** holds one cluster connection in RESP3 (subscriptions on a multiplexed
//!   connection arrive as push messages) and subscribes each channel on the node that owns its
//!   slot. When a slot moves, its owner ends the subscriptions of its channels (`sunsubscribe`
//!   push); the listener subscribes them again, which the client routes to the new owner.
//!   Waiters poll meanwhile, as they do whenever a notification may be missed.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

#[cfg(feature = "tls")]
use dlock_core::backend::tls::TlsFiles;
use dlock_core::backend::url::ConnectUrl;
use dlock_core::{Error, Owner, Result};
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, PushInfo, PushKind, RedisFuture, Value};
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::builder::RedisLockBuilder;
use crate::client::{Inner, RedisLock};
use crate::connection::Connection;
use crate::error;
use crate::protocol::keys::{self, KeyLayout};
use crate::replicas::Acks;
use crate::url::{Endpoint, TakeReplicas};
use crate::wakeups::{Feed, Wakeups};

/// The command connection of a client: to one server, or to a cluster. Both run any command;
/// the cluster one routes each to the node that owns its keys.
#[derive(Clone)]
pub enum RedisConnection {
    /// One server (reconnecting).
    Server(ConnectionManager),
    /// A Redis Cluster: one connection per node, routed by slot, following redirects.
    Cluster(ClusterConnection),
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConnection::Server(con) => con.req_packed_command(cmd),
            RedisConnection::Cluster(con) => con.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConnection::Server(con) => con.req_packed_commands(pipeline, offset, count),
            RedisConnection::Cluster(con) => con.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Server(con) => con.get_db(),
            RedisConnection::Cluster(con) => con.get_db(),
        }
    }
}

/// The client library's TLS settings from `files`, read and checked (see
/// [`TlsFiles::load`](dlock_core::backend::tls::TlsFiles::load)): errors name the setting and the path,
/// never the contents. Without `ca`, nodes are verified against the system's roots.
#[cfg(feature = "tls")]
fn certificates(files: &TlsFiles) -> Result<redis::TlsCertificates> {
    if files.server_name.is_some() {
        return Err(Error::invalid(
            "tls_server_name",
            "is not supported for a Redis Cluster: each node's certificate is checked against \
             the host the cluster announces for it",
        ));
    }
    crate::url::certificates(files)
}

/// Where a cluster is and how to log in; set through [`RedisLockBuilder::cluster`] and the
/// `with_cluster_*` setters. Its `Debug` never shows the password.
#[derive(Clone, Default)]
pub struct ClusterSettings {
    seeds: Vec<String>,
    username: Option<String>,
    password: Option<String>,
    #[cfg(feature = "tls")]
    tls: Option<TlsFiles>,
}

impl fmt::Debug for ClusterSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("ClusterSettings");
        out.field("seeds", &self.seeds)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"));
        #[cfg(feature = "tls")]
        out.field("tls", &self.tls);
        out.finish()
    }
}

impl ClusterSettings {
    /// The redacted description: `redis+cluster://[user:***@]h1:p1,h2:p2`.
    fn redacted(&self) -> String {
        let scheme = if self.tls_enabled() {
            "rediss+cluster://"
        } else {
            "redis+cluster://"
        };
        let auth =
            crate::url::redacted_userinfo(self.username.as_deref(), self.password.as_deref());
        format!("{scheme}{auth}{}", self.seeds.join(","))
    }

    fn tls_enabled(&self) -> bool {
        #[cfg(feature = "tls")]
        {
            self.tls.is_some()
        }
        #[cfg(not(feature = "tls"))]
        {
            false
        }
    }

    /// Checks the seeds (`host:port`), each parsed as a server URL would be.
    fn endpoints(&self) -> Result<Vec<Endpoint>> {
        if self.seeds.is_empty() {
            return Err(Error::invalid("cluster_seeds", "no seed node given"));
        }
        let scheme = if self.tls_enabled() {
            "rediss"
        } else {
            "redis"
        };
        self.seeds
            .iter()
            .map(|seed| {
                let seed = seed.trim();
                if seed.is_empty() || seed.contains(['/', '@', '?', '#']) {
                    return Err(Error::invalid(
                        "cluster_seeds",
                        format!("{seed:?} is not host:port"),
                    ));
                }
                Endpoint::parse(&format!("{scheme}://{seed}")).map_err(|e| match e {
                    Error::InvalidInput { message, .. } => {
                        Error::invalid("cluster_seeds", format!("{seed:?}: {message}"))
                    }
                    other => other,
                })
            })
            .collect()
    }

    /// The `redis` crate's cluster client for these settings.
    fn client(
        &self,
        endpoints: &[Endpoint],
        connect_timeout: Duration,
        request_timeout: Duration,
        pushes: Option<mpsc::UnboundedSender<PushInfo>>,
    ) -> Result<ClusterClient> {
        let mut builder = ClusterClientBuilder::new(
            endpoints
                .iter()
                .map(|e| e.connection_info().clone())
                .collect::<Vec<_>>(),
        )
        .connection_timeout(connect_timeout)
        .response_timeout(request_timeout)
        // TRYAGAIN during a migration and MOVED after one are retried quickly: the request
        // timeout bounds the whole call anyway.
        .retries(CLIENT_RETRIES)
        .min_retry_wait(10)
        .max_retry_wait(100)
        .tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        if let Some(username) = &self.username {
            builder = builder.username(username);
        }
        if let Some(password) = &self.password {
            builder = builder.password(password);
        }
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            builder = builder.certs(certificates(tls)?);
        }
        if let Some(pushes) = pushes {
            builder = builder
                .use_protocol(redis::ProtocolVersion::RESP3)
                .push_sender(pushes);
        }
        // Fails for inconsistent credentials or certificates: name neither's contents.
        builder
            .build()
            .map_err(|e| Error::invalid("cluster_seeds", format!("{:?}", e.kind())))
    }
}

impl RedisLockBuilder {
    /// Settings for a Redis Cluster reached through `seeds` (`host:port` of any of its nodes;
    /// the client learns the others from them), with an empty key prefix and the default
    /// timeouts. See the [crate docs](crate#redis-cluster) for what shares a slot and how waiting
    /// works there.
    ///
    /// ```no_run
    /// # async fn demo() -> dlock_core::Result<()> {
    /// use dlock_redis::RedisLockBuilder;
    ///
    /// let locks = RedisLockBuilder::cluster(["10.0.0.5:7000", "10.0.0.6:7000"])
    ///     .with_cluster_password("secret")
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn cluster<I, S>(seeds: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut builder = RedisLockBuilder::new("");
        builder.cluster = Some(ClusterSettings {
            seeds: seeds.into_iter().map(Into::into).collect(),
            ..ClusterSettings::default()
        });
        builder
    }

    /// The ACL user every node is logged in as (with [`with_cluster_password`](Self::with_cluster_password));
    /// the default user if unset. Ignored unless the builder is for a cluster.
    pub fn with_cluster_username(mut self, username: impl Into<String>) -> Self {
        if let Some(cluster) = &mut self.cluster {
            cluster.username = Some(username.into());
        }
        self
    }

    /// The password every node is logged in with (`AUTH`). Never shown in `Debug`, errors or
    /// logs. Ignored unless the builder is for a cluster.
    pub fn with_cluster_password(mut self, password: impl Into<String>) -> Self {
        if let Some(cluster) = &mut self.cluster {
            cluster.password = Some(password.into());
        }
        self
    }

    /// TLS to every node (`rediss+cluster://`). Ignored unless the builder is for a cluster.
    #[cfg(feature = "tls")]
    pub fn with_cluster_tls(mut self, tls: TlsFiles) -> Self {
        if let Some(cluster) = &mut self.cluster {
            cluster.tls = Some(tls);
        }
        self
    }
}

/// Whether `scheme` names a Redis Cluster (`redis+cluster`, `rediss+cluster`).
pub(crate) fn is_cluster_scheme(scheme: &str) -> bool {
    matches!(scheme, "redis+cluster" | "rediss+cluster")
}

/// Refuses the TLS parameters on `redis+cluster://`, which does not take them.
fn refuse_tls_files(url: &mut ConnectUrl) -> Result<()> {
    for name in dlock_core::backend::tls::TLS_PARAMETERS {
        if url.take(name).is_some() {
            return Err(url.invalid(format!("parameter `{name}` is only for rediss+cluster://")));
        }
    }
    Ok(())
}

/// `redis+cluster://[user[:password]@]host:port[,host:port…][?parameters]` and
/// `rediss+cluster://…?ca=PATH[&cert=PATH&key=PATH]`: the seeds, the credentials every node is
/// logged in with, TLS files, then the settings every Redis URL takes.
pub(crate) fn from_connect_url(url: &mut ConnectUrl) -> Result<RedisLockBuilder> {
    let seeds: Vec<String> = url.hosts()?.into_iter().map(str::to_owned).collect();
    if !matches!(url.path(), "" | "/" | "/0") {
        return Err(url.invalid("a Redis Cluster has only database 0: no path"));
    }
    if url.fragment().is_some() {
        return Err(url.invalid("a fragment is not taken here"));
    }
    let mut builder = RedisLockBuilder::cluster(seeds);
    if let Some(credentials) = url.credentials() {
        let (user, password) = (credentials.user.clone(), credentials.password.clone());
        if !user.is_empty() {
            builder = builder.with_cluster_username(user);
        }
        if let Some(password) = password {
            builder = builder.with_cluster_password(password);
        }
    }
    if url.scheme() == "rediss+cluster" {
        builder = tls_from_url(url, builder)?;
    } else {
        refuse_tls_files(url)?;
    }
    Ok(dlock_core::backend::apply_parameters!(url, builder, {
        "prefix" => take_text => RedisLockBuilder::with_prefix,
        "request_timeout" => take_duration => RedisLockBuilder::with_request_timeout,
        "connect_timeout" => take_duration => RedisLockBuilder::with_connect_timeout,
        "fence_ttl" => take_duration => RedisLockBuilder::with_fence_ttl,
        "min_replicas" => take_replicas => RedisLockBuilder::with_min_replicas,
        "replica_timeout" => take_duration => RedisLockBuilder::with_replica_timeout,
        "owner" => take_text => RedisLockBuilder::with_owner,
    }))
}

#[cfg(feature = "tls")]
fn tls_from_url(url: &mut ConnectUrl, builder: RedisLockBuilder) -> Result<RedisLockBuilder> {
    let files = TlsFiles::from_url(url)?.unwrap_or_default();
    Ok(builder.with_cluster_tls(files))
}

#[cfg(not(feature = "tls"))]
fn tls_from_url(url: &mut ConnectUrl, _: RedisLockBuilder) -> Result<RedisLockBuilder> {
    Err(url.invalid("rediss+cluster:// (TLS) needs the `tls` feature of dlock-redis"))
}

/// What a client knows of the cluster it talks to.
#[derive(Debug)]
pub(crate) struct ClusterInfo {
    /// The seeds with the password hidden.
    redacted: String,
}

impl ClusterInfo {
    pub(crate) fn redacted(&self) -> &str {
        &self.redacted
    }
}

/// Connects a cluster client: the rest of [`RedisLockBuilder::connect`] once the common settings
/// are checked.
pub(crate) async fn connect(
    settings: ClusterSettings,
    layout: KeyLayout,
    connect_timeout: Duration,
    request_timeout: Duration,
    fence_ttl: Option<Duration>,
    acks: Option<Acks>,
    owner: Owner,
) -> Result<RedisLock> {
    let endpoints = settings.endpoints()?;
    let redacted = settings.redacted();
    let client = settings.client(&endpoints, connect_timeout, request_timeout, None)?;
    let span = tracing::debug_span!("dlock.redis.connect", endpoint = redacted.as_str());
    let connected = async {
        let mut con = client.get_async_connection().await?;
        redis::cmd("PING").query_async::<()>(&mut con).await?;
        Ok::<_, redis::RedisError>(con)
    };
    let con = tokio::time::timeout(connect_timeout, connected)
        .instrument(span)
        .await
        .map_err(|_| error::no_answer("connect", connect_timeout))?
        .map_err(connect_error)?;
    let connection = Connection::cluster(con, request_timeout);
    let (pushes, received) = mpsc::unbounded_channel();
    let listener_client =
        settings.client(&endpoints, connect_timeout, request_timeout, Some(pushes))?;
    let listener = Listener {
        client: listener_client,
        pushes: received,
        connect_timeout,
        request_timeout,
        endpoint: redacted.clone(),
    };
    let wakeups = Wakeups::start_with(move |feed| listener.run(feed), Wakeups::new_tag());
    let first = endpoints
        .into_iter()
        .next()
        .ok_or_else(|| Error::invalid("cluster_seeds", "no seed node given"))?;
    Ok(RedisLock::new(Inner {
        connection,
        layout,
        wakeups,
        endpoint: first.redacted().to_owned(),
        fence_ttl,
        acks,
        cluster: Some(ClusterInfo { redacted }),
        owner,
        clock: dlock_core::backend::clock::ClockWatch::new(crate::error::BACKEND),
    }))
}

/// Classifies a failed cluster connect. The cluster client reports a refusal of the first
/// connections as an I/O error whose text names the cause, so refused credentials would look
/// like an unreachable cluster; they are a permanent error instead (retrying will not help).
fn connect_error(e: redis::RedisError) -> Error {
    let refused = e.kind() == redis::ErrorKind::AuthenticationFailed
        || e.detail().is_some_and(|detail| {
            detail.contains("AuthenticationFailed") || detail.contains("WRONGPASS")
        });
    if refused {
        return Error::backend(
            error::BACKEND,
            false,
            "connect: the cluster refused the user name or password",
        );
    }
    error::from_redis("connect", e)
}

/// The channel a release of `lock_key` is announced on in a cluster: in the lock key's slot, so
/// the release script may `SPUBLISH` on it.
///
/// * a lock key with a hash tag keeps it: `dlock:released:jobs:{t7}:nightly` (the single
///   server's channel name);
/// * a lock key without braces is wrapped in one: `dlock:released:{jobs/nightly}`;
/// * a lock key with a `}` but no valid hash tag gets its slot's numeric tag in front:
///   `dlock:released:{5061}a}b`.
pub(crate) fn release_channel(lock_key: &str) -> String {
    if keys::hash_tag(lock_key.as_bytes()).is_some() {
        return keys::release_channel(lock_key);
    }
    if !lock_key.contains('}') {
        return format!("{}{{{lock_key}}}", keys::RELEASE_CHANNEL_PREFIX);
    }
    let tag = keys::slot_tag(keys::hash_slot(lock_key.as_bytes()));
    format!("{}{{{tag}}}{lock_key}", keys::RELEASE_CHANNEL_PREFIX)
}

/// One slot of each primary of the cluster (from `CLUSTER SLOTS`), to route a command that
/// names no key — `SCAN` — to every primary once.
pub(crate) async fn primaries(con: &mut RedisConnection) -> redis::RedisResult<Vec<u16>> {
    let ranges: Vec<Value> = redis::cmd("CLUSTER").arg("SLOTS").query_async(con).await?;
    let mut first_slot: BTreeMap<Vec<u8>, u16> = BTreeMap::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            continue;
        };
        let start: Option<u16> = fields
            .first()
            .and_then(|v| redis::from_redis_value(v.clone()).ok());
        // The primary: `[host, port, id, …]`; told apart by address and port (the id is only
        // there since Redis 4).
        let primary = match fields.get(2) {
            Some(Value::Array(node)) => node.iter().take(2).fold(Vec::new(), |mut id, part| {
                if let Ok(text) = redis::from_redis_value::<String>(part.clone()) {
                    id.extend(text.bytes());
                    id.push(b' ');
                }
                id
            }),
            _ => continue,
        };
        if let Some(start) = start {
            first_slot.entry(primary).or_insert(start);
        }
    }
    Ok(first_slot.into_values().collect())
}

/// Runs `command` (one that names no key, such as `SCAN`) on the one server, or on the primary
/// that owns `slot` in a cluster.
pub(crate) async fn run_on<T: redis::FromRedisValue>(
    con: &mut RedisConnection,
    slot: Option<u16>,
    command: Cmd,
) -> redis::RedisResult<T> {
    match (con, slot) {
        (RedisConnection::Cluster(con), Some(slot)) => {
            use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
            let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
            let answer = con
                .route_command(command, RoutingInfo::SingleNode(route))
                .await?;
            Ok(redis::from_redis_value(answer)?)
        }
        (con, _) => command.query_async(con).await,
    }
}

/// The indexes of `lock_keys` grouped so that each group is in one slot and at most `batch`
/// long, each group in the order given: one multi-key script per group.
pub(crate) fn slot_batches(lock_keys: &[String], batch: usize) -> Vec<Vec<usize>> {
    let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    for (index, key) in lock_keys.iter().enumerate() {
        by_slot
            .entry(keys::hash_slot(key.as_bytes()))
            .or_default()
            .push(index);
    }
    by_slot
        .into_values()
        .flat_map(|indexes| {
            indexes
                .chunks(batch.max(1))
                .map(<[usize]>::to_vec)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// How often the cluster client retries one request (after `MOVED`, `ASK`, `TRYAGAIN` or a
/// reconnection), 10 to 100 ms apart: enough to outlast a slot migration's split moment, and
/// bounded by the request timeout anyway. (The client computes `10 · 2^retry` ms before capping
/// it, which overflows past about 60 retries.)
const CLIENT_RETRIES: u32 = 40;

/// How often channels that lost their subscription (a slot moved, a request failed) are
/// subscribed again while tasks wait on them.
const RESUBSCRIBE_EVERY: Duration = Duration::from_millis(500);
/// How often channels without waiters are unsubscribed.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// The pause between attempts to open the listener's connection.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// The background task that subscribes release channels on a cluster.
struct Listener {
    client: ClusterClient,
    pushes: mpsc::UnboundedReceiver<PushInfo>,
    connect_timeout: Duration,
    request_timeout: Duration,
    /// The redacted seeds, for logs.
    endpoint: String,
}

impl Listener {
    async fn run(mut self, mut feed: Feed) {
        // Opened on first need; the cluster connection then reconnects to each node by itself
        // and subscribes the channels it tracks again.
        let mut con = loop {
            if !feed.has_channels() && feed.requests.recv().await.is_none() {
                return;
            }
            match tokio::time::timeout(self.connect_timeout, self.client.get_async_connection())
                .await
            {
                Ok(Ok(con)) => break con,
                Ok(Err(error)) => {
                    tracing::debug!(endpoint = %self.endpoint, %error, "release notifications: cannot connect");
                }
                Err(_) => {
                    tracing::debug!(endpoint = %self.endpoint, "release notifications: connect timed out");
                }
            }
            feed.set_status(0, true);
            tokio::select! {
                _ = tokio::time::sleep(RETRY_PAUSE) => {}
                request = feed.requests.recv() => if request.is_none() { return },
            }
        };
        const EPOCH: u64 = 1;
        self.subscribe(&mut con, &feed, EPOCH).await;
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        let mut retry = tokio::time::interval(RESUBSCRIBE_EVERY);
        loop {
            tokio::select! {
                push = self.pushes.recv() => match push {
                    Some(push) => self.handle(push, &feed),
                    None => return,
                },
                request = feed.requests.recv() => {
                    if request.is_none() {
                        return;
                    }
                    while let Ok(()) = feed.requests.try_recv() {}
                    self.subscribe(&mut con, &feed, EPOCH).await;
                }
                _ = retry.tick() => self.subscribe(&mut con, &feed, EPOCH).await,
                _ = sweep.tick() => {
                    for channel in feed.take_idle() {
                        let done = con.sunsubscribe(&channel);
                        let _ = tokio::time::timeout(self.request_timeout, done).await;
                    }
                }
            }
        }
    }

    /// Wakes a waiter on a message; notes a subscription the server ended (its slot moved).
    fn handle(&self, push: PushInfo, feed: &Feed) {
        let channel = match push.data.first() {
            Some(Value::BulkString(name)) => String::from_utf8_lossy(name).into_owned(),
            _ => return,
        };
        match push.kind {
            PushKind::SMessage => {
                let payload = match push.data.get(1) {
                    Some(Value::BulkString(payload)) => payload.as_slice(),
                    _ => &[],
                };
                feed.wake(&channel, payload);
            }
            PushKind::SUnsubscribe if feed.unconfirm(&channel) => tracing::debug!(
                channel,
                "release notifications: the shard ended a subscription; subscribing again"
            ),
            _ => {}
        }
    }

    /// Subscribes every channel waited on but not confirmed, one `SSUBSCRIBE` per slot (sharded
    /// channels of one command must share a slot).
    async fn subscribe(&self, con: &mut ClusterConnection, feed: &Feed, epoch: u64) {
        let pending = feed.unconfirmed(epoch);
        if pending.is_empty() {
            return;
        }
        let mut failed = false;
        for group in slot_batches(&pending, usize::MAX) {
            let names: Vec<&str> = group.iter().map(|&i| pending[i].as_str()).collect();
            match tokio::time::timeout(self.request_timeout, con.ssubscribe(&names)).await {
                Ok(Ok(())) => feed.confirm(&names, epoch),
                Ok(Err(error)) => {
                    failed = true;
                    tracing::debug!(endpoint = %self.endpoint, %error, "release notifications: SSUBSCRIBE failed");
                }
                Err(_) => {
                    failed = true;
                    tracing::debug!(endpoint = %self.endpoint, "release notifications: SSUBSCRIBE timed out");
                }
            }
        }
        // Waiters of channels that are not subscribed poll rather than wait for a confirmation.
        feed.set_status(epoch, failed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_channels_share_the_lock_keys_slot() {
        for lock in ["jobs/nightly", "{t}:x", "a}b", "x{}y", "}", "{", "ключ"] {
            let channel = release_channel(lock);
            assert!(
                channel.starts_with(keys::RELEASE_CHANNEL_PREFIX),
                "{channel}"
            );
            assert!(channel.contains(lock), "{channel}");
            assert_eq!(
                keys::hash_slot(channel.as_bytes()),
                keys::hash_slot(lock.as_bytes()),
                "{lock:?} → {channel:?}"
            );
        }
        assert_eq!(
            release_channel("jobs/nightly"),
            "dlock:released:{jobs/nightly}"
        );
        assert_eq!(release_channel("a:{t}:b"), "dlock:released:a:{t}:b");
    }

    #[test]
    fn slot_batches_keep_one_slot_each_and_cover_every_index() {
        let keys: Vec<String> = (0..50).map(|i| format!("k{}", i % 7)).collect();
        let batches = slot_batches(&keys, 3);
        let mut seen: Vec<usize> = batches.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..50).collect::<Vec<_>>());
        for batch in &batches {
            assert!(batch.len() <= 3);
            let slot = keys::hash_slot(keys[batch[0]].as_bytes());
            assert!(batch
                .iter()
                .all(|&i| keys::hash_slot(keys[i].as_bytes()) == slot));
        }
    }

    #[tokio::test]
    async fn bad_cluster_settings_are_rejected_by_name_without_connecting() {
        let field = |result: Result<RedisLock>| match result {
            Err(Error::InvalidInput { field, .. }) => field,
            Err(other) => panic!("expected InvalidInput, got {other}"),
            Ok(_) => panic!("accepted"),
        };
        let none: [&str; 0] = [];
        assert_eq!(
            field(RedisLockBuilder::cluster(none).connect().await),
            "cluster_seeds"
        );
        assert_eq!(
            field(RedisLockBuilder::cluster(["redis://a:1"]).connect().await),
            "cluster_seeds"
        );
        assert_eq!(
            field(RedisLockBuilder::cluster(["a:notaport"]).connect().await),
            "cluster_seeds"
        );
        assert_eq!(
            field(
                RedisLockBuilder::cluster(["127.0.0.1:1"])
                    .with_request_timeout(Duration::ZERO)
                    .connect()
                    .await
            ),
            "request_timeout"
        );
    }

    fn url_error(url: &str) -> String {
        match RedisLockBuilder::from_url(url) {
            Err(Error::InvalidInput {
                field: "url",
                message,
            }) => message,
            Err(other) => panic!("{url}: expected InvalidInput(url), got {other}"),
            Ok(builder) => panic!("{url}: accepted as {builder:?}"),
        }
    }

    #[test]
    fn cluster_urls_give_the_seeds_credentials_and_settings() {
        let builder = RedisLockBuilder::from_url(
            "redis+cluster://app:s%40cret@h1:7000,h2:7001?prefix=billing:&request_timeout=2s",
        )
        .unwrap();
        let settings = builder.cluster.clone().unwrap();
        assert_eq!(settings.seeds, ["h1:7000", "h2:7001"]);
        assert_eq!(settings.username.as_deref(), Some("app"));
        assert_eq!(settings.password.as_deref(), Some("s@cret"));
        let shown = format!("{builder:?}");
        assert!(
            shown.contains("billing:") && shown.contains("2s"),
            "{shown}"
        );
        assert!(!shown.contains("cret"), "{shown}");
        let acknowledged =
            RedisLockBuilder::from_url("redis+cluster://h:1?min_replicas=1&replica_timeout=200ms")
                .unwrap();
        let shown = format!("{acknowledged:?}");
        assert!(
            shown.contains("min_replicas: 1") && shown.contains("replica_timeout: 200ms"),
            "{shown}"
        );
        assert!(url_error("redis+cluster://h:1?min_replicas=x").contains("min_replicas"));
        let no_user = RedisLockBuilder::from_url("redis+cluster://:pw@h:1").unwrap();
        assert_eq!(no_user.cluster.clone().unwrap().username, None);
    }

    #[test]
    fn bad_cluster_urls_say_what_is_wrong_without_the_password() {
        for (url, expected) in [
            ("redis+cluster://:hunter2@h:1/3", "database 0"),
            (
                "redis+cluster://:hunter2@h:1?ca=/ca.pem",
                "only for rediss+cluster",
            ),
            ("redis+cluster://:hunter2@h:1?db=2", "unknown parameter"),
            ("redis+cluster://:hunter2@h:1,,h:2", "empty"),
        ] {
            let message = url_error(url);
            assert!(message.contains(expected), "{url}: {message}");
            assert!(!message.contains("hunter2"), "{url}: {message}");
        }
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn a_tls_cluster_url_names_the_missing_feature() {
        assert!(url_error("rediss+cluster://h:1").contains("`tls` feature"));
    }

    #[cfg(feature = "tls")]
    #[test]
    fn a_tls_cluster_url_takes_its_files() {
        let builder =
            RedisLockBuilder::from_url("rediss+cluster://h:1?ca=/ca.pem&cert=/c.pem&key=/k.pem")
                .unwrap();
        let settings = builder.cluster.clone().unwrap();
        assert!(settings.tls_enabled());
        assert_eq!(settings.redacted(), "rediss+cluster://h:1");
        assert!(url_error("redis+cluster://h:1?ca=/ca.pem").contains("only for rediss+cluster"));
    }

    #[cfg(feature = "tls")]
    #[tokio::test]
    async fn unreadable_tls_files_are_named_by_path_never_by_contents() {
        let dir = std::env::temp_dir().join(format!("dlock-cluster-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("client.key");
        std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\nsecret-key-bytes\n").unwrap();
        let missing = dir.join("missing-ca.pem");
        let attempt = |tls: TlsFiles| async move {
            match RedisLockBuilder::cluster(["127.0.0.1:1"])
                .with_cluster_tls(tls)
                .connect()
                .await
            {
                Err(Error::InvalidInput { field, message }) => (field, message),
                Err(other) => panic!("expected InvalidInput, got {other}"),
                Ok(_) => panic!("connected with unusable TLS files"),
            }
        };
        let (field, message) = attempt(TlsFiles::new(&missing)).await;
        assert_eq!(field, "ca");
        assert!(message.contains("missing-ca.pem"), "{message}");
        // A key where a certificate belongs: named by its path, its contents never shown.
        let half = attempt(TlsFiles {
            cert: Some(key.clone()),
            ..TlsFiles::default()
        })
        .await;
        assert_eq!(half.0, "key", "a certificate without its key: {}", half.1);
        let (field, message) = attempt(TlsFiles::default().with_client_cert(&key, &key)).await;
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(field, "cert");
        assert!(message.contains("client.key"), "{message}");
        assert!(!message.contains("secret-key-bytes"), "{message}");
    }

    #[test]
    fn debug_never_shows_the_password() {
        let builder = RedisLockBuilder::cluster(["h1:7000", "h2:7001"])
            .with_cluster_username("app")
            .with_cluster_password("hunter2");
        let shown = format!("{builder:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        let settings = builder.cluster.clone().unwrap_or_default();
        assert_eq!(
            settings.redacted(),
            "redis+cluster://app:***@h1:7000,h2:7001"
        );
    }
}
