//! The semaphore and the read-write lock, served as views of the lock trait
//! ([`DistributedLock::primitive`]): each view shares its client's lock sessions, table of held
//! locks, keeper and listener, and its grants are advisory locks of those sessions like the lock's,
//! each with a token from `dlock_fencing` and a row in `dlock_holders` (see [`sql`]).
//!
//! # Read-write lock
//!
//! The read-write lock of a name is the advisory key of the lock of that name
//! ([`advisory_key`]), as DistributedLock's `PostgresDistributedReaderWriterLock` takes it:
//! readers hold it shared (`pg_try_advisory_lock_shared`), a writer exclusive
//! (`pg_try_advisory_lock`). A dlock writer and the dlock lock of the same name are therefore the
//! same server lock (unlike on the other backends, where the lock and the read-write lock of one
//! name are independent), and a .NET service or a `psql` session holding
//! `pg_advisory_lock_shared` / `pg_advisory_lock` on that key is a reader / writer to dlock.
//!
//! **A waiting writer holds back new readers.** While a dlock writer waits, it holds the
//! exclusive advisory lock of the name's **companion key** ([`rw_companion_key`]); a reader's
//! granting statement first takes and at once gives back a shared lock on the companion key,
//! which is refused while any writer waits, and only then tries the name's key. A writer that is
//! granted, gives up, times out or is dropped gives the companion key back (announcing it, so
//! that held-back readers try again). PostgreSQL itself refuses a `try_lock_shared` while a
//! peer's blocking `pg_advisory_lock` waits for the key, so a .NET or `psql` writer that waits
//! holds dlock's readers back too. A `try_write` that is busy does not hold anyone back.
//!
//! # Semaphore
//!
//! A semaphore of `N` permits is `N` **slot keys** ([`semaphore_slot_key`]) of the pair space;
//! a permit is the exclusive advisory lock of one slot. `N` is part of every slot key, so a
//! client that asks with another number sees the other number's slots in `pg_locks` and is
//! refused with [`Error::Mismatch`], taking nothing. The grants of one semaphore, by every
//! client, take turns on its **guard key** ([`semaphore_guard_key`], a transaction lock held
//! for one statement), so two clients with different numbers cannot both find the other absent.
//!
//! # The layout of the keys
//!
//! Every primitive key is a pair `(high, low)`: `high` is the first four bytes of the SHA-1 of
//! the name's UTF-8, read little-endian; `low` ends in the bits `01` and says in its top two bits
//! which key it is:
//!
//! | key | `low` |
//! |---|---|
//! | semaphore slot `i` of `N` permits | `N << 16 \| i << 2 \| 1` (top bits `00`) |
//! | semaphore guard | `0x4000_0001` |
//! | read-write companion | `0x8000_0001` |
//!
//! No lock name's key is one of them unless a name spells out a pair in hexadecimal
//! (`XXXXXXXX,XXXXXXXX`): the pairs of short ASCII names end in a multiple of seven `1` bits,
//! never in `01`, and hashed names are in the `bigint` space. Two names whose hashes share their
//! first 32 bits share these keys: their semaphores share slots (and, with different numbers,
//! refuse each other), and their writers hold back each other's readers. Among a thousand
//! semaphore names that happens with a chance near 10^-4.
//!
//! # Within one client
//!
//! The locks of one client live in its lock session, where advisory locks never conflict with
//! each other (or, past [`LOCKS_PER_SESSION`](crate::LOCKS_PER_SESSION), in a few sessions that
//! do conflict), so the client applies the rules among its own owners itself (see `held.rs`): a
//! writer excludes its readers and other writers, readers share, a waiting writer holds back its
//! readers, and a grant of a permit skips the slots the client uses.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{
    Attempt, Capabilities, ExtendRequest, Extension, Grant, LeaseRef, LockKey, LockRequest,
    Primitive, Waiting,
};
use dlock_core::inspect::Holding;
use dlock_core::{Backoff, DistributedLock, Error, Released, Result};
use tokio::time::Instant;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use crate::client::{granted, holder_of, Inner, Term};
use crate::error::BACKEND;
use crate::held::Kind;
use crate::key::{advisory_key, AdvisoryKey};
use crate::session::Session;
use crate::sql::{self, KeyParams};

/// The bits every primitive key's `low` ends in.
const TAG: u32 = 0b01;
/// The top bits of a semaphore guard's `low`.
const GUARD: u32 = 0x4000_0000;
/// The top bits of a read-write companion's `low`.
const COMPANION: u32 = 0x8000_0000;
/// The width of a slot's number and of the permits in a slot key.
const FIELD: u32 = 14;
const FIELD_MASK: u32 = (1 << FIELD) - 1;

/// The `high` of every primitive key of `name`.
fn name_hash(name: &str) -> i32 {
    let digest = sha1_smol::Sha1::from(name.as_bytes()).digest().bytes();
    i32::from_le_bytes([digest[0], digest[1], digest[2], digest[3]])
}

/// The `low` of slot 0 of a semaphore of `permits`; slot `i` adds `4 i`.
fn slot_base(permits: u32) -> u32 {
    ((permits & FIELD_MASK) << 16) | TAG
}

/// The key a waiting writer of the read-write lock `name` holds exclusively, and a reader's
/// grant takes shared and gives back at once (see the [module documentation](self)).
///
/// ```
/// use dlock_postgres::{rw_companion_key, AdvisoryKey};
///
/// let AdvisoryKey::Pair(_, low) = rw_companion_key("config") else { unreachable!() };
/// assert_eq!(low as u32, 0x8000_0001);
/// ```
pub fn rw_companion_key(name: &str) -> AdvisoryKey {
    AdvisoryKey::Pair(name_hash(name), (COMPANION | TAG) as i32)
}

/// The key the grants of the semaphore `name` take turns on (a transaction lock).
pub fn semaphore_guard_key(name: &str) -> AdvisoryKey {
    AdvisoryKey::Pair(name_hash(name), (GUARD | TAG) as i32)
}

/// The key of slot `slot` (`0..permits`) of the semaphore `name` of `permits` permits: its
/// holder holds one permit.
pub fn semaphore_slot_key(name: &str, permits: u32, slot: u32) -> AdvisoryKey {
    let low = slot_base(permits) + ((slot & FIELD_MASK) << 2);
    AdvisoryKey::Pair(name_hash(name), low as i32)
}

/// The permits and the slot of a slot key of the semaphore whose `high` is `hash`.
fn decode_slot(key: AdvisoryKey, hash: i32) -> Option<(u32, u32)> {
    let AdvisoryKey::Pair(high, low) = key else {
        return None;
    };
    let low = low as u32;
    if high != hash || low & 0b11 != TAG || low >> 30 != 0 {
        return None;
    }
    Some(((low >> 16) & FIELD_MASK, (low >> 2) & FIELD_MASK))
}

/// Which primitive a view serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Read,
    Write,
    Semaphore { permits: u32 },
}

/// One primitive of a [`PgLock`](crate::PgLock), as a lock service of its own.
pub(crate) struct View {
    inner: Arc<Inner>,
    side: Side,
}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgPrimitive")
            .field("side", &self.side)
            .finish_non_exhaustive()
    }
}

type Param<'a> = (&'a (dyn ToSql + Sync), Type);

impl View {
    /// A view of `primitive` (validated by the caller); the election is not served.
    pub(crate) fn new(inner: Arc<Inner>, primitive: &Primitive) -> Result<View> {
        let side = match primitive {
            Primitive::Read => Side::Read,
            Primitive::Write => Side::Write,
            Primitive::Semaphore { permits } => Side::Semaphore { permits: *permits },
            other => {
                return Err(Error::Unsupported {
                    backend: BACKEND,
                    what: other.name(),
                })
            }
        };
        Ok(View { inner, side })
    }

    /// The payload of the releases this view's waiters wait for: the name's key for the
    /// read-write lock, the guard for a semaphore.
    fn payload(&self, key: &LockKey) -> String {
        match self.side {
            Side::Semaphore { .. } => KeyParams::new(semaphore_guard_key(key.as_str())).payload,
            Side::Read | Side::Write => KeyParams::new(advisory_key(key.as_str())).payload,
        }
    }

    /// One attempt at a read hold: reserved here (no writer of this client holds or waits),
    /// then granted by the server.
    async fn try_read(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        let key = advisory_key(req.key.as_str());
        let (inner, name) = (self.inner.clone(), req.key.as_str().to_string());
        self.reserve_then_grant(req, Some(key), Kind::Read, |session, owner, term| {
            grant_read(inner, session, owner, key, name, term)
        })
        .await
    }

    /// One attempt at a permit: reserved here without a slot, then granted by the server.
    async fn try_permit(&self, req: &LockRequest<'_>, permits: u32) -> Result<Attempt> {
        let announce = semaphore_guard_key(req.key.as_str());
        let kind = Kind::Permit { slot: 0, announce };
        let (inner, name) = (self.inner.clone(), req.key.as_str().to_string());
        self.reserve_then_grant(req, None, kind, |session, owner, term| {
            grant_permit(inner, session, owner, name, permits, term)
        })
        .await
    }

    /// Reserves `req`'s entry of `kind` here, then runs `grant` with a session in a task of its
    /// own, so that a dropped caller cannot leave a grant unrecorded. The TTL counts from
    /// before a session is sought.
    async fn reserve_then_grant<F, Fut>(
        &self,
        req: &LockRequest<'_>,
        key: Option<AdvisoryKey>,
        kind: Kind,
        grant: F,
    ) -> Result<Attempt>
    where
        F: FnOnce(Arc<Session>, u128, Term) -> Fut,
        Fut: Future<Output = Result<Attempt>> + Send + 'static,
    {
        let owner = req.owner.as_u128();
        let term = Term::starting_now(req.ttl);
        let held = self
            .inner
            .held()
            .reserve_as(owner, key, kind, req.key.as_str(), term.until());
        if !held {
            return Ok(Attempt::Busy { retry_after: None });
        }
        let session = match self.inner.session().await {
            Ok(session) => session,
            Err(e) => {
                self.inner.held().remove(owner);
                return Err(e);
            }
        };
        granted(tokio::spawn(grant(session, owner, term))).await
    }

    /// The holders of the read-write lock: the writer, or the readers (earliest token first).
    async fn inspect_rw(&self, key: &LockKey) -> Result<Holding> {
        let params = KeyParams::new(advisory_key(key.as_str()));
        let name = key.as_str();
        let statement = format!(
            "SELECT l.pid, h.token, h.owner, l.mode FROM pg_locks l
             LEFT JOIN dlock_holders h ON h.pid = l.pid AND h.name = $4
                 AND h.key1 = $5 AND h.key2 = $6 AND h.space = $7
                 AND h.kind = CASE WHEN l.mode = 'ExclusiveLock' THEN 'lock' ELSE 'read' END
             WHERE {}
             ORDER BY h.token NULLS LAST",
            sql::on_key(&params)
        );
        let rest: [Param<'_>; 4] = [
            (&name, Type::TEXT),
            (&params.key1, Type::INT8),
            (&params.key2, Type::INT8),
            (&params.space, Type::INT2),
        ];
        let rows = crate::inspect::read(
            &self.inner,
            &statement,
            &params.with(&rest),
            "look at a read-write lock",
        )
        .await?;
        let mode = |row: &Row| row.try_get::<_, String>(3).unwrap_or_default();
        if let Some(writer) = rows.iter().find(|r| mode(r) == "ExclusiveLock") {
            return Ok(Holding::Held(crate::inspect::holder_of(writer)));
        }
        Ok(match rows.first() {
            Some(first) => Holding::Held(crate::inspect::holder_of(first).with_holders(rows.len())),
            None => Holding::Free,
        })
    }

    /// The holders of the semaphore's permits (of whatever number they agreed on), earliest
    /// token first.
    async fn inspect_semaphore(&self, key: &LockKey) -> Result<Holding> {
        let hash = name_hash(key.as_str());
        let name = key.as_str();
        let statement = "SELECT l.pid, h.token, h.owner FROM pg_locks l
             LEFT JOIN dlock_holders h ON h.pid = l.pid AND h.name = $2 AND h.kind = 'semaphore'
                 AND h.key1 = l.classid::bigint AND h.key2 = l.objid::bigint AND h.space = 2
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
                 AND l.classid = ($1::bigint & 4294967295)::oid
                 AND (l.objid::bigint & 3) = 1 AND (l.objid::bigint >> 30) = 0
                 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
             ORDER BY h.token NULLS LAST";
        let params: [Param<'_>; 2] = [(&hash, Type::INT4), (&name, Type::TEXT)];
        let rows =
            crate::inspect::read(&self.inner, statement, &params, "look at a semaphore").await?;
        Ok(match rows.first() {
            Some(first) => Holding::Held(crate::inspect::holder_of(first).with_holders(rows.len())),
            None => Holding::Free,
        })
    }

    /// Waits for a grant: an attempt, then a wait for an announced release (or the backoff),
    /// listening before each attempt so that a release in between is not missed. A writer that
    /// has to wait holds the companion key meanwhile (see the [module documentation](self)).
    async fn wait(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        let notify = self.inner.listener.subscribe(&self.payload(req.key));
        let mut waiting = Waiting::new(req.key, deadline, retry);
        let mut companion: Option<WaitingWriter> = None;
        let result = loop {
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let sent = Instant::now();
            match self.try_lock(req).await {
                Ok(Attempt::Acquired(grant)) => break Ok(grant.sent_no_later_than(sent)),
                Ok(Attempt::Busy { .. }) => {}
                Err(e) => break Err(e),
            }
            let now = match waiting.check() {
                Ok(now) => now,
                Err(e) => break Err(e),
            };
            if self.side == Side::Write {
                let writer = companion
                    .get_or_insert_with(|| WaitingWriter::start(&self.inner, req.key.as_str()));
                writer.hold_back_readers().await;
            }
            let until = waiting.next_attempt(now, None);
            let _ = tokio::time::timeout_at(until, notified).await;
        };
        if let Some(writer) = companion {
            writer.withdraw(req.key).await;
        }
        result
    }
}

/// Takes a read hold for `owner` on `session`.
async fn grant_read(
    inner: Arc<Inner>,
    session: Arc<Session>,
    owner: u128,
    key: AdvisoryKey,
    name: String,
    term: Term,
) -> Result<Attempt> {
    let Term { sent, ttl } = term;
    let params = KeyParams::new(key);
    let statement = sql::grant_read(&params);
    let record = inner.settings.owner.record().to_json();
    let (companion_high, companion_low) = match rw_companion_key(&name) {
        AdvisoryKey::Pair(high, low) => (high, low),
        AdvisoryKey::Single(_) => (0, 0),
    };
    let holder = holder_of(owner);
    let rest: [Param<'_>; 8] = [
        (&name, Type::TEXT),
        (&record, Type::TEXT),
        (&params.key1, Type::INT8),
        (&params.key2, Type::INT8),
        (&params.space, Type::INT2),
        (&companion_high, Type::INT4),
        (&companion_low, Type::INT4),
        (&holder, Type::TEXT),
    ];
    let rows = session
        .query(&statement, &params.with(&rest), "take a read hold")
        .await;
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) => {
            // The statement may have taken the shared lock before failing. Give it back only if
            // no other reader of this client holds the key: an unlock of a hold that was never
            // taken would take another reader's. Otherwise the session keeps one shared hold
            // too many until it ends, which only holds writers back.
            let alone = {
                let mut held = inner.held();
                held.remove(owner);
                held.sharers(key) == 0
            };
            if alone && !session.is_ended() {
                tokio::spawn(async move {
                    let unlock = sql::unlock(&params, "pg_advisory_unlock_shared");
                    let _ = session
                        .query(&unlock, &params.with(&[]), "undo a failed grant")
                        .await;
                });
            }
            return Err(e);
        }
    };
    inner.token_or_busy(&session, owner, &rows, sent, ttl).await
}

/// Takes a permit of the semaphore `name` of `permits` for `owner` on `session`, one grant of
/// this client at a time.
async fn grant_permit(
    inner: Arc<Inner>,
    session: Arc<Session>,
    owner: u128,
    name: String,
    permits: u32,
    term: Term,
) -> Result<Attempt> {
    let Term { sent, ttl } = term;
    let _turn = inner.permit_turn.lock().await;
    let hash = name_hash(&name);
    let guard = (GUARD | TAG) as i32;
    let base = slot_base(permits) as i32;
    let permits_param = permits as i32;
    let skip: Vec<i32> = inner
        .held()
        .keys_where(|key| {
            decode_slot(key, hash)
                .filter(|(n, _)| *n == permits)
                .is_some()
        })
        .into_iter()
        .filter_map(|key| decode_slot(key, hash).map(|(_, slot)| slot as i32))
        .collect();
    let record = inner.settings.owner.record().to_json();
    let params: [Param<'_>; 7] = [
        (&hash, Type::INT4),
        (&guard, Type::INT4),
        (&base, Type::INT4),
        (&permits_param, Type::INT4),
        (&skip, Type::INT4_ARRAY),
        (&name, Type::TEXT),
        (&record, Type::TEXT),
    ];
    let rows = match session
        .query(sql::GRANT_PERMIT, &params, "take a permit")
        .await
    {
        Ok(rows) => rows,
        Err(e) => {
            inner.held().remove(owner);
            if !session.is_ended() {
                // The statement may have taken a slot before failing: give back every slot this
                // client does not use (the others are not this session's).
                let undo: [Param<'_>; 4] = [
                    (&hash, Type::INT4),
                    (&base, Type::INT4),
                    (&permits_param, Type::INT4),
                    (&skip, Type::INT4_ARRAY),
                ];
                let _ = session
                    .query(sql::UNDO_PERMIT, &undo, "undo a failed grant")
                    .await;
            }
            return Err(e);
        }
    };
    let row = rows.first();
    let other: Option<i32> = row.and_then(|r| r.try_get(0).ok()).flatten();
    let slot: Option<i32> = row.and_then(|r| r.try_get(1).ok()).flatten();
    let token: Option<i64> = row.and_then(|r| r.try_get(2).ok()).flatten();
    if let Some(other) = other {
        inner.held().remove(owner);
        return Err(Error::mismatch(
            &name,
            format!("the semaphore is held with {other} permits, not {permits}"),
        ));
    }
    let (Some(slot), Some(token)) = (slot, token) else {
        inner.held().remove(owner);
        return Ok(Attempt::Busy { retry_after: None });
    };
    let slot = slot as u32;
    let key = semaphore_slot_key(&name, permits, slot);
    if !inner.held().place(owner, key, slot) {
        // Released while the grant was under way, or (never, since the grant skips them) a
        // slot this client uses: give the slot back.
        let announce = semaphore_guard_key(&name);
        let entry = crate::held::Entry {
            key: Some(key),
            kind: Kind::Permit { slot, announce },
            name: name.clone(),
            grant: None,
            delete_at: sent + ttl,
            abandoned: true,
        };
        let _ = inner.give_back(owner, token as u64, &session, &entry).await;
        return Ok(Attempt::Busy { retry_after: None });
    }
    inner
        .finish_grant(&session, owner, token as u64, sent, ttl)
        .await
}

/// A writer of this client that waits: it holds this client's readers back at once, and the
/// other clients' readers while it holds the companion key; it gives both up when it is
/// withdrawn or dropped.
struct WaitingWriter {
    inner: Arc<Inner>,
    key: AdvisoryKey,
    companion: AdvisoryKey,
    hold: Arc<Mutex<CompanionHold>>,
    done: bool,
}

/// Whether the companion key is held for a waiting writer, and in which session.
#[derive(Default)]
struct CompanionHold {
    /// The writer stopped waiting: a hold that lands now is given back at once.
    stopped: bool,
    /// The session generation the companion key is held in.
    held_in: Option<u64>,
}

impl CompanionHold {
    fn lock(hold: &Mutex<CompanionHold>) -> std::sync::MutexGuard<'_, CompanionHold> {
        hold.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl WaitingWriter {
    fn start(inner: &Arc<Inner>, name: &str) -> WaitingWriter {
        let key = advisory_key(name);
        inner.held().start_waiting(key);
        WaitingWriter {
            inner: inner.clone(),
            key,
            companion: rw_companion_key(name),
            hold: Arc::default(),
            done: false,
        }
    }

    /// Takes the companion key if this writer does not hold it yet (another client's waiting
    /// writer may hold it; then it holds the readers back, and this one tries again at its
    /// next attempt). Runs in a task of its own, so that a hold taken for a writer dropped
    /// meanwhile is given back.
    async fn hold_back_readers(&mut self) {
        if CompanionHold::lock(&self.hold).held_in.is_some() {
            return;
        }
        let (inner, hold, companion) = (self.inner.clone(), self.hold.clone(), self.companion);
        let task = tokio::spawn(async move {
            let session = inner.session().await?;
            let params = KeyParams::new(companion);
            let statement = sql::unlock(&params, "pg_try_advisory_lock");
            let rows = session
                .query(&statement, &params.with(&[]), "hold readers back")
                .await?;
            let taken = rows.first().and_then(|r| r.try_get::<_, bool>(0).ok()) == Some(true);
            if taken {
                let give_back = {
                    let mut hold = CompanionHold::lock(&hold);
                    if hold.stopped {
                        true
                    } else {
                        hold.held_in = Some(session.generation);
                        false
                    }
                };
                if give_back {
                    let unlock = sql::unlock(&params, "pg_advisory_unlock");
                    session
                        .query(&unlock, &params.with(&[]), "stop holding readers back")
                        .await?;
                } else {
                    inner.held().hold_outside(session.generation);
                }
            }
            Ok::<(), Error>(())
        });
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(backend = BACKEND, error = %e, "a waiting writer could not hold readers back");
            }
            Err(e) => {
                tracing::debug!(backend = BACKEND, error = %e, "a waiting writer's task failed");
            }
        }
    }

    /// Stops waiting: this client's readers may go on, and the companion key is given back
    /// (within dlock-core's withdrawal bound; past it in the background).
    async fn withdraw(mut self, name: &LockKey) {
        self.done = true;
        let held_in = self.stop();
        if let Some(generation) = held_in {
            // In a task of its own, so that past the bound it still finishes in the background.
            let release = tokio::spawn(release_companion(
                self.inner.clone(),
                generation,
                self.companion,
                self.key,
            ));
            let finished = async move {
                match release.await {
                    Ok(result) => result,
                    Err(e) => Err(Error::backend(
                        BACKEND,
                        true,
                        format!("its task failed: {e}"),
                    )),
                }
            };
            dlock_core::backend::withdraw(name, finished).await;
        }
    }

    /// Marks the writer as no longer waiting; the generation the companion key is held in.
    fn stop(&self) -> Option<u64> {
        let held_in = {
            let mut hold = CompanionHold::lock(&self.hold);
            hold.stopped = true;
            hold.held_in.take()
        };
        self.inner.held().stop_waiting(self.key);
        self.inner.listener.wake(&KeyParams::new(self.key).payload);
        held_in
    }
}

impl Drop for WaitingWriter {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some(generation) = self.stop() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let release =
                    release_companion(self.inner.clone(), generation, self.companion, self.key);
                runtime.spawn(async move {
                    if let Err(e) = release.await {
                        tracing::debug!(backend = BACKEND, error = %e, "giving back a companion key failed");
                    }
                });
            }
        }
    }
}

/// Gives back the companion key held in session `generation` (if that session still lives),
/// announcing it with the name's key, so that the readers it held back try again.
async fn release_companion(
    inner: Arc<Inner>,
    generation: u64,
    companion: AdvisoryKey,
    key: AdvisoryKey,
) -> Result<()> {
    // The session is found before the client stops counting the key as held there: an idle
    // session that holds nothing is closed at the next grant, and closing it would give the key
    // back without the announcement.
    let session = inner.session_of(generation).await;
    let given_back = match session {
        Some(session) => {
            let params = KeyParams::new(companion);
            let payload = KeyParams::new(key).payload;
            let statement = format!(
                "SELECT pg_advisory_unlock({}), pg_notify('{}', $4)",
                params.args(),
                sql::CHANNEL
            );
            let rest: [Param<'_>; 1] = [(&payload, Type::TEXT)];
            session
                .query(&statement, &params.with(&rest), "stop holding readers back")
                .await
                .map(|_| ())
        }
        None => Ok(()),
    };
    inner.held().release_outside(generation);
    given_back
}

#[async_trait]
impl DistributedLock for View {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    /// What the client declares, but the fair queue: the primitives wait by polling and by the
    /// announcements on `dlock_release`, not in the lock's queue.
    fn capabilities(&self) -> Capabilities {
        let mut capabilities = self.inner.capabilities();
        capabilities.fair_queue = false;
        capabilities
    }

    /// One attempt: a writer is the lock of the name; a reader's and a permit's statements
    /// are in [`sql`].
    ///
    /// # Cancel safety
    /// The statement runs in a task of its own; if the caller goes away its grant is still
    /// recorded, so a release by owner token (or the TTL) gives it back.
    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        match self.side {
            Side::Write => self.inner.try_lock(req).await,
            Side::Read => self.try_read(req).await,
            Side::Semaphore { permits } => self.try_permit(req, permits).await,
        }
    }

    /// As the lock's: the session confirmed, the TTL moved.
    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        self.inner.extend(lease, ttl).await
    }

    async fn extend_many(&self, requests: &[ExtendRequest<'_>]) -> Vec<Result<Extension>> {
        self.inner.extend_many(requests).await
    }

    /// As the lock's: the row deleted, the hold given back, the release announced.
    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        self.inner.release(lease).await
    }

    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        let notify = self.inner.listener.subscribe(&self.payload(key));
        let _ = tokio::time::timeout_at(until, notify.notified()).await;
        Ok(())
    }

    /// The writer, or the readers and how many; the permits' holders and how many.
    async fn inspect(&self, key: &LockKey) -> Result<Holding> {
        match self.side {
            Side::Read | Side::Write => self.inspect_rw(key).await,
            Side::Semaphore { .. } => self.inspect_semaphore(key).await,
        }
    }

    /// Waits for announced releases between attempts; a writer holds readers back meanwhile
    /// and stops before it returns (withdrawn within dlock-core's bound), or when dropped.
    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        self.wait(req, deadline, retry).await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn slot_keys_carry_their_permits_and_slot() {
        let hash = name_hash("crawlers");
        for (permits, slot) in [(1, 0), (3, 2), (10_000, 9_999)] {
            let key = semaphore_slot_key("crawlers", permits, slot);
            assert_eq!(decode_slot(key, hash), Some((permits, slot)));
            assert_eq!(decode_slot(key, hash.wrapping_add(1)), None);
        }
        assert_ne!(
            semaphore_slot_key("crawlers", 2, 0),
            semaphore_slot_key("crawlers", 3, 0),
            "another number of permits is another key"
        );
        assert_eq!(decode_slot(semaphore_guard_key("crawlers"), hash), None);
        assert_eq!(decode_slot(rw_companion_key("crawlers"), hash), None);
        assert_eq!(decode_slot(advisory_key("crawlers"), hash), None);
    }

    /// The pairs of short ASCII names end in a multiple of seven `1` bits, never in `01`.
    #[test]
    fn primitive_keys_never_meet_a_lock_name() {
        for name in ["", "a", "crawlers", "123456789", "config", "x\u{7f}"] {
            if name.is_empty() {
                continue;
            }
            let AdvisoryKey::Pair(_, low) = advisory_key(name) else {
                continue;
            };
            assert_ne!(low as u32 & 0b11, TAG, "{name}");
        }
        for key in [
            rw_companion_key("a"),
            semaphore_guard_key("a"),
            semaphore_slot_key("a", 5, 4),
        ] {
            let AdvisoryKey::Pair(_, low) = key else {
                panic!("not a pair")
            };
            assert_eq!(low as u32 & 0b11, TAG);
        }
    }
}
