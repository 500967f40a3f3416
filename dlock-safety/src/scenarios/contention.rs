//! Scenario 1: many clients, many acquisitions, no faults.

use std::time::Duration;

use tokio::time::Instant;

use super::Outcome;
use crate::run::Run;
use crate::targets::Target;

/// Each client takes the lock `rounds` times and does a read-modify-write under it.
pub async fn run(target: &dyn Target, run: &Run) -> anyhow::Result<Outcome> {
    let plan = run.plan;
    let opts =
        dlock_core::LockOptions::new(Duration::from_secs(10)).with_wait(Duration::from_secs(60));
    let mut tasks = Vec::with_capacity(plan.clients);
    let started = Instant::now();
    for client in 0..plan.clients {
        let lock = target.client().await?;
        let run = run.clone();
        let opts = opts.clone();
        tasks.push(tokio::spawn(async move {
            let mut granted = 0usize;
            for _ in 0..plan.rounds {
                // An error (a request that timed out on a loaded machine) is retried, as a
                // service would; it stays in the history as an indeterminate outcome.
                if let Some(lease) = run.acquire_retrying(client, &lock, &opts).await {
                    granted += 1;
                    let read = run.read();
                    // Give a contender the chance to interleave between read and write.
                    tokio::task::yield_now().await;
                    run.write(client, lease.fencing_token(), read);
                    run.release(client, lease).await;
                }
            }
            granted
        }));
    }
    let mut granted = 0;
    for task in tasks {
        granted += task.await?;
    }
    let wanted = plan.clients * plan.rounds;
    let elapsed = started.elapsed();
    Ok(Outcome {
        handed_on: granted == wanted,
        note: format!(
            "{} clients × {} rounds: {granted}/{wanted} granted in {:.1} s",
            plan.clients,
            plan.rounds,
            elapsed.as_secs_f64()
        ),
        ..Outcome::default()
    })
}
