//! A holder that keeps working while its lease says it holds the lock, as a careful service does:
//! before each write it checks the lease, and it stops once the lease is uncertain or lost, or
//! has less validity left than a write may take.

use std::time::Duration;

use dlock_core::Lease;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::run::Run;

/// How often the working holder writes.
const WRITE_EVERY: Duration = Duration::from_millis(20);

/// The validity a write needs left when the lease is checked before it: the check and the write
/// are not one instant, and on a busy machine the task may be scheduled late in between (a
/// check just before the deadline made a write just after it, with nobody else holding yet).
const WRITE_MARGIN: Duration = WRITE_EVERY;

/// Starts writing under `lease` as `client`; the task ends when the lease stops being held (the
/// time it noticed) or when `stop` fires, and hands the lease back.
pub fn start(
    run: &Run,
    client: usize,
    lease: Lease,
) -> (JoinHandle<(Lease, Option<Instant>)>, oneshot::Sender<()>) {
    let (stop, mut stopped) = oneshot::channel();
    let run = run.clone();
    let task = tokio::spawn(async move {
        let mut valid_until = lease.valid_until();
        loop {
            let left = lease
                .valid_until()
                .saturating_duration_since(Instant::now());
            if !lease.is_held() || left < WRITE_MARGIN {
                return (lease, Some(Instant::now()));
            }
            if lease.valid_until() > valid_until {
                valid_until = lease.valid_until();
                run.history
                    .extended(client, &run.key, lease.fencing_token(), valid_until);
            }
            let read = run.read();
            run.write(client, lease.fencing_token(), read);
            tokio::select! {
                _ = &mut stopped => return (lease, None),
                _ = tokio::time::sleep(WRITE_EVERY) => {}
            }
        }
    });
    (task, stop)
}
