//! A three-member ZooKeeper ensemble with short sessions.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::DistributedLock;
use dlock_testkit::fixtures::ZkEnsemble;
use dlock_zk::ZkLock;

use super::freeze::Proxies;
use super::{fault_error, FreezableClient, Target};

/// The session timeout of every client: short, so that abandoned locks free within seconds.
pub const SESSION: Duration = Duration::from_secs(2);

/// `dlock-zk` clients of an ensemble.
#[derive(Debug)]
pub struct ZkTarget {
    ensemble: ZkEnsemble,
}

impl ZkTarget {
    /// Clients of `ensemble`.
    pub fn new(ensemble: ZkEnsemble) -> Self {
        ZkTarget { ensemble }
    }

    /// Removes the ensemble's containers.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        Ok(self.ensemble.shutdown().await?)
    }

    async fn connect(endpoints: &[String]) -> anyhow::Result<Arc<dyn DistributedLock>> {
        let url = format!("zk://{}", endpoints.join(","));
        Ok(Arc::new(
            ZkLock::builder(&url)
                .with_session_timeout(SESSION)
                .with_root("/dlock-safety")
                .connect()
                .await?,
        ))
    }
}

#[async_trait]
impl Target for ZkTarget {
    async fn client(&self) -> anyhow::Result<Arc<dyn DistributedLock>> {
        Self::connect(&self.ensemble.endpoints()).await
    }

    async fn freezable(&self) -> anyhow::Result<FreezableClient> {
        let proxies = Proxies::start(&self.ensemble.endpoints()).await?;
        let client = Self::connect(&proxies.addrs()).await?;
        Ok((client, Arc::new(proxies)))
    }

    fn fencing(&self) -> bool {
        true
    }

    fn abandon_bound(&self, _ttl: Duration) -> Duration {
        SESSION
    }

    async fn partition_clients(
        &self,
    ) -> anyhow::Result<(Arc<dyn DistributedLock>, Arc<dyn DistributedLock>)> {
        let endpoints = self.ensemble.endpoints();
        self.ensemble.member(0).map_err(fault_error)?;
        let isolated = Self::connect(&endpoints[..1]).await?;
        let majority = Self::connect(&endpoints[1..]).await?;
        Ok((isolated, majority))
    }

    async fn isolate(&self) -> anyhow::Result<()> {
        Ok(self
            .ensemble
            .member(0)
            .map_err(fault_error)?
            .disconnect()
            .await?)
    }

    async fn rejoin(&self) -> anyhow::Result<()> {
        self.ensemble
            .member(0)
            .map_err(fault_error)?
            .reconnect()
            .await?;
        Ok(self.ensemble.wait_ready(Duration::from_secs(120)).await?)
    }
}
