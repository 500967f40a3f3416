//! Scenario 3: the holder's write travels slowly and lands after its TTL, behind the next
//! holder's write.

use super::Outcome;
use crate::run::Run;
use crate::targets::Target;

/// The holder reads and sends its write, which is held up; its lease runs out (no renewal), the
/// next holder reads, writes and releases; then the held-up write arrives.
pub async fn run(target: &dyn Target, run: &Run) -> anyhow::Result<Outcome> {
    let holder = target.client().await?;
    let next = target.client().await?;
    let lease = run.hold(&holder, &run.plan.opts(run.plan.slack)).await?;
    let token = lease.fencing_token();
    let read = run.read();
    let wait = run.plan.ttl + target.abandon_bound(run.plan.ttl) + run.plan.slack;
    let successor = run.acquire(1, &next, &run.plan.opts(wait)).await;
    let handed_on = run.hand_on(successor).await;
    // The delayed write arrives now.
    run.write(0, token, read);
    drop(lease);
    Ok(Outcome {
        handed_on,
        ..Outcome::default()
    })
}
