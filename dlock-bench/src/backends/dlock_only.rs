//! A registry backend the benchmark has no floor or peer for: dlock alone, connected through its
//! URL, so that a new backend is measured as soon as it has a registry entry.

use std::sync::Arc;

use dlock_core::DistributedLock;
use dlock_testkit::registry::Backend;

use super::{freeze_target, Setup};
use crate::locker::{self, Side};

/// Members of a cluster or Redlock masters: the smallest deployment that survives losing one.
const MEMBERS: usize = 3;

async fn connect(url: &str) -> anyhow::Result<Arc<dyn DistributedLock>> {
    Ok(dlock::connect(url).await?.backend().clone())
}

pub async fn start(backend: &'static Backend) -> anyhow::Result<Setup> {
    let deployment = backend.fixture.start(MEMBERS).await?;
    let endpoints = deployment.network_endpoints().await?;
    let url = backend.url(&endpoints, "");
    let locks = connect(&url).await?;
    let client = locker::client(url, |url| async move { connect(&url).await });
    let freeze = freeze_target(deployment.leader().await, deployment.members());
    Ok(Setup {
        servers: format!("{}: {} server(s)", backend.title, endpoints.len()),
        sides: vec![Side::dlock(
            &format!("dlock {}", backend.title),
            &locks,
            &client,
        )],
        locks,
        client,
        wire_batch: None,
        renewal_note: "no floor or peer for this backend yet: dlock alone",
        server_count: Err("no server count for this backend yet".into()),
        max_clients: None,
        fresh_floor: None,
        freeze,
        deployment,
    })
}
