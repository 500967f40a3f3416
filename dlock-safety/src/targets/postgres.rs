//! One PostgreSQL server, spoken to by `dlock-postgres` through its registry URL.
//!
//! A PostgreSQL lock lives as long as the holder's session, and the server ends a silent
//! client's session after its `idle_session_timeout`, which the client sets to its
//! `session_timeout`. The target makes that timeout short ([`SESSION`]), so that the locks of a
//! paused, crashed or cut-off holder free within seconds; that timeout is then the bound for
//! abandoned locks, not the lease's TTL.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::DistributedLock;
use dlock_testkit::fixtures::PostgresServer;
use dlock_testkit::{url_target, url_via, FreezeProxy};

use super::{FreezableClient, Target};
use crate::Backend;

/// The session timeout of every client: the server frees a silent holder's locks this long after
/// it last heard from it.
pub const SESSION: Duration = Duration::from_secs(2);

/// dlock clients of one PostgreSQL server.
#[derive(Debug)]
pub struct PostgresTarget {
    backend: &'static Backend,
    server: PostgresServer,
}

impl PostgresTarget {
    /// Clients of `backend` on `server`.
    pub fn new(backend: &'static Backend, server: PostgresServer) -> Self {
        PostgresTarget { backend, server }
    }

    /// Removes the server's container.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        Ok(self.server.shutdown().await?)
    }

    /// A dlock client of the server at `server_url` (the fixture's URL, or the same through a
    /// proxy): [`SESSION`]-long sessions, requests bounded well below the session, and a
    /// connect timeout for a loaded machine.
    async fn connect(&self, server_url: &str) -> anyhow::Result<Arc<dyn DistributedLock>> {
        let params = format!(
            "session_timeout={}ms&request_timeout=1s&connect_timeout=10s",
            SESSION.as_millis()
        );
        let url = self.backend.url(&[server_url.to_owned()], &params);
        Ok(dlock::connect(&url).await?.backend().clone())
    }
}

#[async_trait]
impl Target for PostgresTarget {
    async fn client(&self) -> anyhow::Result<Arc<dyn DistributedLock>> {
        self.connect(&self.server.url()).await
    }

    async fn freezable(&self) -> anyhow::Result<FreezableClient> {
        let server_url = self.server.url();
        let proxy = FreezeProxy::start(url_target(&server_url, 5432)?).await?;
        let client = self.connect(&url_via(&server_url, proxy.addr())?).await?;
        // The proxy is its own switch, and runs for as long as the scenario holds it.
        Ok((client, Arc::new(proxy)))
    }

    fn fencing(&self) -> bool {
        true
    }

    fn abandon_bound(&self, _ttl: Duration) -> Duration {
        SESSION
    }
}
