//! A three-member etcd cluster: dlock beside the floor of its bare requests (a create-if-absent
//! transaction and a delete) and beside etcd's own lock service as the peer (etcd-client's
//! `lock`/`unlock`, with a lease per client), all on member 0; dlock's election beside etcd's own
//! election service (etcd-client's `campaign`/`resign`, a lease per client).

use std::sync::Arc;

use async_trait::async_trait;
use dlock_core::DistributedLock;
use dlock_etcd::EtcdLock;
use dlock_testkit::registry::Backend;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::{cluster, freeze_target, Setup};
use crate::locker::{self, Connect, Held, Kind, Locker, Recipe, Release, Side};
use crate::server::EtcdMessages;

/// The peer's lease: long enough for any run, so no keep-alive is needed.
const PEER_LEASE_SECS: i64 = 900;

async fn connect(endpoint: &str) -> anyhow::Result<Arc<dyn DistributedLock>> {
    let lock = EtcdLock::builder()
        .with_endpoints([endpoint.to_owned()])
        .with_prefix("dlock-bench/")
        .connect()
        .await?;
    Ok(Arc::new(lock))
}

pub async fn start(backend: &'static Backend) -> anyhow::Result<Setup> {
    let (deployment, endpoint) = cluster(backend).await?;
    let locks = connect(&endpoint).await?;
    let raw = etcd_client::Client::connect([endpoint.clone()], None).await?;
    let freeze = freeze_target(deployment.leader().await, deployment.members());
    let client = locker::client(endpoint.clone(), |endpoint| async move {
        connect(&endpoint).await
    });
    let peer_endpoint = endpoint.clone();
    let connect_peer: Connect = Arc::new(move || {
        let endpoint = peer_endpoint.clone();
        Box::pin(async move { Ok(Arc::new(Peer::connect(&endpoint).await?) as Arc<dyn Locker>) })
    });
    let peer_endpoint = endpoint.clone();
    let connect_election_peer: Connect = Arc::new(move || {
        let endpoint = peer_endpoint.clone();
        Box::pin(async move {
            Ok(Arc::new(ElectionPeer(Peer::connect(&endpoint).await?)) as Arc<dyn Locker>)
        })
    });
    let sides = vec![
        Side::dlock("dlock EtcdLock", &locks, &client),
        Side::floor(
            "floor: txn (create if absent) + delete",
            Arc::new(Floor { raw }),
        ),
        Side {
            kind: Kind::Peer,
            label: "etcd-client lock/unlock".into(),
            locker: Arc::new(Peer::connect(&endpoint).await?),
            connect: Some(connect_peer),
        },
        Side {
            kind: Kind::PrimitivePeer(Recipe::Election),
            label: "etcd-client campaign/resign".into(),
            locker: Arc::new(ElectionPeer(Peer::connect(&endpoint).await?)),
            connect: Some(connect_election_peer),
        },
    ];
    Ok(Setup {
        servers: "3-member etcd cluster".into(),
        sides,
        locks,
        client,
        wire_batch: None,
        renewal_note: "one etcd lease per client, kept alive by the client: no request per lease",
        server_count: Ok(Arc::new(EtcdMessages {
            endpoint: endpoint.clone(),
        })),
        max_clients: None,
        fresh_floor: None,
        freeze,
        deployment,
    })
}

/// The requests a lock cycle cannot avoid: take the key if nobody has it, delete it.
struct Floor {
    raw: etcd_client::Client,
}

struct FloorHeld {
    raw: etcd_client::Client,
    key: String,
}

#[async_trait]
impl Locker for Floor {
    async fn acquire(&self, key: &str) -> anyhow::Result<Held> {
        let key = format!("floor-bench/{key}");
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.as_str(), "floor", None)]);
        let answer = self.raw.clone().txn(txn).await?;
        anyhow::ensure!(answer.succeeded(), "the floor's key {key} was free");
        Ok(Box::new(FloorHeld {
            raw: self.raw.clone(),
            key,
        }))
    }
}

#[async_trait]
impl Release for FloorHeld {
    async fn release(mut self: Box<Self>) -> anyhow::Result<()> {
        self.raw.delete(self.key.as_str(), None).await?;
        Ok(())
    }
}

/// etcd's server-side lock service, as etcd-client exposes it: the lock is held under a lease.
struct Peer {
    client: etcd_client::Client,
    lease: i64,
}

impl Peer {
    async fn connect(endpoint: &str) -> anyhow::Result<Peer> {
        let mut client = etcd_client::Client::connect([endpoint], None).await?;
        let lease = client.lease_grant(PEER_LEASE_SECS, None).await?.id();
        Ok(Peer { client, lease })
    }
}

struct PeerHeld {
    client: etcd_client::Client,
    key: Vec<u8>,
}

#[async_trait]
impl Locker for Peer {
    async fn acquire(&self, key: &str) -> anyhow::Result<Held> {
        let mut client = self.client.clone();
        let options = etcd_client::LockOptions::new().with_lease(self.lease);
        let locked = client
            .lock(format!("peer-bench/{key}"), Some(options))
            .await?;
        Ok(Box::new(PeerHeld {
            client,
            key: locked.key().to_vec(),
        }))
    }
}

#[async_trait]
impl Release for PeerHeld {
    async fn release(mut self: Box<Self>) -> anyhow::Result<()> {
        self.client.unlock(self.key).await?;
        Ok(())
    }
}

/// etcd's server-side election service, as etcd-client exposes it: a campaign under the client's
/// lease that returns once it leads, and a resignation.
struct ElectionPeer(Peer);

struct Leading {
    client: etcd_client::Client,
    leader: etcd_client::LeaderKey,
}

#[async_trait]
impl Locker for ElectionPeer {
    async fn acquire(&self, key: &str) -> anyhow::Result<Held> {
        let mut client = self.0.client.clone();
        let mut won = client
            .campaign(format!("peer-election/{key}"), "bench", self.0.lease)
            .await?;
        let leader = won
            .take_leader()
            .ok_or_else(|| anyhow::anyhow!("a campaign on {key} returned no leader key"))?;
        Ok(Box::new(Leading { client, leader }))
    }
}

#[async_trait]
impl Release for Leading {
    async fn release(mut self: Box<Self>) -> anyhow::Result<()> {
        let options = etcd_client::ResignOptions::new().with_leader(self.leader);
        self.client.resign(Some(options)).await?;
        Ok(())
    }
}
