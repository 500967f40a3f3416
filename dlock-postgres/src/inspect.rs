//! What operators see and do: the holder of a lock (from `pg_locks`, with its row in
//! `dlock_holders` if a dlock client took it), the held locks under a prefix, and eviction.
//!
//! Eviction ends the holder's **session** (`pg_terminate_backend`): PostgreSQL has no way to
//! give back another session's advisory lock. Every lock the evicted client held in that
//! session ends with it (all of its locks, unless it holds more than
//! [`LOCKS_PER_SESSION`](crate::LOCKS_PER_SESSION)), and those leases turn lost; its next call
//! opens a new session.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::LockKey;
use dlock_core::inspect::{Eviction, HeldLock, Holder, Holding};
use dlock_core::{Error, FencingToken, OwnerRecord, Result};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use crate::client::Inner;
use crate::error::{from_driver, BACKEND};
use crate::key::advisory_key;
use crate::sql::{self, KeyParams, CHANNEL};

/// How long an eviction waits for the evicted process to exit (and free its locks).
const EXIT_WAIT: Duration = Duration::from_secs(5);

async fn reader(inner: &Inner) -> Result<Arc<tokio_postgres::Client>> {
    inner.listener.start(&inner.settings);
    inner
        .listener
        .client(inner.settings.request_timeout)
        .await
        .ok_or_else(|| {
            Error::no_answer("PostgreSQL read connection", inner.settings.request_timeout)
        })
}

pub(crate) async fn read(
    inner: &Inner,
    statement: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
    what: &'static str,
) -> Result<Vec<Row>> {
    let client = reader(inner).await?;
    let timeout = inner.settings.request_timeout;
    tokio::time::timeout(timeout, client.query_typed(statement, params))
        .await
        .map_err(|_| Error::no_answer(format_args!("PostgreSQL {what}"), timeout))?
        .map_err(|e| from_driver(e, what))
}

/// The holder of `key`: its process, and its token and owner record where a dlock client took it,
/// and how many dlock waiters stand in its queue (entries that have not lapsed).
fn holder_query(params: &KeyParams) -> String {
    format!(
        "SELECT l.pid, h.token, h.owner,
             (SELECT count(*) FROM dlock_waiters w WHERE w.key = $8 AND w.until > now())
         FROM pg_locks l
         LEFT JOIN dlock_holders h ON h.name = $4 AND h.kind = 'lock' AND h.holder = ''
             AND h.pid = l.pid AND h.key1 = $5 AND h.key2 = $6 AND h.space = $7
         WHERE {} AND l.mode = 'ExclusiveLock'",
        sql::on_key(params)
    )
}

pub(crate) fn holder_of(row: &Row) -> Holder {
    let token: Option<i64> = row.try_get(1).ok().flatten();
    let owner: Option<String> = row.try_get(2).ok().flatten();
    let mut holder = Holder::new().with_owner(owner.and_then(|o| OwnerRecord::parse(o.as_bytes())));
    if let Some(token) = token {
        holder = holder.with_fencing(FencingToken(token as u64));
    }
    holder
}

/// The current holder and its process, if any.
async fn current(inner: &Inner, key: &LockKey) -> Result<Option<(i32, Holder)>> {
    let params = KeyParams::new(advisory_key(key.as_str()));
    let name = key.as_str();
    let rest: [(&(dyn ToSql + Sync), Type); 5] = [
        (&name, Type::TEXT),
        (&params.key1, Type::INT8),
        (&params.key2, Type::INT8),
        (&params.space, Type::INT2),
        (&params.payload, Type::TEXT),
    ];
    let rows = read(
        inner,
        &holder_query(&params),
        &params.with(&rest),
        "look at a lock",
    )
    .await?;
    Ok(rows.first().map(|row| {
        let pid: i32 = row.try_get(0).unwrap_or_default();
        let waiting: i64 = row.try_get(3).unwrap_or_default();
        let waiting = usize::try_from(waiting).unwrap_or_default();
        (pid, holder_of(row).with_waiting(waiting))
    }))
}

pub(crate) async fn holding(inner: &Inner, key: &LockKey) -> Result<Holding> {
    Ok(match current(inner, key).await? {
        Some((_, holder)) => Holding::Held(holder),
        None => Holding::Free,
    })
}

pub(crate) async fn list(inner: &Inner, prefix: &str) -> Result<Vec<HeldLock>> {
    let statement = "SELECT h.name, h.token, h.owner FROM dlock_holders h
         JOIN pg_locks l ON l.pid = h.pid AND l.locktype = 'advisory' AND l.granted
             AND l.mode = 'ExclusiveLock' AND l.classid::bigint = h.key1
             AND l.objid::bigint = h.key2 AND l.objsubid = h.space
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
         WHERE h.kind = 'lock' AND starts_with(h.name, $1) ORDER BY h.name";
    let rows = read(
        inner,
        statement,
        &[(&prefix, Type::TEXT)],
        "list the held locks",
    )
    .await?;
    Ok(rows
        .iter()
        .filter_map(|row| {
            let name: String = row.try_get(0).ok()?;
            Some(HeldLock::new(name, holder_of(row)))
        })
        .collect())
}

pub(crate) async fn evict(
    inner: &Inner,
    key: &LockKey,
    expected: Option<FencingToken>,
) -> Result<Eviction> {
    let Some((pid, holder)) = current(inner, key).await? else {
        return Ok(Eviction::Free);
    };
    if expected.is_some() && holder.fencing != expected {
        return Ok(Eviction::Changed(holder));
    }
    let params = KeyParams::new(advisory_key(key.as_str()));
    let name = key.as_str();
    let token = holder.fencing.map(|t| t.0 as i64);
    let wait = EXIT_WAIT.as_millis() as i64;
    // Only the process read above, only while it still holds the key, and only with the token
    // shown (if one was): an eviction never removes a holder the caller was not shown.
    let statement = format!(
        "SELECT pg_terminate_backend(l.pid, $6) FROM pg_locks l
         WHERE {} AND l.mode = 'ExclusiveLock' AND l.pid = $4
           AND ($7::bigint IS NULL OR EXISTS (SELECT 1 FROM dlock_holders h
                WHERE h.name = $5 AND h.kind = 'lock' AND h.pid = l.pid AND h.token = $7))",
        sql::on_key(&params)
    );
    let rest: [(&(dyn ToSql + Sync), Type); 4] = [
        (&pid, Type::INT4),
        (&name, Type::TEXT),
        (&wait, Type::INT8),
        (&token, Type::INT8),
    ];
    let rows = read(inner, &statement, &params.with(&rest), "evict the holder").await?;
    let ended = rows.first().and_then(|r| r.try_get::<_, bool>(0).ok()) == Some(true);
    if !ended {
        return Ok(match current(inner, key).await? {
            Some((_, now)) => Eviction::Changed(now),
            None => Eviction::Free,
        });
    }
    let notify = format!("SELECT pg_notify('{CHANNEL}', $1)");
    if let Err(e) = read(
        inner,
        &notify,
        &[(&params.payload, Type::TEXT)],
        "announce the eviction",
    )
    .await
    {
        tracing::debug!(backend = BACKEND, error = %e, "announcing an eviction failed");
    }
    Ok(Eviction::Evicted(holder))
}
