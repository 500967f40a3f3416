//! The statements dlock sends, and the server-side objects they use.
//!
//! * `dlock_fencing`, a sequence: every grant takes `nextval`, so tokens grow across all keys
//!   and survive restarts (a sequence never goes back, also after a crash: it logs ahead).
//! * `dlock_holders`, an **unlogged** table: one row per holder — its fencing token, the
//!   holder's owner record, its server process and its advisory key — written by the granting
//!   statement and deleted by the releasing one, for operators (`inspect`, `list`, `evict`). The
//!   server lock is the truth: a row counts only while its process holds the advisory key in
//!   `pg_locks`. Unlogged, because the rows matter only while the sessions live: writing them
//!   costs no WAL, and a crash, which ends every session, also empties the table.
//!
//! A row's primary key is `(name, kind, holder)`:
//!
//! | `kind` | who | `holder` | advisory key |
//! |---|---|---|---|
//! | `lock` | the lock, or the writer of the read-write lock of that name (the same server lock) | `''` | the name's key, exclusive |
//! | `read` | a reader of the read-write lock | the acquire's owner token in hex | the name's key, shared |
//! | `semaphore` | the holder of one permit | the slot's number | the slot's key (see [`crate::primitives`]) |
//!
//! An exclusive grant overwrites the row a holder whose session ended left behind (there is one
//! such row per name at most), and deletes the rows of readers, which cannot hold any more once a
//! writer does.
//!
//! Rows of sessions that ended without releasing are swept each time a client opens its lock
//! session.
//!
//! * `dlock_waiters`, an **unlogged** table: the fair queue of each lock, one row per waiting
//!   acquire — the lock's key (as the release payload writes it), the waiter (its owner token in
//!   hex), its client's wake tag (empty while the waiter waits in the lock manager, on a waiting
//!   connection, and needs no announcement), its arrival and when the entry lapses (server time, the
//!   lease's TTL after the waiter's last attempt). The head is the live entry that arrived
//!   first. A row counts only until it lapses, so a crashed waiter holds nobody up for longer
//!   than its TTL.
//!
//! A grant of a lock is one statement and one round trip: if nobody else heads the lock's queue,
//! try the advisory lock, and only if it was taken, take a token, write the row and leave the
//! queue; if it was not taken, a waiting acquire stands in (or refreshes) its queue entry in the
//! same statement. A release is one statement too: delete the row (only if it is still the
//! releaser's), unlock, and announce the release: to the head of the queue alone, on its
//! client's wake channel `dlock_release_<tag>` with the payload `<key> <waiter>` (not at all if
//! the head waits on the lock itself), or, with nobody queued, on the channel `dlock_release`
//! with the key as payload.

use std::sync::LazyLock;

use tokio_postgres::types::{ToSql, Type};

use crate::key::AdvisoryKey;

/// The channel releases are announced on, with the text of the key its waiters listen for as
/// payload: the lock's (or read-write lock's) key, a semaphore's guard key (its waiters wait for
/// any permit, not one slot). A release of a lock whose queue has a head is announced on the
/// head's wake channel instead ([`wake_channel`]).
pub(crate) const CHANNEL: &str = "dlock_release";

/// The wake channel of the client with wake tag `tag` (16 lowercase hex digits): releases that
/// hand a lock to one of its queued waiters are announced there, with the payload
/// [`wake_payload`], so that no other client hears them.
pub(crate) fn wake_channel(tag: &str) -> String {
    format!("{CHANNEL}_{tag}")
}

/// The payload that wakes `waiter` (its owner token in hex) queued for the lock with release
/// payload `key`.
pub(crate) fn wake_payload(key: &str, waiter: &str) -> String {
    format!("{key} {waiter}")
}

/// The condition that the sequence and the tables exist, `dlock_holders` with its `holder`
/// column (the layout before the primitives had none).
macro_rules! schema_complete {
    () => {
        "to_regclass('dlock_fencing') IS NOT NULL AND to_regclass('dlock_holders') IS NOT NULL
         AND to_regclass('dlock_waiters') IS NOT NULL
         AND EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('dlock_holders')
             AND attname = 'holder' AND NOT attisdropped)"
    };
}

/// Whether the layout is complete.
pub(crate) const SCHEMA_EXISTS: &str = concat!("SELECT ", schema_complete!());

/// Creates the sequence and the tables, or brings an older layout up to date, one client at a
/// time (`CREATE … IF NOT EXISTS` alone races with itself).
///
/// A client that waited for another's creation finds the layout complete once it has the guard
/// (read committed: the check sees what committed while it waited), and then touches nothing: `ALTER TABLE` would take `dlock_holders` exclusively, behind the
/// grants that the first client's peers already run, while holding `dlock_waiters`, which those
/// grants go on to write — a deadlock the server breaks by failing one of them.
pub(crate) fn create_schema() -> String {
    let guard =
        crate::key::advisory_key("dlock-postgres: creating dlock_fencing and dlock_holders");
    format!(
        "BEGIN ISOLATION LEVEL READ COMMITTED;
         SELECT pg_advisory_xact_lock({});
         DO $create$ BEGIN
         IF NOT ({}) THEN
             CREATE SEQUENCE IF NOT EXISTS dlock_fencing;
             CREATE UNLOGGED TABLE IF NOT EXISTS dlock_holders (
                 name text NOT NULL,
                 kind text NOT NULL,
                 holder text NOT NULL,
                 token bigint NOT NULL,
                 owner text NOT NULL,
                 pid integer NOT NULL,
                 key1 bigint NOT NULL,
                 key2 bigint NOT NULL,
                 space smallint NOT NULL,
                 PRIMARY KEY (name, kind, holder)
             );
             CREATE UNLOGGED TABLE IF NOT EXISTS dlock_waiters (
                 key text NOT NULL,
                 waiter text NOT NULL,
                 tag text NOT NULL,
                 arrival timestamptz NOT NULL,
                 until timestamptz NOT NULL,
                 PRIMARY KEY (key, waiter)
             );
             CREATE INDEX IF NOT EXISTS dlock_waiters_order
                 ON dlock_waiters (key, arrival, waiter);
             ALTER TABLE dlock_holders ADD COLUMN IF NOT EXISTS kind text NOT NULL DEFAULT 'lock';
             ALTER TABLE dlock_holders ADD COLUMN IF NOT EXISTS holder text NOT NULL DEFAULT '';
             IF NOT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a
                     ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
                     WHERE i.indrelid = 'dlock_holders'::regclass AND i.indisprimary
                         AND a.attname = 'holder') THEN
                 ALTER TABLE dlock_holders DROP CONSTRAINT IF EXISTS dlock_holders_pkey;
                 ALTER TABLE dlock_holders ADD PRIMARY KEY (name, kind, holder);
             END IF;
         END IF;
         END $create$;
         COMMIT;",
        guard.sql_args(),
        schema_complete!()
    )
}

/// Deletes the rows whose process no longer holds their key: those of sessions that ended without
/// releasing (a crash, a termination, a restart). A row becomes visible only once its grant's
/// lock is held, so a grant under way is never swept. Lapsed queue entries go too.
pub(crate) const SWEEP: &str =
    "WITH lapsed AS (DELETE FROM dlock_waiters WHERE until <= clock_timestamp())
     DELETE FROM dlock_holders h WHERE NOT EXISTS (
         SELECT 1 FROM pg_locks l WHERE l.pid = h.pid AND l.locktype = 'advisory' AND l.granted
             AND l.classid::bigint = h.key1 AND l.objid::bigint = h.key2 AND l.objsubid = h.space
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))";

/// The first three parameters of every statement on a key: `$1` the `bigint` key, `$2, $3` the
/// pair (the unused ones are zero).
pub(crate) struct KeyParams {
    single: i64,
    high: i32,
    low: i32,
    /// `pg_locks`' `classid`, `objid` (as `bigint`) and `objsubid`.
    pub(crate) key1: i64,
    pub(crate) key2: i64,
    pub(crate) space: i16,
    /// The release notification's payload.
    pub(crate) payload: String,
    args: &'static str,
}

impl KeyParams {
    pub(crate) fn new(key: AdvisoryKey) -> Self {
        let (single, high, low, args) = match key {
            AdvisoryKey::Single(k) => (k, 0, 0, "$1"),
            AdvisoryKey::Pair(h, l) => (0, h, l, "$2, $3"),
        };
        let (key1, key2, space) = key.in_pg_locks();
        KeyParams {
            single,
            high,
            low,
            key1: i64::from(key1),
            key2: i64::from(key2),
            space,
            payload: key.to_string(),
            args,
        }
    }

    /// The key as `$1`–`$3` carry it: the `bigint`, then the pair (the unused ones are zero).
    pub(crate) fn parts(&self) -> (i64, i32, i32) {
        (self.single, self.high, self.low)
    }

    /// The arguments of an advisory-lock function for this key.
    pub(crate) fn args(&self) -> &'static str {
        self.args
    }

    /// `$1`–`$3`, followed by `rest`.
    pub(crate) fn with<'a>(
        &'a self,
        rest: &[(&'a (dyn ToSql + Sync), Type)],
    ) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
        let mut params: Vec<(&(dyn ToSql + Sync), Type)> = vec![
            (&self.single, Type::INT8),
            (&self.high, Type::INT4),
            (&self.low, Type::INT4),
        ];
        params.extend_from_slice(rest);
        params
    }
}

/// The column in which a granting statement reports how long the server worked on it, in
/// microseconds of the server's clock: from the start of the statement's transaction (`now()`,
/// stamped as the server took up the request, before it bound the statement, so that a wait for
/// a table lock is counted) to the reading, at the end of the statement. A statement sent alone
/// runs in a transaction of its own, so its answer left the server at least that long after the
/// request was sent, and the session is known to live that much longer (see
/// [`crate::session`]): a grant held up for most of the session timeout still gets a lease with
/// the whole timeout ahead of it.
pub(crate) const WORKED: &str = "worked_us";

/// The [`WORKED`] column, to go last in a granting statement's answer, after what it waits for.
macro_rules! worked {
    () => {
        "(extract(epoch FROM clock_timestamp() - now()) * 1000000)::bigint AS worked_us"
    };
}

/// Overwrites a row left behind by a holder whose session ended.
const UPSERT: &str = "ON CONFLICT (name, kind, holder) DO UPDATE SET token = excluded.token,
             owner = excluded.owner, pid = excluded.pid, key1 = excluded.key1,
             key2 = excluded.key2, space = excluded.space";

/// Takes the lock (or a writer's hold) if free and nobody else heads its queue: `$4` name, `$5`
/// owner record, `$6`–`$8` the key in `pg_locks`, `$9` the key's release payload, `$10` the
/// waiter (owner token in hex), `$11` its client's wake tag (empty for a seated waiter, which
/// needs no announcement), `$12` its queue entry's lifetime in
/// milliseconds (0: a `try_lock`, which never queues), `$13` whether the client lets this owner
/// take the key (false while another owner of the client holds it: the attempt only queues).
///
/// Returns one row: the token (null if not granted); if another waiter heads the queue, in
/// how many milliseconds its entry lapses and who it is (both null when the caller heads it or
/// nobody does); if not granted, the waiter just ahead of the caller (null when it heads the
/// queue); and the server's time on the statement ([`WORKED`]). When granted, the rows of
/// readers of the name go (none can hold beside us), and so do the caller's entry and the lapsed
/// entries of the queue. If not granted, a waiting caller stands in the queue: at the end if it
/// was not in it (or its entry lapsed), otherwise in its place, with the entry's lapse moved.
pub(crate) fn grant(key: &KeyParams, function: &str) -> String {
    format!(
        "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t),
         head AS MATERIALIZED (SELECT w.waiter, w.until FROM dlock_waiters w, now
             WHERE w.key = $9 AND w.until > now.t ORDER BY w.arrival, w.waiter LIMIT 1),
         granted AS MATERIALIZED (SELECT CASE
             WHEN $13 AND NOT EXISTS (SELECT 1 FROM head WHERE head.waiter <> $10)
             THEN {function}({}) ELSE false END AS ok),
         stale AS (DELETE FROM dlock_holders WHERE name = $4 AND kind = 'read'
             AND (SELECT ok FROM granted)),
         served AS (DELETE FROM dlock_waiters w USING now WHERE (SELECT ok FROM granted)
             AND w.key = $9 AND (w.waiter = $10 OR w.until <= now.t)),
         queued AS (INSERT INTO dlock_waiters AS w (key, waiter, tag, arrival, until)
             SELECT $9, $10, $11, now.t, now.t + $12::float8 * interval '1 millisecond'
             FROM now, granted WHERE NOT granted.ok AND $12 > 0
             ON CONFLICT (key, waiter) DO UPDATE SET tag = excluded.tag, until = excluded.until,
                 arrival = CASE WHEN w.until > excluded.arrival THEN w.arrival
                     ELSE excluded.arrival END),
         ins AS (INSERT INTO dlock_holders AS h
                 (name, kind, holder, token, owner, pid, key1, key2, space)
             SELECT $4, 'lock', '', nextval('dlock_fencing'), $5, pg_backend_pid(), $6, $7, $8
             FROM granted WHERE ok
             {UPSERT}
             RETURNING token)
         SELECT (SELECT token FROM ins),
             (SELECT ceil(extract(epoch FROM head.until - now.t) * 1000)::bigint
                 FROM head, now WHERE head.waiter <> $10),
             (SELECT head.waiter FROM head WHERE head.waiter <> $10),
             (SELECT w.waiter FROM dlock_waiters w, now
                 WHERE NOT (SELECT ok FROM granted) AND w.key = $9 AND w.until > now.t
                     AND (w.arrival, w.waiter) < (COALESCE((SELECT m.arrival
                         FROM dlock_waiters m WHERE m.key = $9 AND m.waiter = $10
                             AND m.until > now.t), now.t), $10)
                 ORDER BY w.arrival DESC, w.waiter DESC LIMIT 1),
             {}",
        key.args(),
        worked!()
    )
}

/// [`grant`] for many keys of one lock session in one statement (see [`crate::batch`]): one row
/// per grant, in the order of the arrays, with the columns of [`grant`]'s answer. The arrays:
/// `$1`–`$3` the keys (`bigint`, and the pair: the space, `$8`, says which is used), `$4` the
/// names, `$5` the owner records, `$6`–`$8` the keys in `pg_locks`, `$9` the release
/// payloads, `$10` the waiters, `$11` their wake tags, `$12` their queue entries' lifetimes,
/// `$13` whether the client lets each take its key. No two grants of one statement share a
/// name or a payload, so each row is decided as [`grant`] decides it alone, with one difference:
/// a grant leaves the lapsed entries of others in its queue (which count for nobody once
/// lapsed) to the grants that go alone and to the sweep of a new session. So a statement for
/// many changes no row but its own grants' and their queue entries', and two of them (of two
/// sessions) can never wait for each other's rows.
pub(crate) static GRANT_MANY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH r AS MATERIALIZED (SELECT * FROM unnest($1::int8[], $2::int4[], $3::int4[],
             $4::text[], $5::text[], $6::int8[], $7::int8[], $8::int2[], $9::text[], $10::text[],
             $11::text[], $12::int8[], $13::bool[]) WITH ORDINALITY AS r(single, high, low,
             name, owner, key1, key2, space, payload, waiter, tag, lifetime, may_take, ord)),
         now AS MATERIALIZED (SELECT clock_timestamp() AS t),
         head AS MATERIALIZED (SELECT r.ord, h.waiter, h.until FROM r, now,
             LATERAL (SELECT w.waiter, w.until FROM dlock_waiters w
                 WHERE w.key = r.payload AND w.until > now.t
                 ORDER BY w.arrival, w.waiter LIMIT 1) h),
         granted AS MATERIALIZED (SELECT r.ord, CASE
             WHEN r.may_take AND NOT EXISTS (SELECT 1 FROM head
                 WHERE head.ord = r.ord AND head.waiter <> r.waiter)
             THEN (CASE WHEN r.space = 1 THEN pg_try_advisory_lock(r.single)
                 ELSE pg_try_advisory_lock(r.high, r.low) END)
             ELSE false END AS ok FROM r),
         stale AS (DELETE FROM dlock_holders d USING r, granted g
             WHERE g.ord = r.ord AND g.ok AND d.name = r.name AND d.kind = 'read'),
         served AS (DELETE FROM dlock_waiters w USING r, granted g
             WHERE g.ord = r.ord AND g.ok AND w.key = r.payload AND w.waiter = r.waiter),
         queued AS (INSERT INTO dlock_waiters AS w (key, waiter, tag, arrival, until)
             SELECT r.payload, r.waiter, r.tag, now.t,
                 now.t + r.lifetime::float8 * interval '1 millisecond'
             FROM r, granted g, now WHERE g.ord = r.ord AND NOT g.ok AND r.lifetime > 0
             ON CONFLICT (key, waiter) DO UPDATE SET tag = excluded.tag, until = excluded.until,
                 arrival = CASE WHEN w.until > excluded.arrival THEN w.arrival
                     ELSE excluded.arrival END),
         ins AS (INSERT INTO dlock_holders AS h
                 (name, kind, holder, token, owner, pid, key1, key2, space)
             SELECT r.name, 'lock', '', nextval('dlock_fencing'), r.owner, pg_backend_pid(),
                 r.key1, r.key2, r.space
             FROM r, granted g WHERE g.ord = r.ord AND g.ok
             {UPSERT}
             RETURNING name, token)
         SELECT (SELECT ins.token FROM ins WHERE ins.name = r.name),
             (SELECT ceil(extract(epoch FROM head.until - now.t) * 1000)::bigint
                 FROM head, now WHERE head.ord = r.ord AND head.waiter <> r.waiter),
             (SELECT head.waiter FROM head WHERE head.ord = r.ord AND head.waiter <> r.waiter),
             (SELECT w.waiter FROM dlock_waiters w, now, granted g
                 WHERE g.ord = r.ord AND NOT g.ok AND w.key = r.payload AND w.until > now.t
                     AND (w.arrival, w.waiter) < (COALESCE((SELECT m.arrival
                         FROM dlock_waiters m WHERE m.key = r.payload AND m.waiter = r.waiter
                             AND m.until > now.t), now.t), r.waiter)
                 ORDER BY w.arrival DESC, w.waiter DESC LIMIT 1),
             {}
         FROM r ORDER BY r.ord",
        worked!()
    )
});

/// Clears the wake tag of waiter `$2` (owner token in hex) in the queue of the lock with
/// release payload `$1`: it waits in the lock manager, and a release to it is not announced
/// (see [`crate::lock_wait`]).
pub(crate) const QUIET: &str = "UPDATE dlock_waiters SET tag = '' WHERE key = $1 AND waiter = $2";

/// Gives a seat's ticket `$1` back (`true` if it was held), which wakes the waiter behind.
pub(crate) const LEAVE_SEAT: &str = "SELECT pg_advisory_unlock($1)";

/// The start of a wait in the lock manager: bounds it by `lock_timeout` (`$timeout`
/// milliseconds; it ends with `lock_not_available`), then, if `$take`, takes the seat's ticket
/// `$ticket` (the answer is `false` if it could not). `CASE` fixes the order.
fn wait_start(timeout: &str, ticket: &str, take: &str) -> String {
    format!(
        "WHEN set_config('lock_timeout', {timeout}, false) IS NULL THEN NULL
         WHEN (CASE WHEN {take} THEN NOT pg_try_advisory_lock({ticket}) ELSE false END)
             THEN false"
    )
}

/// Waits until the ticket `$1` of the waiter ahead is free, then gives it back; `$2` the
/// bound, `$3` the seat's ticket, `$4` whether to take it first (see `wait_start`). `true`
/// once free.
pub(crate) fn wait_ticket() -> String {
    format!(
        "SELECT CASE {}
             WHEN pg_advisory_lock($1)::text IS NOT NULL THEN pg_advisory_unlock($1) END",
        wait_start("$2", "$3", "$4")
    )
}

/// Waits until the key is free, then gives it back (nothing but the ticket is held once it
/// returns); `$4` the bound, `$5` the seat's ticket, `$6` whether to take it first (see
/// `wait_start`). `true` once free.
pub(crate) fn wait_free(key: &KeyParams) -> String {
    let args = key.args();
    format!(
        "SELECT CASE {}
             WHEN pg_advisory_lock({args})::text IS NOT NULL THEN pg_advisory_unlock({args}) END",
        wait_start("$4", "$5", "$6")
    )
}

/// Takes `$2` (a waiter, its owner token in hex) out of the queue of the lock with release
/// payload `$1`, and, if it headed the queue, wakes the new head (the withdrawn waiter may have
/// been woken for a release it will not take).
pub(crate) const WITHDRAW: &str = "WITH gone AS (DELETE FROM dlock_waiters
         WHERE key = $1 AND waiter = $2 RETURNING arrival, waiter),
     headed AS (SELECT 1 FROM gone g WHERE NOT EXISTS (SELECT 1 FROM dlock_waiters w
         WHERE w.key = $1 AND w.until > clock_timestamp()
             AND (w.arrival, w.waiter) < (g.arrival, g.waiter))),
     head AS (SELECT tag, waiter FROM dlock_waiters
         WHERE key = $1 AND waiter <> $2 AND until > clock_timestamp()
         ORDER BY arrival, waiter LIMIT 1)
     SELECT pg_notify('dlock_release_' || head.tag, $1 || ' ' || head.waiter)
     FROM head WHERE head.tag <> '' AND EXISTS (SELECT 1 FROM headed)";

/// Takes a read hold if no writer holds the key and none waits (`$9, $10`: the companion
/// key, which a waiting writer holds; its shared lock is taken and given back at once):
/// `$4` name, `$5` owner record, `$11` the holder (owner token in hex); returns the token and
/// the server's time on the statement ([`WORKED`]), or no row if busy. `CASE` fixes the order:
/// companion first, then the key.
pub(crate) fn grant_read(key: &KeyParams) -> String {
    format!(
        "WITH granted AS (SELECT CASE WHEN pg_try_advisory_lock_shared($9, $10) THEN
             (CASE WHEN pg_advisory_unlock_shared($9, $10)
                 THEN pg_try_advisory_lock_shared({}) ELSE false END)
             ELSE false END AS ok)
         INSERT INTO dlock_holders AS h (name, kind, holder, token, owner, pid, key1, key2, space)
         SELECT $4, 'read', $11, nextval('dlock_fencing'), $5, pg_backend_pid(), $6, $7, $8
         FROM granted WHERE ok
         {UPSERT}
         RETURNING token, {}",
        key.args(),
        worked!()
    )
}

/// Takes a semaphore's permit, one statement in one implicit transaction:
///
/// 1. the guard `($1, $2)` as a transaction lock, so that grants of one semaphore (by any
///    client) are one at a time;
/// 2. a slot held by anyone with another number of permits than `$4` (its number is returned,
///    and nothing is taken);
/// 3. otherwise the first free slot `i` in `0..$4`, skipping the slots this client uses (`$5`:
///    its session would be granted them again), with key `($1, $3 + 4 i)`;
/// 4. a token and the row: `$6` name, `$7` owner record.
///
/// Returns one row: the other number of permits, the slot, the token, and the server's time on
/// the statement ([`WORKED`]). Each step is in a materialized CTE that reads the one before, so
/// they run in this order.
pub(crate) const GRANT_PERMIT: &str = concat!(
    "WITH guard AS MATERIALIZED (
         SELECT pg_advisory_xact_lock($1, $2)::text AS g),
     other AS MATERIALIZED (
         SELECT (SELECT ((l.objid::bigint >> 16) & 16383)::integer FROM pg_locks l
             WHERE guard.g IS NOT NULL AND l.locktype = 'advisory' AND l.granted
                 AND l.objsubid = 2 AND l.classid = ($1::bigint & 4294967295)::oid
                 AND (l.objid::bigint & 3) = 1 AND (l.objid::bigint >> 30) = 0
                 AND ((l.objid::bigint >> 16) & 16383) <> $4
                 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
             LIMIT 1) AS n
         FROM guard),
     slot AS MATERIALIZED (
         SELECT other.n, CASE WHEN other.n IS NULL THEN
             (SELECT i FROM generate_series(0, $4 - 1) AS i
                 WHERE other.n IS NULL
                     AND CASE WHEN i = ANY($5) THEN false
                         ELSE pg_try_advisory_lock($1, $3 + i * 4) END
                 LIMIT 1)
             END AS i
         FROM other),
     ins AS (
         INSERT INTO dlock_holders AS h (name, kind, holder, token, owner, pid, key1, key2, space)
         SELECT $6, 'semaphore', slot.i::text, nextval('dlock_fencing'), $7, pg_backend_pid(),
             $1::bigint & 4294967295, ($3 + slot.i * 4)::bigint & 4294967295, 2
         FROM slot WHERE slot.i IS NOT NULL
         ON CONFLICT (name, kind, holder) DO UPDATE SET token = excluded.token,
             owner = excluded.owner, pid = excluded.pid, key1 = excluded.key1,
             key2 = excluded.key2, space = excluded.space
         RETURNING token)
     SELECT slot.n, slot.i, (SELECT token FROM ins), ",
    worked!(),
    " FROM slot"
);

/// Gives back the slots `($1, $2 + 4 i)`, `i` in `0..$3` but not in `$4`, after a permit's
/// grant failed without saying which slot it took, if any (unlocking a slot this session does
/// not hold only warns).
pub(crate) const UNDO_PERMIT: &str = "SELECT count(*) FROM generate_series(0, $3 - 1) AS i
     WHERE CASE WHEN i = ANY($4) THEN false ELSE pg_advisory_unlock($1, $2 + i * 4) END";

/// Gives a hold back: `$4` name, `$5` token, `$6` payload, `$7` kind, `$8` holder; returns
/// whether it was held. The release is announced to the head of the payload's queue on its
/// wake channel (unless the head waits on the lock itself), or on [`CHANNEL`] when nobody is
/// queued; a release of a read hold or a permit
/// is also announced on [`CHANNEL`], where the primitives' waiters listen.
pub(crate) fn release(key: &KeyParams, function: &str) -> String {
    format!(
        "WITH gone AS (DELETE FROM dlock_holders WHERE name = $4 AND kind = $7 AND holder = $8
             AND token = $5 AND pid = pg_backend_pid()),
         head AS (SELECT w.tag, w.waiter FROM dlock_waiters w
             WHERE w.key = $6 AND w.until > clock_timestamp()
             ORDER BY w.arrival, w.waiter LIMIT 1)
         SELECT {function}({}),
             CASE WHEN h.tag <> ''
                 THEN pg_notify('{CHANNEL}_' || h.tag, $6 || ' ' || h.waiter) END,
             CASE WHEN h.tag IS NULL OR $7 <> 'lock' THEN pg_notify('{CHANNEL}', $6) END
         FROM (SELECT 1) AS one LEFT JOIN head h ON true",
        key.args()
    )
}

/// [`release`] for many holds of one lock session in one statement (see [`crate::batch`]): one
/// row per hold, in the order of the arrays, whose first column says whether it was held. The
/// arrays: `$1`–`$3` the keys and `$4` their spaces (as in [`GRANT_MANY`]), `$5` whether the
/// hold is shared (a reader's), `$6` the names, `$7` the tokens, `$8` the payloads, `$9` the
/// kinds, `$10` the holders.
pub(crate) static RELEASE_MANY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH r AS MATERIALIZED (SELECT * FROM unnest($1::int8[],
         $2::int4[], $3::int4[], $4::int2[], $5::bool[], $6::text[], $7::int8[], $8::text[],
         $9::text[], $10::text[]) WITH ORDINALITY AS r(single, high, low, space, shared, name,
         token, payload, kind, holder, ord)),
     gone AS (DELETE FROM dlock_holders d USING r WHERE d.name = r.name AND d.kind = r.kind
         AND d.holder = r.holder AND d.token = r.token AND d.pid = pg_backend_pid()),
     head AS (SELECT r.ord, h.tag, h.waiter FROM r, LATERAL (SELECT w.tag, w.waiter
         FROM dlock_waiters w WHERE w.key = r.payload AND w.until > clock_timestamp()
         ORDER BY w.arrival, w.waiter LIMIT 1) h)
     SELECT CASE WHEN r.shared THEN (CASE WHEN r.space = 1
             THEN pg_advisory_unlock_shared(r.single)
             ELSE pg_advisory_unlock_shared(r.high, r.low) END)
         ELSE (CASE WHEN r.space = 1 THEN pg_advisory_unlock(r.single)
             ELSE pg_advisory_unlock(r.high, r.low) END) END,
         CASE WHEN h.tag <> ''
             THEN pg_notify('{CHANNEL}_' || h.tag, r.payload || ' ' || h.waiter) END,
         CASE WHEN h.tag IS NULL OR r.kind <> 'lock' THEN pg_notify('{CHANNEL}', r.payload) END
     FROM r LEFT JOIN head h ON h.ord = r.ord ORDER BY r.ord"
    )
});

/// Gives back a lock whose grant may or may not have happened (after an error).
pub(crate) fn unlock(key: &KeyParams, function: &str) -> String {
    format!("SELECT {function}({})", key.args())
}

/// The condition that a `pg_locks` row `l` is a granted lock on `$1`–`$3` in this database.
pub(crate) fn on_key(key: &KeyParams) -> &'static str {
    if key.space == 1 {
        "l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
         AND l.classid = (($1 >> 32) & 4294967295)::oid AND l.objid = ($1 & 4294967295)::oid \
         AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    } else {
        "l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 \
         AND l.classid = ($2::bigint & 4294967295)::oid AND l.objid = ($3::bigint & 4294967295)::oid \
         AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn granting_statements_report_the_servers_time() {
        assert!(worked!().ends_with(&format!(" AS {WORKED}")));
        let key = KeyParams::new(AdvisoryKey::Single(7));
        for statement in [grant(&key, "pg_try_advisory_lock"), grant_read(&key)] {
            assert!(statement.contains(worked!()), "{statement}");
        }
        assert!(GRANT_PERMIT.contains(worked!()));
    }
}
