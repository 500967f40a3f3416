//! One PostgreSQL server: dlock beside the floor of its protocol's bare round trips
//! (`pg_try_advisory_lock`, then `pg_advisory_unlock`, each one statement on a plain
//! tokio-postgres connection, as dlock's grant and release are each one statement).
//!
//! The server runs with a larger lock table than the default: session-level advisory locks
//! live in PostgreSQL's shared lock table (`max_locks_per_transaction` × `max_connections`
//! slots, 6,400 by default), and the renewal workload holds up to 100,000 leases in one session.
//! It also accepts more connections than the default 100, for the hot key's clients.

use std::sync::Arc;

use async_trait::async_trait;
use dlock_core::DistributedLock;
use dlock_postgres::{advisory_key, AdvisoryKey};
use dlock_testkit::fixtures::{PostgresOptions, PostgresServer};
use dlock_testkit::registry::{Backend, Deployment};
use tokio_postgres::{NoTls, Statement};

use super::Setup;
use crate::locker::{self, Held, Locker, Release, Side};

/// Connections the server accepts: three times the default, so that one hot-key measurement's
/// clients can connect while the previous one's are still closing.
const MAX_CONNECTIONS: &str = "300";
/// Lock-table slots per connection: 1,024 × the 300 connections, room for the full run's
/// 100,000 leases beside everything else.
const MAX_LOCKS_PER_TRANSACTION: &str = "1024";
/// Hot-key tasks with clients of their own: each waiting dlock client has three connections
/// (its lock session, the one that hears releases, and the seat its waiter waits on), and a
/// measurement's clients close only after it.
const MAX_TASKS: usize = 40;

async fn connect(url: &str) -> anyhow::Result<Arc<dyn DistributedLock>> {
    Ok(dlock::connect(url).await?.backend().clone())
}

pub async fn start(backend: &'static Backend) -> anyhow::Result<Setup> {
    let server = PostgresServer::start_with(
        PostgresOptions::default()
            .with_setting("max_connections", MAX_CONNECTIONS)
            .with_setting("max_locks_per_transaction", MAX_LOCKS_PER_TRANSACTION),
    )
    .await?;
    let deployment = Deployment::PostgresServer(server);
    let server_url = deployment
        .network_endpoints()
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("PostgreSQL: a deployment without a URL"))?;
    let url = backend.url(std::slice::from_ref(&server_url), "");
    let locks = connect(&url).await?;
    let client = locker::client(url, |url| async move { connect(&url).await });
    let floor = Floor::connect(&server_url).await?;
    let sides = vec![
        Side::dlock("dlock PgLock", &locks, &client),
        Side::floor(
            "floor: pg_try_advisory_lock + pg_advisory_unlock",
            Arc::new(floor),
        ),
    ];
    Ok(Setup {
        servers: "one PostgreSQL 15 server".into(),
        sides,
        locks,
        client,
        wire_batch: None,
        renewal_note: "a lock session per 2,000 locks of a client, pinged by the client while it holds locks: no request per lease",
        server_count: Err("not counted: PostgreSQL's statistics views (pg_stat_database) are written by each backend up to seconds after its statements, too late for the short windows of the run".into()),
        max_clients: Some((
            MAX_TASKS,
            "the server accepts 300 connections, each waiting dlock client opens three (its lock session, its listener and its waiter's seat), and one measurement's clients may still be closing while the next one's connect",
        )),
        fresh_floor: None,
        freeze: Err("one server, which every client needs: nothing to freeze beside it".into()),
        deployment,
    })
}

/// The bare round trips, on one plain connection shared by every task (as dlock's one lock
/// session is): statements prepared once, so each call is one round trip.
struct Floor {
    client: Arc<tokio_postgres::Client>,
    lock: Statement,
    unlock: Statement,
}

impl Floor {
    async fn connect(url: &str) -> anyhow::Result<Floor> {
        let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("the floor's PostgreSQL connection ended: {e}");
            }
        });
        let lock = client
            .prepare("SELECT pg_try_advisory_lock($1::bigint)")
            .await?;
        let unlock = client
            .prepare("SELECT pg_advisory_unlock($1::bigint)")
            .await?;
        Ok(Floor {
            client: Arc::new(client),
            lock,
            unlock,
        })
    }
}

/// The floor's key for `key`: a `bigint` of its own namespace, so it never meets dlock's lock
/// of the same name (floors only pay the round trips; they exclude nobody).
fn floor_key(key: &str) -> i64 {
    match advisory_key(&format!("dlock-bench-floor/{key}")) {
        AdvisoryKey::Single(k) => k,
        AdvisoryKey::Pair(high, low) => (i64::from(high) << 32) | i64::from(low as u32),
    }
}

struct FloorHeld {
    client: Arc<tokio_postgres::Client>,
    unlock: Statement,
    key: i64,
}

#[async_trait]
impl Locker for Floor {
    async fn acquire(&self, key: &str) -> anyhow::Result<Held> {
        let key = floor_key(key);
        // Granted or not (tasks on distinct keys always are), the round trip is what counts.
        let _: bool = self.client.query_one(&self.lock, &[&key]).await?.get(0);
        Ok(Box::new(FloorHeld {
            client: self.client.clone(),
            unlock: self.unlock.clone(),
            key,
        }))
    }
}

#[async_trait]
impl Release for FloorHeld {
    async fn release(self: Box<Self>) -> anyhow::Result<()> {
        let _: bool = self
            .client
            .query_one(&self.unlock, &[&self.key])
            .await?
            .get(0);
        Ok(())
    }
}
