//! The backends under test, one entry each: how to start (or reach) its servers, its dlock client,
//! its floor and its peers, and what can be frozen. Adding a backend is adding an entry.

mod etcd;
mod memory;
mod redis;
mod redlock;
mod zk;

use std::sync::Arc;

use dlock_core::DistributedLock;
use dlock_testkit::fixtures::{EtcdCluster, Member, RedisMasters, RedisServer, ZkEnsemble};
use futures::future::BoxFuture;

use crate::locker::{Client, Side};

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
    pub fixture: Fixture,
}

/// The servers a setup started, removed at the end.
pub enum Fixture {
    None,
    Redis(RedisServer),
    Redlock(RedisMasters),
    Zk(ZkEnsemble),
    Etcd(EtcdCluster),
}

impl Fixture {
    pub async fn shutdown(self) -> anyhow::Result<()> {
        match self {
            Fixture::None => {}
            Fixture::Redis(server) => server.shutdown().await?,
            Fixture::Redlock(masters) => masters.shutdown().await?,
            Fixture::Zk(ensemble) => ensemble.shutdown().await?,
            Fixture::Etcd(cluster) => cluster.shutdown().await?,
        }
        Ok(())
    }
}

/// One backend of the run.
pub struct Entry {
    /// The name used in flags, progress and the report.
    pub name: &'static str,
    /// Whether its servers come from Docker (no `DLOCK_TEST_*_URL` given).
    pub needs_docker: fn() -> bool,
    pub start: fn() -> BoxFuture<'static, anyhow::Result<Setup>>,
}

/// Every backend, in report order.
pub const ENTRIES: &[Entry] = &[
    Entry {
        name: "memory",
        needs_docker: || false,
        start: || Box::pin(memory::start()),
    },
    Entry {
        name: "redis",
        needs_docker: RedisServer::needs_docker,
        start: || Box::pin(redis::start()),
    },
    Entry {
        name: "redlock",
        needs_docker: RedisMasters::needs_docker,
        start: || Box::pin(redlock::start()),
    },
    Entry {
        name: "zk",
        needs_docker: ZkEnsemble::needs_docker,
        start: || Box::pin(zk::start()),
    },
    Entry {
        name: "etcd",
        needs_docker: EtcdCluster::needs_docker,
        start: || Box::pin(etcd::start()),
    },
];

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
