//! The timestamp lock from Redis's old `SETNX` documentation.
//!
//! The value is the lock's expiry time in Unix milliseconds on the client's clock. A client takes
//! a free lock with `SETNX key <now + ttl + 1>`; a lock whose timestamp has passed it takes over
//! with `GETSET key <now + ttl + 1>`, and wins if the old value it got back was still expired.
//! To release, it deletes the key if the timestamp it reads is still in the future, which is also
//! true of a successor's timestamp. There is no owner in the value and no token.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use dlock_core::backend::{Attempt, Extension, Grant, LeaseRef, LockRequest};
use dlock_core::{FencingToken, Released, Result};
use tokio::time::Instant;

use super::connection::{Baseline, BaselineLock, Scheme};

/// The legacy baseline (see the module docs).
pub type LegacyGetSetLock = BaselineLock<LegacyGetSet>;

/// The legacy baseline's commands.
pub struct LegacyGetSet;

fn now_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

fn expiry(ttl: Duration) -> u64 {
    now_ms()
        .saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
        .saturating_add(1)
}

fn parse(value: Option<String>) -> Option<u64> {
    value.and_then(|v| v.parse().ok())
}

#[async_trait]
impl Scheme for LegacyGetSet {
    const NAME: &'static str = "legacy-setnx-getset";
    const PREFIX: &'static str = "baseline:legacy:";

    async fn try_lock(conn: &Baseline, req: &LockRequest<'_>) -> Result<Attempt> {
        let sent = Instant::now();
        let key = conn.key(req.key);
        let set: bool = conn
            .query(redis::cmd("SETNX").arg(&key).arg(expiry(req.ttl)))
            .await?;
        if set {
            return Ok(Attempt::Acquired(Grant::new(FencingToken(0), sent)));
        }
        let current: Option<String> = conn.query(redis::cmd("GET").arg(&key)).await?;
        let now = now_ms();
        match parse(current) {
            Some(until) if until > now => Ok(Attempt::Busy {
                retry_after: Some(Duration::from_millis(until - now)),
            }),
            _ => {
                let old: Option<String> = conn
                    .query(redis::cmd("GETSET").arg(&key).arg(expiry(req.ttl)))
                    .await?;
                if parse(old).is_none_or(|until| until <= now_ms()) {
                    Ok(Attempt::Acquired(Grant::new(FencingToken(0), sent)))
                } else {
                    Ok(Attempt::Busy { retry_after: None })
                }
            }
        }
    }

    async fn extend(conn: &Baseline, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        // The scheme has no extend; deployments rewrote the timestamp, whoever held the key.
        let _: Option<String> = conn
            .query(
                redis::cmd("GETSET")
                    .arg(conn.key(lease.key))
                    .arg(expiry(ttl)),
            )
            .await?;
        Ok(Extension::Extended)
    }

    async fn release(conn: &Baseline, lease: &LeaseRef<'_>) -> Result<Released> {
        let key = conn.key(lease.key);
        let current: Option<String> = conn.query(redis::cmd("GET").arg(&key)).await?;
        if parse(current).is_some_and(|until| until > now_ms()) {
            let _: u64 = conn.query(redis::cmd("DEL").arg(&key)).await?;
            Ok(Released::Released)
        } else {
            Ok(Released::Expired)
        }
    }
}
