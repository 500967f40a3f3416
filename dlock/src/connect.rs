//! `dlock::connect`: from a URL to a connected backend.
//!
//! Each backend owns its schemes and parameters ([`FromUrl`]); this module only maps a scheme to
//! the backend that serves it and takes the per-acquire parameters every scheme shares. Everything
//! in the URL is checked before a connection is attempted: the scheme (and whether its Cargo
//! feature is compiled in), every parameter, and the backend's own settings, which each builder
//! validates before it sends anything.

use std::sync::Arc;

use dlock_core::backend::url::ConnectUrl;
#[cfg_attr(
    not(any(
        feature = "redis",
        feature = "redlock",
        feature = "zk",
        feature = "etcd",
        feature = "postgres"
    )),
    allow(dead_code, unused_imports)
)]
use dlock_core::backend::url::FromUrl;
use dlock_core::{DistributedLock, Drift, Error, InMemoryLock, LockOptions, Locks, Result};

use crate::builder::Layers;

/// The parameters every scheme takes: defaults for each acquire (see [`Locks::options`]), and
/// the layers to put around the backend (see [`LocksBuilder`](crate::LocksBuilder)).
pub const COMMON_PARAMETERS: &[&str] = &[
    "ttl",
    "wait",
    "drift",
    "drift_factor",
    "tracing",
    "metrics",
    "metrics_keys",
];

/// The parameters `memory://` takes besides [`COMMON_PARAMETERS`].
pub const MEMORY_PARAMETERS: &[&str] = &["owner"];

/// Every scheme and the Cargo feature of the dlock crate that serves it, so that a scheme whose
/// backend is not compiled in gets an error naming the feature. (A test checks it against each
/// backend's own [`FromUrl::SCHEMES`].)
pub const SCHEMES: &[(&str, &str)] = &[
    ("memory", ""),
    ("redis", "redis"),
    ("redis+unix", "redis"),
    ("unix", "redis"),
    ("rediss", "redis-tls"),
    ("redis+sentinel", "redis"),
    ("rediss+sentinel", "redis-tls"),
    ("redis+cluster", "redis"),
    ("rediss+cluster", "redis-tls"),
    ("redlock", "redlock"),
    ("zk", "zk"),
    ("zk+tls", "zk-tls"),
    ("etcd", "etcd"),
    ("etcd+https", "etcd"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
];

/// A connected backend.
type Backend = Arc<dyn DistributedLock>;

/// Connects to the backend `url` names and returns a shared handle with the URL's defaults.
///
/// | URL | backend | Cargo feature | scheme parameters |
/// |---|---|---|---|
/// | `memory://` | [`InMemoryLock`], new for each call | — | `owner` |
/// | `redis://[user[:password]@]host[:port][/db]`, `redis+unix:///path` | one Redis server | `redis` | `prefix`, `request_timeout`, `connect_timeout`, `fence_ttl` (let idle keys' counters expire, e.g. `30d`), `min_replicas`, `replica_timeout` (`WAIT` for replicas after each write), `owner` (the label in each grant's owner record) |
/// | `rediss://…` (TLS; `#insecure` skips certificate checks) | one Redis server | `redis-tls` | as `redis://` |
/// | `redis+sentinel://[user[:password]@]host:26379[,host…]/SERVICE[/db]` | the primary of a Redis Sentinel service, followed through failovers | `redis` | as `redis://`, and `sentinel_password` |
/// | `rediss+sentinel://…` (TLS to sentinels and primary) | as `redis+sentinel://` | `redis-tls` | as `redis+sentinel://`, and `ca`, `cert`, `key` |
/// | `redis+cluster://[user[:password]@]host:port[,host:port…]` | a Redis Cluster (seed nodes) | `redis` | as `redis://` |
/// | `rediss+cluster://…?ca=PATH[&cert=PATH&key=PATH]` | a Redis Cluster over TLS | `redis-tls` | as `redis://`, and `ca`, `cert`, `key` (PEM files) |
/// | `redlock://host[:port],host[:port],…[/db]` | Redlock over independent Redis masters | `redlock` | `prefix`, `quorum`, `request_timeout` (each master's), `connect_timeout`, `retry_jitter`, `fencing` (`true`/`false`), `delayed_restart` (the longest TTL in use), `fence_ttl`, `owner` |
/// | `zk://[user:password@]host[:port],…[/chroot]` | a ZooKeeper ensemble | `zk` | `prefix` (root node, e.g. `/dlock`), `session_timeout`, `request_timeout`, `connect_timeout`, `owner` (the owner record's label), `identifier` (its earlier name), `naming` (`kazoo` or `curator`) |
/// | `zk+tls://[user:password@]host[:port],…[/chroot]?ca=PATH[&cert=PATH&key=PATH]` (ports default to 2281) | a ZooKeeper ensemble over TLS | `zk-tls` | as `zk://`, and `ca`, `cert`, `key` (PEM files) |
/// | `etcd://[user[:password]@]host:port,…[/namespace]` | an etcd cluster | `etcd` | `prefix` (namespace, also the path), `session_timeout` (the session lease's TTL), `request_timeout`, `connect_timeout`, `owner` (the label in the owner records) |
/// | `etcd+https://[user[:password]@]host:port,…[/namespace]?ca=PATH[&cert=PATH&key=PATH]` | an etcd cluster over TLS | `etcd` | as `etcd://`, and `ca` (required), `cert`, `key` (PEM files), `tls_server_name` |
/// | `postgres://[user[:password]@]host[:port][,host[:port]…][/database]` (also `postgresql://`; several hosts are tried in order, as libpq does) | one PostgreSQL server (14 or later): session-level advisory locks | `postgres` | `sslmode` (`disable`, `prefer` (the default), `require`, `verify-ca`, `verify-full`), `sslrootcert`, `sslcert`, `sslkey` (PEM files), `session_timeout` (how long the server keeps a silent client's session, and with it its locks), `request_timeout`, `connect_timeout`, `application_name`, `owner` |
///
/// Every scheme also takes the per-acquire defaults `ttl`, `wait`, `drift` (the fixed part of
/// the clock-drift allowance) and `drift_factor`, found in [`Locks::options`], and the layers
/// `tracing=true`, `metrics=true` and `metrics_keys=true` (see [`LocksBuilder`](crate::LocksBuilder)). Durations are
/// written `500ms`, `30s`, `2m`. Percent-encode `@ : / ? # %` in user names and passwords.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use dlock::DistributedLockExt;
///
/// let url = std::env::var("DLOCK_URL").unwrap_or_else(|_| "memory://?ttl=10s&wait=2s".into());
/// let locks = dlock::connect(&url).await?;
/// let lease = locks.acquire("reports/daily", locks.options()).await?;
/// lease.release().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::InvalidInput`] (field `url`, or the backend setting at fault) for a malformed URL,
/// an unknown, repeated or malformed parameter, or a scheme whose feature is not compiled in —
/// the message says what is wrong, where, and which feature to enable, and never repeats the
/// password. Nothing has been sent then. Otherwise the backend's connect errors, typically
/// [`Error::Unavailable`] when no server answers in time.
///
/// # Cancel safety
/// Cancel safe: a connection opened by a cancelled call is closed when dropped.
pub async fn connect(url: &str) -> Result<Locks> {
    crate::builder(url).connect().await
}

/// [`connect`] with the `layers` a [`LocksBuilder`] asked for, on top of those the URL asks for.
pub(crate) async fn connect_with(url: &str, layers: Layers) -> Result<Locks> {
    let mut url = ConnectUrl::parse(url)?;
    let Some(&(_, feature)) = SCHEMES.iter().find(|(scheme, _)| *scheme == url.scheme()) else {
        let known: Vec<String> = SCHEMES.iter().map(|(s, _)| format!("{s}://")).collect();
        return Err(url.invalid(format!(
            "unknown scheme {:?}; expected one of {}",
            url.scheme(),
            known.join(", ")
        )));
    };
    let options = lock_options(&mut url)?;
    let layers = layers.or(url_layers(&mut url)?);
    if !compiled(feature) {
        return Err(missing_feature(&url, feature));
    }
    let backend: Backend = match feature {
        #[cfg(feature = "redis")]
        "redis" | "redis-tls" => open(&mut url, dlock_redis::RedisLockBuilder::connect).await?,
        #[cfg(feature = "redlock")]
        "redlock" => open(&mut url, dlock_redlock::RedlockBuilder::connect).await?,
        #[cfg(feature = "zk")]
        "zk" | "zk-tls" => open(&mut url, dlock_zk::ZkLockBuilder::connect).await?,
        #[cfg(feature = "etcd")]
        "etcd" => open(&mut url, dlock_etcd::EtcdLockBuilder::connect).await?,
        #[cfg(feature = "postgres")]
        "postgres" => open(&mut url, dlock_postgres::PgLockBuilder::connect).await?,
        "" => memory(&mut url)?,
        other => return Err(missing_feature(&url, other)),
    };
    Ok(Locks::new(layers.around(backend), options, url.shown()))
}

/// The layers the URL asks for: `tracing`, `metrics`, `metrics_keys` (each `true` or `false`).
fn url_layers(url: &mut ConnectUrl) -> Result<Layers> {
    Ok(Layers {
        tracing: url.take_bool("tracing")?.unwrap_or(false),
        metrics: url.take_bool("metrics")?.unwrap_or(false),
        metrics_keys: url.take_bool("metrics_keys")?.unwrap_or(false),
    })
}

/// The per-acquire defaults: the core's defaults with `ttl`, `wait`, `drift` (the fixed part of
/// the allowance) and `drift_factor` applied, validated together.
fn lock_options(url: &mut ConnectUrl) -> Result<LockOptions> {
    let mut options = LockOptions::default();
    if let Some(ttl) = url.take_duration("ttl")? {
        options.ttl = ttl;
    }
    options.wait = url.take_duration("wait")?;
    let mut drift = Drift::default();
    if let Some(fixed) = url.take_duration("drift")? {
        drift.fixed = fixed;
    }
    if let Some(factor) = url.take_parsed("drift_factor", "a number such as 0.01")? {
        drift.factor = factor;
    }
    options.drift = drift;
    options.validate().map_err(|e| match e {
        Error::InvalidInput { field, message } => {
            let parameter = match field {
                "drift.factor" => "drift_factor",
                other => other,
            };
            url.invalid(format!("parameter `{parameter}`: {message}"))
        }
        other => other,
    })?;
    Ok(options)
}

/// The backend features of this crate compiled into this build.
const COMPILED: &[&str] = &[
    #[cfg(feature = "redis")]
    "redis",
    #[cfg(feature = "redis-tls")]
    "redis-tls",
    #[cfg(feature = "redlock")]
    "redlock",
    #[cfg(feature = "zk")]
    "zk",
    #[cfg(feature = "zk-tls")]
    "zk-tls",
    #[cfg(feature = "etcd")]
    "etcd",
    #[cfg(feature = "postgres")]
    "postgres",
];

/// Whether the Cargo feature `feature` of this crate is compiled in (`""`: no feature needed).
fn compiled(feature: &str) -> bool {
    feature.is_empty() || COMPILED.contains(&feature)
}

/// The error for a scheme whose backend is not compiled in.
fn missing_feature(url: &ConnectUrl, feature: &str) -> Error {
    url.invalid(format!(
        "{}:// needs the `{feature}` feature of the dlock crate, which this build lacks \
         (enable it in Cargo.toml: dlock = {{ features = [\"{feature}\"] }})",
        url.scheme()
    ))
}

/// `memory://`: a fresh in-process lock table; the common parameters and `owner` (the
/// application label of its owner records).
fn memory(url: &mut ConnectUrl) -> Result<Backend> {
    if url.credentials().is_some() || url.has_hosts() || !url.path().is_empty() {
        return Err(url.invalid("memory:// takes no host, credentials or path"));
    }
    let mut locks = InMemoryLock::new();
    if let Some(label) = url.take_text("owner")? {
        locks = locks
            .with_owner(&label)
            .map_err(|e| url.invalid(format!("parameter `owner`: {e}")))?;
    }
    let known: Vec<&str> = COMMON_PARAMETERS
        .iter()
        .chain(MEMORY_PARAMETERS)
        .copied()
        .collect();
    url.finish(&known)?;
    Ok(Arc::new(locks))
}

/// Makes backend `B`'s builder from the URL, refuses what neither it nor [`COMMON_PARAMETERS`]
/// knows, and connects. (A builder's settings are named as its URL parameters, so a complaint
/// about one names what the user wrote.)
#[cfg_attr(
    not(any(
        feature = "redis",
        feature = "redlock",
        feature = "zk",
        feature = "etcd",
        feature = "postgres"
    )),
    allow(dead_code)
)]
async fn open<B, L, F>(url: &mut ConnectUrl, connect: impl FnOnce(B) -> F) -> Result<Backend>
where
    B: FromUrl,
    F: std::future::Future<Output = Result<L>>,
    L: DistributedLock,
{
    let builder = B::from_connect_url(url)?;
    let known: Vec<&str> = COMMON_PARAMETERS
        .iter()
        .chain(B::PARAMETERS)
        .copied()
        .collect();
    url.finish(&known)?;
    // Boxed, so that `connect`'s future holds a pointer rather than the largest backend's whole
    // connect state: an application's `main` that awaits it beside other work stays small.
    Ok(Arc::new(Box::pin(connect(builder)).await?))
}
