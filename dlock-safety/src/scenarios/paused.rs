//! Scenario 2: the holder's process pauses past its lease, then writes as if nothing happened.

use dlock_core::LockOptions;
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
    let Some(lease) = run.acquire(0, &holder, &opts).await else {
        anyhow::bail!("the holder could not take the free lock");
    };
    let token = lease.fencing_token();
    let read = run.read();
    freeze.freeze();
    let paused_at = Instant::now();
    let wait = target.abandon_bound(run.plan.ttl) + run.plan.ttl + run.plan.slack;
    let successor = run
        .acquire_retrying(1, &next, &LockOptions::new(run.plan.ttl).with_wait(wait))
        .await;
    let handed_on = successor.is_some();
    let recovery = paused_at.elapsed();
    if let Some(lease) = successor {
        run.work_and_release(1, lease).await;
    }
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
