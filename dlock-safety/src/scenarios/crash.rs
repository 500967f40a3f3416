//! Scenario 5: the holder dies while others wait.

use tokio::time::Instant;

use super::{ms, Outcome};
use crate::run::Run;
use crate::targets::Target;

/// The holder's link freezes for good (to the service, a killed process looks the same: no
/// release, no renewal, no keep-alive); a waiting client must get the lock within the backend's
/// bound for abandoned locks. A late hand-over counts as unavailable.
pub async fn run(target: &dyn Target, run: &Run) -> anyhow::Result<Outcome> {
    let (holder, freeze) = target.freezable().await?;
    let next = target.client().await?;
    let opts = run.plan.opts(run.plan.slack).with_auto_renew();
    let lease = run.hold(&holder, &opts).await?;
    freeze.freeze();
    let crashed_at = Instant::now();
    let bound = target.abandon_bound(run.plan.ttl);
    let wait = bound + run.plan.slack;
    let successor = run.acquire_retrying(1, &next, &run.plan.opts(wait)).await;
    let recovery = crashed_at.elapsed();
    let handed_on = run.hand_on(successor).await;
    // The dead holder's lease goes with its frozen link; nothing it sends arrives.
    drop(lease);
    Ok(Outcome {
        handed_on,
        recovery: handed_on.then_some(recovery),
        bound: Some(bound),
        note: if handed_on {
            format!("next holder after {} (bound {})", ms(recovery), ms(bound))
        } else {
            format!("no hand-over within {}", ms(wait))
        },
        ..Outcome::default()
    })
}
