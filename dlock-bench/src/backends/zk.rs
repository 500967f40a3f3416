//! A three-member ZooKeeper ensemble: dlock beside the floor of its recipe's bare requests
//! (create an ephemeral sequential node, list its parent, delete it), all on member 0.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::DistributedLock;
use dlock_testkit::registry::Backend;
use dlock_zk::ZkLock;
use zookeeper_client as zk;

use super::{cluster, freeze_target, Setup};
use crate::locker::{self, Held, Locker, Release, Side};
use crate::server::ZkPackets;

const SESSION: Duration = Duration::from_secs(10);
/// Where the floor's nodes live, away from the locks.
const FLOOR_ROOT: &str = "/dlock-bench-floor";

async fn connect(url: &str) -> anyhow::Result<Arc<dyn DistributedLock>> {
    let lock = ZkLock::builder(url)
        .with_session_timeout(SESSION)
        .connect()
        .await?;
    Ok(Arc::new(lock))
}

pub async fn start(backend: &'static Backend) -> anyhow::Result<Setup> {
    let (deployment, endpoint) = cluster(backend).await?;
    let url = backend.url(std::slice::from_ref(&endpoint), "");
    let locks = connect(&url).await?;
    let raw = zk::Client::connector()
        .with_session_timeout(SESSION)
        .connect(&endpoint)
        .await?;
    create_if_absent(&raw, FLOOR_ROOT).await?;
    let freeze = freeze_target(deployment.leader().await, deployment.members());
    let client = locker::client(url, |url| async move { connect(&url).await });
    let sides = vec![
        Side::dlock("dlock ZkLock", &locks, &client),
        Side::floor(
            "floor: create + list + delete",
            Arc::new(Floor { raw: raw.clone() }),
        ),
    ];
    let fresh_floor: Arc<dyn Locker> = Arc::new(FreshFloor { raw });
    Ok(Setup {
        servers: "3-member ZooKeeper ensemble".into(),
        sides,
        locks,
        client,
        wire_batch: None,
        renewal_note:
            "one session per client, kept alive by the client library: no request per lease",
        server_count: Ok(Arc::new(ZkPackets {
            endpoint: endpoint.clone(),
        })),
        max_clients: None,
        fresh_floor: Some((
            "floor: create parent + create + list + delete".into(),
            fresh_floor,
        )),
        freeze,
        deployment,
    })
}

async fn create_if_absent(raw: &zk::Client, path: &str) -> anyhow::Result<()> {
    let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    match raw.create(path, b"", &options).await {
        Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The requests the lock recipe cannot avoid, on a parent per key.
struct Floor {
    raw: zk::Client,
}

/// The requests a cycle on a key nobody has used cannot avoid: create the key's parent (a
/// container, as dlock's), then the floor's create, list and delete.
struct FreshFloor {
    raw: zk::Client,
}

struct FloorHeld {
    raw: zk::Client,
    node: String,
}

#[async_trait]
impl Locker for Floor {
    async fn acquire(&self, key: &str) -> anyhow::Result<Held> {
        let parent = format!("{FLOOR_ROOT}/{}", key.replace('/', "_"));
        let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let prefix = format!("{parent}/{:032x}__lock__", rand::random::<u128>());
        let (_, sequence) = match self.raw.create(&prefix, b"dlock", &options).await {
            Err(zk::Error::NoNode) => {
                create_if_absent(&self.raw, &parent).await?;
                self.raw.create(&prefix, b"dlock", &options).await?
            }
            other => other?,
        };
        let children = self.raw.list_children(&parent).await?;
        anyhow::ensure!(!children.is_empty(), "the node just created is listed");
        Ok(Box::new(FloorHeld {
            raw: self.raw.clone(),
            node: format!("{prefix}{sequence}"),
        }))
    }
}

#[async_trait]
impl Locker for FreshFloor {
    async fn acquire(&self, key: &str) -> anyhow::Result<Held> {
        let parent = format!("{FLOOR_ROOT}/{}", key.replace('/', "_"));
        let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
        self.raw.create(&parent, b"", &container).await?;
        Floor {
            raw: self.raw.clone(),
        }
        .acquire(key)
        .await
    }
}

#[async_trait]
impl Release for FloorHeld {
    async fn release(self: Box<Self>) -> anyhow::Result<()> {
        self.raw.delete(&self.node, None).await?;
        Ok(())
    }
}
