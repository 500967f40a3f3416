//! The PostgreSQL lock client, [`PgLock`], and its implementation of the lock contract.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{
    Attempt, Capabilities, ExtendRequest, Extension, FencingGuarantee, Grant, LeaseRef, LockKey,
    LockRequest, Primitive, Primitives, Waiting,
};
use dlock_core::inspect::{Eviction, HeldLock, Holding};
use dlock_core::layer::Layer;
use dlock_core::{Backoff, DistributedLock, Error, FencingToken, Released, Result};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_postgres::types::Type;

use crate::batch::{self, GrantRequest, ReleaseRequest};
use crate::builder::{PgLockBuilder, Settings};
use crate::error::{session_gone, BACKEND};
use crate::held::{Entry, Held, Kind};
use crate::key::{advisory_key, AdvisoryKey};
use crate::listener::Listener;
use crate::lock_wait::{ticket_of, Seat, Seats, Target, Waited, MAX_SLICE};
use crate::session::{connect, follow_connection, Session};
use crate::sql::{self, KeyParams};

/// A distributed lock service on PostgreSQL.
///
/// One value is one client: a lock session that holds the locks it takes (another one for every
/// further [`LOCKS_PER_SESSION`]), and one connection that hears releases and serves reads. Clone it (cheaply) to share it between tasks, or hold
/// it as `Arc<dyn DistributedLock>`. See the crate documentation for the protocol.
#[derive(Clone)]
pub struct PgLock {
    inner: Arc<Inner>,
}

/// What every clone of one [`PgLock`] shares.
pub(crate) struct Inner {
    pub(crate) settings: Settings,
    sessions: tokio::sync::Mutex<Sessions>,
    /// Taken while a lock session is chosen or opened, so that one opens at a time, without
    /// holding `sessions` (which releases and renewals need) while it connects.
    opening: tokio::sync::Mutex<()>,
    generations: AtomicU64,
    schema_ready: AtomicBool,
    held: Mutex<Held>,
    keeper: Notify,
    pub(crate) listener: Arc<Listener>,
    /// The connections waiting acquires wait in the lock manager on (see [`crate::lock_wait`]).
    seats: Arc<Seats>,
    /// The owners that may stand in a lock's queue on the server, with the key's release
    /// payload and the generation of the session their last attempt went to: a release by
    /// owner token, as a dropped acquire sends, withdraws them there.
    queued: Mutex<HashMap<u128, (String, u64)>>,
    /// Serializes this client's semaphore grants: each picks a free slot skipping the slots
    /// this client uses, which a grant under way would not show yet.
    pub(crate) permit_turn: tokio::sync::Mutex<()>,
    this: Weak<Inner>,
}

/// How many locks one lock session holds before the client opens another for new ones (a few
/// more when grants were under way as it filled).
///
/// Every statement a PostgreSQL 15 session runs costs time in proportion to the locks it holds:
/// ending a transaction walks the session's whole table of local locks, advisory ones included.
/// Measured on one server with `SELECT 1`: 34 µs with no advisory lock held, 65 µs with 1,000,
/// 505 µs with 10,000, 6.6 ms with 50,000. Capping a session's locks keeps its grants and
/// releases near the first figure; 100,000 held locks take 50 sessions (and the client's
/// listening connection beside them).
pub const LOCKS_PER_SESSION: usize = 2_000;

/// The lock sessions of one client.
#[derive(Default)]
struct Sessions {
    /// Where new locks go.
    current: Option<Arc<Session>>,
    /// Sessions new locks no longer go to, by generation: those that hold [`LOCKS_PER_SESSION`]
    /// or more (or did), and those left idle for half the session timeout. Each stays open
    /// while it holds a lock or serves a statement; then it is closed at the next grant.
    retired: HashMap<u64, Arc<Session>>,
}

impl Sessions {
    /// Closes the retired sessions that no longer hold a lock, nor serve a statement.
    fn close_idle_retired(&mut self, held: &Held) {
        self.retired.retain(|generation, session| {
            !session.is_ended() && (held.holds_in(*generation) || Arc::strong_count(session) > 1)
        });
    }
}

impl fmt::Debug for PgLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.inner.settings;
        f.debug_struct("PgLock")
            .field("hosts", &s.hosts)
            .field("user", &s.user)
            .field("database", &s.database)
            .field("sslmode", &s.tls.mode)
            .field("session_timeout", &s.session_timeout)
            .field("held", &self.inner.held().len())
            .finish()
    }
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inner").finish_non_exhaustive()
    }
}

impl PgLock {
    /// What a PostgreSQL client declares about itself ([`DistributedLock::capabilities`]): tokens
    /// from a sequence, ordered while the server keeps its data; releases that wake waiters, the
    /// lock's in arrival order from a queue table; locks that live in the client's session; the
    /// semaphore and the read-write lock, no election.
    pub const CAPABILITIES: Capabilities =
        Capabilities::new(FencingGuarantee::MonotonicWhileDataSurvives)
            .with_notifications()
            .with_sessions()
            .with_fair_queue()
            .with_primitives(primitives());

    /// Connects with a connection string (see [`PgLockBuilder`] for its form and parameters).
    pub async fn connect(url: &str) -> Result<PgLock> {
        PgLockBuilder::from_url(url)?.connect().await
    }

    /// A builder, for settings in code.
    pub fn builder() -> PgLockBuilder {
        PgLockBuilder::new()
    }

    pub(crate) async fn start(settings: Settings) -> Result<PgLock> {
        let inner = Arc::new_cyclic(|this| Inner {
            settings,
            sessions: tokio::sync::Mutex::new(Sessions::default()),
            opening: tokio::sync::Mutex::new(()),
            generations: AtomicU64::new(0),
            schema_ready: AtomicBool::new(false),
            held: Mutex::new(Held::default()),
            keeper: Notify::new(),
            listener: Arc::new(Listener::new()),
            seats: Arc::default(),
            queued: Mutex::default(),
            permit_turn: tokio::sync::Mutex::new(()),
            this: this.clone(),
        });
        inner.session().await?;
        inner.listener.start(&inner.settings);
        tokio::spawn(keeper(Arc::downgrade(&inner)));
        Ok(PgLock { inner })
    }

    /// The advisory key a lock name maps to (see [`advisory_key`]): what to hand to
    /// `pg_advisory_lock` in psql or another library to exclude each other.
    pub fn advisory_key(name: &str) -> AdvisoryKey {
        advisory_key(name)
    }

    /// The server process of the lock session new locks go to, if one is open (`pg_locks.pid`).
    pub async fn session_pid(&self) -> Option<i32> {
        let sessions = self.inner.sessions.lock().await;
        sessions
            .current
            .as_ref()
            .filter(|s| !s.is_ended())
            .map(|s| s.pid)
    }
}

/// Every lock call goes to the shared state; the primitives are views of it.
impl Layer for PgLock {
    fn inner(&self) -> &dyn DistributedLock {
        self.inner.as_ref()
    }

    /// The semaphore and the two sides of the read-write lock, sharing this client's lock
    /// session, its table of held locks, its keeper and its listener (see
    /// [`primitives`](crate::primitives) for their layout). There is no election.
    fn primitive(&self, primitive: &Primitive) -> Result<Arc<dyn DistributedLock>> {
        primitive.validate()?;
        let view = crate::primitives::View::new(self.inner.clone(), primitive)?;
        Ok(Arc::new(view))
    }
}

/// The TTL an attempt asks for, and the instant it counts from: when the attempt began, before
/// it sought a session (opening one can take long), so that the server never keeps a lock past
/// the validity its lease reports.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Term {
    pub(crate) sent: Instant,
    pub(crate) ttl: Duration,
}

impl Term {
    /// A TTL of `ttl` from now.
    pub(crate) fn starting_now(ttl: Duration) -> Term {
        Term {
            sent: Instant::now(),
            ttl,
        }
    }

    /// When it runs out.
    pub(crate) fn until(&self) -> Instant {
        self.sent + self.ttl
    }
}

/// How an attempt on a lock treats its queue.
#[derive(Debug, Clone, Copy)]
struct Queueing {
    /// How long the attempt's queue entry lives unless refreshed (zero: never queue).
    lifetime: Duration,
    /// Whether the client lets the owner take the key (no other owner of it holds the key).
    may_take: bool,
    /// Whether the entry goes without a wake tag: the waiter is seated, and waits in the lock
    /// manager rather than for an announcement.
    quiet: bool,
}

/// Where a busy attempt stands in the lock's queue: when another waiter heads it, which (its
/// owner token in hex), and in how long its entry lapses; neither when the attempt heads the
/// queue or nobody does. `ahead` is the waiter just ahead of the attempt, if any.
#[derive(Debug, Clone, Default)]
struct Place {
    head_waiter: Option<String>,
    head_lapses_in: Option<Duration>,
    ahead: Option<String>,
}

/// The granting statement's one row: the token if granted, and the caller's place in the queue.
fn grant_answer(rows: &[tokio_postgres::Row]) -> Result<(Option<i64>, Place)> {
    let reply = |e: tokio_postgres::Error| {
        Error::backend(BACKEND, false, format!("the grant's answer: {e}"))
    };
    let row = rows
        .first()
        .ok_or_else(|| Error::backend(BACKEND, false, "the grant gave no answer"))?;
    let token: Option<i64> = row.try_get(0).map_err(reply)?;
    let place = Place {
        head_waiter: row.try_get(2).map_err(reply)?,
        head_lapses_in: row
            .try_get::<_, Option<i64>>(1)
            .map_err(reply)?
            .map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
        ahead: row.try_get(3).map_err(reply)?,
    };
    Ok((token, place))
}

/// The primitives this backend serves besides the lock.
pub(crate) const fn primitives() -> Primitives {
    Primitives::ALL.without_election()
}

impl Inner {
    pub(crate) fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn arc(&self) -> Result<Arc<Inner>> {
        self.this
            .upgrade()
            .ok_or_else(|| session_gone("use a dropped client"))
    }

    /// The lock session new locks go to: the current one if it can serve and holds fewer than
    /// [`LOCKS_PER_SESSION`], otherwise a new one (the one it replaces stays open while it holds
    /// locks or serves a statement).
    pub(crate) async fn session(&self) -> Result<Arc<Session>> {
        let _opening = self.opening.lock().await;
        {
            let mut sessions = self.sessions.lock().await;
            let held = self.held();
            sessions.close_idle_retired(&held);
            if let Some(session) = sessions.current.take() {
                let holds = held.held_in(session.generation);
                if !session.is_ended() {
                    let usable = holds > 0 || session.is_fresh(Instant::now());
                    if usable && holds < LOCKS_PER_SESSION {
                        sessions.current = Some(session.clone());
                        return Ok(session);
                    }
                    // Kept while it holds a lock or serves a statement: a grant under way on
                    // it records its lock there, and the lease must find the session again.
                    sessions.retired.insert(session.generation, session);
                }
            }
        }
        let session = self.open().await?;
        self.sessions.lock().await.current = Some(session.clone());
        Ok(session)
    }

    /// Whether the session of `generation` is the one new locks go to.
    async fn is_current(&self, generation: u64) -> bool {
        let sessions = self.sessions.lock().await;
        sessions
            .current
            .as_ref()
            .is_some_and(|s| s.generation == generation)
    }

    /// The session of `generation`, if it is open and has not ended.
    pub(crate) async fn session_of(&self, generation: u64) -> Option<Arc<Session>> {
        let sessions = self.sessions.lock().await;
        sessions
            .current
            .iter()
            .chain(sessions.retired.get(&generation))
            .find(|s| s.generation == generation && !s.is_ended())
            .cloned()
    }

    async fn open(&self) -> Result<Arc<Session>> {
        let generation = self.generations.fetch_add(1, Ordering::AcqRel) + 1;
        let sent = Instant::now();
        let (client, connection) = connect(&self.settings, true).await?;
        let (ended_tx, ended_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let _ = ended_tx.send(connection.await);
        });
        let rows = tokio::time::timeout(
            self.settings.request_timeout,
            client.query_typed("SELECT pg_backend_pid()", &[]),
        )
        .await
        .map_err(|_| Error::no_answer("PostgreSQL session start", self.settings.request_timeout))?
        .map_err(|e| crate::error::from_driver(e, "start the session"))?;
        let pid: i32 = rows
            .first()
            .and_then(|r| r.try_get(0).ok())
            .ok_or_else(|| Error::backend(BACKEND, false, "pg_backend_pid() gave no answer"))?;
        let session = Arc::new(Session::new(generation, client, pid, &self.settings, sent));
        if !self.schema_ready.load(Ordering::Acquire) {
            self.ensure_schema(&session).await?;
        }
        // Best effort: a stale row only misleads operators until its name is granted again.
        if let Err(e) = session
            .query(sql::SWEEP, &[], "sweep ended sessions' rows")
            .await
        {
            tracing::debug!(backend = BACKEND, error = %e, "sweeping stale holder rows failed");
        }
        let weak = Arc::downgrade(&session);
        let inner = self.this.clone();
        tokio::spawn(async move {
            let ended = async move { ended_rx.await.unwrap_or(Ok(())) };
            follow_connection(weak, ended).await;
            if let Some(inner) = inner.upgrade() {
                inner.session_ended(generation).await;
            }
        });
        tokio::spawn(watchdog(self.this.clone(), Arc::downgrade(&session)));
        Ok(session)
    }

    /// Creates the sequence and the table if they are missing.
    async fn ensure_schema(&self, session: &Session) -> Result<()> {
        let rows = session
            .query(sql::SCHEMA_EXISTS, &[], "look for dlock's table")
            .await?;
        let exists = rows.first().and_then(|r| r.try_get::<_, bool>(0).ok()) == Some(true);
        if !exists {
            let create = sql::create_schema();
            tokio::time::timeout(
                self.settings.request_timeout,
                session.client.batch_execute(&create),
            )
            .await
            .map_err(|_| Error::no_answer("create dlock's table", self.settings.request_timeout))?
            .map_err(|e| crate::error::from_driver(e, "create dlock_fencing and dlock_holders"))?;
        }
        self.schema_ready.store(true, Ordering::Release);
        Ok(())
    }

    /// Forgets the locks of an ended session, wakes their local waiters, and drops the session
    /// so that its connection closes.
    async fn session_ended(&self, generation: u64) {
        let gone = self.held().take_generation(generation);
        for entry in &gone {
            self.listener.wake(&announced(entry));
        }
        let mut sessions = self.sessions.lock().await;
        if sessions
            .current
            .as_ref()
            .is_some_and(|s| s.generation == generation)
        {
            sessions.current = None;
        }
        sessions.retired.remove(&generation);
    }

    /// Takes `key` for `owner` on `session` if nobody else heads its queue (run in a task of its
    /// own, so that a dropped caller cannot leave a grant unrecorded). A waiting attempt
    /// (`queue.lifetime` not zero) that is not granted stands in the queue; one the client does
    /// not let take the key (`queue.may_take` false) only queues.
    async fn grant(
        self: Arc<Self>,
        session: Arc<Session>,
        owner: u128,
        key: AdvisoryKey,
        name: String,
        term: Term,
        queue: Queueing,
    ) -> Result<(Attempt, Place)> {
        let Term { sent, ttl } = term;
        let request = GrantRequest {
            key: KeyParams::new(key),
            name,
            record: self.settings.owner.record().to_json(),
            waiter: holder_of(owner),
            tag: (!queue.quiet).then(|| self.listener.tag().clone()),
            lifetime: i64::try_from(queue.lifetime.as_millis()).unwrap_or(i64::MAX),
            may_take: queue.may_take,
        };
        let answer = batch::run(&session, |s| &s.grants, request)
            .await
            .and_then(|rows| grant_answer(&rows));
        let (token, place) = match answer {
            Ok(answer) => answer,
            Err(e) => {
                let params = KeyParams::new(key);
                // A statement that failed may have taken the lock before failing (session locks
                // outlive a failed statement): give it back before freeing the reservation. A
                // queue entry it may have made stays known (`queued`), so the release by owner
                // token that follows a failed acquire withdraws it.
                if queue.may_take {
                    tokio::spawn(async move {
                        if !session.is_ended() {
                            let unlock = sql::unlock(&params, "pg_advisory_unlock");
                            let _ = session
                                .query(&unlock, &params.with(&[]), "undo a failed grant")
                                .await;
                        }
                        self.held().remove(owner);
                    });
                }
                return Err(e);
            }
        };
        let Some(token) = token else {
            let params = KeyParams::new(key);
            if queue.may_take {
                self.held().remove(owner);
                // A waiter of this client heading the queue may have been refused the key
                // locally because of this attempt's reservation: it tries again now.
                let local_head = place.head_waiter.as_deref().filter(|h| {
                    u128::from_str_radix(h, 16).is_ok_and(|h| h != owner && self.is_queued(h))
                });
                if let Some(head) = local_head {
                    self.listener
                        .wake(&sql::wake_payload(&params.payload, head));
                }
            }
            if !queue.lifetime.is_zero() && !self.is_queued(owner) {
                // Withdrawn while this attempt was under way: it queued again.
                self.withdraw(&params.payload, session.generation, owner)
                    .await;
            }
            return Ok((Attempt::Busy { retry_after: None }, place));
        };
        self.queued().remove(&owner);
        let attempt = self
            .finish_grant(&session, owner, token as u64, sent, ttl)
            .await?;
        Ok((attempt, place))
    }

    fn queued(&self) -> MutexGuard<'_, HashMap<u128, (String, u64)>> {
        self.queued.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_queued(&self, owner: u128) -> bool {
        self.queued().contains_key(&owner)
    }

    /// Takes `owner` out of the queue of the lock with release payload `payload`, waking the
    /// new head if it headed it; failures are logged, as the entry lapses with its TTL anyway.
    ///
    /// It is sent on the session of the owner's last attempt (`generation`) while it is open,
    /// and on the client's second connection otherwise. An attempt of the same owner still under
    /// way may reach the server after it (one that waits to share a statement, see
    /// [`crate::batch`], or one sent on another connection) and queue the owner again: the
    /// attempt withdraws it once more when its answer finds the owner withdrawn.
    async fn withdraw(&self, payload: &str, generation: u64, owner: u128) {
        let timeout = self.settings.request_timeout;
        let waiter = holder_of(owner);
        let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 2] =
            [(&payload, Type::TEXT), (&waiter, Type::TEXT)];
        let done = match self.session_of(generation).await {
            Some(session) => session
                .query(sql::WITHDRAW, &params, "withdraw from the queue")
                .await
                .map(|_| ()),
            None => {
                async {
                    let client = self
                        .listener
                        .client(timeout)
                        .await
                        .ok_or_else(|| session_gone("withdraw from the queue"))?;
                    tokio::time::timeout(timeout, client.query_typed(sql::WITHDRAW, &params))
                        .await
                        .map_err(|_| Error::no_answer("withdraw from the queue", timeout))?
                        .map_err(|e| crate::error::from_driver(e, "withdraw from the queue"))?;
                    Ok::<(), Error>(())
                }
                .await
            }
        };
        if let Err(error) = done {
            tracing::debug!(backend = BACKEND, %error, "a queue entry could not be withdrawn; it lapses with its TTL");
        }
    }

    /// One attempt on the lock `req` asks for; a waiting one (`lifetime` not zero) stands in
    /// the queue if not granted.
    async fn attempt(
        &self,
        req: &LockRequest<'_>,
        lifetime: Duration,
        quiet: bool,
    ) -> Result<(Attempt, Place)> {
        let key = advisory_key(req.key.as_str());
        let owner = req.owner.as_u128();
        // The TTL counts from here, before a session is sought (opening one can take long):
        // the server never keeps the lock longer than the lease says it is valid.
        let term = Term::starting_now(req.ttl);
        let may_take = self
            .held()
            .reserve(owner, key, req.key.as_str(), term.until());
        if !may_take && lifetime.is_zero() {
            return Ok((Attempt::Busy { retry_after: None }, Place::default()));
        }
        let session = match self.session().await {
            Ok(session) => session,
            Err(e) => {
                if may_take {
                    self.held().remove(owner);
                }
                return Err(e);
            }
        };
        if !lifetime.is_zero() {
            let payload = KeyParams::new(key).payload;
            self.queued().insert(owner, (payload, session.generation));
        }
        let inner = self.arc()?;
        let name = req.key.as_str().to_string();
        let queue = Queueing {
            lifetime,
            may_take,
            quiet,
        };
        granted(tokio::spawn(
            inner.grant(session, owner, key, name, term, queue),
        ))
        .await
    }

    /// Concludes a granting statement that returns the token in its one row, or no row when the
    /// key is busy (which frees the reservation).
    pub(crate) async fn token_or_busy(
        &self,
        session: &Arc<Session>,
        owner: u128,
        rows: &[tokio_postgres::Row],
        sent: Instant,
        ttl: Duration,
    ) -> Result<Attempt> {
        let Some(row) = rows.first() else {
            self.held().remove(owner);
            return Ok(Attempt::Busy { retry_after: None });
        };
        let token: i64 = row
            .try_get(0)
            .map_err(|e| Error::backend(BACKEND, false, format!("the grant's token: {e}")))?;
        self.finish_grant(session, owner, token as u64, sent, ttl)
            .await
    }

    /// Records a grant the server made for `owner` (with the request sent at `sent`), or gives
    /// it back at once if the owner released it meanwhile.
    pub(crate) async fn finish_grant(
        &self,
        session: &Arc<Session>,
        owner: u128,
        token: u64,
        sent: Instant,
        ttl: Duration,
    ) -> Result<Attempt> {
        let entry = self
            .held()
            .grant(owner, token, session.generation, sent + ttl);
        match entry {
            Some(entry) if !entry.abandoned => {}
            Some(entry) => {
                let _ = self.give_back(owner, token, session, &entry).await;
                return Ok(Attempt::Busy { retry_after: None });
            }
            None => return Ok(Attempt::Busy { retry_after: None }),
        }
        self.keeper.notify_one();
        Ok(Attempt::Acquired(
            Grant::new(FencingToken(token), sent).with_session(session.watch()),
        ))
    }

    /// Releases `owner`'s grant of `token` (its `entry`) on `session`; whether the server held
    /// it. The release is announced with the payload its waiters listen for.
    pub(crate) async fn give_back(
        &self,
        owner: u128,
        token: u64,
        session: &Arc<Session>,
        entry: &Entry,
    ) -> Result<bool> {
        let Some(key) = entry.key else {
            self.held().remove(owner);
            return Ok(false);
        };
        let key = KeyParams::new(key);
        let (shared, kind, holder, payload) = match entry.kind {
            Kind::Lock => (false, "lock", String::new(), key.payload.clone()),
            Kind::Read => (true, "read", holder_of(owner), key.payload.clone()),
            Kind::Permit { slot, announce } => (
                false,
                "semaphore",
                slot.to_string(),
                KeyParams::new(announce).payload,
            ),
        };
        let request = ReleaseRequest {
            key,
            shared,
            name: entry.name.clone(),
            token: token as i64,
            payload: payload.clone(),
            kind,
            holder,
        };
        let rows = batch::run(session, |s| &s.releases, request).await?;
        self.held().remove(owner);
        self.listener.wake(&payload);
        Ok(rows.first().and_then(|r| r.try_get::<_, bool>(0).ok()) == Some(true))
    }

    /// Gives back the locks whose TTL passed.
    async fn expire_due(&self) {
        let due = self.held().take_due(Instant::now());
        for (owner, entry) in due {
            self.expire(owner, entry).await;
        }
    }

    async fn expire(&self, owner: u128, entry: Entry) {
        let Some((token, generation)) = entry.grant else {
            return;
        };
        if let Some(session) = self.session_of(generation).await {
            // Re-reserve while the unlock is under way, so that no local owner takes the key
            // in between; the release removes the reservation again.
            self.held().insert(owner, entry.clone());
            if let Err(e) = self.give_back(owner, token, &session, &entry).await {
                tracing::debug!(backend = BACKEND, error = %e, "giving back an expired lock failed");
                self.held().remove(owner);
            }
        } else {
            self.listener.wake(&announced(&entry));
        }
    }
}

/// The payload a release of `entry` is announced with.
pub(crate) fn announced(entry: &Entry) -> String {
    match (entry.kind, entry.key) {
        (Kind::Permit { announce, .. }, _) => KeyParams::new(announce).payload,
        (_, Some(key)) => KeyParams::new(key).payload,
        (_, None) => String::new(),
    }
}

/// The `holder` column of a reader's row: its owner token in hex.
pub(crate) fn holder_of(owner: u128) -> String {
    format!("{owner:032x}")
}

/// Gives back locks at their TTL, until the client is dropped.
async fn keeper(inner: Weak<Inner>) {
    loop {
        let (next, wake) = {
            let Some(inner) = inner.upgrade() else { return };
            let next = inner.held().next_deadline();
            (next, inner)
        };
        let far = Instant::now() + Duration::from_secs(1);
        let until = next.map_or(far, |n| n.min(far));
        tokio::select! {
            _ = tokio::time::sleep_until(until) => {}
            _ = wake.keeper.notified() => {}
        }
        wake.expire_due().await;
    }
}

/// Pings the session every quarter of its timeout while it holds locks, and ends it once the
/// server may have ended it. The session new locks go to is pinged too once it has been idle for
/// an eighth (so never idle for half, when it would be passed by), so that the next acquire finds
/// it serving: opening (and authenticating) a new connection counts against that acquire's lease
/// validity, and a loaded server can take longer than a short TTL for it. A session in use needs
/// no ping to stay open.
async fn watchdog(inner: Weak<Inner>, session: Weak<Session>) {
    loop {
        let interval = match session.upgrade() {
            Some(s) if !s.is_ended() => s.timeout() / 4,
            _ => return,
        };
        tokio::time::sleep(interval).await;
        let (Some(inner), Some(session)) = (inner.upgrade(), session.upgrade()) else {
            return;
        };
        if session.is_ended() {
            return;
        }
        let holds = inner.held().holds_in(session.generation);
        let idle = session
            .idle_since()
            .is_some_and(|since| since.elapsed() >= interval / 2);
        let keep_warm = idle && inner.is_current(session.generation).await;
        if !(holds || keep_warm) {
            continue;
        }
        if session
            .query("SELECT 1", &[], "ping the session")
            .await
            .is_err()
            && Instant::now() >= session.bound()
            && session.end()
        {
            inner.session_ended(session.generation).await;
            return;
        }
    }
}

#[async_trait]
impl DistributedLock for Inner {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    /// Tokens come from a sequence, which only grows while the server keeps its data (a
    /// failover to a replica that missed the last writes can repeat them); a release announces
    /// itself to the next waiter in line; locks live in the client's session.
    fn capabilities(&self) -> Capabilities {
        PgLock::CAPABILITIES
    }

    /// One statement: the advisory lock if free and nobody waits for it, and then a token and
    /// the holder's row. It never queues.
    ///
    /// # Cancel safety
    /// The statement runs in a task of its own; if the caller goes away its grant is still
    /// recorded, so a release by owner token (or the TTL) gives it back.
    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        Ok(self.attempt(req, Duration::ZERO, false).await?.0)
    }

    /// Confirms the session on the server (one round trip) and moves the TTL.
    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        let mut answers = self
            .extend_many(&[ExtendRequest { lease: *lease, ttl }])
            .await;
        answers.pop().unwrap_or(Ok(Extension::Expired))
    }

    /// One ping of each session the batch's locks live in, sent together, then each TTL moved
    /// locally: a lock in a live session cannot have been taken from it (only ending the session
    /// frees it).
    async fn extend_many(&self, requests: &[ExtendRequest<'_>]) -> Vec<Result<Extension>> {
        let generations: Vec<Option<(u64, Instant)>> = {
            let held = self.held();
            requests
                .iter()
                .map(|r| {
                    held.get(r.lease.owner.as_u128())
                        .and_then(|e| e.grant.map(|(_, g)| (g, e.delete_at)))
                })
                .collect()
        };
        let mut sessions: Vec<u64> = generations.iter().flatten().map(|(g, _)| *g).collect();
        sessions.sort_unstable();
        sessions.dedup();
        let pings = sessions.into_iter().map(|generation| async move {
            let session = self.session_of(generation).await?;
            let sent = Instant::now();
            let pinged = session.query("SELECT 1", &[], "extend").await.map(|_| ());
            Some((generation, (session, sent, pinged)))
        });
        let pinged: HashMap<u64, (Arc<Session>, Instant, Result<()>)> =
            futures::future::join_all(pings)
                .await
                .into_iter()
                .flatten()
                .collect();
        requests
            .iter()
            .zip(&generations)
            .map(|(request, held)| {
                let Some((g, delete_at)) = *held else {
                    return Ok(Extension::Expired);
                };
                let Some((session, sent, pinged)) = pinged.get(&g) else {
                    return Ok(Extension::Expired);
                };
                let sent = *sent;
                if sent >= delete_at || session.is_ended() {
                    return Ok(Extension::Expired);
                }
                if let Err(e) = pinged {
                    return Err(Error::unreachable(e.to_string()));
                }
                let owner = request.lease.owner.as_u128();
                Ok(if self.held().re_arm(owner, g, sent + request.ttl) {
                    Extension::Extended
                } else {
                    Extension::Expired
                })
            })
            .collect()
    }

    /// One statement: the row deleted if it is still ours, the advisory lock given back, and the
    /// release announced.
    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        let owner = lease.owner.as_u128();
        let queued = self.queued().remove(&owner);
        if let Some((payload, generation)) = queued {
            self.withdraw(&payload, generation, owner).await;
        }
        let entry = self.held().get(owner).cloned();
        let Some(entry) = entry else {
            return Ok(Released::Expired);
        };
        let Some((token, generation)) = entry.grant else {
            self.held().abandon(owner);
            return Ok(Released::Expired);
        };
        let Some(session) = self.session_of(generation).await else {
            self.held().remove(owner);
            return Ok(Released::Expired);
        };
        let held = self.give_back(owner, token, &session, &entry).await?;
        Ok(if held {
            Released::Released
        } else {
            Released::Expired
        })
    }

    /// Returns when a release of `key` is announced (by this client or another dlock client),
    /// or at `until`.
    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        let payload = KeyParams::new(advisory_key(key.as_str())).payload;
        let notify = self.listener.subscribe(&payload);
        let _ = tokio::time::timeout_at(until, notify.notified()).await;
        Ok(())
    }

    /// Waits in the lock's queue on the server (see the crate docs, "Waiting"): each attempt
    /// stands in the queue or refreshes its entry. Between attempts a waiter with a seat (see
    /// [`crate::lock_wait`]) waits in the lock manager: as the head on the lock's key, behind
    /// another waiter on its ticket. Without one it sleeps until a release names it on its
    /// client's wake channel, a release is announced to nobody in particular (nobody was queued
    /// when it was sent), or it must come back by itself — to refresh its entry every third of
    /// its TTL, when the head's entry lapses (a crashed head is never woken), and as the head at
    /// the caller's backoff, since releases nobody announces (a peer's `pg_advisory_unlock`, a
    /// session the server ended) are found only by trying.
    ///
    /// # Cancel safety
    /// Not cancel safe on its own: core releases by owner token when an acquire is dropped,
    /// which withdraws the queue entry; a seat dropped mid-wait is closed (see `lock_wait`).
    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        let key = KeyParams::new(advisory_key(req.key.as_str()));
        let owner = req.owner.as_u128();
        let waiter = holder_of(owner);
        let named = self
            .listener
            .subscribe(&sql::wake_payload(&key.payload, &waiter));
        let released = self.listener.subscribe(&key.payload);
        let mut waiting = Waiting::new(req.key, deadline, retry);
        let refresh = (req.ttl / 3).max(Duration::from_millis(1));
        // A free seat is taken before the first attempt, so that the waiter queues without a
        // wake tag; without one, a seat is opened once the first attempt finds the lock busy.
        let mut seat: Option<Seat> = self.seats.reuse(&self.settings, owner);
        let mut seat_asked = seat.is_some();
        // What the last wait in the lock manager found free. If the next attempt waits for the
        // same target, nothing holds it for the queue (the waiter ahead has no seat; a key held
        // by a reservation of this client or by readers): the waiter then waits once for the
        // announcement, with its wake tag written back (`announced`), so that it does not spin.
        let mut found_free: Option<Target> = None;
        let mut announced = false;
        let waited = async {
            loop {
                let (to_me, to_all) = (named.notified(), released.notified());
                tokio::pin!(to_me, to_all);
                to_me.as_mut().enable();
                to_all.as_mut().enable();
                let quiet = seat.is_some() && !announced;
                let sent = Instant::now();
                let (place, answered) = match self.attempt(req, req.ttl, quiet).await {
                    Ok((Attempt::Acquired(grant), _)) => return Ok(grant.sent_no_later_than(sent)),
                    Ok((Attempt::Busy { .. }, place)) => (place, true),
                    // A statement the server rolled back (a deadlock, as an upgrade of the
                    // tables racing running grants can cause): the wait goes on, and tries
                    // again at the backoff.
                    Err(Error::Backend {
                        temporary: true, ..
                    }) => (Place::default(), false),
                    Err(e) => return Err(e),
                };
                let now = waiting.check()?;
                if answered && !std::mem::take(&mut announced) {
                    if !seat_asked {
                        seat_asked = true;
                        seat = self.seats.open(&self.settings, owner).await;
                    }
                    if let Some(seated) = seat.as_mut() {
                        let target = match place.ahead.as_deref() {
                            None => Some(Target::Lock),
                            Some(ahead) => ticket_of(ahead).map(Target::Ticket),
                        };
                        match target {
                            Some(target) if found_free.take() != Some(target) => {
                                // At the latest when its entry needs refreshing.
                                let slice =
                                    waiting.bound(sent + refresh).saturating_duration_since(now);
                                match seated.wait(target, &key, &waiter, quiet, slice).await {
                                    Some(Waited::Freed) => found_free = Some(target),
                                    Some(Waited::TimedOut) => {}
                                    // Of no more use: closed; the next attempt writes the tag back.
                                    None => seat = None,
                                }
                                waiting.check()?;
                            }
                            _ => announced = true,
                        }
                        continue;
                    }
                }
                let mut until = sent + refresh;
                if place.head_waiter.is_none() || !self.listener.listening() {
                    until = until.min(waiting.next_attempt(now, None));
                }
                // A seated waiter comes back within a slice too: its entry may be quiet, and a
                // release that overlapped the attempt writing its tag back was not announced.
                if seat.is_some() {
                    until = until.min(now + MAX_SLICE);
                }
                if let Some(left) = place.head_lapses_in {
                    until = until.min(now + left + Duration::from_millis(1));
                }
                tokio::select! {
                    _ = to_me => {}
                    _ = to_all => {}
                    _ = tokio::time::sleep_until(waiting.bound(until)) => {
                        waiting.check()?;
                    }
                }
            }
        }
        .await;
        if let Err(Error::Timeout { .. }) = &waited {
            // Within dlock-core's bound; past it, the task finishes in the background.
            let queued = self.queued().remove(&owner);
            if let (Some((payload, generation)), Ok(inner)) = (queued, self.arc()) {
                let withdrawal = async move { inner.withdraw(&payload, generation, owner).await };
                dlock_core::backend::withdraw(req.key, tokio::spawn(withdrawal)).await;
            }
        }
        // Out of the queue (granted, withdrawn or failed): the waiter behind may move up.
        if let Some(seat) = seat {
            seat.leave();
        }
        waited
    }

    async fn inspect(&self, key: &LockKey) -> Result<Holding> {
        crate::inspect::holding(self, key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        crate::inspect::list(self, prefix).await
    }

    async fn evict(&self, key: &LockKey, expected: Option<FencingToken>) -> Result<Eviction> {
        crate::inspect::evict(self, key, expected).await
    }
}

/// The outcome of a grant run in a task of its own (see `Inner::attempt`).
pub(crate) async fn granted<T>(task: tokio::task::JoinHandle<Result<T>>) -> Result<T> {
    task.await
        .map_err(|e| Error::backend(BACKEND, true, format!("the grant's task failed: {e}")))?
}
