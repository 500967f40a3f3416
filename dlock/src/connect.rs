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

/// How a scheme's URL parameter sets its backend's builder `B`.
#[cfg(any(
    feature = "redis",
    feature = "redlock",
    feature = "zk",
    feature = "etcd"
))]
enum Apply<B> {
    /// The value taken as it is, or parsed by the setter (which may refuse it).
    Text(fn(B, &str, &Address<'_>) -> Result<B>),
    /// A duration such as `30s`.
    Duration(fn(B, std::time::Duration) -> B),
}

/// A scheme's own parameters, in the order they are applied, with how each sets the builder.
#[cfg(any(
    feature = "redis",
    feature = "redlock",
    feature = "zk",
    feature = "etcd"
))]
type Parameters<B> = [(&'static str, Apply<B>)];

/// Opens a backend the one way every scheme does: checks the URL's parameters against the
/// common ones and `own`, makes the builder (after those checks, so that a bad parameter is
/// reported first), applies the given ones of `own` to it and connects. A complaint of the
/// backend about its setting `renamed.0` reads as one about the URL parameter `renamed.1` that
/// set it, so the message names what the user wrote.
#[cfg(any(
    feature = "redis",
    feature = "redlock",
    feature = "zk",
    feature = "etcd"
))]
async fn open<B, L, F>(
    address: &Address<'_>,
    make: impl FnOnce() -> Result<B>,
    own: &Parameters<B>,
    connect: impl FnOnce(B) -> F,
    renamed: Option<(&str, &str)>,
) -> Result<Opened>
where
    F: std::future::Future<Output = Result<L>>,
    L: DistributedLock,
{
    let names: Vec<&str> = own.iter().map(|(name, _)| *name).collect();
    let params = Params::parse(address, &names)?;
    let options = params.lock_options()?;
    let mut builder = make()?;
    for (name, apply) in own {
        builder = match apply {
            Apply::Text(set) => match params.text(name) {
                Some(value) => set(builder, value, address)?,
                None => builder,
            },
            Apply::Duration(set) => match params.duration(name)? {
                Some(value) => set(builder, value),
                None => builder,
            },
        };
    }
    let lock = connect(builder)
        .await
        .map_err(|error| match (error, renamed) {
            (Error::InvalidInput { field, message }, Some((setting, parameter)))
                if field == setting =>
            {
                address.invalid(format!("parameter `{parameter}`: {message}"))
            }
            (other, _) => other,
        })?;
    Ok((Arc::new(lock), options))
}

/// The parameters `redlock://` takes besides the common ones.
#[cfg(feature = "redlock")]
const REDLOCK_PARAMS: &Parameters<dlock_redlock::RedlockBuilder> = {
    use dlock_redlock::RedlockBuilder as B;
    &[
        (
            "prefix",
            Apply::Text(|b, prefix, _| Ok(b.with_prefix(prefix))),
        ),
        (
            "quorum",
            Apply::Text(|b, quorum, address| {
                let quorum = quorum.parse::<usize>().map_err(|_| {
                    address.invalid(format!("quorum={quorum:?} is not a number of masters"))
                })?;
                Ok(b.with_quorum(quorum))
            }),
        ),
        ("node_timeout", Apply::Duration(B::with_node_timeout)),
        ("connect_timeout", Apply::Duration(B::with_connect_timeout)),
        ("retry_jitter", Apply::Duration(B::with_retry_jitter)),
        (
            "fencing",
            Apply::Text(|b, fencing, address| {
                let on = match fencing {
                    "true" | "on" => true,
                    "false" | "off" => false,
                    other => {
                        return Err(address.invalid(format!(
                            "fencing={other:?} is not one of true, false, on, off"
                        )))
                    }
                };
                Ok(b.with_fencing(on))
            }),
        ),
        ("delayed_restart", Apply::Duration(B::with_delayed_restart)),
        ("fence_ttl", Apply::Duration(B::with_fence_ttl)),
    ]
};

/// `redlock://h1,h2,h3[/db]`: one `redis://` URL per master, sharing credentials and database.
#[cfg(feature = "redlock")]
async fn redlock(address: &Address<'_>) -> Result<Opened> {
    let make = || {
        Ok(dlock_redlock::RedlockBuilder::from_urls(
            address.per_host("redis")?,
        ))
    };
    open(
        address,
        make,
        REDLOCK_PARAMS,
        dlock_redlock::RedlockBuilder::connect,
        None,
    )
    .await
}

#[cfg(not(feature = "redlock"))]
async fn redlock(address: &Address<'_>) -> Result<Opened> {
    // The host list is checked first, so a malformed one reads the same with the feature on.
    address.per_host("redis")?;
    Err(missing_feature(address, "redlock"))
}

/// The parameters `redis://` takes besides the common ones.
#[cfg(feature = "redis")]
const REDIS_PARAMS: &Parameters<dlock_redis::RedisLockBuilder> = {
    use dlock_redis::RedisLockBuilder as B;
    &[
        (
            "prefix",
            Apply::Text(|b, prefix, _| Ok(b.with_prefix(prefix))),
        ),
        ("request_timeout", Apply::Duration(B::with_request_timeout)),
        ("connect_timeout", Apply::Duration(B::with_connect_timeout)),
        ("fence_ttl", Apply::Duration(B::with_fence_ttl)),
    ]
};

#[cfg(feature = "redis")]
async fn redis(address: &Address<'_>) -> Result<Opened> {
    if address.scheme == "rediss" && !cfg!(feature = "redis-tls") {
        return Err(missing_feature(address, "redis-tls"));
    }
    let make = || Ok(dlock_redis::RedisLock::builder(address.without_query()));
    open(
        address,
        make,
        REDIS_PARAMS,
        dlock_redis::RedisLockBuilder::connect,
        None,
    )
    .await
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
const ZK_PARAMS: &Parameters<dlock_zk::ZkLockBuilder> = {
    use dlock_zk::ZkLockBuilder as B;
    &[
        ("prefix", Apply::Text(|b, root, _| Ok(b.with_root(root)))),
        ("session_timeout", Apply::Duration(B::with_session_timeout)),
        ("connect_timeout", Apply::Duration(B::with_connect_timeout)),
        (
            "operation_timeout",
            Apply::Duration(B::with_operation_timeout),
        ),
        (
            "identifier",
            Apply::Text(|b, identifier, _| Ok(b.with_identifier(identifier))),
        ),
        (
            "naming",
            Apply::Text(|b, naming, _| Ok(b.with_naming(naming.parse()?))),
        ),
    ]
};

#[cfg(feature = "zk")]
async fn zk(address: &Address<'_>) -> Result<Opened> {
    let make = || Ok(dlock_zk::ZkLock::builder(&address.without_query()));
    open(
        address,
        make,
        ZK_PARAMS,
        dlock_zk::ZkLockBuilder::connect,
        Some(("root", "prefix")),
    )
    .await
}

#[cfg(not(feature = "zk"))]
async fn zk(address: &Address<'_>) -> Result<Opened> {
    Err(missing_feature(address, "zk"))
}

/// The parameters `etcd://` takes besides the common ones.
#[cfg(feature = "etcd")]
const ETCD_PARAMS: &Parameters<dlock_etcd::EtcdLockBuilder> = {
    use dlock_etcd::EtcdLockBuilder as B;
    &[
        (
            "prefix",
            Apply::Text(|b, namespace, address| {
                if !address.path.trim_start_matches('/').is_empty() {
                    return Err(address.invalid(
                        "the namespace is given twice: as the path and as `prefix`; keep one",
                    ));
                }
                Ok(b.with_namespace(namespace))
            }),
        ),
        ("session_ttl", Apply::Duration(B::with_session_ttl)),
        ("request_timeout", Apply::Duration(B::with_request_timeout)),
        ("connect_timeout", Apply::Duration(B::with_connect_timeout)),
    ]
};

#[cfg(feature = "etcd")]
async fn etcd(address: &Address<'_>) -> Result<Opened> {
    let make = || dlock_etcd::EtcdLockBuilder::from_url(&address.without_query());
    open(
        address,
        make,
        ETCD_PARAMS,
        dlock_etcd::EtcdLockBuilder::connect,
        Some(("namespace", "prefix")),
    )
    .await
}

#[cfg(not(feature = "etcd"))]
async fn etcd(address: &Address<'_>) -> Result<Opened> {
    Err(missing_feature(address, "etcd"))
}
