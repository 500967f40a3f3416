//! Auto-renew, written once for every backend on top of its ownership-checked extend.
//!
//! One task per renewed lease sleeps until the next renewal, extends, and publishes the outcome on
//! the lease's state channel. Renewal lifecycle bugs are a classic source of double holders
//! (renewal outliving unlock, watchdogs dead after reconnect), so the rules are few and strict:
//! the task is aborted on release and on drop; it never re-creates a lock (extend is ownership
//! checked); a renewal that cannot be confirmed before the deadline leaves the lease lost, never
//! held; and a lost lease is never renewed again.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::backend::{DistributedLock, LeaseRef};
use crate::key::LockKey;
use crate::lease::apply_extension;
use crate::options::{AutoRenew, Drift};
use crate::state::{self, StatusSender};
use crate::token::{FencingToken, OwnerToken};
use crate::Error;

/// Everything the renewal task needs, owned.
pub(crate) struct Renewal {
    pub(crate) backend: Arc<dyn DistributedLock>,
    pub(crate) key: LockKey,
    pub(crate) owner: OwnerToken,
    pub(crate) fencing: FencingToken,
    pub(crate) ttl: Duration,
    pub(crate) drift: Drift,
    pub(crate) acquired_at: Instant,
    pub(crate) config: AutoRenew,
    pub(crate) status: StatusSender,
}

impl Renewal {
    /// Starts the task on the current runtime.
    pub(crate) fn spawn(self) -> JoinHandle<()> {
        tokio::spawn(self.run())
    }

    async fn run(self) {
        let interval = self.config.interval_for(self.ttl);
        let validity = self.drift.validity(self.ttl);
        let stop_at = self.config.max_hold.map(|m| self.acquired_at + m);
        let mut next = self.acquired_at + interval;
        loop {
            tokio::time::sleep_until(next).await;
            let sent = Instant::now();
            if stop_at.is_some_and(|stop| sent >= stop) {
                tracing::debug!(key = %self.key, "maximum hold time reached: renewal stops, the lease runs out");
                return;
            }
            let deadline = self.status.borrow().until();
            if self.status.borrow().at(sent).is_lost() {
                state::record_expiry(&self.status, sent);
                return;
            }
            let lease = LeaseRef {
                key: &self.key,
                owner: self.owner,
                fencing: Some(self.fencing),
            };
            // An answer after the deadline is useless: the lease is lost by then.
            let result = match tokio::time::timeout_at(
                deadline,
                self.backend.as_ref().extend(&lease, self.ttl),
            )
            .await
            {
                Ok(result) => result,
                Err(_) => {
                    state::record_expiry(&self.status, Instant::now());
                    return;
                }
            };
            match apply_extension(&self.status, &self.key, sent, validity, result) {
                Ok(()) => next = sent + interval,
                Err(Error::Lost { .. } | Error::NotOwner { .. }) => return,
                Err(error) => {
                    if self.status.borrow().at(Instant::now()).is_lost() {
                        return;
                    }
                    tracing::warn!(key = %self.key, %error, "renewal failed; the lease is uncertain");
                    // Retry well before the deadline, a few times per interval.
                    next = Instant::now() + (interval / 4).max(Duration::from_millis(1));
                }
            }
        }
    }
}
