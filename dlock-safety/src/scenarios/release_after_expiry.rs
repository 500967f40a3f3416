//! Scenario 11: a holder whose lease ran out extends and releases after the next holder took the
//! lock; neither may touch the next holder's lock.

use dlock_core::backend::{Extension, LeaseRef, LockKey};
use dlock_core::{DistributedLock, DistributedLockExt, LockOptions};

use super::Outcome;
use crate::run::Run;
use crate::targets::Target;

/// The holder's lease runs out (no renewal); the next holder takes the lock. The stale holder
/// then sends an extend straight to the backend (a renewal that was in flight, past dlock-core's
/// own check) and, if told it succeeded, believes it holds the lock again and writes; then it
/// releases. A third client tries the lock: if the release removed the next holder's lock it gets
/// it, and the next holder's following write is stale.
pub async fn run(target: &dyn Target, run: &Run) -> anyhow::Result<Outcome> {
    let holder = target.client().await?;
    let next = target.client().await?;
    let third = target.client().await?;
    let lease = run.hold(&holder, &run.plan.opts(run.plan.slack)).await?;
    let token = lease.fencing_token();
    let wait = run.plan.ttl + target.abandon_bound(run.plan.ttl) + run.plan.slack;
    let long = LockOptions::new(run.ttls(8.0)).with_wait(wait);
    let successor = run.acquire(1, &next, &long).await;
    let handed_on = successor.is_some();
    let key = LockKey::new(lease.key())?;
    let stale = LeaseRef {
        key: &key,
        owner: lease.owner(),
        fencing: Some(token),
    };
    let extension = holder.extend(&stale, run.plan.ttl).await;
    let mut notes = vec![format!("stale extend: {}", describe(&extension))];
    if matches!(&extension, Ok(answer) if answer.is_extended()) {
        // The holder believes its lease is back; it writes.
        run.history.extended(
            0,
            &run.key,
            token,
            tokio::time::Instant::now() + run.plan.ttl,
        );
        let read = run.read();
        run.write(0, token, read);
    }
    run.history.releasing(0, &run.key, token);
    match holder.release(&stale).await {
        Ok(released) => notes.push(format!("stale release: {released:?}")),
        Err(e) => {
            run.history
                .indeterminate(0, &run.key, format!("release: {e}"));
            notes.push("stale release: error".to_owned());
        }
    }
    drop(lease);
    let intruder = match third
        .try_acquire(&run.key, &run.plan.opts(run.plan.slack))
        .await
    {
        Ok(Some(lease)) => {
            run.record_grant(2, &lease);
            Some(lease)
        }
        Ok(None) => None,
        Err(e) => {
            run.history
                .indeterminate(2, &run.key, format!("try_acquire: {e}"));
            None
        }
    };
    if let Some(lease) = successor {
        run.work_and_release(1, lease).await;
    }
    if let Some(lease) = intruder {
        notes.push("a third client got the lock".to_owned());
        run.work_and_release(2, lease).await;
    }
    Ok(Outcome {
        handed_on,
        note: notes.join("; "),
        ..Outcome::default()
    })
}

fn describe(extension: &dlock_core::Result<Extension>) -> String {
    match extension {
        Ok(e) => format!("{e:?}"),
        Err(e) => format!("error ({e})"),
    }
}
