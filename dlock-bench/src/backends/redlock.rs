//! Redlock on five independent Redis masters: dlock beside the floor of two rounds of a bare
//! script to every master in parallel, and beside `rslock`, the most used Rust Redlock.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::DistributedLock;
use dlock_redis::EXTEND_BATCH;
use dlock_redlock::RedlockBuilder;
use dlock_testkit::registry::Backend;
use redis::aio::MultiplexedConnection;

use super::Setup;
use crate::locker::{self, Held, Kind, Locker, Release, Side};
use crate::server::{RedisCommands, ServerCount};

const MASTERS: usize = 5;
/// The peer's TTL, as dlock's sides use.
const PEER_TTL: Duration = Duration::from_secs(30);

/// Per-master request bound: the Redlock trials' value for these loaded machines (the default,
/// 50 ms, fails requests when 64 tasks share two cores with five servers).
const NODE_TIMEOUT: Duration = Duration::from_millis(200);

async fn connect(urls: Vec<String>) -> anyhow::Result<Arc<dyn DistributedLock>> {
    let lock = RedlockBuilder::from_urls(urls)
        .with_request_timeout(NODE_TIMEOUT)
        .connect()
        .await?;
    Ok(Arc::new(lock))
}

pub async fn start(backend: &'static Backend) -> anyhow::Result<Setup> {
    let deployment = backend.fixture.start(MASTERS).await?;
    let urls = deployment.network_endpoints().await?;
    let locks = connect(urls.clone()).await?;
    let mut connections = Vec::with_capacity(urls.len());
    for url in &urls {
        connections.push(
            redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?,
        );
    }
    let freeze = match deployment.members().map(|m| m.get(MASTERS - 1)) {
        Ok(Some(member)) => Ok((
            member.clone(),
            format!("master {} of {MASTERS}", MASTERS - 1),
        )),
        Ok(None) | Err(_) => Err("external servers".to_owned()),
    };
    let server_count = RedisCommands::connect(&urls)
        .await
        .map(|c| Arc::new(c) as Arc<dyn ServerCount>)
        .map_err(|e| format!("INFO stats: {e}"));
    let joined = urls.join(" ");
    let client = locker::client(joined, |joined| async move {
        connect(joined.split(' ').map(str::to_owned).collect()).await
    });
    let rslock = rslock::LockManager::new(urls.clone());
    // rslock's cycle on a key nobody used, beside dlock's: a fresh key is what a job lock on a
    // new order or invoice meets.
    let fresh_floor: Arc<dyn Locker> = Arc::new(Peer(rslock.clone()));
    let sides = vec![
        Side::dlock("dlock RedlockLock", &locks, &client),
        Side::floor(
            "floor: 2 rounds of EVALSHA `return 1` to every master",
            Arc::new(Arc::new(Floor {
                connections,
                script: redis::Script::new("return 1"),
            })),
        ),
        Side {
            kind: Kind::Peer,
            label: "rslock".into(),
            locker: Arc::new(Peer(rslock.clone())),
            connect: Some(Arc::new(move || {
                let urls = urls.clone();
                Box::pin(async move {
                    Ok(Arc::new(Peer(rslock::LockManager::new(urls))) as Arc<dyn Locker>)
                })
            })),
        },
    ];
    Ok(Setup {
        servers: format!(
            "Redlock over {MASTERS} independent Redis masters, per-master timeout {NODE_TIMEOUT:?}"
        ),
        sides,
        locks,
        client,
        wire_batch: Some(EXTEND_BATCH),
        renewal_note: "a TTL per key; batched: one script to every master re-arms up to 500 leases (a request is one round to all masters)",
        server_count,
        max_clients: None,
        fresh_floor: Some(("rslock".to_owned(), fresh_floor)),
        freeze,
        deployment,
    })
}

/// The round trips a Redlock cycle cannot avoid: one round to every master to take, one to give
/// back, each waiting for all answers.
struct Floor {
    connections: Vec<MultiplexedConnection>,
    script: redis::Script,
}

impl Floor {
    async fn round(&self) -> anyhow::Result<()> {
        let calls = self.connections.iter().map(|con| {
            let mut con = con.clone();
            let script = &self.script;
            async move { script.invoke_async::<_, i64>(&mut con).await }
        });
        for answer in futures::future::join_all(calls).await {
            answer?;
        }
        Ok(())
    }
}

struct FloorHeld(Arc<Floor>);

#[async_trait]
impl Locker for Arc<Floor> {
    async fn acquire(&self, _key: &str) -> anyhow::Result<Held> {
        self.round().await?;
        Ok(Box::new(FloorHeld(self.clone())))
    }
}

#[async_trait]
impl Release for FloorHeld {
    async fn release(self: Box<Self>) -> anyhow::Result<()> {
        self.0.round().await
    }
}

/// rslock, waiting with its own retries until it holds the lock.
struct Peer(rslock::LockManager);

#[async_trait]
impl Locker for Peer {
    async fn acquire(&self, key: &str) -> anyhow::Result<Held> {
        let lock = self
            .0
            .acquire_no_guard(format!("peer-bench/{key}").as_bytes(), PEER_TTL)
            .await
            .map_err(|e| anyhow::anyhow!("rslock: {e:?}"))?;
        Ok(Box::new(lock))
    }
}

#[async_trait]
impl Release for rslock::Lock {
    async fn release(self: Box<Self>) -> anyhow::Result<()> {
        rslock::Lock::release(*self).await;
        Ok(())
    }
}
