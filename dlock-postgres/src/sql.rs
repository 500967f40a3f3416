//! The statements dlock sends, and the server-side objects they use.
//!
//! * `dlock_fencing`, a sequence: every grant takes `nextval`, so tokens grow across all keys
//!   and survive restarts (a sequence never goes back, also after a crash: it logs ahead).
//! * `dlock_holders`, an **unlogged** table: one row per held lock name — its fencing token, the
//!   holder's owner record, its server process and its advisory key — written by the granting
//!   statement and deleted by the releasing one, for operators (`inspect`, `list`, `evict`). The
//!   server lock is the truth: a row counts only while its process holds the advisory key in
//!   `pg_locks`. Unlogged, because the rows matter only while the sessions live: writing them
//!   costs no WAL, and a crash, which ends every session, also empties the table.
//!
//! Rows of sessions that ended without releasing are swept each time a client opens its lock
//! session.
//!
//! A grant is one statement and one round trip: try the advisory lock, and only if it was taken,
//! take a token and write the row. A release is one statement too: delete the row (only if it is
//! still the releaser's), unlock, and announce the release on the channel `dlock_release`.

use tokio_postgres::types::{ToSql, Type};

use crate::key::AdvisoryKey;

/// The channel releases are announced on, with the key's text as payload.
pub(crate) const CHANNEL: &str = "dlock_release";

/// Whether the sequence and the table exist.
pub(crate) const SCHEMA_EXISTS: &str =
    "SELECT to_regclass('dlock_fencing') IS NOT NULL AND to_regclass('dlock_holders') IS NOT NULL";

/// Creates them, one client at a time (`CREATE … IF NOT EXISTS` alone races with itself).
pub(crate) fn create_schema() -> String {
    let guard =
        crate::key::advisory_key("dlock-postgres: creating dlock_fencing and dlock_holders");
    format!(
        "BEGIN;
         SELECT pg_advisory_xact_lock({});
         CREATE SEQUENCE IF NOT EXISTS dlock_fencing;
         CREATE UNLOGGED TABLE IF NOT EXISTS dlock_holders (
             name text PRIMARY KEY,
             token bigint NOT NULL,
             owner text NOT NULL,
             pid integer NOT NULL,
             key1 bigint NOT NULL,
             key2 bigint NOT NULL,
             space smallint NOT NULL
         );
         COMMIT;",
        guard.sql_args()
    )
}

/// Deletes the rows whose process no longer holds their key: those of sessions that ended without
/// releasing (a crash, a termination, a restart). A row becomes visible only once its grant's
/// lock is held, so a grant under way is never swept.
pub(crate) const SWEEP: &str = "DELETE FROM dlock_holders h WHERE NOT EXISTS (
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

/// Takes the lock if free: `$4` name, `$5` owner record; returns the token, or no row if busy.
pub(crate) fn grant(key: &KeyParams, function: &str) -> String {
    format!(
        "WITH granted AS (SELECT {function}({}) AS ok)
         INSERT INTO dlock_holders AS h (name, token, owner, pid, key1, key2, space)
         SELECT $4, nextval('dlock_fencing'), $5, pg_backend_pid(), $6, $7, $8 FROM granted WHERE ok
         ON CONFLICT (name) DO UPDATE SET token = excluded.token, owner = excluded.owner,
             pid = excluded.pid, key1 = excluded.key1, key2 = excluded.key2, space = excluded.space
         RETURNING token",
        key.args()
    )
}

/// Gives the lock back: `$4` name, `$5` token, `$6` payload; returns whether it was held.
pub(crate) fn release(key: &KeyParams, function: &str) -> String {
    format!(
        "WITH gone AS (DELETE FROM dlock_holders WHERE name = $4 AND token = $5 AND pid = pg_backend_pid())
         SELECT {function}({}), pg_notify('{CHANNEL}', $6)",
        key.args()
    )
}

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
