//! Waiting for a busy lock: the same fair queue on every master, and one wake-up for the next
//! in line.
//!
//! Each master keeps the lock's queue of waiters as a single Redis server does (see
//! `dlock_redis::protocol::scripts::ACQUIRE`); a Redlock waiter enters every master's queue
//! with one arrival score of its own choosing (the client's clock, in microseconds since the Unix
//! epoch, ties broken by owner token), so that all masters order waiters alike and the head of
//! one is the head of all.
//!
//! 1. One attempt on every master, which stands in each master's queue if busy. Free with nobody
//!    queued: granted after one round, with no subscription.
//! 2. Busy: register on every master for the release notifications that name this waiter's owner
//!    token, and wait until the subscriptions are confirmed (bounded by the request timeout). If
//!    some channel was not subscribed before the attempt, attempt once more, since a release in
//!    between was not heard; on a hot lock the registrations are made before the first attempt.
//! 3. Loop: wait until a master names this waiter (a release that leaves the lock free there with
//!    this waiter at the head of its queue), then attempt on every master. Without one, the
//!    waiter comes back by itself: at the holder's expiry (plus a little jitter) when it heads a
//!    quorum of the queues, when the head's entries lapse when it is second in line (the head may
//!    have crashed), after about a third of its entry's lifetime to refresh its entries (the
//!    lifetime is the lease's TTL, so a crashed waiter blocks the queues no longer than that),
//!    and after the caller's backoff while fewer than a quorum of subscriptions are confirmed or
//!    while a holder's release will not be announced (a foreign client's key); never past the
//!    deadline.
//!
//! An attempt waits for every master's answer (each within the per-node timeout). Short of a
//! quorum it gives its grants back but keeps its place in every queue: where it gives a grant
//! back, the same script puts it back in the queue at its score, so the next in line cannot
//! take that master meanwhile and split the masters between them. A waiter
//! whose wait runs out withdraws from every master's queue (a release by its owner token, within
//! [`dlock_core::backend::WITHDRAW_BOUND`], then in the background); a dropped wait is withdrawn by
//! dlock-core the same way. Wake-ups that came before an attempt was sent are dropped (the
//! attempt saw what they announced); those that come after it are kept for the next wait, so none
//! is lost.

use std::time::Duration;

use dlock_core::backend::{Grant, LeaseRef, LockRequest, Outcome, Waiting};
use dlock_core::{Backoff, DistributedLock, Error, Result};
use dlock_redis::Registration;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use tokio::time::Instant;

use crate::client::{micros_now, Names, RedlockLock, Round};

/// How long after the holder's TTL ends the head of the queues comes back: 1 ms plus up to 2 ms
/// of jitter.
fn past_expiry() -> Duration {
    Duration::from_micros(1_000 + rand::random_range(0..2_000u64))
}

/// How often a queued waiter refreshes its entries: a third of their lifetime, so that two
/// refreshes may be late or lost before an entry lapses.
fn refresh_every(entry_lifetime: Duration) -> Duration {
    (entry_lifetime / 3).max(Duration::from_millis(1))
}

impl RedlockLock {
    /// [`DistributedLock::lock`] for Redlock; see the module docs.
    ///
    /// # Cancel safety
    /// Not cancel safe on its own: an attempt may have reached the masters. Core releases by
    /// owner token when an acquire is dropped, which also withdraws the queue entries.
    pub(crate) async fn wait_for_lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        let mut waiting = Waiting::new(req.key, deadline, retry);
        let names = Names::new(&self.inner.settings, req.key, req.owner);
        // The arrival score: now on the client's clock.
        let arrival = Some(micros_now());
        let nodes = &self.inner.nodes;
        let (channel, owner) = (&*names.channel, Some(&*names.owner));
        let early: Vec<Option<Registration>> = nodes
            .iter()
            .map(|node| node.wakeups().register_if_subscribed(channel, owner))
            .collect();
        let mut sent = Instant::now();
        let mut round = match self.attempt(req, &names, arrival).await? {
            Round::Granted(grant) => return Ok(grant),
            busy => busy,
        };
        let mut attempts: u32 = 1;
        let waited = async {
            waiting.check()?;
            let heard = early.iter().all(Option::is_some);
            let registrations: Vec<Registration> = early
                .into_iter()
                .zip(nodes)
                .map(|(early, node)| {
                    early.unwrap_or_else(|| node.wakeups().register(channel, owner))
                })
                .collect();
            let ready_by =
                waiting.bound(Instant::now() + self.inner.settings.untimed_node_timeout());
            let mut subscribed = self.subscribed(&registrations, ready_by).await;
            let mut attempt_now = !heard;
            loop {
                if !attempt_now {
                    let now = waiting.check()?;
                    let mut until = sent + refresh_every(req.ttl);
                    if let Round::Busy {
                        come_back_in, poll, ..
                    } = round
                    {
                        if let Some(left) = come_back_in {
                            until = until.min(now + left + past_expiry());
                        }
                        if poll {
                            // No release announcement to count on.
                            until = until.min(waiting.next_attempt(now, None));
                        }
                    }
                    if !subscribed {
                        // Too few notifications to count on: poll.
                        until = until.min(waiting.next_attempt(now, None));
                    }
                    let mut woken: FuturesUnordered<_> =
                        registrations.iter().map(Registration::notified).collect();
                    tokio::select! {
                        _ = woken.next() => {}
                        _ = tokio::time::sleep_until(waiting.bound(until)) => {}
                    }
                }
                attempt_now = false;
                // What was announced so far, the attempt sees.
                for registration in &registrations {
                    let _ = registration.notified().now_or_never();
                }
                sent = Instant::now();
                attempts = attempts.saturating_add(1);
                round = match self.attempt(req, &names, arrival).await? {
                    Round::Granted(grant) => return Ok(grant),
                    busy => busy,
                };
                if !subscribed {
                    subscribed = self.subscribed(&registrations, Instant::now()).await;
                }
            }
        }
        .await;
        if let Err(Error::Timeout { .. }) = &waited {
            self.withdraw(req).await;
        }
        // The wait's own detail, inside the caller's `dlock.acquire` span when it traces.
        tracing::debug!(
            attempts,
            outcome = waited.outcome(),
            "redlock: waited for the lock"
        );
        waited
    }

    /// Whether a quorum of the masters' subscriptions are confirmed, waiting for them until
    /// `until` at the latest.
    async fn subscribed(&self, registrations: &[Registration], until: Instant) -> bool {
        let confirmations = registrations
            .iter()
            .zip(&self.inner.nodes)
            .map(|(registration, node)| node.wakeups().subscribed(registration, until));
        let confirmed = futures::future::join_all(confirmations).await;
        confirmed.into_iter().filter(|c| *c).count() >= self.inner.settings.quorum
    }

    /// Takes the queue entries of a wait that ran out back (a release by its owner token on
    /// every master), waiting for it within dlock-core's withdrawal bound; past it, it goes on
    /// in the background (a spawned task is not cancelled with its handle).
    async fn withdraw(&self, req: &LockRequest<'_>) {
        let (lock, key, owner) = (self.clone(), req.key.clone(), req.owner);
        let withdrawal = tokio::spawn(async move {
            let lease = LeaseRef {
                key: &key,
                owner,
                fencing: None,
            };
            lock.release(&lease).await.map_err(|e| e.to_string())
        });
        let finished = async { withdrawal.await.map_err(|e| e.to_string())? };
        dlock_core::backend::withdraw(req.key, finished).await;
    }
}
