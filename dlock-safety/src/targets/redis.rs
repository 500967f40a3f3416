//! One Redis server, spoken to by `dlock-redis` or by one of the baselines.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::DistributedLock;
use dlock_testkit::fixtures::redis::set_clock_offset;
use dlock_testkit::fixtures::{RedisReplicated, RedisServer};
use dlock_testkit::registry::{Backend, Role};

use super::freeze::Proxies;
use super::{fault_error, FreezableClient, Target};
use crate::baselines::{LegacyGetSetLock, NaiveExpireLock};

/// Which client speaks to the server.
#[derive(Debug, Clone, Copy)]
pub enum RedisFlavor {
    /// A dlock backend (`dlock-redis`), connected through its registry URL.
    Dlock(&'static Backend),
    /// `dlock-redis` with `min_replicas = 1`: every grant, extension and release waits for the
    /// replica's acknowledgement (`WAIT`).
    Acknowledged,
    /// The SETNX/GETSET baseline.
    LegacyGetSet,
    /// The SETNX+EXPIRE baseline.
    NaiveExpire,
}

impl RedisFlavor {
    /// The client of a registry entry on one Redis server: dlock's own for a backend, the
    /// baseline of that name for a baseline.
    pub fn of(backend: &'static Backend) -> anyhow::Result<RedisFlavor> {
        Ok(match (backend.role, backend.name) {
            (Role::Baseline, "legacy-getset") => RedisFlavor::LegacyGetSet,
            (Role::Baseline, "naive-expire") => RedisFlavor::NaiveExpire,
            (Role::Baseline, other) => anyhow::bail!("no baseline client named {other:?}"),
            (Role::Variant("redis"), "redis-wait") => RedisFlavor::Acknowledged,
            (Role::Backend | Role::Variant(_), _) => RedisFlavor::Dlock(backend),
        })
    }
}

/// A Redis server and a primary/replica pair (shared by the flavours, which use distinct keys),
/// and the client flavour.
#[derive(Debug)]
pub struct RedisTarget {
    server: Arc<RedisServer>,
    pub(super) replicated: Result<Arc<RedisReplicated>, String>,
    flavor: RedisFlavor,
}

impl RedisTarget {
    /// Clients of `flavor` on `server`, and on `replicated` (or why it is missing).
    pub fn new(
        server: Arc<RedisServer>,
        replicated: Result<Arc<RedisReplicated>, String>,
        flavor: RedisFlavor,
    ) -> Self {
        RedisTarget {
            server,
            replicated,
            flavor,
        }
    }

    pub(super) async fn connect(&self, url: &str) -> anyhow::Result<Arc<dyn DistributedLock>> {
        Ok(match self.flavor {
            RedisFlavor::Dlock(backend) => {
                let url = backend.url(&[url.to_owned()], "request_timeout=1s");
                dlock::connect(&url).await?.backend().clone()
            }
            RedisFlavor::Acknowledged => Arc::new(
                dlock_redis::RedisLock::builder(url)
                    .with_request_timeout(Duration::from_secs(1))
                    .with_min_replicas(1)
                    .with_replica_timeout(Duration::from_millis(500))
                    .connect()
                    .await?,
            ),
            RedisFlavor::LegacyGetSet => Arc::new(LegacyGetSetLock::connect(url).await?),
            RedisFlavor::NaiveExpire => Arc::new(NaiveExpireLock::connect(url).await?),
        })
    }
}

#[async_trait]
impl Target for RedisTarget {
    async fn client(&self) -> anyhow::Result<Arc<dyn DistributedLock>> {
        self.connect(&self.server.url()).await
    }

    async fn freezable(&self) -> anyhow::Result<FreezableClient> {
        let proxies = Proxies::start(&[self.server.url()]).await?;
        let url = format!("redis://{}", proxies.addrs().concat());
        let client = self.connect(&url).await?;
        Ok((client, Arc::new(proxies)))
    }

    fn fencing(&self) -> bool {
        matches!(
            self.flavor,
            RedisFlavor::Dlock(_) | RedisFlavor::Acknowledged
        )
    }

    fn abandon_bound(&self, ttl: Duration) -> Duration {
        ttl
    }

    fn replication(&self) -> anyhow::Result<&dyn super::Replication> {
        match &self.replicated {
            Ok(_) => Ok(self),
            Err(e) => Err(super::FaultUnavailable(format!("no primary/replica pair: {e}")).into()),
        }
    }

    async fn jump_clock(&self, ahead: Duration) -> anyhow::Result<()> {
        let member = self.server.member().map_err(fault_error)?;
        set_clock_offset(member, i64::try_from(ahead.as_millis())?).await?;
        Ok(())
    }

    async fn restore_clock(&self) -> anyhow::Result<()> {
        let member = self.server.member().map_err(fault_error)?;
        set_clock_offset(member, 0).await?;
        Ok(())
    }

    async fn restart_without_data(&self) -> anyhow::Result<()> {
        // The fixture runs Redis without persistence: a restart comes back empty.
        let member = self.server.member().map_err(fault_error)?;
        member.restart_keep_data().await?;
        Ok(())
    }
}
