//! Scenario 8: the server restarts without persistence while the lock is held.

use dlock_core::LockOptions;

use super::{ms, take_over, Outcome};
use crate::run::Run;
use crate::targets::Target;

/// The holder takes a long lease (no renewal, so nothing tells it the server forgot); the server
/// restarts empty; another client takes the lock at once and writes; the holder, whose lease is
/// still valid on its clock, writes too.
pub async fn run(target: &dyn Target, run: &Run) -> anyhow::Result<Outcome> {
    let holder = target.holder_client().await?;
    let next = target.client().await?;
    // Long enough to outlive the restart.
    let long = run.plan.long_ttl();
    // A master restarted a moment ago may not vote yet (Redlock's delayed restart): wait it out.
    let opts = LockOptions::new(long).with_wait(long + run.plan.slack);
    let Some(lease) = run.acquire_retrying(0, &holder, &opts).await else {
        anyhow::bail!("the holder could not take the free lock");
    };
    let read = run.read();
    let started = tokio::time::Instant::now();
    target.restart_without_data().await?;
    let restart = started.elapsed();
    let wait = run.ttls(1.0) + run.plan.slack;
    let successor = run
        .acquire_retrying(1, &next, &LockOptions::new(long).with_wait(wait))
        .await;
    let outcome = take_over::both_write(run, lease, read, successor).await;
    Ok(Outcome {
        note: format!("restart took {}; {}", ms(restart), outcome.note),
        ..outcome
    })
}
