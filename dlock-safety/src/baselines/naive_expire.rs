//! `SETNX key owner`, then `PEXPIRE key ttl` in a second round trip; `DEL key` to release.
//!
//! The classic first attempt: a client that dies between the two commands leaves a lock that never
//! expires, extend re-arms whatever key is there, and release deletes whoever holds the lock.

use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{
    Attempt, Capabilities, DistributedLock, Extension, FencingGuarantee, FencingToken, Grant,
    LeaseRef, LockRequest, Released, Result,
};
use tokio::time::Instant;

use super::connection::Baseline;

const NAME: &str = "naive-setnx-expire";

/// The naive baseline (see the module docs).
#[derive(Clone, Debug)]
pub struct NaiveExpireLock(Baseline);

impl NaiveExpireLock {
    /// Connects to the Redis server at `url`.
    pub async fn connect(url: &str) -> Result<Self> {
        Ok(NaiveExpireLock(
            Baseline::connect(NAME, "baseline:naive:", url).await?,
        ))
    }
}

fn millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}

#[async_trait]
impl DistributedLock for NaiveExpireLock {
    fn backend_name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(FencingGuarantee::None)
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        let sent = Instant::now();
        let key = self.0.key(req.key);
        let set: bool = self
            .0
            .query(redis::cmd("SETNX").arg(&key).arg(req.owner.to_hex()))
            .await?;
        if !set {
            return Ok(Attempt::Busy { retry_after: None });
        }
        let _: bool = self
            .0
            .query(redis::cmd("PEXPIRE").arg(&key).arg(millis(req.ttl)))
            .await?;
        Ok(Attempt::Acquired(Grant::new(FencingToken(0), sent)))
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        let armed: bool = self
            .0
            .query(
                redis::cmd("PEXPIRE")
                    .arg(self.0.key(lease.key))
                    .arg(millis(ttl)),
            )
            .await?;
        Ok(if armed {
            Extension::Extended
        } else {
            Extension::Expired
        })
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        let deleted: u64 = self
            .0
            .query(redis::cmd("DEL").arg(self.0.key(lease.key)))
            .await?;
        Ok(if deleted > 0 {
            Released::Released
        } else {
            Released::Expired
        })
    }
}
