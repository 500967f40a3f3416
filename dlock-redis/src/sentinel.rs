//! Redis Sentinel: find a service's primary through its sentinels, and follow it after a failover.
//!
//! With Sentinel, the client is given the sentinels' addresses and the service (master) name, not
//! the primary's address: the primary is whichever server the sentinels name now. [`Primary`]
//! asks them once when the client connects (redis-rs's `SentinelClient`, which also checks that
//! the server it names answers `ROLE` as a master), and again whenever the current primary looks
//! gone:
//!
//! * a request on the command connection fails with a connection error or `READONLY` (the old
//!   primary came back as a replica, or Sentinel demoted it and closed its clients), or gets no
//!   answer within the request timeout (a frozen or partitioned primary);
//! * the release-notification connection cannot be opened;
//! * a sentinel announces `+switch-master` (one sentinel at a time is listened to), so the client
//!   moves at once even while the old primary still answers (a `SENTINEL FAILOVER`).
//!
//! A new answer that names another server bumps the primary's *generation*: the command
//! connection opens its next link to the new primary, and the release-notification listener
//! leaves its connection and subscribes again there. One lookup runs at a time, and lookups
//! start at most every [`LOOKUP_SPACING`], however many requests fail together.
//!
//! So after a failover, requests fail (`Unavailable`, or a temporary `Backend` error for
//! `READONLY`) until the sentinels have promoted a replica, and the first failure after the
//! promotion moves the client: new acquires work again within the failover time (the sentinels'
//! `down-after-milliseconds` plus the election) plus a lookup and a reconnection, well within 2 s
//! of the promotion with the default timeouts.
//!
//! # What a holder's lease reports across a failover
//!
//! Replication is asynchronous: the promoted replica may or may not have received the lock key.
//! The holder's renewal (or an explicit `extend`) decides it on the new primary: the key is there
//! — the lease goes on as before; the key is missing — the extension answers "not held" and the
//! lease is reported **lost**; no answer while the sentinels fail over — the lease becomes
//! **uncertain** until an extension answers again. A lease that is not renewed cannot notice and
//! stays valid on the client until its TTL, while a waiter may already have been granted the lock
//! on a new primary that never had the key. `min_replicas` (see
//! [`RedisLockBuilder::with_min_replicas`](crate::RedisLockBuilder::with_min_replicas)) makes
//! that rarer: a grant is only returned once a replica has it, so the key is lost only if the
//! promoted replica is not one that acknowledged it.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use dlock_core::backend::tls::TlsFiles;
use dlock_core::backend::url::ConnectUrl;
use dlock_core::{Error, Result};
use futures::StreamExt;
use redis::io::tcp::TcpSettings;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo, TlsMode};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::error;

/// The shortest time between the starts of two lookups of the primary, so a burst of failing
/// requests costs one lookup, not one each.
pub(crate) const LOOKUP_SPACING: Duration = Duration::from_millis(100);

/// Sentinel's default port.
const SENTINEL_PORT: u16 = 26379;

/// Where a Sentinel-managed Redis service is: its sentinels, its name, and the credentials for
/// the sentinels and for the data servers.
///
/// ```no_run
/// # async fn demo() -> dlock_core::Result<()> {
/// use dlock_redis::{RedisLockBuilder, SentinelSettings};
///
/// let locks = RedisLockBuilder::sentinel(
///     SentinelSettings::new(["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"], "mymaster")
///         .with_password("data-secret")
///         .with_sentinel_password("sentinel-secret")
///         .with_db(2),
/// )
/// .with_min_replicas(1)
/// .connect()
/// .await?;
/// # Ok(()) }
/// ```
///
/// `Debug` never shows either password.
#[derive(Clone)]
pub struct SentinelSettings {
    sentinels: Vec<String>,
    service: String,
    username: Option<String>,
    password: Option<String>,
    sentinel_username: Option<String>,
    sentinel_password: Option<String>,
    db: i64,
    tls: Option<TlsFiles>,
}

dlock_core::backend::setters! {
    SentinelSettings {
        /// The ACL user for the primary (the data servers); none by default.
        with_username(user: impl Into<String>) => username = Some(user.into());
        /// The password for the primary (the data servers); none by default.
        with_password(password: impl Into<String>) => password = Some(password.into());
        /// The ACL user for the sentinels, which may differ from the data servers'.
        with_sentinel_username(user: impl Into<String>) => sentinel_username = Some(user.into());
        /// The password for the sentinels (`requirepass` in their configuration), which may
        /// differ from the data servers'.
        with_sentinel_password(password: impl Into<String>) => sentinel_password = Some(password.into());
        /// The database number on the primary (0 by default).
        with_db(db: i64) => db = db;
    }
}

impl SentinelSettings {
    /// The service `service` (the name in the sentinels' `sentinel monitor` line), found through
    /// the sentinels at `sentinels` (`host` or `host:port`, port 26379 by default). Checked when
    /// the client connects.
    pub fn new(
        sentinels: impl IntoIterator<Item = impl Into<String>>,
        service: impl Into<String>,
    ) -> Self {
        SentinelSettings {
            sentinels: sentinels.into_iter().map(Into::into).collect(),
            service: service.into(),
            username: None,
            password: None,
            sentinel_username: None,
            sentinel_password: None,
            db: 0,
            tls: None,
        }
    }

    /// TLS to the sentinels and to the primary, with the `tls` feature: both are checked against
    /// `files.ca` (the system's roots with [`TlsFiles::default()`]), and `files.cert` and
    /// `files.key` are presented to servers that require a client certificate
    /// (`tls-auth-clients yes`). The files are read when the client connects; each problem is an
    /// [`Error::InvalidInput`] naming the setting and the path. `files.server_name` is refused
    /// (field `tls_server_name`): each server's certificate is checked against the address the
    /// sentinels give for it. Without the feature, connecting fails with [`Error::InvalidInput`]
    /// naming it.
    pub fn with_tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// From `redis+sentinel://[user[:password]@]host[:port][,host…]/SERVICE[/db]` (or
    /// `rediss+sentinel://…`, TLS to the sentinels and the primary, with the TLS files `ca`,
    /// `cert` and `key`), taking its `sentinel_password` parameter: the credentials in the string
    /// are the data servers', the sentinels' password is separate.
    pub(crate) fn from_url(url: &mut ConnectUrl) -> Result<Self> {
        let hosts = url.hosts()?;
        let path = url.path_decoded()?;
        let (service, db) = path.split_once('/').unwrap_or((path.as_str(), ""));
        if service.is_empty() {
            return Err(url.invalid(format!(
                "no service name: write {}://host:26379/SERVICE[/db]",
                url.scheme()
            )));
        }
        let mut settings = SentinelSettings::new(hosts, service);
        let db = db.trim_end_matches('/');
        if !db.is_empty() {
            let db = db.parse::<u32>().map_err(|_| {
                url.invalid(format!("database {db:?} is not a non-negative number"))
            })?;
            settings = settings.with_db(i64::from(db));
        }
        if let Some(credentials) = url.credentials() {
            if !credentials.user.is_empty() {
                settings = settings.with_username(credentials.user.clone());
            }
            if let Some(password) = &credentials.password {
                settings = settings.with_password(password.clone());
            }
        }
        if let Some(other) = url.fragment() {
            return Err(url.invalid(format!("unsupported fragment #{other}")));
        }
        let tls = TlsFiles::from_url(url)?;
        if url.scheme() == "rediss+sentinel" {
            settings = settings.with_tls(tls.unwrap_or_default());
        } else if tls.is_some() {
            return Err(url.invalid(
                "parameters `ca`, `cert`, `key` and `tls_server_name` need rediss+sentinel:// (TLS)",
            ));
        }
        if let Some(password) = url.take("sentinel_password") {
            settings = settings.with_sentinel_password(password);
        }
        Ok(settings)
    }

    /// `redis+sentinel://host:port,…/service/db` (`rediss+sentinel` with TLS) without any
    /// password, for logs, errors and `Debug`.
    pub fn redacted(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss+sentinel"
        } else {
            "redis+sentinel"
        };
        let user =
            crate::url::redacted_userinfo(self.username.as_deref(), self.password.as_deref());
        format!(
            "{scheme}://{user}{}/{}/{}",
            self.sentinels.join(","),
            self.service,
            self.db
        )
    }

    /// Checks every setting; each problem is an [`Error::InvalidInput`] naming its field.
    fn check(&self) -> Result<Vec<ConnectionInfo>> {
        if self.tls.is_some() && !cfg!(feature = "tls") {
            return Err(Error::invalid(
                "sentinel",
                "TLS to the sentinels needs the `tls` feature of dlock-redis",
            ));
        }
        if self.tls.as_ref().is_some_and(|t| t.server_name.is_some()) {
            return Err(Error::invalid(
                "tls_server_name",
                "is not supported with Sentinel: each server's certificate is checked against \
                 the address the sentinels give for it",
            ));
        }
        if self.service.trim().is_empty() || self.service.chars().any(char::is_whitespace) {
            return Err(Error::invalid(
                "sentinel_service",
                format!("{:?} is not a service name", self.service),
            ));
        }
        if self.db < 0 {
            return Err(Error::invalid(
                "db",
                "the database number must not be negative",
            ));
        }
        if self.sentinels.is_empty() {
            return Err(Error::invalid("sentinels", "no sentinel address given"));
        }
        self.sentinels
            .iter()
            .map(|address| self.sentinel_info(address))
            .collect()
    }

    /// The connection settings of one sentinel at `host[:port]`.
    fn sentinel_info(&self, address: &str) -> Result<ConnectionInfo> {
        let invalid =
            || Error::invalid("sentinels", format!("{address:?} is not host or host:port"));
        let address = address.trim();
        let (host, port) = match address.rsplit_once(':') {
            Some((host, port)) if !host.contains(':') || host.ends_with(']') => {
                (host, port.parse::<u16>().map_err(|_| invalid())?)
            }
            _ => (address, SENTINEL_PORT),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || port == 0 {
            return Err(invalid());
        }
        let addr = match self.tls {
            None => ConnectionAddr::Tcp(host.to_owned(), port),
            Some(_) => ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: false,
                tls_params: None,
            },
        };
        let mut redis = RedisConnectionInfo::default();
        if let Some(user) = &self.sentinel_username {
            redis = redis.set_username(user);
        }
        if let Some(password) = &self.sentinel_password {
            redis = redis.set_password(password);
        }
        let info = addr
            .into_connection_info()
            .map_err(|e| Error::invalid("sentinels", e.to_string()))?;
        Ok(info.set_redis_settings(redis).set_tcp_settings(nodelay()))
    }

    /// The client that asks the sentinels at `sentinels` for the primary, and how it reaches
    /// the primary once they named it.
    fn sentinel_client(
        &self,
        sentinels: &[ConnectionInfo],
        certificates: Option<&Certificates>,
    ) -> Result<SentinelClient> {
        let mut builder = SentinelClientBuilder::new(
            sentinels.iter().map(|info| info.addr().clone()),
            &self.service,
            SentinelServerType::Master,
        )
        .map_err(|e| Error::invalid("sentinels", e.to_string()))?
        .set_client_to_redis_db(self.db)
        .set_client_to_redis_tcp_settings(nodelay())
        .set_client_to_sentinel_tcp_settings(nodelay());
        if let Some(user) = &self.username {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = &self.password {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(user) = &self.sentinel_username {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = &self.sentinel_password {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if self.tls.is_some() {
            builder = builder
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure);
        }
        #[cfg(feature = "tls")]
        if let Some(certificates) = certificates {
            builder = builder
                .set_client_to_redis_certificates(certificates.clone())
                .set_client_to_sentinel_certificates(certificates.clone());
        }
        #[cfg(not(feature = "tls"))]
        let _ = certificates;
        builder
            .build()
            .map_err(|e| Error::invalid("sentinels", e.to_string()))
    }

    /// The TLS files as the client library takes them, read now; `None` without TLS or with
    /// neither files (the system's roots).
    fn certificates(&self) -> Result<Option<Certificates>> {
        match &self.tls {
            Some(files) if files.ca.is_some() || files.cert.is_some() || files.key.is_some() => {
                certificates(files).map(Some)
            }
            _ => Ok(None),
        }
    }
}

/// Custom TLS files for the client library.
#[cfg(feature = "tls")]
type Certificates = redis::TlsCertificates;
/// Without the `tls` feature there are none: [`SentinelSettings::check`] refuses TLS first.
#[cfg(not(feature = "tls"))]
type Certificates = std::convert::Infallible;

#[cfg(feature = "tls")]
fn certificates(files: &TlsFiles) -> Result<Certificates> {
    crate::url::certificates(files)
}

#[cfg(not(feature = "tls"))]
fn certificates(_: &TlsFiles) -> Result<Certificates> {
    Err(Error::invalid(
        "sentinel",
        "TLS to the sentinels needs the `tls` feature of dlock-redis",
    ))
}

/// A client for one sentinel (the watcher's), with the custom TLS files if any.
fn sentinel_connection(
    info: &ConnectionInfo,
    certificates: Option<&Certificates>,
) -> Result<redis::Client> {
    let client = match certificates {
        #[cfg(feature = "tls")]
        Some(certificates) => redis::Client::build_with_tls(info.clone(), certificates.clone()),
        #[cfg(not(feature = "tls"))]
        Some(never) => match *never {},
        None => redis::Client::open(info.clone()),
    };
    client.map_err(|e| Error::invalid("sentinels", e.to_string()))
}

impl fmt::Debug for SentinelSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelSettings")
            .field("url", &self.redacted())
            .field("sentinel_username", &self.sentinel_username)
            .field(
                "sentinel_password",
                &self.sentinel_password.as_ref().map(|_| "***"),
            )
            .finish()
    }
}

/// Nagle's algorithm would hold back pipelined requests until earlier ones are acknowledged.
fn nodelay() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

/// The current primary of a Sentinel service, looked up again when it looks gone.
pub(crate) struct Primary {
    /// A client for the primary the sentinels named last.
    current: Mutex<redis::Client>,
    /// Bumped when the sentinels name another server.
    generation: watch::Sender<u64>,
    /// Wakes the finder task: one lookup follows however many calls came meanwhile.
    wanted: Arc<Notify>,
    /// For logs: the settings without passwords.
    shown: String,
}

impl Primary {
    /// Checks `settings`, asks the sentinels for the primary within `timeout`, and starts the
    /// background tasks that look it up again: the finder (on [`suspect`](Self::suspect)) and
    /// the watcher of the sentinels' `+switch-master` announcements.
    pub(crate) async fn find(settings: &SentinelSettings, timeout: Duration) -> Result<Arc<Self>> {
        let sentinels = settings.check()?;
        let certificates = settings.certificates()?;
        let mut sentinel = settings.sentinel_client(&sentinels, certificates.as_ref())?;
        let watched = sentinels
            .iter()
            .map(|info| sentinel_connection(info, certificates.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        let first = lookup(&mut sentinel, timeout).await?;
        let primary = Arc::new(Primary {
            current: Mutex::new(first),
            generation: watch::Sender::new(0),
            wanted: Arc::new(Notify::new()),
            shown: settings.redacted(),
        });
        let finder = Finder {
            primary: Arc::downgrade(&primary),
            wanted: primary.wanted.clone(),
            sentinel,
            timeout,
        };
        tokio::spawn(finder.run());
        let watcher = Watcher {
            primary: Arc::downgrade(&primary),
            closed: primary.generation.subscribe(),
            sentinels: watched,
            timeout,
        };
        tokio::spawn(watcher.run());
        Ok(primary)
    }

    /// A client for the primary the sentinels named last.
    pub(crate) fn client(&self) -> redis::Client {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many times the primary changed since the client connected.
    pub(crate) fn generation(&self) -> u64 {
        *self.generation.borrow()
    }

    /// Completes when the primary changes after `seen` (a [`generation`](Self::generation)).
    pub(crate) async fn moved(&self, seen: u64) {
        let mut changes = self.generation.subscribe();
        // Fails only when `self` is gone, which the caller's reference rules out.
        let _ = changes.wait_for(|now| *now != seen).await;
    }

    /// The primary looks gone: ask the sentinels again in the background. Calls during a lookup
    /// lead to one more lookup after it, at most one per [`LOOKUP_SPACING`].
    pub(crate) fn suspect(&self) {
        self.wanted.notify_one();
    }

    /// Takes `client` as the primary if it is another server than the current one.
    fn adopt(&self, client: redis::Client) {
        {
            let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
            if current.get_connection_info().addr() == client.get_connection_info().addr() {
                return;
            }
            tracing::info!(
                sentinel = %self.shown,
                from = %current.get_connection_info().addr(),
                to = %client.get_connection_info().addr(),
                "redis sentinel: the primary moved"
            );
            *current = client;
        }
        self.generation.send_modify(|g| *g += 1);
    }
}

impl Drop for Primary {
    fn drop(&mut self) {
        // Lets the finder see that the client is gone.
        self.wanted.notify_one();
    }
}

/// The background task that looks the primary up when asked.
struct Finder {
    primary: Weak<Primary>,
    wanted: Arc<Notify>,
    sentinel: SentinelClient,
    timeout: Duration,
}

impl Finder {
    async fn run(mut self) {
        loop {
            self.wanted.notified().await;
            let started = Instant::now();
            if self.primary.strong_count() == 0 {
                return;
            }
            let found = lookup(&mut self.sentinel, self.timeout).await;
            let Some(primary) = self.primary.upgrade() else {
                return;
            };
            match found {
                Ok(client) => primary.adopt(client),
                Err(error) => tracing::debug!(
                    sentinel = %primary.shown,
                    %error,
                    "redis sentinel: no primary found yet"
                ),
            }
            drop(primary);
            tokio::time::sleep_until(started + LOOKUP_SPACING).await;
        }
    }
}

/// How often the watcher checks its sentinel connection with a `PING`.
const WATCH_PING_EVERY: Duration = Duration::from_secs(5);

/// The background task that listens to one sentinel at a time for `+switch-master`, which the
/// sentinels publish when they promote a replica: the client moves at once, even while its old
/// primary still answers (a `SENTINEL FAILOVER`, or a primary cut off from the sentinels only).
struct Watcher {
    primary: Weak<Primary>,
    /// Closed when the primary is dropped.
    closed: watch::Receiver<u64>,
    /// A client for each sentinel (not connected until listened to).
    sentinels: Vec<redis::Client>,
    timeout: Duration,
}

impl Watcher {
    async fn run(mut self) {
        let mut first = true;
        for client in self.sentinels.clone().iter().cycle() {
            let subscribed = async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe("+switch-master").await?;
                Ok::<_, redis::RedisError>(pubsub)
            };
            match tokio::time::timeout(self.timeout, subscribed).await {
                Ok(Ok(pubsub)) => {
                    if !first {
                        // A switch may have been announced while no sentinel was listened to.
                        suspect(&self.primary);
                    }
                    first = false;
                    if !self.listen(pubsub).await {
                        return;
                    }
                }
                Ok(Err(error)) => {
                    tracing::debug!(%error, "redis sentinel: cannot listen for failovers");
                }
                Err(_) => tracing::debug!("redis sentinel: listening for failovers timed out"),
            }
            tokio::select! {
                _ = tokio::time::sleep(LOOKUP_SPACING) => {}
                _ = gone(&mut self.closed) => return,
            }
        }
    }

    /// Asks for a lookup on every announcement until the connection breaks (true) or the client
    /// is gone (false).
    async fn listen(&mut self, pubsub: redis::aio::PubSub) -> bool {
        let (mut sink, mut stream) = pubsub.split();
        let mut ping =
            tokio::time::interval_at(Instant::now() + WATCH_PING_EVERY, WATCH_PING_EVERY);
        loop {
            tokio::select! {
                message = stream.next() => match message {
                    Some(_) => suspect(&self.primary),
                    None => return true,
                },
                _ = ping.tick() => {
                    let answer = tokio::time::timeout(self.timeout, sink.ping::<redis::Value>());
                    if !matches!(answer.await, Ok(Ok(_))) {
                        return true;
                    }
                }
                _ = gone(&mut self.closed) => return false,
            }
        }
    }
}

/// Completes when the primary (the sender of `closed`) is dropped.
async fn gone(closed: &mut watch::Receiver<u64>) {
    while closed.changed().await.is_ok() {}
}

/// Asks for a lookup if the client still exists.
fn suspect(primary: &Weak<Primary>) {
    if let Some(primary) = primary.upgrade() {
        primary.suspect();
    }
}

/// One lookup of the primary through the sentinels, bounded by `timeout`.
async fn lookup(sentinel: &mut SentinelClient, timeout: Duration) -> Result<redis::Client> {
    match tokio::time::timeout(timeout, sentinel.async_get_client()).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(error::from_redis("find the primary through Sentinel", e)),
        Err(_) => Err(error::no_answer(
            "find the primary through Sentinel",
            timeout,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_redacted_never_show_passwords() {
        let settings = SentinelSettings::new(["s1:26379", "s2"], "mymaster")
            .with_username("app")
            .with_password("hunter2")
            .with_sentinel_password("swordfish")
            .with_db(3);
        let shown = format!("{settings:?} {}", settings.redacted());
        assert!(
            !shown.contains("hunter2") && !shown.contains("swordfish"),
            "{shown}"
        );
        assert!(
            shown.contains("redis+sentinel://app:***@s1:26379,s2/mymaster/3"),
            "{shown}"
        );
    }

    fn from(raw: &str) -> Result<SentinelSettings> {
        SentinelSettings::from_url(&mut ConnectUrl::parse(raw)?)
    }

    #[test]
    fn urls_give_sentinels_service_db_and_both_passwords() {
        let s = from(
            "redis+sentinel://app:data%40pw@s1:26379,s2/mymaster/2?sentinel_password=sentinel-pw",
        )
        .unwrap();
        assert_eq!(s.sentinels, ["s1:26379", "s2"]);
        assert_eq!((s.service.as_str(), s.db), ("mymaster", 2));
        assert_eq!(s.username.as_deref(), Some("app"));
        assert_eq!(s.password.as_deref(), Some("data@pw"));
        assert_eq!(s.sentinel_password.as_deref(), Some("sentinel-pw"));
        assert_eq!(s.tls, None);
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("data@pw") && !shown.contains("sentinel-pw"),
            "{shown}"
        );
        let tls = from("rediss+sentinel://h/m").unwrap();
        assert_eq!(tls.tls, Some(TlsFiles::default()));
        let files = from("rediss+sentinel://h/m?ca=/c.pem&cert=/d.pem&key=/k.pem").unwrap();
        assert_eq!(
            files.tls,
            Some(TlsFiles::new("/c.pem").with_client_cert("/d.pem", "/k.pem"))
        );
        assert_eq!(from("redis+sentinel://h/m").unwrap().db, 0);
    }

    #[test]
    fn bad_urls_say_what_is_wrong_without_the_password() {
        let message = |raw: &str| match from(raw) {
            Err(Error::InvalidInput {
                field: "url",
                message,
            }) => message,
            other => panic!("{raw}: expected InvalidInput(url), got {other:?}"),
        };
        assert!(message("redis+sentinel://:pw@h").contains("no service name"));
        assert!(message("redis+sentinel://:pw@h/m/x").contains("database"));
        assert!(message("redis+sentinel://:pw@h/m#frag").contains("fragment"));
        assert!(message("rediss+sentinel://h/m#insecure").contains("fragment"));
        assert!(message("redis+sentinel://h/m?ca=/c.pem").contains("rediss+sentinel"));
        assert!(!message("redis+sentinel://:hunter2@h/m/x").contains("hunter2"));
    }

    #[test]
    fn bad_settings_name_their_field() {
        let field = |settings: SentinelSettings| match settings.check() {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("expected InvalidInput, got {:?}", other.map(|v| v.len())),
        };
        let none: [&str; 0] = [];
        assert_eq!(field(SentinelSettings::new(none, "m")), "sentinels");
        assert_eq!(field(SentinelSettings::new(["h:x"], "m")), "sentinels");
        assert_eq!(field(SentinelSettings::new(["h:0"], "m")), "sentinels");
        assert_eq!(field(SentinelSettings::new(["h"], "")), "sentinel_service");
        assert_eq!(
            field(SentinelSettings::new(["h"], "a b")),
            "sentinel_service"
        );
        assert_eq!(field(SentinelSettings::new(["h"], "m").with_db(-1)), "db");
        let named = TlsFiles::default().with_server_name("x");
        assert_eq!(
            field(SentinelSettings::new(["h"], "m").with_tls(named)),
            "tls_server_name"
        );
        let ok = SentinelSettings::new(["h", "h2:26380", "[::1]:26381"], "m").check();
        assert_eq!(ok.map(|v| v.len()).ok(), Some(3));
    }
}
