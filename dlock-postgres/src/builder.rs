//! Configuration of a PostgreSQL lock client, and its connection string, validated before
//! anything is sent.
//!
//! `postgres://[user[:password]@]host[:port][,host[:port]…][/database][?parameters]` (also
//! `postgresql://`). Parameters: `sslmode`, `sslrootcert`, `sslcert`, `sslkey` (as libpq reads
//! them, see [`SslMode`]), `session_timeout` (how long the server keeps the locks of a silent
//! client; default 10 s), `request_timeout` and `connect_timeout` (durations such as `10s` or
//! `1500ms`), `application_name`, `owner` (the application label of the owner records), and
//! `waiting_connections` (default 4; see [`PgLockBuilder::with_waiting_connections`]).
//! Several hosts are tried in order, as libpq does, for the first that takes writes (libpq's
//! `target_session_attrs=read-write`: a primary, not a standby). The port defaults to 5432, the user to
//! `postgres`, the database to the user's name.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use dlock_core::backend::check_within;
use dlock_core::backend::url::FromUrl;
use dlock_core::{Error, Owner, Result};

use crate::client::PgLock;
use crate::tls::{PgTls, SslMode};

/// How long the server keeps a silent client's session (and so its locks) when none is set.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// The shortest session timeout accepted.
pub const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(500);
/// The longest session timeout accepted (one hour).
pub const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(3600);
/// How long one request may wait for an answer when none is set.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting may take when none is set.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest request or connect timeout accepted.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(120);
/// PostgreSQL's port.
pub const DEFAULT_PORT: u16 = 5432;
/// How many connections a client opens at most for its waiting acquires when none is set (see
/// [`PgLockBuilder::with_waiting_connections`]).
pub const DEFAULT_WAITING_CONNECTIONS: usize = 4;
/// The most waiting connections accepted per client.
pub const MAX_WAITING_CONNECTIONS: usize = 64;

/// The schemes of a PostgreSQL connection string.
pub const SCHEMES: &[&str] = &["postgres", "postgresql"];

/// A password that never shows in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(pub(crate) String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Builds a [`PgLock`], in code or from a connection string
/// ([`from_url`](Self::from_url)):
///
/// `postgres://[user[:password]@]host[:port][,host[:port]…][/database][?parameters]` (also
/// `postgresql://`). Parameters: `sslmode`, `sslrootcert`, `sslcert`, `sslkey` (as libpq reads
/// them, see [`SslMode`]), `session_timeout` (how long the server keeps the locks of a silent
/// client; default 10 s), `request_timeout` and `connect_timeout` (durations such as `10s` or
/// `1500ms`), `application_name`, `owner` (the application label of the owner records), and
/// `waiting_connections` (default 4; see [`PgLockBuilder::with_waiting_connections`]).
/// Several hosts are tried in order, as libpq does, for the first that takes writes (libpq's
/// `target_session_attrs=read-write`: a primary, not a standby). The port defaults to 5432, the user to
/// `postgres`, the database to the user's name.
#[derive(Debug, Clone)]
pub struct PgLockBuilder {
    hosts: Vec<(String, u16)>,
    user: String,
    password: Option<Secret>,
    database: Option<String>,
    pub(crate) tls: PgTls,
    session_timeout: Duration,
    request_timeout: Duration,
    connect_timeout: Duration,
    application_name: Option<String>,
    owner: Option<String>,
    waiting_connections: usize,
}

/// What a client runs with.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) hosts: Vec<(String, u16)>,
    pub(crate) user: String,
    pub(crate) password: Option<Secret>,
    pub(crate) database: String,
    pub(crate) tls: PgTls,
    pub(crate) session_timeout: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) application_name: String,
    pub(crate) owner: Owner,
    pub(crate) waiting_connections: usize,
}

impl Default for PgLockBuilder {
    fn default() -> Self {
        PgLockBuilder::new()
    }
}

impl PgLockBuilder {
    /// A builder for `localhost:5432`, user `postgres`, `sslmode=prefer`.
    pub fn new() -> Self {
        PgLockBuilder {
            hosts: Vec::new(),
            user: "postgres".into(),
            password: None,
            database: None,
            tls: PgTls::default(),
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            application_name: None,
            owner: None,
            waiting_connections: DEFAULT_WAITING_CONNECTIONS,
        }
    }

    /// Parses a connection string (the form and parameters above). A malformed string is an
    /// [`Error::InvalidInput`] for field `url` that never repeats the password.
    pub fn from_url(url: &str) -> Result<Self> {
        <Self as FromUrl>::from_url(url)
    }

    /// Adds a server to try (in the order added).
    pub fn with_host(mut self, host: impl Into<String>, port: u16) -> Self {
        self.hosts.push((host.into(), port));
        self
    }

    /// The user and password to log in with.
    pub fn with_credentials(mut self, user: impl Into<String>, password: Option<String>) -> Self {
        self.user = user.into();
        self.password = password.map(Secret);
        self
    }

    /// The database (default: the user's name). dlock keeps a sequence (`dlock_fencing`) and an
    /// unlogged table (`dlock_holders`) there, in the first schema of the search path.
    pub fn with_database(mut self, database: impl Into<String>) -> Self {
        self.database = Some(database.into());
        self
    }

    /// libpq's `sslmode` (default `prefer`).
    pub fn with_ssl_mode(mut self, mode: SslMode) -> Self {
        self.tls.mode = mode;
        self
    }

    /// libpq's `sslrootcert`: the authority the server's certificate must chain to.
    pub fn with_root_cert(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls.files.ca = Some(path.into());
        self
    }

    /// libpq's `sslcert` and `sslkey`: a client certificate and its key.
    pub fn with_client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls.files.cert = Some(cert.into());
        self.tls.files.key = Some(key.into());
        self
    }

    /// How long the server keeps the session of a client it no longer hears from, and so its
    /// locks: the server ends a session idle for longer (`idle_session_timeout`), and the client,
    /// which pings every quarter of it while it holds locks, counts its leases lost before then.
    pub fn with_session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// How long one request may wait for its answer.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How long connecting may take.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The `application_name` the sessions show in `pg_stat_activity` (default `dlock`).
    pub fn with_application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = Some(name.into());
        self
    }

    /// The application label of the owner records this client writes.
    pub fn with_owner(mut self, label: impl Into<String>) -> Self {
        self.owner = Some(label.into());
        self
    }

    /// At most `count` connections the client opens for its waiting acquires (default 4, up
    /// to 64; each closed once unused for 10 to 15 s): on one, a waiter blocks in PostgreSQL's
    /// lock manager and is woken by the release that concerns it alone. Waiters beyond them,
    /// and all with `0`, wait for a release's announcement (`pg_notify`), which PostgreSQL
    /// delivers by signalling every listening server process of the database: with many
    /// clients, each hand-off then costs time in proportion to them.
    ///
    /// A client holds its lock sessions (one per 2,000 held locks) and a listening connection
    /// besides, so the server's `max_connections` should allow each client
    /// 2 + `count` connections (more with many held locks).
    pub fn with_waiting_connections(mut self, count: usize) -> Self {
        self.waiting_connections = count;
        self
    }

    /// Checks the settings; nothing is sent.
    pub(crate) fn validate(&self) -> Result<Settings> {
        check_within(
            "session_timeout",
            self.session_timeout,
            MIN_SESSION_TIMEOUT..=MAX_SESSION_TIMEOUT,
        )?;
        check_within(
            "request_timeout",
            self.request_timeout,
            Duration::from_millis(1)..=MAX_TIMEOUT,
        )?;
        check_within(
            "connect_timeout",
            self.connect_timeout,
            Duration::from_millis(1)..=MAX_TIMEOUT,
        )?;
        if self.user.is_empty() {
            return Err(Error::invalid("user", "the user name is empty"));
        }
        for (host, _) in &self.hosts {
            if host.is_empty() {
                return Err(Error::invalid("host", "a host name is empty"));
            }
        }
        self.tls.validate()?;
        check_within(
            "waiting_connections",
            self.waiting_connections,
            0..=MAX_WAITING_CONNECTIONS,
        )?;
        let owner = Owner::labelled(self.owner.clone())?;
        let application_name = self
            .application_name
            .clone()
            .unwrap_or_else(|| "dlock".into());
        if application_name.len() > 63 || !application_name.is_ascii() {
            return Err(Error::invalid(
                "application_name",
                "at most 63 ASCII characters (the server cuts longer names)",
            ));
        }
        Ok(Settings {
            hosts: if self.hosts.is_empty() {
                vec![("localhost".into(), DEFAULT_PORT)]
            } else {
                self.hosts.clone()
            },
            user: self.user.clone(),
            password: self.password.clone(),
            database: self.database.clone().unwrap_or_else(|| self.user.clone()),
            tls: self.tls.clone(),
            session_timeout: self.session_timeout,
            request_timeout: self.request_timeout,
            connect_timeout: self.connect_timeout,
            application_name,
            owner,
            waiting_connections: self.waiting_connections,
        })
    }

    /// Checks the settings and connects (opening the lock session at once, so that a wrong
    /// address or password fails here).
    pub async fn connect(self) -> Result<PgLock> {
        PgLock::start(self.validate()?).await
    }
}
