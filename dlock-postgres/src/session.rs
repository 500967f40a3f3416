//! A lock session: a connection of the client that holds the locks taken on it (every lock, up
//! to [`LOCKS_PER_SESSION`](crate::LOCKS_PER_SESSION)), since a session-level advisory lock
//! belongs to the session that took it.
//!
//! The server ends the session when it has been idle for the session timeout `T`
//! (`idle_session_timeout`, set for this session only), which frees the locks of a client that
//! was paused, frozen or cut off. While locks are held the client pings every `T/4`, so a living
//! client's session is never idle that long. The lease's session bound is the instant the
//! session was last confirmed plus `T`, minus an allowance (a tenth of `T`, 1 % and 2 ms for
//! clock rates): the server cannot have ended the session before then, because its idle timer
//! starts only after it answered. An answer confirms the session as of its request's sending,
//! and a granting statement's answer as of later: it says how long the server worked on the
//! statement ([`sql::WORKED`]), and it left the server at least that long after the request was
//! sent. So a grant held up on the server for most of `T` (by a row or table lock of
//! `dlock_holders`, a semaphore's other grants, a slow server) does not hand out a lease whose
//! session bound is already past, when no other lock of the session is pinged meanwhile to
//! confirm it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, Weak};
use std::time::Duration;

use dlock_core::backend::{SessionState, SessionWatch};
use dlock_core::{Error, Result};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Row, Statement};

use crate::batch::{GrantRequest, Group, ReleaseRequest};
use crate::builder::Settings;
use crate::error::{from_driver, BACKEND};
use crate::sql;

/// One connection and what the client knows of its session.
pub(crate) struct Session {
    /// Counts the sessions of one client: a lock taken in one generation is lost with it.
    pub(crate) generation: u64,
    pub(crate) client: tokio_postgres::Client,
    /// The server process of the session (`pg_backend_pid()`), which `pg_locks` shows.
    pub(crate) pid: i32,
    timeout: Duration,
    request_timeout: Duration,
    state: watch::Sender<SessionState>,
    /// The latest instant the server is known to have answered a request after (see
    /// [`confirmed_by`]): its idle timer started no earlier.
    confirmed: Mutex<Instant>,
    /// When the session last had an answer (or opened): a session idle for half its timeout is
    /// replaced rather than used, so that no request meets the server ending it.
    used: Mutex<Instant>,
    /// Requests sent and not answered yet: the server does not count a session idle while it
    /// runs a statement, however long that takes (a grant held up by a table lock, or many
    /// grants queued on the connection).
    under_way: AtomicUsize,
    ended: AtomicBool,
    /// This connection's prepared statements, by text: dlock sends a few fixed statements over
    /// and over, and a prepared one is parsed once and soon runs on a cached plan, where an
    /// unnamed one is parsed and planned on every call (most of a grant's server time).
    prepared: Mutex<HashMap<String, Statement>>,
    /// The grants and the releases that wait to go together (see [`crate::batch`]).
    pub(crate) grants: Group<GrantRequest>,
    pub(crate) releases: Group<ReleaseRequest>,
}

/// How many statements one session keeps prepared (dlock has fewer; a bound all the same).
const PREPARED_AT_MOST: usize = 64;

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("generation", &self.generation)
            .field("pid", &self.pid)
            .field("ended", &self.ended.load(Ordering::Relaxed))
            .finish()
    }
}

/// A tenth of the timeout, plus 1 % and 2 ms for clock rates.
fn allowance(timeout: Duration) -> Duration {
    timeout / 10 + timeout / 100 + Duration::from_millis(2)
}

/// The instant an answer that arrived at `answered`, to a request sent at `sent`, confirms the
/// session as of: the sending, or, when the answer says that the server worked `worked` on the
/// statement, that much later, less 1 % (the server's clock may run that much faster than
/// ours, as the allowance assumes) and never past the answer's arrival (the server's wall clock
/// may have jumped meanwhile).
fn confirmed_by(sent: Instant, answered: Instant, worked: Option<Duration>) -> Instant {
    let Some(worked) = worked else {
        return sent;
    };
    sent + (worked - worked / 100).min(answered.saturating_duration_since(sent))
}

/// The server's time on the statement, if its answer reports it ([`sql::WORKED`], in the first
/// row); a negative one (the server's clock went back) counts as none.
fn worked(rows: &[Row]) -> Option<Duration> {
    let micros: i64 = rows.first()?.try_get(sql::WORKED).ok()?;
    u64::try_from(micros).ok().map(Duration::from_micros)
}

/// How the lock session plans its statements: once per session, as a generic plan, and never
/// with a sequential or bitmap scan. A grant is one statement of a dozen parts, whose planning
/// took four times its execution (166 µs against 42 µs on PostgreSQL 15); with the default
/// `plan_cache_mode` the server mostly planned it again at every call, since a plan for the given
/// parameters is estimated cheaper than a generic one. A generic plan is made without knowing
/// the table sizes it will meet, so the scans that read a whole table are ruled out: every
/// statement of dlock finds its rows by an index.
const PLANNING: &str =
    "-c plan_cache_mode=force_generic_plan -c enable_seqscan=off -c enable_bitmapscan=off";

/// The driver's settings of a connection: the lock session gets the server-side idle timeout
/// and its [`PLANNING`], the listener neither (it idles by design).
pub(crate) fn driver_config(settings: &Settings, lock_session: bool) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    for (host, port) in &settings.hosts {
        config.host(host).port(*port);
    }
    config
        .user(&settings.user)
        .dbname(&settings.database)
        .application_name(&settings.application_name)
        .connect_timeout(settings.connect_timeout)
        .keepalives(true)
        // Only a server that takes writes (a primary) can grant: the token and the row are
        // writes, and NOTIFY and pg_locks are the primary's own. Among several hosts, libpq's
        // `target_session_attrs=read-write` picks it; both connections go to it.
        .target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite)
        .keepalives_idle(settings.session_timeout.max(Duration::from_secs(2)) / 2);
    if let Some(password) = &settings.password {
        config.password(password.0.as_bytes());
    }
    if lock_session {
        config
            .options(format!(
                "-c idle_session_timeout={} {PLANNING}",
                settings.session_timeout.as_millis()
            ))
            .tcp_user_timeout(settings.session_timeout);
    }
    config
}

/// A connection's driving half, which a task must poll for the client to make progress.
pub(crate) type Connection = tokio_postgres::Connection<
    tokio_postgres::Socket,
    <tokio_postgres_rustls::MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<
        tokio_postgres::Socket,
    >>::Stream,
>;

/// Connects with `settings`: the lock session (`lock_session`) or the listener.
pub(crate) async fn connect(
    settings: &Settings,
    lock_session: bool,
) -> Result<(tokio_postgres::Client, Connection)> {
    let mut config = driver_config(settings, lock_session);
    let (mode, rustls) = settings.tls.load()?;
    config.ssl_mode(mode);
    let tls = tokio_postgres_rustls::MakeRustlsConnect::new(rustls);
    match tokio::time::timeout(settings.connect_timeout, config.connect(tls)).await {
        Ok(result) => result.map_err(|e| from_driver(e, "connect")),
        Err(_) => Err(Error::no_answer(
            "PostgreSQL connect",
            settings.connect_timeout,
        )),
    }
}

impl Session {
    /// A session of `client` (whose server process is `pid`), confirmed at `sent`.
    pub(crate) fn new(
        generation: u64,
        client: tokio_postgres::Client,
        pid: i32,
        settings: &Settings,
        sent: Instant,
    ) -> Session {
        let timeout = settings.session_timeout;
        let until = sent + timeout - allowance(timeout);
        Session {
            generation,
            client,
            pid,
            timeout,
            request_timeout: settings.request_timeout,
            state: watch::Sender::new(SessionState::Alive { until: Some(until) }),
            confirmed: Mutex::new(sent),
            used: Mutex::new(sent),
            under_way: AtomicUsize::new(0),
            ended: AtomicBool::new(false),
            prepared: Mutex::default(),
            grants: Group::default(),
            releases: Group::default(),
        }
    }

    /// The session timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// What leases granted in this session follow.
    pub(crate) fn watch(&self) -> SessionWatch {
        self.state.subscribe()
    }

    /// Whether the session is over (or the connection gone, which ends it).
    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire) || self.client.is_closed()
    }

    /// Whether the session may serve a request now: alive, and not idle so long that the server
    /// may be ending it.
    pub(crate) fn is_fresh(&self, now: Instant) -> bool {
        !self.is_ended()
            && self
                .idle_since()
                .is_none_or(|since| now.saturating_duration_since(since) < self.timeout / 2)
    }

    /// Since when the session has been idle (its last answer, or its opening), or `None` while a
    /// statement is under way on it.
    pub(crate) fn idle_since(&self) -> Option<Instant> {
        if self.under_way.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(*self.used.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn touch(&self, at: Instant) {
        *self.used.lock().unwrap_or_else(|e| e.into_inner()) = at;
    }

    /// The latest instant the server is known to keep the session until.
    pub(crate) fn bound(&self) -> Instant {
        let confirmed = *self.confirmed.lock().unwrap_or_else(|e| e.into_inner());
        confirmed + self.timeout - allowance(self.timeout)
    }

    /// The server answered a request after `at` (the request's sending, or later: see
    /// [`confirmed_by`]).
    pub(crate) fn confirm(&self, at: Instant) {
        {
            let mut confirmed = self.confirmed.lock().unwrap_or_else(|e| e.into_inner());
            if at > *confirmed {
                *confirmed = at;
            }
        }
        if !self.ended.load(Ordering::Acquire) {
            let until = self.bound();
            self.state.send_if_modified(|state| match state {
                SessionState::Alive { until: old } if *old == Some(until) => false,
                SessionState::Expired => false,
                _ => {
                    *state = SessionState::Alive { until: Some(until) };
                    true
                }
            });
        }
    }

    /// The client cannot reach the server: leases are uncertain until the bound.
    pub(crate) fn suspend(&self) {
        if !self.ended.load(Ordering::Acquire) {
            let until = self.bound();
            self.state.send_if_modified(|state| match state {
                SessionState::Expired | SessionState::Suspended { .. } => false,
                _ => {
                    *state = SessionState::Suspended { until };
                    true
                }
            });
        }
    }

    /// The session is gone, and every lock in it. Returns whether this call ended it.
    pub(crate) fn end(&self) -> bool {
        let first = !self.ended.swap(true, Ordering::AcqRel);
        self.state.send_replace(SessionState::Expired);
        first
    }

    /// Runs `sql` as a statement prepared on this connection (prepared on first use).
    async fn run(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
        let cached = self
            .prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(sql)
            .cloned();
        let statement = match cached {
            Some(statement) => statement,
            None => {
                let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
                let statement = self.client.prepare_typed(sql, &types).await?;
                let mut prepared = self.prepared.lock().unwrap_or_else(|e| e.into_inner());
                if prepared.len() < PREPARED_AT_MOST {
                    prepared.insert(sql.to_string(), statement.clone());
                }
                statement
            }
        };
        let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(value, _)| *value).collect();
        self.client.query(&statement, &values).await
    }

    /// Runs one statement with typed parameters within the request timeout, confirming the
    /// session on an answer: as of the request's sending, or later if the answer reports the
    /// server's time on the statement ([`sql::WORKED`], as the granting statements do). A timeout
    /// suspends the session (the connection is stuck).
    pub(crate) async fn query(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        what: &'static str,
    ) -> Result<Vec<Row>> {
        let sent = Instant::now();
        let _under_way = UnderWay::start(self);
        match tokio::time::timeout(self.request_timeout, self.run(sql, params)).await {
            Ok(Ok(rows)) => {
                let answered = Instant::now();
                self.confirm(confirmed_by(sent, answered, worked(&rows)));
                self.touch(answered);
                Ok(rows)
            }
            Ok(Err(e)) => {
                if e.as_db_error().is_some() {
                    // The server answered, with an error.
                    self.confirm(sent);
                    self.touch(Instant::now());
                } else {
                    self.suspend();
                }
                Err(from_driver(e, what))
            }
            Err(_) => {
                self.suspend();
                Err(Error::no_answer(
                    format_args!("PostgreSQL {what}"),
                    self.request_timeout,
                ))
            }
        }
    }
}

/// A request under way on a session, from its sending to its answer (or its caller giving up);
/// an answer counts as use (the server's idle time starts when the statement ends), a request
/// that timed out or was dropped does not.
struct UnderWay<'a>(&'a Session);

impl<'a> UnderWay<'a> {
    fn start(session: &'a Session) -> Self {
        session.under_way.fetch_add(1, Ordering::AcqRel);
        UnderWay(session)
    }
}

impl Drop for UnderWay<'_> {
    fn drop(&mut self) {
        self.0.under_way.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether the driver's error says the server ended the session (SQLSTATE class 57: terminated
/// by an administrator, a shutdown or an idle timeout), so that its locks are gone for sure.
pub(crate) fn server_ended(error: &tokio_postgres::Error) -> bool {
    error
        .as_db_error()
        .is_some_and(|db| db.code().code().starts_with("57"))
}

/// Ends the session when its connection stops: at once if the server ended it, otherwise (the
/// connection broke; the server may keep the session) after its bound.
pub(crate) async fn follow_connection<F>(session: Weak<Session>, connection: F)
where
    F: std::future::Future<Output = std::result::Result<(), tokio_postgres::Error>>,
{
    let ended_by_server = match connection.await {
        Ok(()) => false,
        Err(e) => {
            tracing::debug!(backend = BACKEND, error = %e, "PostgreSQL connection ended");
            server_ended(&e)
        }
    };
    let Some(session) = session.upgrade() else {
        return;
    };
    if !ended_by_server {
        session.suspend();
        tokio::time::sleep_until(session.bound()).await;
    }
    session.end();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reported_server_time_confirms_the_session_later_but_never_past_the_answer() {
        let sent = Instant::now();
        let answered = sent + Duration::from_millis(1_800);
        assert_eq!(confirmed_by(sent, answered, None), sent);
        assert_eq!(
            confirmed_by(sent, answered, Some(Duration::from_millis(1_700))),
            sent + Duration::from_millis(1_683),
            "less 1 % for the server's clock rate"
        );
        assert_eq!(
            confirmed_by(sent, answered, Some(Duration::from_secs(3_600))),
            answered,
            "a server clock that jumped"
        );
        assert_eq!(confirmed_by(sent, sent, Some(Duration::ZERO)), sent);
    }
}
