//! Failing over to an asynchronous replica that missed the last writes (scenario 10).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use async_trait::async_trait;
use dlock_core::DistributedLock;
use dlock_testkit::fixtures::RedisReplicated;
use tokio::time::Instant;

use super::fault_error;
use super::redis::RedisTarget;

/// A primary whose replica can be made to lag and then promoted.
#[async_trait]
pub trait Replication: Send + Sync {
    /// A client of the primary, once the replica follows it.
    async fn primary_client(&self) -> anyhow::Result<Arc<dyn DistributedLock>>;

    /// Waits until the replica has everything the primary has, then cuts the replica off, so the
    /// writes that follow reach the primary only.
    async fn stop_replicating(&self) -> anyhow::Result<()>;

    /// Kills the primary, brings the replica back and promotes it; a client of the new primary.
    async fn promote_replica(&self) -> anyhow::Result<Arc<dyn DistributedLock>>;

    /// Back to a fresh primary and replica.
    async fn reset(&self) -> anyhow::Result<()>;
}

impl RedisTarget {
    fn pair(&self) -> anyhow::Result<&RedisReplicated> {
        self.replicated
            .as_deref()
            .map_err(|e| anyhow::anyhow!("{e}"))
    }
}

#[async_trait]
impl Replication for RedisTarget {
    async fn primary_client(&self) -> anyhow::Result<Arc<dyn DistributedLock>> {
        let pair = self.pair()?;
        // After a reset the replica may still be synchronising; a client that waits for its
        // acknowledgement (`min_replicas`) could not take even a free lock before it follows.
        wait_in_sync(&pair.primary_url(), &pair.replica_url()).await?;
        self.connect(&pair.primary_url()).await
    }

    async fn stop_replicating(&self) -> anyhow::Result<()> {
        let pair = self.pair()?;
        wait_in_sync(&pair.primary_url(), &pair.replica_url()).await?;
        pair.replica().map_err(fault_error)?.disconnect().await?;
        Ok(())
    }

    async fn promote_replica(&self) -> anyhow::Result<Arc<dyn DistributedLock>> {
        let pair = self.pair()?;
        pair.primary().map_err(fault_error)?.kill().await?;
        pair.replica().map_err(fault_error)?.reconnect().await?;
        let mut conn = raw(&pair.replica_url()).await?;
        let _: String = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query_async(&mut conn)
            .await
            .context("promoting the replica")?;
        self.connect(&pair.replica_url()).await
    }

    async fn reset(&self) -> anyhow::Result<()> {
        Ok(self.pair()?.reset().await?)
    }
}

async fn raw(url: &str) -> anyhow::Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url)?;
    Ok(tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    .context("connecting to Redis")??)
}

/// The value of `field` in an `INFO replication` answer.
fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
}

async fn info(url: &str) -> anyhow::Result<String> {
    let mut conn = raw(url).await?;
    Ok(redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut conn)
        .await?)
}

/// Polls until the replica's link is up and its offset equals the primary's.
async fn wait_in_sync(primary: &str, replica: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = info(primary).await?;
        let r = info(replica).await?;
        let up = info_field(&r, "master_link_status").as_deref() == Some("up");
        let offset = info_field(&p, "master_repl_offset");
        if up && offset.is_some() && offset == info_field(&r, "slave_repl_offset") {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("the replica did not catch up with the primary within 60 s:\n{r}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_fields_are_read_by_exact_name() {
        let info = "# Replication\r\nrole:slave\r\nmaster_link_status:up\r\nslave_repl_offset:42\r\nslave_repl_offset_x:1\r\n";
        assert_eq!(
            info_field(info, "master_link_status").as_deref(),
            Some("up")
        );
        assert_eq!(info_field(info, "slave_repl_offset").as_deref(), Some("42"));
        assert_eq!(info_field(info, "master_repl_offset"), None);
    }
}
