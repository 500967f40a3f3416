//! The end the server-fault scenarios (8, 9, 10) share: after the servers forgot the holder's
//! lock, the next client takes it and writes, and the holder, whose lease is still valid on its
//! own clock, writes too.

use dlock_core::Lease;

use super::Outcome;
use crate::run::Run;

/// `successor` (client 1, if it got the lock) writes, then the holder (client 0) writes what it
/// read before the fault if its lease still says held; both release. The outcome says whether
/// the lock was handed on, and its note the two tokens.
pub async fn both_write(run: &Run, holder: Lease, read: u64, successor: Option<Lease>) -> Outcome {
    let token = holder.fencing_token();
    let handed_on = successor.is_some();
    let successor_token = successor.as_ref().map(|l| l.fencing_token());
    if let Some(lease) = &successor {
        let read = run.read();
        run.write(1, lease.fencing_token(), read);
    }
    if holder.is_held() {
        run.write(0, token, read);
    }
    // After a failover the holder's server is gone: its release cannot be answered.
    run.release(0, holder).await;
    if let Some(lease) = successor {
        run.release(1, lease).await;
    }
    let tokens = format!(
        "tokens {token} then {}",
        successor_token.map_or("none".to_owned(), |t| t.to_string())
    );
    Outcome {
        handed_on,
        note: tokens,
        ..Outcome::default()
    }
}
