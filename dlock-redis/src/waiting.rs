//! Waiting for a busy lock: a fair queue on every server, and one wake-up for the next in line.
//!
//! One loop serves a single Redis server and Redlock's masters alike; a single server is a
//! quorum of one. Each server keeps the lock's queue of waiters (see
//! [`scripts::ACQUIRE`](crate::protocol::scripts::ACQUIRE)); a Redlock waiter enters every
//! master's queue with one arrival score of its own, so that all masters order waiters alike.
//!
//! 1. One attempt, which stands in the lock's queues if busy. Free with nobody queued: granted
//!    after one round, with no subscription (the uncontended case costs one script call per
//!    server).
//! 2. Busy: register on every server for the release notifications that name this waiter's
//!    owner token, and wait until the subscriptions are confirmed (bounded by `subscribe_within`;
//!    skipped while a subscriber connection is down). If some channel was not subscribed before
//!    the attempt (the first waiter of this client on the lock), attempt once more, since a
//!    release in between was not heard; on a hot lock the registrations are made before the
//!    first attempt instead.
//! 3. Loop: wait until a server names this waiter (a release whose queue it heads), then attempt.
//!    Without one, a waiter comes back by itself: when the attempt said (the head at the
//!    holder's expiry, the second in line when the head's entry lapses), plus a little jitter;
//!    every waiter after about a third of its entry's lifetime to refresh its entry (the lifetime
//!    is the lease's TTL, so a crashed waiter blocks the queue no longer than that); and after
//!    the caller's backoff while fewer than a quorum of subscriptions are confirmed or while the
//!    holder's release will not be announced (a foreign client's key); never past the deadline,
//!    where it makes one last attempt.
//!
//! Wake-ups that came before an attempt was sent are dropped (the attempt sees what they
//! announced); those that come after it are kept for the next wait, so none is lost. A
//! subscription that lapses while the waiter waits (its connection broke) counts as unconfirmed
//! until the next attempt confirms it again.
//!
//! A waiter whose wait runs out withdraws its queue entries (a release by its owner token, see
//! [`wait_for_lock`]); a dropped wait is withdrawn by dlock-core the same way. A withdrawal that
//! leaves the lock free announces the next head.
//!
//! Commands per acquisition on a hot lock, per server: the attempt that enqueues, the winning
//! attempt and the release — three, whatever the number of waiters — plus one refresh per third
//! of the TTL waited. A release that is not announced (an expiry, a message lost while the
//! subscriber reconnects) costs the head at most the holder's remaining TTL and any waiter at
//! most a third of its entry's lifetime; a foreign client's release costs the head one backoff
//! step.

use std::future::Future;
use std::time::Duration;

use dlock_core::backend::{Grant, LeaseRef, LockRequest, Outcome, Waiting};
use dlock_core::{Backoff, DistributedLock, Error, Result};
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use tokio::time::Instant;

use crate::{Registration, Wakeups};

/// What one attempt of a waiting acquire found.
#[derive(Debug)]
pub enum Round {
    /// Granted (by a quorum of the servers, in time).
    Granted(Grant),
    /// Not granted; the waiter stands in the queues of the servers that answered busy.
    Busy {
        /// When the waiter may be served without being told: the holder's remaining TTL where
        /// it heads the queue, the time until the head's entry lapses where it is second in
        /// line (the head may have crashed); `None` when neither applies.
        come_back_in: Option<Duration>,
        /// The waiter heads the queue but the holder's release will not be announced (a foreign
        /// client's key, or a key without a TTL): poll.
        poll: bool,
    },
}

/// Where a waiter hears releases.
pub struct Listeners<'a> {
    /// Each server's wake-ups, in the order of the servers.
    pub wakeups: &'a [&'a Wakeups],
    /// How many subscriptions must be confirmed for the waiter to count on announcements.
    pub quorum: usize,
    /// How long the first confirmation of the subscriptions may take.
    pub subscribe_within: Duration,
    /// The lock's release channel.
    pub channel: &'a str,
    /// The waiter's owner token, which the release notifications name.
    pub owner: &'a str,
}

impl Listeners<'_> {
    /// Confirms each registration's subscription, waiting for them until `until` at the latest.
    async fn confirm(&self, registrations: &[Registration], until: Instant) -> Vec<bool> {
        let confirmations = registrations
            .iter()
            .zip(self.wakeups)
            .map(|(registration, wakeups)| wakeups.subscribed(registration, until));
        futures::future::join_all(confirmations).await
    }

    /// Whether enough of `confirmed` are to count on announcements.
    fn heard(&self, confirmed: &[bool]) -> bool {
        confirmed.iter().filter(|c| **c).count() >= self.quorum
    }
}

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

/// Waits for the lock `req` names until `deadline`, attempting with `attempt` (see the module
/// docs). A wait that runs out returns [`Error::Timeout`] once its queue entries are withdrawn:
/// a release of `lock` by the waiter's owner token on every server, waited for within
/// [`dlock_core::backend::WITHDRAW_BOUND`] and finished in the background past it.
///
/// # Cancel safety
/// Not cancel safe on its own: an attempt may have reached the servers. Core releases by owner
/// token when an acquire is dropped, which also withdraws the queue entries.
pub async fn wait_for_lock<L, A, F>(
    lock: &L,
    req: &LockRequest<'_>,
    deadline: Option<Instant>,
    retry: &Backoff,
    listeners: &Listeners<'_>,
    mut attempt: A,
) -> Result<Grant>
where
    L: DistributedLock + Clone + 'static,
    A: FnMut() -> F,
    F: Future<Output = Result<Round>>,
{
    let (channel, owner) = (listeners.channel, Some(listeners.owner));
    let servers = listeners.wakeups.len();
    // On a hot lock, registered before the first attempt (see the module docs). On a lock
    // nobody waits for, nothing is registered and nothing allocated before the grant.
    let mut early: Vec<Option<Registration>> = Vec::new();
    for (i, wakeups) in listeners.wakeups.iter().enumerate() {
        if let Some(registration) = wakeups.register_if_subscribed(channel, owner) {
            early.resize_with(servers, || None);
            early[i] = Some(registration);
        }
    }
    let sent = Instant::now();
    let round = match attempt().await? {
        Round::Granted(grant) => return Ok(grant),
        busy => busy,
    };
    let mut attempts: u32 = 1;
    let waited = async {
        let mut waiting = Waiting::new(req.key, deadline, retry);
        waiting.check()?;
        let heard = early.len() == servers && early.iter().all(Option::is_some);
        early.resize_with(servers, || None);
        let registrations: Vec<Registration> = early
            .into_iter()
            .zip(listeners.wakeups)
            .map(|(early, wakeups)| early.unwrap_or_else(|| wakeups.register(channel, owner)))
            .collect();
        let ready_by = waiting.bound(Instant::now() + listeners.subscribe_within);
        let mut confirmed = listeners.confirm(&registrations, ready_by).await;
        let (mut sent, mut round, mut attempt_now) = (sent, round, !heard);
        loop {
            if !attempt_now {
                let now = waiting.check()?;
                let mut until = sent + refresh_every(req.ttl);
                let mut poll = !listeners.heard(&confirmed);
                if let Round::Busy {
                    come_back_in,
                    poll: unannounced,
                } = round
                {
                    if let Some(left) = come_back_in {
                        until = until.min(now + left + past_expiry());
                    }
                    poll |= unannounced;
                }
                if poll {
                    until = until.min(waiting.next_attempt(now, None));
                }
                let mut woken: FuturesUnordered<_> =
                    registrations.iter().map(Registration::notified).collect();
                // Messages may be lost once a confirmed subscription lapses.
                let mut lapsed: FuturesUnordered<_> = (0..registrations.len())
                    .filter(|i| confirmed[*i])
                    .map(|i| {
                        listeners.wakeups[i]
                            .unsubscribed(&registrations[i])
                            .map(move |()| i)
                    })
                    .collect();
                tokio::select! {
                    _ = woken.next() => {}
                    Some(i) = lapsed.next() => {
                        confirmed[i] = false;
                        continue;
                    }
                    // At the deadline too: one last attempt, which may find the holder's
                    // lease just ended.
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
            round = match attempt().await? {
                Round::Granted(grant) => return Ok(grant),
                busy => busy,
            };
            if !listeners.heard(&confirmed) {
                confirmed = listeners.confirm(&registrations, Instant::now()).await;
            }
        }
    }
    .await;
    if let Err(Error::Timeout { .. }) = &waited {
        withdraw(lock, req).await;
    }
    // The wait's own detail, inside the caller's `dlock.acquire` span when it traces.
    tracing::debug!(
        backend = lock.backend_name(),
        attempts,
        outcome = waited.outcome(),
        "waited for the lock"
    );
    waited
}

/// When a primitive's waiter, which polls (it has no queue), attempts again after a busy answer
/// at `now`: after its next backoff step, or 1 ms after the holder's lease ends (`retry_after`)
/// if sooner; a writer that registered its intent also before a third of the intent's lifetime
/// has passed, to renew it.
pub fn next_poll(
    waiting: &mut Waiting,
    now: Instant,
    retry_after: Option<Duration>,
    intent: Option<Duration>,
) -> Instant {
    let holder_left = retry_after.map(|left| left + Duration::from_millis(1));
    let until = waiting.next_attempt(now, holder_left);
    intent.map_or(until, |intent| until.min(now + refresh_every(intent)))
}

/// Takes back what a wait that gave up left on the servers (its queue entries, a writer's
/// intent): a release of `req`'s lock by its owner token on every server, waited for within
/// dlock-core's withdrawal bound; past it, it goes on in the background (a spawned task is not
/// cancelled with its handle).
pub async fn withdraw<L>(lock: &L, req: &LockRequest<'_>)
where
    L: DistributedLock + Clone + 'static,
{
    let (lock, key, owner) = (lock.clone(), req.key.clone(), req.owner);
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
