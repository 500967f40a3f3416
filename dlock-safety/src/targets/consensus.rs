//! The consensus-backed targets: a three-member etcd cluster or ZooKeeper ensemble with short
//! sessions. Both are driven the same way — clients of all members, a client cut off behind
//! proxies, member 0 partitioned from the others — and their clients connect through the
//! registry's URL for the backend.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use dlock_core::DistributedLock;
use dlock_testkit::fixtures::Member;
use dlock_testkit::registry::Deployment;

use super::freeze::Proxies;
use super::{fault_error, FreezableClient, Target};
use crate::Backend;

/// The session TTL or timeout of every client: short, so that abandoned locks free within seconds.
pub const SESSION: Duration = Duration::from_secs(2);

/// dlock clients of a consensus deployment.
#[derive(Debug)]
pub struct ConsensusTarget {
    backend: &'static Backend,
    deployment: Deployment,
}

impl ConsensusTarget {
    /// Clients of `backend` on `deployment`.
    pub fn new(backend: &'static Backend, deployment: Deployment) -> Self {
        ConsensusTarget {
            backend,
            deployment,
        }
    }

    /// Removes the deployment's containers.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        Ok(self.deployment.shutdown().await?)
    }

    fn first_member(&self) -> anyhow::Result<&Member> {
        let members = self.deployment.members().map_err(fault_error)?;
        members.first().context("a deployment without members")
    }

    /// A dlock client of the members at `endpoints` (`host:port`, any scheme is dropped): the
    /// report's own namespace, [`SESSION`]-long sessions, and etcd's request bounds.
    async fn connect(&self, endpoints: &[String]) -> anyhow::Result<Arc<dyn DistributedLock>> {
        let session = ms_param(SESSION);
        let params = match self.backend.scheme {
            "etcd" => format!(
                "prefix=dlock-safety/&session_timeout={session}&request_timeout=2s&connect_timeout=10s"
            ),
            _ => format!("prefix=/dlock-safety&session_timeout={session}"),
        };
        let url = self.backend.url(endpoints, &params);
        Ok(dlock::connect(&url).await?.backend().clone())
    }
}

/// `d` as the URL parameters write durations (`2000ms`).
fn ms_param(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

#[async_trait]
impl Target for ConsensusTarget {
    async fn client(&self) -> anyhow::Result<Arc<dyn DistributedLock>> {
        self.connect(&self.deployment.endpoints()).await
    }

    async fn freezable(&self) -> anyhow::Result<FreezableClient> {
        let proxies = Proxies::start(&self.deployment.endpoints()).await?;
        let client = self.connect(&proxies.addrs()).await?;
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
        let endpoints = self.deployment.endpoints();
        self.first_member()?;
        let isolated = self.connect(&endpoints[..1]).await?;
        let majority = self.connect(&endpoints[1..]).await?;
        Ok((isolated, majority))
    }

    async fn isolate(&self) -> anyhow::Result<()> {
        Ok(self.first_member()?.disconnect().await?)
    }

    async fn rejoin(&self) -> anyhow::Result<()> {
        self.first_member()?.reconnect().await?;
        Ok(self.deployment.wait_ready(Duration::from_secs(120)).await?)
    }
}
