//! Scenarios 6 and 7: the holder loses the lock service while it keeps working — its own link is
//! cut (6), or the member it talks to is partitioned from the rest of the service (7). Does it
//! learn that it lost the lock, and how long after another client got it?

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::DistributedLock;
use tokio::time::Instant;

use super::{ms, working_holder, Outcome};
use crate::run::Run;
use crate::targets::Target;

/// Scenario 6: the holder's link to the service freezes.
pub async fn run_cut_off(target: &dyn Target, run: &Run) -> anyhow::Result<Outcome> {
    let (holder, freeze) = target.freezable().await?;
    let next = target.client().await?;
    let cut = async {
        freeze.freeze();
        Ok(())
    };
    let outcome = hold_through(target, run, holder, next, cut).await;
    freeze.thaw();
    outcome
}

/// Scenario 7: the holder's member is cut off from its peers and from the holder.
pub async fn run_partition(target: &dyn Target, run: &Run) -> anyhow::Result<Outcome> {
    let (holder, next) = target.partition_clients().await?;
    let outcome = hold_through(target, run, holder, next, target.isolate()).await;
    let healed = target.rejoin().await;
    let outcome = outcome?;
    healed?;
    Ok(outcome)
}

async fn hold_through(
    target: &dyn Target,
    run: &Run,
    holder: Arc<dyn DistributedLock>,
    next: Arc<dyn DistributedLock>,
    cut: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<Outcome> {
    let opts = run.plan.opts(run.plan.slack).with_auto_renew();
    let lease = run.hold(&holder, &opts).await?;
    let (worker, stop) = working_holder::start(run, 0, lease);
    // Let it work (and renew) for a while first.
    tokio::time::sleep(run.ttls(1.5)).await;
    let cut_at = Instant::now();
    cut.await?;
    let bound = target.abandon_bound(run.plan.ttl);
    let wait = bound + run.plan.ttl + run.plan.slack * 2;
    let successor = run.acquire_retrying(1, &next, &run.plan.opts(wait)).await;
    let took_over_at = Instant::now();
    let handed_on = run.hand_on(successor).await;
    // A holder that has not noticed within a second more is stopped; the history shows its writes.
    let mut worker = worker;
    let (lease, noticed_at) = match tokio::time::timeout(Duration::from_secs(1), &mut worker).await
    {
        Ok(joined) => joined?,
        Err(_) => {
            let _ = stop.send(());
            worker.await?
        }
    };
    drop(lease);
    let note = match (noticed_at, handed_on) {
        (Some(at), true) if at <= took_over_at => format!(
            "holder stopped {} before the next holder got the lock ({} after the cut)",
            ms(took_over_at - at),
            ms(took_over_at - cut_at)
        ),
        (Some(at), true) => format!(
            "holder stopped {} after the next holder got the lock",
            ms(at - took_over_at)
        ),
        (Some(at), false) => format!(
            "holder stopped {} after the cut; no hand-over",
            ms(at - cut_at)
        ),
        (None, _) => "holder never noticed".to_owned(),
    };
    Ok(Outcome {
        handed_on,
        recovery: handed_on.then(|| took_over_at - cut_at),
        bound: Some(bound),
        note,
        ..Outcome::default()
    })
}
