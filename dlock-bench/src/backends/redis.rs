//! One Redis server: dlock beside the floor of two bare script round trips.

use std::sync::Arc;

use async_trait::async_trait;
use dlock_core::DistributedLock;
use dlock_redis::RedisConnection;
use dlock_redis::{RedisLock, EXTEND_BATCH};
use dlock_testkit::registry::Backend;

use super::Setup;
use crate::locker::{self, Held, Locker, Release, Side};
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
    let sides = vec![
        Side::dlock("dlock RedisLock", &locks, &client),
        Side::floor("floor: 2 × EVALSHA `return 1`", floor),
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
