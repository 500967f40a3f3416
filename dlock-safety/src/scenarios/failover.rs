//! Scenario 10: the primary dies before replicating the holder's lock, and its asynchronous
//! replica is promoted.

use dlock_core::LockOptions;

use super::{take_over, Outcome};
use crate::run::Run;
use crate::targets::Target;

/// An earlier holder takes and releases the lock, and the replica catches up (so the fencing
/// counter exists on both). The replica is cut off; the holder takes the lock on the primary; the
/// primary dies; the replica is promoted, and another client takes the lock there — the grant was
/// never replicated — and writes; the holder, whose lease is still valid, writes too.
///
/// A client that waits for replica acknowledgement (`min_replicas`) is refused the grant while
/// the replica is cut off; the holder then never holds, and only the successor works.
pub async fn run(target: &dyn Target, run: &Run) -> anyhow::Result<Outcome> {
    let pair = target.replication()?;
    let outcome = fail_over(pair, run).await;
    let reset = pair.reset().await;
    let outcome = outcome?;
    reset?;
    Ok(outcome)
}

async fn fail_over(pair: &dyn crate::targets::Replication, run: &Run) -> anyhow::Result<Outcome> {
    let primary = pair.primary_client().await?;
    let long = LockOptions::new(run.plan.long_ttl()).with_wait(run.plan.slack);
    let Some(earlier) = run.acquire_retrying(2, &primary, &long).await else {
        anyhow::bail!("the earlier holder could not take the free lock");
    };
    run.work_and_release(2, earlier).await;
    pair.stop_replicating().await?;
    let Some(lease) = run.acquire(0, &primary, &long).await else {
        let promoted = pair.promote_replica().await?;
        let successor = run.acquire_retrying(1, &promoted, &long).await;
        return Ok(Outcome {
            handed_on: run.hand_on(successor).await,
            note: "the holder's grant was refused: no replica acknowledged it".to_owned(),
            ..Outcome::default()
        });
    };
    let read = run.read();
    let promoted = pair.promote_replica().await?;
    let successor = run.acquire_retrying(1, &promoted, &long).await;
    Ok(take_over::both_write(run, lease, read, successor).await)
}
