//! `dlock::connect`: from a URL to a connected backend, one function per scheme.
//!
//! Everything in the URL is checked before a connection is attempted: the scheme (and whether
//! its Cargo feature is compiled in), every query parameter, and the backend's own settings,
//! which each backend's builder validates before it sends anything.

use std::sync::Arc;

use dlock_core::{DistributedLock, Error, InMemoryLock, LockOptions, Result};

use crate::address::Address;
use crate::locks::Locks;
use crate::params::Params;

/// A connected backend and the URL's per-acquire defaults.
type Opened = (Arc<dyn DistributedLock>, LockOptions);

/// Connects to the backend `url` names and returns a shared handle with the URL's defaults.
///
/// | URL | backend | Cargo feature | scheme parameters |
/// |---|---|---|---|
/// | `memory://` | [`InMemoryLock`], new for each call | — | — |
/// | `redis://[user[:password]@]host[:port][/db]`, `redis+unix:///path` | one Redis server | `redis` | `prefix`, `request_timeout`, `connect_timeout`, `fence_ttl` (let idle keys' counters expire, e.g. `30d`) |
/// | `rediss://…` (TLS; `#insecure` skips certificate checks) | one Redis server | `redis-tls` | as `redis://` |
/// | `redlock://host[:port],host[:port],…[/db]` | Redlock over independent Redis masters | `redlock` | `prefix`, `quorum`, `node_timeout`, `connect_timeout`, `retry_jitter`, `fencing` (`true`/`false`), `delayed_restart` (the longest TTL in use), `fence_ttl` |
/// | `zk://[user:password@]host[:port],…[/chroot]` | a ZooKeeper ensemble | `zk` | `prefix` (root node, e.g. `/dlock`), `session_timeout`, `connect_timeout`, `operation_timeout`, `identifier`, `naming` (`kazoo` or `curator`) |
/// | `etcd://[user[:password]@]host:port,…[/namespace]` | an etcd cluster | `etcd` | `prefix` (namespace, also the path), `session_ttl`, `request_timeout`, `connect_timeout` |
///
/// Every scheme also takes the per-acquire defaults `ttl`, `wait`, `drift` (the fixed part of
/// the clock-drift allowance) and `drift_factor`, found in [`Locks::options`]. Durations are
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
    let address = Address::split(url)?;
    let (backend, options) = match address.scheme.as_str() {
        "memory" => memory(&address)?,
        "redis" | "rediss" | "redis+unix" => redis(&address).await?,
        "redlock" => redlock(&address).await?,
        "zk" => zk(&address).await?,
        "etcd" => etcd(&address).await?,
        other => {
            return Err(address.invalid(format!(
                "unknown scheme {other:?}; expected memory://, redis://, rediss://, \
                 redis+unix://, redlock://, zk:// or etcd://"
            )))
        }
    };
    Ok(Locks::new(backend, options, &address.shown))
}

/// The error for a scheme whose backend is not compiled in.
fn missing_feature(address: &Address<'_>, feature: &str) -> Error {
    address.invalid(format!(
        "{}:// needs the `{feature}` feature of the dlock crate, which this build lacks \
         (enable it in Cargo.toml: dlock = {{ features = [\"{feature}\"] }})",
        address.scheme
    ))
}

/// `memory://`: a fresh in-process lock table; only the common parameters.
fn memory(address: &Address<'_>) -> Result<Opened> {
    if address.userinfo.is_some() || !address.hosts.is_empty() || !address.path.is_empty() {
        return Err(address.invalid("memory:// takes no host, credentials or path"));
    }
    let options = Params::parse(address, &[])?.lock_options()?;
    Ok((Arc::new(InMemoryLock::new()), options))
}

/// The parameters `redlock://` takes besides the common ones.
#[cfg(feature = "redlock")]
const REDLOCK_PARAMS: &[&str] = &[
    "prefix",
    "quorum",
    "node_timeout",
    "connect_timeout",
    "retry_jitter",
    "fencing",
    "delayed_restart",
    "fence_ttl",
];

/// `redlock://h1,h2,h3[/db]`: one `redis://` URL per master, sharing credentials and database.
#[cfg(feature = "redlock")]
async fn redlock(address: &Address<'_>) -> Result<Opened> {
    let params = Params::parse(address, REDLOCK_PARAMS)?;
    let options = params.lock_options()?;
    let mut builder = dlock_redlock::RedlockBuilder::from_urls(address.per_host("redis")?);
    if let Some(prefix) = params.text("prefix") {
        builder = builder.with_prefix(prefix);
    }
    if let Some(quorum) = params.text("quorum") {
        let quorum = quorum.parse::<usize>().map_err(|_| {
            address.invalid(format!("quorum={quorum:?} is not a number of masters"))
        })?;
        builder = builder.with_quorum(quorum);
    }
    if let Some(timeout) = params.duration("node_timeout")? {
        builder = builder.with_node_timeout(timeout);
    }
    if let Some(timeout) = params.duration("connect_timeout")? {
        builder = builder.with_connect_timeout(timeout);
    }
    if let Some(jitter) = params.duration("retry_jitter")? {
        builder = builder.with_retry_jitter(jitter);
    }
    if let Some(fencing) = params.text("fencing") {
        let on = match fencing {
            "true" | "on" => true,
            "false" | "off" => false,
            other => {
                return Err(address.invalid(format!(
                    "fencing={other:?} is not one of true, false, on, off"
                )))
            }
        };
        builder = builder.with_fencing(on);
    }
    if let Some(max_ttl) = params.duration("delayed_restart")? {
        builder = builder.with_delayed_restart(max_ttl);
    }
    if let Some(ttl) = params.duration("fence_ttl")? {
        builder = builder.with_fence_ttl(ttl);
    }
    Ok((Arc::new(builder.connect().await?), options))
}

#[cfg(not(feature = "redlock"))]
async fn redlock(address: &Address<'_>) -> Result<Opened> {
    // The host list is checked first, so a malformed one reads the same with the feature on.
    address.per_host("redis")?;
    Err(missing_feature(address, "redlock"))
}

/// The parameters `redis://` takes besides the common ones.
#[cfg(feature = "redis")]
const REDIS_PARAMS: &[&str] = &["prefix", "request_timeout", "connect_timeout", "fence_ttl"];

#[cfg(feature = "redis")]
async fn redis(address: &Address<'_>) -> Result<Opened> {
    if address.scheme == "rediss" && !cfg!(feature = "redis-tls") {
        return Err(missing_feature(address, "redis-tls"));
    }
    let params = Params::parse(address, REDIS_PARAMS)?;
    let options = params.lock_options()?;
    let mut builder = dlock_redis::RedisLock::builder(address.without_query());
    if let Some(prefix) = params.text("prefix") {
        builder = builder.with_prefix(prefix);
    }
    if let Some(timeout) = params.duration("request_timeout")? {
        builder = builder.with_request_timeout(timeout);
    }
    if let Some(timeout) = params.duration("connect_timeout")? {
        builder = builder.with_connect_timeout(timeout);
    }
    if let Some(ttl) = params.duration("fence_ttl")? {
        builder = builder.with_fence_ttl(ttl);
    }
    Ok((Arc::new(builder.connect().await?), options))
}

#[cfg(not(feature = "redis"))]
async fn redis(address: &Address<'_>) -> Result<Opened> {
    let feature = if address.scheme == "rediss" {
        "redis-tls"
    } else {
        "redis"
    };
    Err(missing_feature(address, feature))
}

/// The parameters `zk://` takes besides the common ones.
#[cfg(feature = "zk")]
const ZK_PARAMS: &[&str] = &[
    "prefix",
    "session_timeout",
    "connect_timeout",
    "operation_timeout",
    "identifier",
    "naming",
];

#[cfg(feature = "zk")]
async fn zk(address: &Address<'_>) -> Result<Opened> {
    let params = Params::parse(address, ZK_PARAMS)?;
    let options = params.lock_options()?;
    let mut builder = dlock_zk::ZkLock::builder(&address.without_query());
    if let Some(root) = params.text("prefix") {
        builder = builder.with_root(root);
    }
    if let Some(timeout) = params.duration("session_timeout")? {
        builder = builder.with_session_timeout(timeout);
    }
    if let Some(timeout) = params.duration("connect_timeout")? {
        builder = builder.with_connect_timeout(timeout);
    }
    if let Some(timeout) = params.duration("operation_timeout")? {
        builder = builder.with_operation_timeout(timeout);
    }
    if let Some(identifier) = params.text("identifier") {
        builder = builder.with_identifier(identifier);
    }
    if let Some(naming) = params.text("naming") {
        builder = builder.with_naming(naming.parse()?);
    }
    let lock = builder
        .connect()
        .await
        .map_err(|e| as_parameter(address, e, "root", "prefix"))?;
    Ok((Arc::new(lock), options))
}

#[cfg(not(feature = "zk"))]
async fn zk(address: &Address<'_>) -> Result<Opened> {
    Err(missing_feature(address, "zk"))
}

/// The parameters `etcd://` takes besides the common ones.
#[cfg(feature = "etcd")]
const ETCD_PARAMS: &[&str] = &[
    "prefix",
    "session_ttl",
    "request_timeout",
    "connect_timeout",
];

#[cfg(feature = "etcd")]
async fn etcd(address: &Address<'_>) -> Result<Opened> {
    let params = Params::parse(address, ETCD_PARAMS)?;
    let options = params.lock_options()?;
    let mut builder = dlock_etcd::EtcdLockBuilder::from_url(&address.without_query())?;
    if let Some(namespace) = params.text("prefix") {
        if !address.path.trim_start_matches('/').is_empty() {
            return Err(address
                .invalid("the namespace is given twice: as the path and as `prefix`; keep one"));
        }
        builder = builder.with_namespace(namespace);
    }
    if let Some(ttl) = params.duration("session_ttl")? {
        builder = builder.with_session_ttl(ttl);
    }
    if let Some(timeout) = params.duration("request_timeout")? {
        builder = builder.with_request_timeout(timeout);
    }
    if let Some(timeout) = params.duration("connect_timeout")? {
        builder = builder.with_connect_timeout(timeout);
    }
    let lock = builder
        .connect()
        .await
        .map_err(|e| as_parameter(address, e, "namespace", "prefix"))?;
    Ok((Arc::new(lock), options))
}

#[cfg(not(feature = "etcd"))]
async fn etcd(address: &Address<'_>) -> Result<Opened> {
    Err(missing_feature(address, "etcd"))
}

/// A backend's complaint about its setting `field` as one about the URL parameter `parameter`
/// that set it, so the message names what the user wrote.
#[cfg(any(feature = "zk", feature = "etcd"))]
fn as_parameter(address: &Address<'_>, error: Error, field: &str, parameter: &str) -> Error {
    match error {
        Error::InvalidInput { field: f, message } if f == field => {
            address.invalid(format!("parameter `{parameter}`: {message}"))
        }
        other => other,
    }
}
