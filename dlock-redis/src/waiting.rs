//! Waiting for a busy lock: a fair queue on the server, and one wake-up for the next in line.
//!
//! 1. One attempt, which stands in the lock's queue of waiters if busy (see
//!    [`scripts::ACQUIRE`](crate::protocol::scripts::ACQUIRE)). Free with nobody queued:
//!    granted after one round trip, with no subscription (the uncontended case costs exactly one
//!    script call).
//! 2. Busy: register for the release notifications that name this waiter's owner token, and
//!    wait until the subscription is confirmed (bounded by the request timeout; skipped while the
//!    subscriber connection is down). If the channel was not subscribed before the attempt (the
//!    first waiter of this client on the lock), attempt once more, since a release in between
//!    was not heard; on a hot lock the registration is made before the first attempt instead.
//! 3. Loop: wait until this waiter's notification (a release whose queue it heads), then attempt.
//!    Without one, a waiter comes back by itself: the head of the queue at the holder's expiry
//!    (plus a little jitter), the second in line when the head's entry lapses, every waiter after about a third of its entry's lifetime to
//!    refresh its entry (the lifetime is the lease's TTL, so a crashed waiter blocks the queue no
//!    longer than that), and after the caller's backoff while no subscription is confirmed or
//!    (the head) while a foreign client holds the lock, whose release is not announced; never
//!    past the deadline.
//!
//! A waiter whose wait runs out withdraws its queue entry (a release by its owner token, bounded
//! by [`dlock_core::backend::WITHDRAW_BOUND`], finished in the background past it); a dropped wait is
//! withdrawn by dlock-core the same way. A withdrawal that leaves the lock free announces the
//! next head.
//!
//! Commands per acquisition on a hot lock: the attempt that enqueues, the winning attempt and
//! the release — three, whatever the number of waiters — plus one refresh per third of the TTL
//! waited. A release that is not announced (an expiry, a message lost while the subscriber
//! reconnects) costs the head at most the holder's remaining TTL and any waiter at most a third
//! of its entry's lifetime; a foreign client's release costs the head one backoff step.

use std::time::Duration;

use dlock_core::backend::{Grant, LeaseRef, LockRequest, Outcome, Waiting};
use dlock_core::{Backoff, DistributedLock, Result};
use tokio::time::Instant;

use crate::client::{AttemptNames, RedisLock};
use crate::protocol::scripts::AcquireReply;

/// How long after the holder's TTL ends the head of the queue comes back: 1 ms plus up to 2 ms
/// of jitter.
fn past_expiry() -> Duration {
    Duration::from_micros(1_000 + rand::random_range(0..2_000u64))
}

/// How often a queued waiter refreshes its entry: a third of the entry's lifetime, so that two
/// refreshes may be late or lost before the entry lapses.
fn refresh_every(entry_lifetime: Duration) -> Duration {
    (entry_lifetime / 3).max(Duration::from_millis(1))
}

impl RedisLock {
    /// [`DistributedLock::lock`](dlock_core::DistributedLock::lock) for Redis; see the module docs.
    ///
    /// # Cancel safety
    /// Not cancel safe on its own: an attempt may have reached the server. Core releases by owner
    /// token when an acquire is dropped, which also withdraws the queue entry.
    pub(crate) async fn wait_for_lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        let mut waiting = Waiting::new(req.key, deadline, retry);
        // One record for the whole wait: `since` is when the lock was requested.
        let names = AttemptNames::new(self, req);
        let (channel, owner) = (&names.channel, &names.owner);
        let call = names.call(self, req.ttl, req.ttl);
        let early = self.wakeups().register_if_subscribed(channel, Some(owner));
        let mut sent = Instant::now();
        let mut busy = match self.attempt(call).await? {
            AcquireReply::Granted(token) => return Ok(Grant::new(token, sent)),
            busy @ AcquireReply::Busy { .. } => busy,
        };
        let mut attempts: u32 = 1;
        let waited = async {
            waiting.check()?;
            let heard = early.is_some();
            let registration = match early {
                Some(registration) => registration,
                None => self.wakeups().register(channel, Some(owner)),
            };
            let ready_by = waiting.bound(Instant::now() + self.request_timeout());
            let mut subscribed = self.wakeups().subscribed(&registration, ready_by).await;
            let mut attempt_now = !heard;
            loop {
                if let (
                    false,
                    AcquireReply::Busy {
                        pttl,
                        head,
                        foreign,
                        head_lapses_in,
                    },
                ) = (attempt_now, busy)
                {
                    let now = waiting.check()?;
                    let mut until = sent + refresh_every(req.ttl);
                    // The head at the holder's expiry; the second in line when the head's entry
                    // lapses (if the head crashed, nobody else is woken).
                    if let Some(left) = if head { pttl } else { head_lapses_in } {
                        until = until.min(now + left + past_expiry());
                    }
                    if !subscribed || (head && (foreign || pttl.is_none())) {
                        // No release announcement to count on: poll.
                        until = until.min(waiting.next_attempt(now, None));
                    }
                    tokio::select! {
                        _ = registration.notified() => {}
                        // Messages may be lost from now on: poll until subscribed again.
                        _ = self.wakeups().unsubscribed(&registration), if subscribed => {
                            subscribed = false;
                            continue;
                        }
                        _ = tokio::time::sleep_until(waiting.bound(until)) => {
                            waiting.check()?;
                        }
                    }
                }
                attempt_now = false;
                sent = Instant::now();
                attempts = attempts.saturating_add(1);
                busy = match self.attempt(call).await? {
                    AcquireReply::Granted(token) => return Ok(Grant::new(token, sent)),
                    busy @ AcquireReply::Busy { .. } => busy,
                };
                if !subscribed {
                    subscribed = self
                        .wakeups()
                        .subscribed(&registration, Instant::now())
                        .await;
                }
            }
        }
        .await;
        if let Err(dlock_core::Error::Timeout { .. }) = &waited {
            self.withdraw(req).await;
        }
        // The wait's own detail, inside the caller's `dlock.acquire` span when it traces.
        tracing::debug!(
            attempts,
            outcome = waited.outcome(),
            "redis: waited for the lock"
        );
        waited
    }

    /// Takes the queue entry of a wait that ran out back (a release by its owner token), within
    /// dlock-core's withdrawal bound; past it, in the background.
    async fn withdraw(&self, req: &LockRequest<'_>) {
        let lease = LeaseRef {
            key: req.key,
            owner: req.owner,
            fencing: None,
        };
        if dlock_core::backend::withdraw(req.key, self.release(&lease)).await {
            return;
        }
        let (lock, key, owner) = (self.clone(), req.key.clone(), req.owner);
        tokio::spawn(async move {
            let lease = LeaseRef {
                key: &key,
                owner,
                fencing: None,
            };
            if let Err(error) = lock.release(&lease).await {
                tracing::debug!(%error, "redis: a queue entry could not be withdrawn; it lapses with its TTL");
            }
        });
    }
}
