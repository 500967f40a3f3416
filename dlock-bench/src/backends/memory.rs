//! The in-process backend beside `tokio::sync::Mutex`.

use std::sync::Arc;

use dlock_core::{DistributedLock, InMemoryLock};

use dlock_testkit::registry::Deployment;

use super::Setup;
use crate::locker::{Dlock, Kind, Side, TokioMutexes};

pub async fn start() -> anyhow::Result<Setup> {
    let locks: Arc<dyn DistributedLock> = Arc::new(InMemoryLock::new());
    let sides = vec![
        // In-process contenders share the one table, as tasks of one process would.
        Side::shared(
            Kind::Dlock,
            "dlock InMemoryLock",
            Arc::new(Dlock::new(locks.clone())),
        ),
        Side::shared(
            Kind::Peer,
            "tokio::sync::Mutex",
            Arc::new(TokioMutexes::default()),
        ),
    ];
    Ok(Setup {
        servers: "none (in process)".into(),
        sides,
        locks,
        client: Arc::new(|| {
            Box::pin(async { Ok(Arc::new(InMemoryLock::new()) as Arc<dyn DistributedLock>) })
        }),
        wire_batch: None,
        renewal_note: "in process: a renewal is a table update, batched or not",
        server_count: Err("in process: no server".into()),
        max_clients: None,
        fresh_floor: None,
        freeze: Err("no server".into()),
        deployment: Deployment::InProcess,
    })
}
