//! The in-process backend beside `tokio::sync::Mutex`.

use std::sync::Arc;

use dlock_core::{DistributedLock, InMemoryLock};

use super::{Fixture, Setup};
use crate::locker::{Dlock, Kind, Locker, Side, TokioMutexes};

pub async fn start() -> anyhow::Result<Setup> {
    let locks: Arc<dyn DistributedLock> = Arc::new(InMemoryLock::new());
    let dlock: Arc<dyn Locker> = Arc::new(Dlock::new(locks.clone()));
    let peer: Arc<dyn Locker> = Arc::new(TokioMutexes::default());
    let sides = vec![
        Side {
            kind: Kind::Dlock,
            label: "dlock InMemoryLock".into(),
            locker: dlock.clone(),
            // In-process contenders share the one table, as tasks of one process would.
            connect: Some(Arc::new(move || {
                let dlock = dlock.clone();
                Box::pin(async move { Ok(dlock) })
            })),
        },
        Side {
            kind: Kind::Peer,
            label: "tokio::sync::Mutex".into(),
            locker: peer.clone(),
            connect: Some(Arc::new(move || {
                let peer = peer.clone();
                Box::pin(async move { Ok(peer) })
            })),
        },
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
        freeze: Err("no server".into()),
        fixture: Fixture::None,
    })
}
