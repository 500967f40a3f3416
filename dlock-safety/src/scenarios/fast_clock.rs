//! Scenario 9: one Redlock master's clock runs fast, so it expires the holder's key early.

use dlock_core::LockOptions;

use super::{take_over, Outcome};
use crate::run::Run;
use crate::targets::Target;

/// The holder takes a long lease on a bare quorum of masters; one of them expires the key early
/// (the emulated fast clock); another client asks for the lock and, with that master and the ones
/// the holder never reached, has a quorum; both write.
pub async fn run(target: &dyn Target, run: &Run) -> anyhow::Result<Outcome> {
    let holder = target.holder_client().await?;
    let next = target.client().await?;
    let long = LockOptions::new(run.plan.long_ttl()).with_wait(run.plan.slack);
    let lease = run.hold(&holder, &long).await?;
    let read = run.read();
    target.expire_early(&run.key).await?;
    let successor = run.acquire(1, &next, &long).await;
    Ok(take_over::both_write(run, lease, read, successor).await)
}
