//! Scenario 3: the holder's write travels slowly and lands after its TTL, behind the next
//! holder's write.

use dlock_core::LockOptions;

use super::Outcome;
use crate::run::Run;
use crate::targets::Target;

/// The holder reads and sends its write, which is held up; its lease runs out (no renewal), the
/// next holder reads, writes and releases; then the held-up write arrives.
pub async fn run(target: &dyn Target, run: &Run) -> anyhow::Result<Outcome> {
    let holder = target.client().await?;
    let next = target.client().await?;
    let Some(lease) = run
        .acquire(0, &holder, &run.plan.opts(run.plan.slack))
        .await
    else {
        anyhow::bail!("the holder could not take the free lock");
    };
    let token = lease.fencing_token();
    let read = run.read();
    let wait = run.plan.ttl + target.abandon_bound(run.plan.ttl) + run.plan.slack;
    let successor = run
        .acquire(1, &next, &LockOptions::new(run.plan.ttl).with_wait(wait))
        .await;
    let handed_on = successor.is_some();
    if let Some(lease) = successor {
        run.work_and_release(1, lease).await;
    }
    // The delayed write arrives now.
    run.write(0, token, read);
    drop(lease);
    Ok(Outcome {
        handed_on,
        ..Outcome::default()
    })
}
