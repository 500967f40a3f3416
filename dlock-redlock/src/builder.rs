//! Settings of a Redlock client, checked before anything is sent.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::check_within;
use dlock_core::limits::{MAX_BACKOFF, MAX_TTL, MIN_TTL};
use dlock_core::{Drift, Error, Owner, Result};
use dlock_redis::protocol::keys::KeyLayout;
use dlock_redis::protocol::{check_fence_ttl, check_timeout, ServerUrl};
use dlock_redis::{Endpoint, Wakeups};
use tracing::Instrument;

use crate::client::{RedlockLock, Settings};
use crate::node::Node;
use crate::quorum::QuorumFailure;

/// The fewest masters accepted: with fewer, one failure already stops the lock.
pub const MIN_NODES: usize = 3;

/// The most masters accepted. Every request goes to each of them.
pub const MAX_NODES: usize = 63;

/// The shortest per-node timeout the TTL-derived default picks.
pub const MIN_DERIVED_NODE_TIMEOUT: Duration = Duration::from_millis(5);

/// The longest per-node timeout the TTL-derived default picks.
pub const MAX_DERIVED_NODE_TIMEOUT: Duration = Duration::from_millis(50);

// The shortest and longest per-node or connect timeout accepted, and the default bound on
// opening a connection to one master: those of the single-Redis client.
pub use dlock_redis::{DEFAULT_CONNECT_TIMEOUT, MAX_TIMEOUT, MIN_TIMEOUT};

/// The default upper bound of the random part of the wait between attempts.
pub const DEFAULT_RETRY_JITTER: Duration = Duration::from_millis(10);

/// Builds a [`RedlockLock`]: the masters, the quorum, the timeouts, the drift allowance, the
/// retry jitter, fencing and the delayed-restart rule.
///
/// ```no_run
/// # async fn demo() -> dlock_core::Result<()> {
/// use std::time::Duration;
/// use dlock_redlock::RedlockBuilder;
///
/// let locks = RedlockBuilder::from_urls([
///     "redis://10.0.0.1:6379",
///     "redis://10.0.0.2:6379",
///     "redis://10.0.0.3:6379",
///     "redis://10.0.0.4:6379",
///     "redis://10.0.0.5:6379",
/// ])
/// .with_request_timeout(Duration::from_millis(20))
/// .with_delayed_restart(Duration::from_secs(60))
/// .connect()
/// .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RedlockBuilder {
    urls: Vec<ServerUrl>,
    prefix: String,
    quorum: Option<usize>,
    node_timeout: Option<Duration>,
    connect_timeout: Duration,
    drift: Drift,
    retry_jitter: Duration,
    fencing: bool,
    delayed_restart: Option<Duration>,
    fence_ttl: Option<Duration>,
    /// The application label of the owner records, checked at connect.
    owner: Option<String>,
}

dlock_core::backend::setters! {
    RedlockBuilder {
        /// Puts `prefix` before every lock name to form its key on every master (empty by
        /// default).
        with_prefix(prefix: impl Into<String>) => prefix = prefix.into();
        /// How many masters must agree (default `N/2 + 1`). Anything from a majority to all `N`
        /// is accepted; less than a majority would let two clients hold the lock at once.
        with_quorum(quorum: usize) => quorum = Some(quorum);
        /// Bounds each request to each master, including waiting for a reconnection. By default
        /// it is derived from the request's TTL: `ttl / 200`, between
        /// [`MIN_DERIVED_NODE_TIMEOUT`] and [`MAX_DERIVED_NODE_TIMEOUT`] (50 ms for TTLs of 10 s
        /// and more), small against the TTL so that a frozen master costs little of the lease's
        /// validity.
        with_request_timeout(timeout: Duration) => node_timeout = Some(timeout);
        /// Bounds opening a connection to one master ([`DEFAULT_CONNECT_TIMEOUT`]).
        with_connect_timeout(timeout: Duration) => connect_timeout = timeout;
        /// The clock-drift allowance the client subtracts from a lease's validity when it counts
        /// a quorum (default [`Drift::default`], the same as
        /// [`LockOptions`](dlock_core::LockOptions)'s). The lease itself then uses the options'
        /// drift; set both alike (see the crate docs).
        with_drift(drift: Drift) => drift = drift;
        /// The upper bound of a random amount by which every wait between attempts is shortened
        /// ([`DEFAULT_RETRY_JITTER`]), so that contenders woken by the same expiry do not split
        /// the masters between them again and again. Zero turns it off (the caller's backoff
        /// still has its own jitter).
        with_retry_jitter(jitter: Duration) => retry_jitter = jitter;
        /// Turns fencing tokens on (the default) or off. Off saves the write-back round trip that
        /// happens when the masters' counters disagree, and declares
        /// [`FencingGuarantee::None`](dlock_core::backend::FencingGuarantee::None): tokens are then still
        /// handed out but may repeat or go back.
        with_fencing(on: bool) => fencing = on;
        /// Turns on the delayed-restart rule with `max_ttl`, the longest TTL any client will use
        /// on these masters: a master whose server process started less than `max_ttl` (plus the
        /// drift allowance) ago does not count towards a quorum. Requests with a longer TTL are
        /// refused. See the crate docs for when it is needed.
        with_delayed_restart(max_ttl: Duration) => delayed_restart = Some(max_ttl);
        /// Lets each key's fencing counter expire on every master once the key has gone unused
        /// (no grant) for `ttl`, as
        /// [`RedisLockBuilder::with_fence_ttl`](dlock_redis::RedisLockBuilder::with_fence_ttl)
        /// does on one server: the acquire script and the fencing write-back re-arm the expiry.
        /// By default counters never expire. See the crate docs for what it keeps of the fencing
        /// guarantee.
        with_fence_ttl(ttl: Duration) => fence_ttl = Some(ttl);
        /// Puts the application label `label` (the `owner` URL parameter) in the owner record
        /// every grant leaves next to the lock on each master (see "Owner records" in the
        /// [crate docs](crate)): 1 to [`MAX_LABEL_LEN`](dlock_core::limits::MAX_LABEL_LEN) bytes without
        /// control characters, checked before anything is sent (field `owner`).
        with_owner(label: impl Into<String>) => owner = Some(label.into());
    }
}

impl RedlockBuilder {
    /// Settings from a connection string `redlock://host,host,…[/db]` with `?parameters` (see
    /// the table in `docs/urls.md`), checked before anything is sent.
    pub fn from_url(url: &str) -> Result<Self> {
        <Self as dlock_core::backend::url::FromUrl>::from_url(url)
    }

    /// Settings for the masters at `urls` (each a `redis://`, `rediss://` or `redis+unix://` URL as
    /// [`dlock_redis`] accepts it), with the defaults: majority quorum, per-node timeout derived
    /// from each request's TTL, [`Drift::default`], fencing on, no delayed restart.
    pub fn from_urls<I, S>(urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedlockBuilder {
            urls: urls.into_iter().map(ServerUrl::new).collect(),
            prefix: String::new(),
            quorum: None,
            node_timeout: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            drift: Drift::default(),
            retry_jitter: DEFAULT_RETRY_JITTER,
            fencing: true,
            delayed_restart: None,
            fence_ttl: None,
            owner: None,
        }
    }

    /// Checks every setting, connects to every master in parallel and returns the client.
    ///
    /// Fails with [`Error::InvalidInput`] naming the field (`urls`, `quorum`, `node_timeout`,
    /// `connect_timeout`, `drift.factor`, `retry_jitter`, `delayed_restart`, `fence_ttl`, `prefix`,
    /// `owner`)
    /// before any connection is attempted, and with [`Error::Unavailable`] ("reached R of N
    /// nodes, needed Q") if fewer masters than the quorum answer within the connect timeout.
    /// Masters that did not answer are connected later, when a request needs them.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is left behind but closed connections.
    pub async fn connect(self) -> Result<RedlockLock> {
        let (settings, endpoints) = self.check()?;
        let nodes = endpoints
            .into_iter()
            .map(|e| {
                let request_timeout = settings.untimed_node_timeout();
                Node::new(
                    e,
                    self.connect_timeout,
                    request_timeout,
                    settings.restart_window(),
                    settings.wake_tag.clone(),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let span = tracing::debug_span!("dlock.redlock.connect", nodes = nodes.len());
        let results = futures::future::join_all(nodes.iter().map(Node::connect))
            .instrument(span)
            .await;
        let reached = results.iter().filter(|r| r.is_ok()).count();
        if reached < settings.quorum {
            return Err(QuorumFailure {
                op: "connect",
                reached,
                total: nodes.len(),
                needed: settings.quorum,
                excluded: 0,
                last: results.into_iter().filter_map(Result::err).last(),
            }
            .into_error());
        }
        Ok(RedlockLock::new(nodes, settings))
    }

    /// Validates everything; returns the settings and the parsed URLs.
    fn check(&self) -> Result<(Arc<Settings>, Vec<Endpoint>)> {
        let n = self.urls.len();
        if !(MIN_NODES..=MAX_NODES).contains(&n) {
            return Err(Error::invalid(
                "urls",
                format!("{n} master(s) given; Redlock needs {MIN_NODES} to {MAX_NODES}"),
            ));
        }
        if n.is_multiple_of(2) {
            return Err(Error::invalid(
                "urls",
                format!(
                    "{n} masters given; use an odd number (an even one tolerates no more failures than one master fewer)"
                ),
            ));
        }
        let endpoints = parse_urls(&self.urls)?;
        let majority = n / 2 + 1;
        let quorum = self.quorum.unwrap_or(majority);
        if !(majority..=n).contains(&quorum) {
            return Err(Error::invalid(
                "quorum",
                format!("{quorum} is outside {majority}..={n} (a majority of the {n} masters up to all)"),
            ));
        }
        if let Some(timeout) = self.node_timeout {
            check_timeout("request_timeout", timeout)?;
        }
        check_timeout("connect_timeout", self.connect_timeout)?;
        // Against the longest TTL; each request checks it against its own.
        self.drift.validate(MAX_TTL)?;
        check_within(
            "retry_jitter",
            self.retry_jitter,
            Duration::ZERO..=MAX_BACKOFF,
        )?;
        if let Some(max_ttl) = self.delayed_restart {
            check_within("delayed_restart", max_ttl, MIN_TTL..=MAX_TTL)?;
        }
        if let Some(ttl) = self.fence_ttl {
            check_fence_ttl(ttl)?;
        }
        let layout = KeyLayout::new(self.prefix.clone())?;
        let owner = Owner::labelled(self.owner.clone())?;
        let settings = Settings {
            owner,
            layout,
            quorum,
            node_timeout: self.node_timeout,
            drift: self.drift,
            retry_jitter: self.retry_jitter,
            fencing: self.fencing,
            delayed_restart: self.delayed_restart,
            fence_ttl: self.fence_ttl,
            wake_tag: Wakeups::new_tag(),
        };
        Ok((Arc::new(settings), endpoints))
    }
}

/// Parses every master's URL; the same server twice is refused, since it would count twice.
///
/// Public through [`RedlockBuilder`] only; kept apart so that a URL scheme listing several hosts
/// can reuse it.
pub(crate) fn parse_urls(urls: &[ServerUrl]) -> Result<Vec<Endpoint>> {
    let mut endpoints: Vec<Endpoint> = Vec::with_capacity(urls.len());
    for url in urls {
        let endpoint = url.parse()?;
        if let Some(twice) = endpoints
            .iter()
            .find(|e| e.connection_info().addr() == endpoint.connection_info().addr())
        {
            return Err(Error::invalid(
                "urls",
                format!(
                    "{} is given twice (also as {}); each master must count once",
                    endpoint.redacted(),
                    twice.redacted()
                ),
            ));
        }
        endpoints.push(endpoint);
    }
    Ok(endpoints)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn five() -> RedlockBuilder {
        RedlockBuilder::from_urls((1..=5).map(|i| format!("redis://127.0.0.1:{i}")))
    }

    fn field(builder: RedlockBuilder) -> &'static str {
        match builder.check() {
            Err(Error::InvalidInput { field, .. }) => field,
            Err(other) => panic!("expected InvalidInput, got {other}"),
            Ok(_) => panic!("accepted {builder:?}"),
        }
    }

    #[test]
    fn defaults_are_valid_with_a_majority_quorum() {
        let (settings, endpoints) = five().check().unwrap();
        assert_eq!(settings.quorum, 3);
        assert_eq!(endpoints.len(), 5);
        assert!(settings.fencing);
        assert_eq!(settings.delayed_restart, None);
    }

    #[test]
    fn every_bad_setting_names_its_field() {
        let two = RedlockBuilder::from_urls(["redis://a", "redis://b"]);
        assert_eq!(field(two), "urls");
        let four = RedlockBuilder::from_urls((1..=4).map(|i| format!("redis://h{i}")));
        assert_eq!(field(four), "urls");
        let twice = RedlockBuilder::from_urls(["redis://a:1", "redis://b:1", "redis://a:1/2"]);
        assert_eq!(field(twice), "urls");
        let broken = RedlockBuilder::from_urls(["redis://a", "redis://b", "http://c"]);
        assert_eq!(field(broken), "url");
        assert_eq!(field(five().with_quorum(2)), "quorum");
        assert_eq!(field(five().with_quorum(6)), "quorum");
        assert_eq!(
            field(five().with_request_timeout(Duration::ZERO)),
            "request_timeout"
        );
        assert_eq!(
            field(five().with_connect_timeout(Duration::from_secs(3600))),
            "connect_timeout"
        );
        let drift = Drift {
            factor: 1.5,
            fixed: Duration::ZERO,
        };
        assert_eq!(field(five().with_drift(drift)), "drift.factor");
        assert_eq!(
            field(five().with_retry_jitter(Duration::from_secs(3600))),
            "retry_jitter"
        );
        assert_eq!(
            field(five().with_delayed_restart(Duration::from_millis(1))),
            "delayed_restart"
        );
        assert_eq!(field(five().with_prefix("p".repeat(5000))), "prefix");
        assert_eq!(
            field(five().with_fence_ttl(Duration::from_secs(60))),
            "fence_ttl"
        );
        assert_eq!(field(five().with_owner("")), "owner");
        assert_eq!(field(five().with_owner("a\tb")), "owner");
        assert!(five().with_quorum(5).check().is_ok());
    }

    #[test]
    fn debug_never_shows_a_password() {
        let builder = RedlockBuilder::from_urls([
            "redis://app:hunter2@a:6379",
            "redis://b",
            "redis://:hunter2@c/x",
        ]);
        let shown = format!("{builder:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("app:***@a"), "{shown}");
    }

    #[tokio::test]
    async fn bad_settings_are_rejected_without_connecting() {
        // Nobody listens on these ports: had the check passed, the error would be Unavailable.
        match five().with_quorum(1).connect().await {
            Err(Error::InvalidInput { field, .. }) => assert_eq!(field, "quorum"),
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn unreachable_masters_give_reached_of_needed() {
        let error = five()
            .with_connect_timeout(Duration::from_millis(500))
            .connect()
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                Error::Unavailable {
                    reached: 0,
                    needed: 3,
                    ..
                }
            ),
            "{error}"
        );
        let text = crate::quorum::message_and_source(&error);
        assert!(text.contains("reached 0 of 5 nodes, needed 3"), "{text}");
    }
}
