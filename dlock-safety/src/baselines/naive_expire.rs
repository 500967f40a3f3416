//! `SETNX key owner`, then `PEXPIRE key ttl` in a second round trip; `DEL key` to release.
//!
//! The classic first attempt: a client that dies between the two commands leaves a lock that never
//! expires, extend re-arms whatever key is there, and release deletes whoever holds the lock.

use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Attempt, Extension, Grant, LeaseRef, LockRequest};
use dlock_core::{FencingToken, Released, Result};
use tokio::time::Instant;

use super::connection::{Baseline, BaselineLock, Scheme};

/// The naive baseline (see the module docs).
pub type NaiveExpireLock = BaselineLock<NaiveExpire>;

/// The naive baseline's commands.
pub struct NaiveExpire;

fn millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}

#[async_trait]
impl Scheme for NaiveExpire {
    const NAME: &'static str = "naive-setnx-expire";
    const PREFIX: &'static str = "baseline:naive:";

    async fn try_lock(conn: &Baseline, req: &LockRequest<'_>) -> Result<Attempt> {
        let sent = Instant::now();
        let key = conn.key(req.key);
        let set: bool = conn
            .query(redis::cmd("SETNX").arg(&key).arg(req.owner.to_hex()))
            .await?;
        if !set {
            return Ok(Attempt::Busy { retry_after: None });
        }
        let _: bool = conn
            .query(redis::cmd("PEXPIRE").arg(&key).arg(millis(req.ttl)))
            .await?;
        Ok(Attempt::Acquired(Grant::new(FencingToken(0), sent)))
    }

    async fn extend(conn: &Baseline, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        let armed: bool = conn
            .query(
                redis::cmd("PEXPIRE")
                    .arg(conn.key(lease.key))
                    .arg(millis(ttl)),
            )
            .await?;
        Ok(if armed {
            Extension::Extended
        } else {
            Extension::Expired
        })
    }

    async fn release(conn: &Baseline, lease: &LeaseRef<'_>) -> Result<Released> {
        let deleted: u64 = conn
            .query(redis::cmd("DEL").arg(conn.key(lease.key)))
            .await?;
        Ok(if deleted > 0 {
            Released::Released
        } else {
            Released::Expired
        })
    }
}
