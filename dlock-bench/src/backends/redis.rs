//! One Redis server: dlock beside the floor of two bare script round trips, and beside the
//! barest lock the server can give (`SET NX PX`, then a compare-and-delete script).

use std::sync::Arc;

use async_trait::async_trait;
use dlock_core::DistributedLock;
use dlock_redis::RedisConnection;
use dlock_redis::{RedisLock, EXTEND_BATCH};
use dlock_testkit::registry::Backend;

use super::Setup;
use crate::locker::{self, Held, Kind, Locker, Release, Side};
use crate::server::{RedisCommands, ServerCount};

pub async fn start(backend: &'static Backend) -> anyhow::Result<Setup> {
    let deployment = backend.fixture.start(1).await?;
    let url = backend.url(&deployment.network_endpoints().await?, "");
    let redis = RedisLock::connect(&url).await?;
    let locks: Arc<dyn DistributedLock> = Arc::new(redis.clone());
    let floor = Arc::new(Floor {
        con: redis.connection(),
        script: redis::Script::new("return 1"),
    });
    let server_count = RedisCommands::connect(std::slice::from_ref(&url))
        .await
        .map(|c| Arc::new(c) as Arc<dyn ServerCount>)
        .map_err(|e| format!("INFO stats: {e}"));
    let client = locker::client(url, |url| async move {
        Ok(Arc::new(RedisLock::connect(&url).await?) as Arc<dyn DistributedLock>)
    });
    let bare = Arc::new(BareLock {
        con: redis.connection(),
        release: redis::Script::new(COMPARE_AND_DELETE),
    });
    let sides = vec![
        Side::dlock("dlock RedisLock", &locks, &client),
        Side::floor("floor: 2 × EVALSHA `return 1`", floor),
        Side {
            kind: Kind::Peer,
            label: "bare lock: SET NX PX + compare-and-delete".into(),
            locker: bare,
            connect: None,
        },
    ];
    Ok(Setup {
        servers: "1 Redis server".into(),
        sides,
        locks,
        client,
        wire_batch: Some(EXTEND_BATCH),
        renewal_note: "a TTL per key; batched: one script re-arms up to 500 leases",
        server_count,
        max_clients: None,
        fresh_floor: None,
        freeze: Err("a single server: frozen means unavailable".into()),
        deployment,
    })
}

/// The round trips a Redis lock cycle cannot avoid: one script to take, one to give back.
struct Floor {
    con: RedisConnection,
    script: redis::Script,
}

struct FloorHeld {
    con: RedisConnection,
    script: redis::Script,
}

#[async_trait]
impl Locker for Floor {
    async fn acquire(&self, _key: &str) -> anyhow::Result<Held> {
        let mut con = self.con.clone();
        let _: i64 = self.script.invoke_async(&mut con).await?;
        Ok(Box::new(FloorHeld {
            con,
            script: self.script.clone(),
        }))
    }
}

#[async_trait]
impl Release for FloorHeld {
    async fn release(mut self: Box<Self>) -> anyhow::Result<()> {
        let _: i64 = self.script.invoke_async(&mut self.con).await?;
        Ok(())
    }
}

/// Deletes `KEYS[1]` if it holds `ARGV[1]`: the release of [`BareLock`].
const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// The barest lock one Redis server can give: `SET key token NX PX` to take it and a
/// compare-and-delete script to give it back, with no fencing counter, owner record or queue of
/// waiters. Beside dlock it shows what those cost the server, and beside the floor what any lock
/// that checks its owner on release costs. It does not wait, so it has no hot key.
struct BareLock {
    con: RedisConnection,
    release: redis::Script,
}

struct BareHeld {
    con: RedisConnection,
    release: redis::Script,
    key: String,
    token: String,
}

#[async_trait]
impl Locker for BareLock {
    async fn acquire(&self, key: &str) -> anyhow::Result<Held> {
        let mut con = self.con.clone();
        let key = format!("bare-bench/{key}");
        let token = format!("{:032x}", rand::random::<u128>());
        let set: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut con)
            .await?;
        anyhow::ensure!(set.is_some(), "the bare lock {key} is held");
        Ok(Box::new(BareHeld {
            con,
            release: self.release.clone(),
            key,
            token,
        }))
    }
}

#[async_trait]
impl Release for BareHeld {
    async fn release(mut self: Box<Self>) -> anyhow::Result<()> {
        let _: i64 = self
            .release
            .key(&self.key)
            .arg(&self.token)
            .invoke_async(&mut self.con)
            .await?;
        Ok(())
    }
}
