//! Waiting for a busy lock: woken by the release, with polling as the safety net.
//!
//! 1. One attempt. Free: granted after one round trip, with no subscription (the uncontended case
//!    costs exactly one script call).
//! 2. Busy: register for the lock's release notifications and wait until the subscription is
//!    confirmed (bounded by the request timeout; skipped while the subscriber connection is down).
//! 3. Loop: arm the wake-up, attempt, and if still busy sleep until the release notification, the
//!    caller's jittered backoff, or the holder's remaining TTL (plus a little jitter, so waiters of
//!    an expired lock do not all come at once), whichever is first; never past the deadline.
//!
//! Every attempt that may be followed by a wait is made after the subscription is confirmed and
//! after the wake-up is armed, so a release between a "busy" answer and the wait wakes the waiter:
//! no lost wake-up. A release that is not announced (an expiry, a foreign client, a message lost
//! while the subscriber reconnects) costs at most one backoff step or the holder's remaining TTL.

use std::time::Duration;

use dlock_core::{Backoff, Grant, LockRequest, Outcome, Result, Waiting};
use tokio::time::Instant;

use crate::lock::RedisLock;
use crate::protocol::keys;
use crate::protocol::scripts::AcquireReply;

/// How long after the holder's TTL ends a waiter comes back: 1 ms plus up to 2 ms of jitter.
fn past_expiry() -> Duration {
    Duration::from_micros(1_000 + rand::random_range(0..2_000u64))
}

impl RedisLock {
    /// [`DistributedLock::lock`](dlock_core::DistributedLock::lock) for Redis; see the module docs.
    ///
    /// # Cancel safety
    /// Not cancel safe on its own: an attempt may have reached the server. Core releases by owner
    /// token when an acquire is dropped.
    pub(crate) async fn wait_for_lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        let mut waiting = Waiting::new(req.key, deadline, retry);
        let lock = self.layout().lock_key(req.key);
        let fence = keys::fence_key(&lock);
        let owner = req.owner.to_hex();
        // One record for the whole wait: `since` is when the lock was requested.
        let record = self.owner().record().to_json();
        let sent = Instant::now();
        if let AcquireReply::Granted(token) = self
            .attempt(&lock, &fence, &owner, &record, req.ttl)
            .await?
        {
            return Ok(Grant::new(token, sent));
        }
        waiting.check()?;
        let mut attempts: u32 = 1;
        let waited = async {
            let registration = self.wakeups().register(&self.release_channel(&lock));
            let ready_by = waiting.bound(Instant::now() + self.request_timeout());
            self.wakeups().subscribed(&registration, ready_by).await;
            loop {
                let notified = registration.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let sent = Instant::now();
                attempts = attempts.saturating_add(1);
                let retry_after = match self
                    .attempt(&lock, &fence, &owner, &record, req.ttl)
                    .await?
                {
                    AcquireReply::Granted(token) => return Ok(Grant::new(token, sent)),
                    AcquireReply::Busy { pttl } => pttl,
                };
                let now = waiting.check()?;
                let until = waiting.next_attempt(now, retry_after.map(|left| left + past_expiry()));
                tokio::select! {
                    _ = &mut notified => {}
                    _ = tokio::time::sleep_until(until) => {}
                }
            }
        }
        .await;
        // The wait's own detail, inside the caller's `dlock.acquire` span when it traces.
        tracing::debug!(
            attempts,
            outcome = waited.outcome(),
            "redis: waited for the lock"
        );
        waited
    }
}
