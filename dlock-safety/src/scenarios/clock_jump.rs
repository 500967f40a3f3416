//! Scenario 9: a server's wall clock jumps ahead past the holder's lease (the Redis server; one
//! of the Redlock holder's bare quorum of masters), so the server drops the key early.

use dlock_core::backend::{LeaseRef, LockKey};
use dlock_core::LockOptions;
use dlock_testkit::clock_watch;

use super::{take_over, Outcome};
use crate::run::Run;
use crate::targets::Target;

/// The holder takes a long lease and renews it once (its clock watch reads the server's clock);
/// the server's clock jumps past the lease, which drops the key; another client asks for the lock
/// and gets it; both write. The holder's next renewal meets the jumped clock: whether its clock
/// watch counted the jump goes into the cell as its warning. The clock is put back however the
/// cell ends.
pub async fn run(target: &dyn Target, run: &Run) -> anyhow::Result<Outcome> {
    let holder = target.holder_client().await?;
    let next = target.client().await?;
    let ttl = run.plan.long_ttl();
    let long = LockOptions::new(ttl).with_wait(run.plan.slack);
    let mut lease = run.hold(&holder, &long).await?;
    lease.extend(ttl).await?;
    let read = run.read();
    let backend = holder.backend_name();
    let warned_before = clock_watch::jumps(backend, "ahead")?;
    target.jump_clock(ttl + run.plan.slack).await?;
    let after = async {
        let successor = run.acquire(1, &next, &long).await;
        let (key, owner, fencing) = (
            LockKey::new(lease.key())?,
            lease.owner(),
            lease.fencing_token(),
        );
        let mut outcome = take_over::both_write(run, lease, read, successor).await;
        let renewal = LeaseRef {
            key: &key,
            owner,
            fencing: Some(fencing),
        };
        // Its answer is "taken over" or "expired"; what counts is the clock it carried.
        let _ = holder.extend(&renewal, ttl).await;
        if clock_watch::jumps(backend, "ahead")? > warned_before {
            outcome.warning = Some("the holder's clock watch saw the jump".to_owned());
            outcome
                .note
                .push_str("; the holder's next renewal warned of the clock jump");
        } else {
            outcome
                .note
                .push_str("; no clock warning at the holder's next renewal");
        }
        anyhow::Ok(outcome)
    };
    let outcome = after.await;
    target.restore_clock().await?;
    outcome
}
