//! The backends under test: every dlock backend of the test kit's registry, each with the
//! benchmark's own setup beside it (its floor and its peers, what can be frozen). A registry
//! backend without a module here is measured on its own, through its URL ([`dlock_only`]).

mod dlock_only;
mod etcd;
mod memory;
mod postgres;
mod redis;
mod redlock;
mod zk;

use std::sync::Arc;

use dlock_core::DistributedLock;
use dlock_testkit::fixtures::Member;
use dlock_testkit::registry::{Backend, Deployment};
use futures::future::BoxFuture;

use crate::locker::{Client, Kind, Locker, Side};
use crate::server::ServerCount;

/// A backend ready to measure.
pub struct Setup {
    /// What runs where, for the report.
    pub servers: String,
    /// dlock first, then the floor and the peers.
    pub sides: Vec<Side>,
    /// The shared dlock client.
    pub locks: Arc<dyn DistributedLock>,
    /// New dlock clients, for the memory workload.
    pub client: Client,
    /// Leases per request when the backend batches renewals on the wire.
    pub wire_batch: Option<usize>,
    /// How renewal works for this backend, for the report.
    pub renewal_note: &'static str,
    /// A member to freeze, and what it is; `None` says why not.
    pub freeze: Result<(Member, String), String>,
    /// Counts the requests the servers process; `Err` says why there is none.
    pub server_count: Result<Arc<dyn ServerCount>, String>,
    /// The floor of a cycle on a fresh key, where it differs from the floor on a used key (and
    /// what it is).
    pub fresh_floor: Option<(String, Arc<dyn Locker>)>,
    /// How many clients of their own the hot key's tasks may have at most on these servers, and
    /// why; `None` when the servers set no limit the plan reaches.
    pub max_clients: Option<(usize, &'static str)>,
    /// The servers the setup started, removed at the end.
    pub deployment: Deployment,
}

/// Starts `backend`'s servers and its sides, with dlock inside its layers second and dlock's
/// primitives after the lock's sides.
pub async fn start(backend: &'static Backend) -> anyhow::Result<Setup> {
    let starting: BoxFuture<'static, anyhow::Result<Setup>> = match backend.name {
        "memory" => Box::pin(memory::start()),
        "redis" => Box::pin(redis::start(backend)),
        "redlock" => Box::pin(redlock::start(backend)),
        "zk" => Box::pin(zk::start(backend)),
        "etcd" => Box::pin(etcd::start(backend)),
        "postgres" => Box::pin(postgres::start(backend)),
        _ => Box::pin(dlock_only::start(backend)),
    };
    let mut setup = starting.await?;
    setup.servers = format!("{}, {}", setup.servers, setup.deployment.whereabouts());
    setup.sides.insert(1, Side::layered(&setup.locks));
    // After the lock's sides, before any peer recipe a backend added for a primitive.
    let at = setup
        .sides
        .iter()
        .position(|s| matches!(s.kind, Kind::PrimitivePeer(_)))
        .unwrap_or(setup.sides.len());
    let primitives = Side::primitives(&setup.locks, &setup.client);
    setup.sides.splice(at..at, primitives);
    Ok(setup)
}

/// Starts a three-member cluster of `backend` and names member 0's endpoint, which every client
/// of the run talks to, so that dlock, the floor and the peer pay the same hops.
async fn cluster(backend: &Backend) -> anyhow::Result<(Deployment, String)> {
    let deployment = backend.fixture.start(3).await?;
    let endpoint = deployment
        .network_endpoints()
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("{}: a deployment without members", backend.title))?;
    Ok((deployment, endpoint))
}

/// The member to freeze in a cluster with this leader and these members (see
/// [`follower_to_freeze`]), or why there is none.
fn freeze_target(
    leader: dlock_testkit::fixtures::Result<usize>,
    members: dlock_testkit::fixtures::Result<&[Member]>,
) -> Result<(Member, String), String> {
    let (Ok(leader), Ok(members)) = (leader, members) else {
        return Err("external servers".into());
    };
    match follower_to_freeze(leader, members.len()) {
        Some(i) => Ok((
            members[i].clone(),
            format!("follower {i} of {}", members.len()),
        )),
        None => Err("no follower to freeze".into()),
    }
}

/// Which member of a three-member cluster to freeze: a follower other than member 0, which every
/// client of the run talks to, so that the figure is the cost of a missing vote, not of a failover.
fn follower_to_freeze(leader: usize, size: usize) -> Option<usize> {
    (1..size).find(|&i| i != leader)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frozen_member_is_a_follower_the_clients_do_not_use() {
        assert_eq!(follower_to_freeze(0, 3), Some(1));
        assert_eq!(follower_to_freeze(1, 3), Some(2));
        assert_eq!(follower_to_freeze(2, 3), Some(1));
        assert_eq!(follower_to_freeze(0, 1), None);
    }
}
