//! Scenario 2: the holder's process pauses past its lease, then writes as if nothing happened.

use tokio::time::Instant;

use super::{ms, Outcome};
use crate::run::Run;
use crate::targets::Target;

/// The holder freezes (renewals and keep-alives stop) right after reading; another client takes
/// the lock and writes; the holder thaws and writes with the token it had.
pub async fn run(target: &dyn Target, run: &Run) -> anyhow::Result<Outcome> {
    let (holder, freeze) = target.freezable().await?;
    let next = target.client().await?;
    let opts = run.plan.opts(run.plan.slack).with_auto_renew();
    let lease = run.hold(&holder, &opts).await?;
    let token = lease.fencing_token();
    let read = run.read();
    freeze.freeze();
    let paused_at = Instant::now();
    let wait = target.abandon_bound(run.plan.ttl) + run.plan.ttl + run.plan.slack;
    let successor = run.acquire_retrying(1, &next, &run.plan.opts(wait)).await;
    let recovery = paused_at.elapsed();
    let handed_on = run.hand_on(successor).await;
    freeze.thaw();
    // The pause ends: the holder still believes what it believed before it.
    run.write(0, token, read);
    drop(lease);
    Ok(Outcome {
        handed_on,
        note: format!("successor after {}", ms(recovery)),
        ..Outcome::default()
    })
}
