//! The consensus-backed targets: a three-member etcd cluster or ZooKeeper ensemble with short
//! sessions. Both are driven the same way — clients of all members, a client cut off behind
//! proxies, member 0 partitioned from the others — and differ only in how a client connects.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::DistributedLock;
use dlock_etcd::EtcdLock;
use dlock_testkit::fixtures::{EtcdCluster, Member, Result as FixtureResult, ZkEnsemble};
use dlock_zk::ZkLock;

use super::freeze::Proxies;
use super::{fault_error, FreezableClient, Target};

/// The session TTL or timeout of every client: short, so that abandoned locks free within seconds.
pub const SESSION: Duration = Duration::from_secs(2);

/// A consensus fixture and how a dlock client connects to it.
#[async_trait]
pub trait Consensus: Send + Sync + std::fmt::Debug + Sized {
    /// `host:port` of every member.
    fn endpoints(&self) -> Vec<String>;
    /// Member `index`'s container.
    fn member(&self, index: usize) -> FixtureResult<&Member>;
    /// Waits until every member serves again.
    async fn wait_ready(&self, timeout: Duration) -> FixtureResult<()>;
    /// Removes the containers.
    async fn shutdown(self) -> FixtureResult<()>;
    /// The endpoints for a client that reaches the members through proxies at `addrs`
    /// (`127.0.0.1:PORT`).
    fn via(addrs: &[String]) -> Vec<String>;
    /// A dlock client of `endpoints`.
    async fn connect(endpoints: &[String]) -> anyhow::Result<Arc<dyn DistributedLock>>;
}

#[async_trait]
impl Consensus for EtcdCluster {
    fn endpoints(&self) -> Vec<String> {
        EtcdCluster::endpoints(self)
    }

    fn member(&self, index: usize) -> FixtureResult<&Member> {
        EtcdCluster::member(self, index)
    }

    async fn wait_ready(&self, timeout: Duration) -> FixtureResult<()> {
        EtcdCluster::wait_ready(self, timeout).await
    }

    async fn shutdown(self) -> FixtureResult<()> {
        EtcdCluster::shutdown(self).await
    }

    fn via(addrs: &[String]) -> Vec<String> {
        addrs.iter().map(|a| format!("http://{a}")).collect()
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
impl Consensus for ZkEnsemble {
    fn endpoints(&self) -> Vec<String> {
        ZkEnsemble::endpoints(self)
    }

    fn member(&self, index: usize) -> FixtureResult<&Member> {
        ZkEnsemble::member(self, index)
    }

    async fn wait_ready(&self, timeout: Duration) -> FixtureResult<()> {
        ZkEnsemble::wait_ready(self, timeout).await
    }

    async fn shutdown(self) -> FixtureResult<()> {
        ZkEnsemble::shutdown(self).await
    }

    fn via(addrs: &[String]) -> Vec<String> {
        addrs.to_vec()
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

/// dlock clients of a consensus fixture.
#[derive(Debug)]
pub struct ConsensusTarget<C> {
    fixture: C,
}

/// `dlock-etcd` clients of a cluster.
pub type EtcdTarget = ConsensusTarget<EtcdCluster>;

/// `dlock-zk` clients of an ensemble.
pub type ZkTarget = ConsensusTarget<ZkEnsemble>;

impl<C: Consensus> ConsensusTarget<C> {
    /// Clients of `fixture`.
    pub fn new(fixture: C) -> Self {
        ConsensusTarget { fixture }
    }

    /// Removes the fixture's containers.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        Ok(self.fixture.shutdown().await?)
    }

    fn first_member(&self) -> anyhow::Result<&Member> {
        self.fixture.member(0).map_err(fault_error)
    }
}

#[async_trait]
impl<C: Consensus> Target for ConsensusTarget<C> {
    async fn client(&self) -> anyhow::Result<Arc<dyn DistributedLock>> {
        C::connect(&self.fixture.endpoints()).await
    }

    async fn freezable(&self) -> anyhow::Result<FreezableClient> {
        let proxies = Proxies::start(&self.fixture.endpoints()).await?;
        let client = C::connect(&C::via(&proxies.addrs())).await?;
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
        let endpoints = self.fixture.endpoints();
        self.first_member()?;
        let isolated = C::connect(&endpoints[..1]).await?;
        let majority = C::connect(&endpoints[1..]).await?;
        Ok((isolated, majority))
    }

    async fn isolate(&self) -> anyhow::Result<()> {
        Ok(self.first_member()?.disconnect().await?)
    }

    async fn rejoin(&self) -> anyhow::Result<()> {
        self.first_member()?.reconnect().await?;
        Ok(self.fixture.wait_ready(Duration::from_secs(120)).await?)
    }
}
