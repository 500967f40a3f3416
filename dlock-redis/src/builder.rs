//! Settings of a Redis lock client, checked before anything is sent.

use std::fmt;
use std::time::Duration;

use dlock_core::backend::check_within;
use dlock_core::{Owner, Result};
use tracing::Instrument;

use crate::client::{Inner, RedisLock};
use crate::cluster::ClusterSettings;
use crate::connection::{Connection, Target};
use crate::protocol::keys::KeyLayout;
use crate::replicas::Acks;
use crate::sentinel::{Primary, SentinelSettings};
use crate::url::Endpoint;
use crate::wakeups::Wakeups;

/// The default bound on one request: far above a healthy round trip (well under a millisecond on
/// a LAN), far below the TTLs locks are taken with, so a frozen or partitioned server is noticed
/// while a lease still has most of its validity. redis-rs's own default (500 ms) is replaced.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// The default bound on establishing a connection (TCP, TLS, `AUTH`, `SELECT`).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The shortest request or connect timeout accepted.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);

/// The longest request or connect timeout accepted: beyond it a stalled server looks like a hang.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(300);

/// The shortest fence TTL accepted. Shorter, and the counters of keys used less often than that
/// would restart from the server's clock at nearly every grant, so their tokens would rest on the
/// clock rather than on the counter.
pub const MIN_FENCE_TTL: Duration = Duration::from_secs(24 * 3600);

/// The longest fence TTL accepted (about ten years).
pub const MAX_FENCE_TTL: Duration = Duration::from_secs(3650 * 24 * 3600);

/// How long each `WAIT` waits for the replicas by default when `min_replicas` is set: a healthy
/// replica acknowledges within a round trip, and every operation takes this long when too few do.
pub const DEFAULT_REPLICA_TIMEOUT: Duration = Duration::from_millis(500);

/// The most replicas `min_replicas` may ask for.
pub const MAX_MIN_REPLICAS: u32 = 64;

/// Builds a [`RedisLock`]: the server URL, the key prefix and the timeouts.
///
/// ```no_run
/// # async fn demo() -> dlock_core::Result<()> {
/// use std::time::Duration;
/// use dlock_redis::RedisLock;
///
/// let locks = RedisLock::builder("redis://:secret@10.0.0.5:6379/2")
///     .with_prefix("billing:")
///     .with_request_timeout(Duration::from_millis(500))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RedisLockBuilder {
    url: ServerUrl,
    prefix: String,
    request_timeout: Duration,
    connect_timeout: Duration,
    fence_ttl: Option<Duration>,
    /// Connect through these sentinels instead of to `url`.
    sentinel: Option<SentinelSettings>,
    min_replicas: u32,
    replica_timeout: Duration,
    /// The application label of the owner records, checked at connect.
    owner: Option<String>,
    /// Set by [`RedisLockBuilder::cluster`]: the URL is then unused.
    pub(crate) cluster: Option<ClusterSettings>,
}

dlock_core::backend::setters! {
    RedisLockBuilder {
        /// Puts `prefix` before every lock name to form its key. Empty by default, so that a lock
        /// named `n` is the key `n` that other single-instance clients (redis-py's `Lock`,
        /// redsync) use too.
        with_prefix(prefix: impl Into<String>) => prefix = prefix.into();
        /// Bounds every request, including waiting for a reconnection
        /// ([`DEFAULT_REQUEST_TIMEOUT`]). A request that gets no answer in time fails with
        /// [`Error::Unavailable`](dlock_core::Error::Unavailable); its effect on the server is
        /// then unknown.
        with_request_timeout(timeout: Duration) => request_timeout = timeout;
        /// Bounds establishing a connection ([`DEFAULT_CONNECT_TIMEOUT`]).
        with_connect_timeout(timeout: Duration) => connect_timeout = timeout;
        /// Lets each key's fencing counter expire once the key has gone unused (no grant) for
        /// `ttl`, between [`MIN_FENCE_TTL`] and [`MAX_FENCE_TTL`]; by default counters never
        /// expire, and one stays behind for every lock name ever granted. Every grant re-arms the
        /// expiry in the acquire script. Tokens stay strictly increasing while no key is idle
        /// longer than `ttl`; after that the counter restarts from the server's clock, above the
        /// earlier tokens unless the clock went back (see
        /// [`scripts`](crate::protocol::scripts#the-fencing-counters-expiry)).
        with_fence_ttl(ttl: Duration) => fence_ttl = Some(ttl);
        /// Makes every grant, extension and release wait until `n` replicas acknowledged it
        /// (`WAIT n replica_timeout`, on the same connection, right behind the lock script; in a
        /// cluster, on the connection to the primary that owns the lock's slot); 0
        /// (the default) sends no `WAIT`. A grant not acknowledged in time is released and
        /// reported as [`Error::Unavailable`](dlock_core::Error::Unavailable), never returned
        /// as held; an extension or release not acknowledged is an `Unavailable` error too (an
        /// auto-renewed lease becomes uncertain). This narrows, not closes, the window in which a
        /// failover loses a lock: see "Replica acknowledgement" in the [crate docs](crate).
        with_min_replicas(n: u32) => min_replicas = n;
        /// How long each `WAIT` waits for the replicas ([`DEFAULT_REPLICA_TIMEOUT`]); every
        /// request may take this much longer than the request timeout.
        with_replica_timeout(timeout: Duration) => replica_timeout = timeout;
        /// Puts the application label `label` (the `owner` URL parameter) in the owner record
        /// every grant leaves next to the lock (see "Owner records" in the [crate docs](crate)),
        /// so that operators can tell services apart on a shared host: 1 to
        /// [`MAX_LABEL_LEN`](dlock_core::limits::MAX_LABEL_LEN) bytes without control characters, checked
        /// by [`connect`](Self::connect) before anything is sent (field `owner`).
        with_owner(label: impl Into<String>) => owner = Some(label.into());
    }
}

impl RedisLockBuilder {
    /// Settings for the server at `url` (see the crate docs for the URL forms), with an empty key
    /// prefix and the default timeouts.
    pub fn new(url: impl Into<String>) -> Self {
        RedisLockBuilder {
            url: ServerUrl::new(url),
            prefix: String::new(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            fence_ttl: None,
            sentinel: None,
            min_replicas: 0,
            replica_timeout: DEFAULT_REPLICA_TIMEOUT,
            owner: None,
            cluster: None,
        }
    }

    /// Settings for the primary of a Redis Sentinel service (see [`SentinelSettings`] and
    /// "Sentinel" in the [crate docs](crate)): the client asks the sentinels for the primary and
    /// follows it through failovers.
    pub fn sentinel(settings: SentinelSettings) -> Self {
        let mut builder = RedisLockBuilder::new(settings.redacted());
        builder.sentinel = Some(settings);
        builder
    }

    /// Settings from a connection string with `?parameters` (`prefix`, `request_timeout`,
    /// `connect_timeout`, `fence_ttl`, `owner`, …), checked before anything is sent.
    pub fn from_url(url: &str) -> Result<Self> {
        <Self as dlock_core::backend::url::FromUrl>::from_url(url)
    }

    /// Checks every setting, connects and returns the client.
    ///
    /// Fails with [`Error::InvalidInput`](dlock_core::Error::InvalidInput) naming the field (`url`, `prefix`, `request_timeout`,
    /// `connect_timeout`, `fence_ttl`, `owner`) before any connection is attempted, and with
    /// [`Error::Unavailable`](dlock_core::Error::Unavailable) (or a permanent [`Error::Backend`](dlock_core::Error::Backend), e.g. for a wrong password) if
    /// the server cannot be reached or refuses within the connect timeout.
    ///
    /// Needs a tokio runtime: the client runs its connection and its release notifications on it.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is left behind but a closed connection.
    pub async fn connect(self) -> Result<RedisLock> {
        let layout = KeyLayout::new(self.prefix)?;
        check_timeout("request_timeout", self.request_timeout)?;
        check_timeout("connect_timeout", self.connect_timeout)?;
        if let Some(ttl) = self.fence_ttl {
            check_fence_ttl(ttl)?;
        }
        if self.min_replicas > MAX_MIN_REPLICAS {
            return Err(dlock_core::Error::invalid(
                "min_replicas",
                format!("{} is more than {MAX_MIN_REPLICAS}", self.min_replicas),
            ));
        }
        check_timeout("replica_timeout", self.replica_timeout)?;
        let owner = Owner::labelled(self.owner)?;
        #[cfg(feature = "tls")]
        dlock_core::backend::tls::install_crypto_provider();
        if let Some(cluster) = self.cluster {
            if self.sentinel.is_some() {
                return Err(dlock_core::Error::invalid(
                    "sentinel",
                    "Sentinel is not available with a cluster",
                ));
            }
            let (connect, request) = (self.connect_timeout, self.request_timeout);
            let acks = Acks::new(self.min_replicas, self.replica_timeout);
            return crate::cluster::connect(
                cluster,
                layout,
                connect,
                request,
                self.fence_ttl,
                acks,
                owner,
            )
            .await;
        }
        let (target, shown) = match &self.sentinel {
            Some(settings) => {
                let span =
                    tracing::debug_span!("dlock.redis.connect", endpoint = %settings.redacted());
                let primary = Primary::find(settings, self.connect_timeout)
                    .instrument(span)
                    .await?;
                (Target::Sentinel(primary), settings.redacted())
            }
            None => {
                let endpoint = self.url.parse()?;
                (
                    Target::Server(Box::new(endpoint.client()?)),
                    endpoint.redacted().to_owned(),
                )
            }
        };
        let span = tracing::debug_span!("dlock.redis.connect", endpoint = %shown);
        let connection =
            Connection::open(target.clone(), self.connect_timeout, self.request_timeout)
                .instrument(span)
                .await?;
        let wakeups = Wakeups::start(
            target,
            self.connect_timeout,
            self.request_timeout,
            shown.clone(),
            Wakeups::new_tag(),
        );
        Ok(RedisLock::new(Inner {
            connection,
            layout,
            wakeups,
            endpoint: shown,
            fence_ttl: self.fence_ttl,
            acks: Acks::new(self.min_replicas, self.replica_timeout),
            cluster: None,
            owner,
            clock: dlock_core::backend::clock::ClockWatch::new(crate::error::BACKEND),
        }))
    }
}

/// A server URL as given, checked when the client connects. Its `Debug` never shows the password
/// (the URL without it, or `"<invalid URL>"` if it does not parse), so that this builder and the
/// Redlock client's derive theirs.
#[derive(Clone)]
pub struct ServerUrl(String);

impl ServerUrl {
    /// Keeps `url` as given.
    pub fn new(url: impl Into<String>) -> Self {
        ServerUrl(url.into())
    }

    /// Checks the URL; see [`Endpoint::parse`].
    pub fn parse(&self) -> Result<Endpoint> {
        Endpoint::parse(&self.0)
    }
}

impl fmt::Debug for ServerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.parse() {
            Ok(endpoint) => fmt::Debug::fmt(endpoint.redacted(), f),
            Err(_) => fmt::Debug::fmt("<invalid URL>", f),
        }
    }
}

/// Checks a fence TTL against [`MIN_FENCE_TTL`]..=[`MAX_FENCE_TTL`] (the Redlock client too).
pub fn check_fence_ttl(ttl: Duration) -> Result<()> {
    check_within("fence_ttl", ttl, MIN_FENCE_TTL..=MAX_FENCE_TTL)
}

/// Checks that a timeout setting named `field` lies within [`MIN_TIMEOUT`]..=[`MAX_TIMEOUT`]:
/// the bounds every client of Redis servers in dlock applies (the Redlock client too).
pub fn check_timeout(field: &'static str, timeout: Duration) -> Result<()> {
    check_within(field, timeout, MIN_TIMEOUT..=MAX_TIMEOUT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::Error;

    #[test]
    fn url_parameters_reach_the_builder() {
        let builder = RedisLockBuilder::from_url(
            "redis+sentinel://:pw@h1,h2:26380/mymaster/1?sentinel_password=spw&min_replicas=2&replica_timeout=250ms",
        )
        .unwrap();
        assert_eq!(builder.min_replicas, 2);
        assert_eq!(builder.replica_timeout, Duration::from_millis(250));
        assert!(builder.sentinel.is_some());
        let shown = format!("{builder:?}");
        assert!(!shown.contains("pw@") && !shown.contains("spw"), "{shown}");
        let plain =
            RedisLockBuilder::from_url("redis://h?min_replicas=1&owner=billing%20api").unwrap();
        assert_eq!((plain.min_replicas, plain.sentinel.is_none()), (1, true));
        assert_eq!(plain.owner.as_deref(), Some("billing api"));
        let invalid = |raw: &str| {
            matches!(
                RedisLockBuilder::from_url(raw),
                Err(Error::InvalidInput { field: "url", .. })
            )
        };
        assert!(invalid("redis://h?sentinel_password=x"));
        assert!(invalid("redis://h?min_replicas=-1"));
        assert!(invalid("redis://h?replica_timeout=5"));
        let leaked = RedisLockBuilder::from_url(
            "redis+sentinel://:data-hunter2@h/m?sentinel_password=sentinel-hunter2&min_replicas=x",
        );
        match leaked {
            Err(e) => assert!(!format!("{e} {e:?}").contains("hunter2"), "{e}"),
            Ok(b) => panic!("accepted {b:?}"),
        }
    }

    #[test]
    fn debug_never_shows_the_password() {
        let builder = RedisLockBuilder::new("redis://app:hunter2@localhost:6379/1");
        let shown = format!("{builder:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("app:***@localhost"), "{shown}");
        let broken = RedisLockBuilder::new("redis://app:hunter2@localhost:6379/x");
        assert!(!format!("{broken:?}").contains("hunter2"));
    }

    #[tokio::test]
    async fn bad_settings_are_rejected_by_name_without_connecting() {
        let field = |result: Result<RedisLock>| match result {
            Err(Error::InvalidInput { field, .. }) => field,
            Err(other) => panic!("expected InvalidInput, got {other}"),
            Ok(_) => panic!("accepted"),
        };
        // An address nobody listens on: had any of these connected, they would fail otherwise.
        let url = "redis://127.0.0.1:1";
        let cases = [
            (RedisLockBuilder::new("nonsense"), "url"),
            (
                RedisLockBuilder::new(url).with_prefix("p".repeat(2000)),
                "prefix",
            ),
            (
                RedisLockBuilder::new(url).with_request_timeout(Duration::ZERO),
                "request_timeout",
            ),
            (
                RedisLockBuilder::new(url).with_connect_timeout(Duration::from_secs(3600)),
                "connect_timeout",
            ),
            (
                RedisLockBuilder::new(url).with_fence_ttl(Duration::from_secs(3600)),
                "fence_ttl",
            ),
            (
                RedisLockBuilder::new(url).with_min_replicas(1000),
                "min_replicas",
            ),
            (
                RedisLockBuilder::new(url)
                    .with_min_replicas(1)
                    .with_replica_timeout(Duration::ZERO),
                "replica_timeout",
            ),
            (
                RedisLockBuilder::sentinel(SentinelSettings::new(["127.0.0.1:1"], "")),
                "sentinel_service",
            ),
            (RedisLockBuilder::new(url).with_owner(""), "owner"),
            (RedisLockBuilder::new(url).with_owner("a\nb"), "owner"),
        ];
        for (builder, expected) in cases {
            assert_eq!(field(builder.connect().await), expected);
        }
    }
}
