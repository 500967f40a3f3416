//! A three-member etcd cluster with short sessions.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::DistributedLock;
use dlock_etcd::EtcdLock;
use dlock_testkit::fixtures::EtcdCluster;

use super::freeze::Proxies;
use super::{fault_error, FreezableClient, Target};

/// The session TTL of every client: short, so that abandoned locks free within seconds.
pub const SESSION: Duration = Duration::from_secs(2);

/// `dlock-etcd` clients of a cluster.
#[derive(Debug)]
pub struct EtcdTarget {
    cluster: EtcdCluster,
}

impl EtcdTarget {
    /// Clients of `cluster`.
    pub fn new(cluster: EtcdCluster) -> Self {
        EtcdTarget { cluster }
    }

    /// Removes the cluster's containers.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        Ok(self.cluster.shutdown().await?)
    }

    async fn connect(endpoints: &[String]) -> anyhow::Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(
            EtcdLock::builder()
                .with_endpoints(endpoints.iter().cloned())
                .with_namespace("dlock-safety/")
                .with_session_ttl(SESSION)
                .with_request_timeout(Duration::from_secs(2))
                .with_connect_timeout(Duration::from_secs(10))
                .connect()
                .await?,
        ))
    }
}

#[async_trait]
impl Target for EtcdTarget {
    async fn client(&self) -> anyhow::Result<Arc<dyn DistributedLock>> {
        Self::connect(&self.cluster.endpoints()).await
    }

    async fn freezable(&self) -> anyhow::Result<FreezableClient> {
        let proxies = Proxies::start(&self.cluster.endpoints()).await?;
        let urls: Vec<String> = proxies
            .addrs()
            .iter()
            .map(|a| format!("http://{a}"))
            .collect();
        let client = Self::connect(&urls).await?;
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
        let endpoints = self.cluster.endpoints();
        self.cluster.member(0).map_err(fault_error)?;
        let isolated = Self::connect(&endpoints[..1]).await?;
        let majority = Self::connect(&endpoints[1..]).await?;
        Ok((isolated, majority))
    }

    async fn isolate(&self) -> anyhow::Result<()> {
        Ok(self
            .cluster
            .member(0)
            .map_err(fault_error)?
            .disconnect()
            .await?)
    }

    async fn rejoin(&self) -> anyhow::Result<()> {
        self.cluster
            .member(0)
            .map_err(fault_error)?
            .reconnect()
            .await?;
        Ok(self.cluster.wait_ready(Duration::from_secs(120)).await?)
    }
}
