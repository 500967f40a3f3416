//! What a scenario runs against: clients of one backend, and the faults its deployment allows.
//!
//! Each target owns (or shares) a server fixture from `dlock-testkit`, so the servers are real:
//! containers the run may break, or servers named in the `DLOCK_TEST_*_URL` variables, on which
//! the client-side faults still work and the server-side ones are reported as not run.

mod consensus;
mod freeze;
mod memory;
mod postgres;
mod redis;
mod redlock;
mod replication;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::DistributedLock;
use dlock_testkit::Freeze;

pub use self::consensus::ConsensusTarget;
pub use self::memory::MemoryTarget;
pub use self::postgres::PostgresTarget;
pub use self::redis::{RedisFlavor, RedisTarget};
pub use self::redlock::RedlockTarget;
pub use self::replication::Replication;

/// A client and the switch that freezes its link.
pub type FreezableClient = (Arc<dyn DistributedLock>, Arc<dyn Freeze>);

/// A scenario needs a fault this deployment cannot inject (external servers, or a backend without
/// the fault). The cell is then reported as not run, with this message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FaultUnavailable(pub String);

/// One backend's clients and faults.
#[async_trait]
pub trait Target: Send + Sync {
    /// A new independent client (its own connection or session).
    async fn client(&self) -> anyhow::Result<Arc<dyn DistributedLock>>;

    /// A new client whose whole link to the service can be frozen: a paused process, or a cut.
    async fn freezable(&self) -> anyhow::Result<FreezableClient>;

    /// Whether the backend promises that tokens grow (so the analysis judges their order).
    fn fencing(&self) -> bool;

    /// How long the service keeps the lock of a holder that stopped talking to it, for a lease of
    /// `ttl`: the TTL, or the session timeout for session-based backends.
    fn abandon_bound(&self, ttl: Duration) -> Duration;

    /// The client of the holder in the server-fault scenarios (8, 9). Redlock's holder reaches
    /// only a bare quorum of masters, so that one master's fault decides; elsewhere an ordinary
    /// client.
    async fn holder_client(&self) -> anyhow::Result<Arc<dyn DistributedLock>> {
        self.client().await
    }

    /// Moves one server's wall clock `ahead` of the true time (the test images' clock shim), so
    /// that it expires keys early (scenario 9); [`restore_clock`](Self::restore_clock) puts it
    /// back.
    async fn jump_clock(&self, ahead: std::time::Duration) -> anyhow::Result<()> {
        let _ = ahead;
        Err(FaultUnavailable("this target has no server clock to move".into()).into())
    }

    /// Puts back the clock [`jump_clock`](Self::jump_clock) moved.
    async fn restore_clock(&self) -> anyhow::Result<()> {
        Ok(())
    }

    /// Restarts the server so that it loses every key (scenario 8).
    async fn restart_without_data(&self) -> anyhow::Result<()> {
        Err(FaultUnavailable("this target cannot restart its server".into()).into())
    }

    /// A client connected only to the member [`isolate`](Self::isolate) cuts off, and a client of
    /// the others (scenario 7).
    async fn partition_clients(
        &self,
    ) -> anyhow::Result<(Arc<dyn DistributedLock>, Arc<dyn DistributedLock>)> {
        Err(FaultUnavailable("this target has no members to partition".into()).into())
    }

    /// Cuts the first member off the network.
    async fn isolate(&self) -> anyhow::Result<()> {
        Err(FaultUnavailable("this target has no members to partition".into()).into())
    }

    /// Reconnects the isolated member and waits until the service is whole again.
    async fn rejoin(&self) -> anyhow::Result<()> {
        Ok(())
    }

    /// A primary with an asynchronous replica to fail over to (scenario 10).
    fn replication(&self) -> anyhow::Result<&dyn Replication> {
        Err(FaultUnavailable("this target has no asynchronous replica".into()).into())
    }
}

/// Maps a fixture's "faults need containers" error to [`FaultUnavailable`].
pub(crate) fn fault_error(e: dlock_testkit::fixtures::FixtureError) -> anyhow::Error {
    match e {
        dlock_testkit::fixtures::FixtureError::FaultInjectionUnavailable { .. } => {
            FaultUnavailable(e.to_string()).into()
        }
        other => other.into(),
    }
}
