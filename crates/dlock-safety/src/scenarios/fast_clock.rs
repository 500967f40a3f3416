//! Scenario 9: one Redlock master's clock runs fast, so it expires the holder's key early.

use dlock_core::LockOptions;

use super::Outcome;
use crate::run::Run;
use crate::targets::Target;

/// The holder takes a long lease on a bare quorum of masters; one of them expires the key early
/// (the emulated fast clock); another client asks for the lock and, with that master and the ones
/// the holder never reached, has a quorum; both write.
pub async fn run(target: &dyn Target, run: &Run) -> anyhow::Result<Outcome> {
    let holder = target.holder_client().await?;
    let next = target.client().await?;
    let long = LockOptions::new(run.plan.long_ttl()).with_wait(run.plan.slack);
    let Some(lease) = run.acquire(0, &holder, &long).await else {
        anyhow::bail!("the holder could not take the free lock");
    };
    let token = lease.fencing_token();
    let read = run.read();
    target.expire_early(&run.key).await?;
    let successor = run.acquire(1, &next, &long).await;
    let handed_on = successor.is_some();
    let successor_token = successor.as_ref().map(|l| l.fencing_token());
    if let Some(lease) = &successor {
        let read = run.read();
        run.write(1, lease.fencing_token(), read);
    }
    if lease.is_held() {
        run.write(0, token, read);
    }
    run.release(0, lease).await;
    if let Some(lease) = successor {
        run.release(1, lease).await;
    }
    Ok(Outcome {
        handed_on,
        note: format!(
            "tokens {token} then {}",
            successor_token.map_or("none".to_owned(), |t| t.to_string())
        ),
        ..Outcome::default()
    })
}
