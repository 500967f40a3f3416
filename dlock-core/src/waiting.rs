//! The bookkeeping every waiting acquire shares: the caller's deadline, the backoff between
//! attempts, and the timeout error.
//!
//! The rules are the same for every backend: the deadline is checked *between* attempts, never
//! used to cut the first attempt short (a free lock is taken even with a zero wait), and no wait
//! runs past it. [`DistributedLock::lock`](crate::DistributedLock::lock) uses this, and so do the
//! backends that override it.
//!
//! A wait that runs out must leave nothing on the server (see
//! [`DistributedLock::lock`](crate::DistributedLock::lock)); [`withdraw`] is the one bounded way
//! to take a queue entry back before returning the timeout.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::retry::Backoff;

/// One waiting acquire of one key: when it started, until when it may wait, and how many times it
/// has backed off.
#[derive(Debug, Clone)]
pub struct Waiting<'a> {
    key: &'a LockKey,
    deadline: Option<Instant>,
    retry: &'a Backoff,
    started: Instant,
    waits: u32,
}

impl<'a> Waiting<'a> {
    /// Starts waiting for `key` now, until `deadline` (or forever), backing off by `retry`.
    pub fn new(key: &'a LockKey, deadline: Option<Instant>, retry: &'a Backoff) -> Self {
        Waiting {
            key,
            deadline,
            retry,
            started: Instant::now(),
            waits: 0,
        }
    }

    /// When the wait started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The caller's deadline, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Whether the deadline has passed at `now`.
    pub fn is_over(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }

    /// The error of a wait that reached its deadline.
    pub fn timeout(&self) -> Error {
        Error::Timeout {
            key: self.key.to_string(),
            waited: self.started.elapsed(),
        }
    }

    /// Between attempts: the current time if the caller may still wait, the timeout otherwise.
    pub fn check(&self) -> Result<Instant> {
        let now = Instant::now();
        if self.is_over(now) {
            return Err(self.timeout());
        }
        Ok(now)
    }

    /// `until`, but never past the deadline.
    pub fn bound(&self, until: Instant) -> Instant {
        match self.deadline {
            Some(d) => until.min(d),
            None => until,
        }
    }

    /// When to attempt again after a busy answer or a temporary failure at `now`: after the next
    /// jittered backoff step, or once the holder's lease has run out (`holder_left`, including
    /// any margin) if that is sooner, and never past the deadline.
    pub fn next_attempt(&mut self, now: Instant, holder_left: Option<Duration>) -> Instant {
        let mut delay = self.retry.delay(self.waits);
        self.waits = self.waits.saturating_add(1);
        if let Some(left) = holder_left {
            // Wake when the holder's TTL ends, not a whole backoff later.
            delay = delay.min(left);
        }
        self.bound(now + delay)
    }
}

/// How long a waiting acquire that gives up may spend withdrawing what it left on the server
/// before it returns; past this the withdrawal goes on in the background.
pub const WITHDRAW_BOUND: Duration = Duration::from_secs(1);

/// Runs `withdrawal` — taking back a waiter's queue entry, or whatever an acquire may have taken,
/// of `key` — for at most [`WITHDRAW_BOUND`], and tells whether it finished.
///
/// A waiter that gave up must not stand in the queue until its session ends, and a process that
/// exits right after its wait ran out (the `dlock` command) has no background left to finish the
/// job. So the withdrawal is done before the timeout is returned, but bounded: if it fails or is
/// slow (`false`), the caller leaves it to its background clean-up.
pub async fn withdraw<T, E: fmt::Display>(
    key: &LockKey,
    withdrawal: impl Future<Output = std::result::Result<T, E>>,
) -> bool {
    match tokio::time::timeout(WITHDRAW_BOUND, withdrawal).await {
        Ok(Ok(_)) => true,
        Ok(Err(failure)) => {
            tracing::debug!(key = %key, error = %failure, "withdrawing an unfinished acquire failed; retrying in the background");
            false
        }
        Err(_) => {
            tracing::debug!(key = %key, "withdrawing an unfinished acquire is slow; finishing in the background");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steady() -> Backoff {
        Backoff {
            jitter: 0.0,
            ..Backoff::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn backs_off_and_stops_at_the_deadline() {
        let key = LockKey::new("k").expect("valid key");
        let retry = steady();
        let now = Instant::now();
        let mut waiting = Waiting::new(&key, Some(now + Duration::from_millis(25)), &retry);
        assert_eq!(waiting.check().ok(), Some(now));
        assert_eq!(
            waiting.next_attempt(now, None),
            now + Duration::from_millis(10)
        );
        assert_eq!(
            waiting.next_attempt(now, Some(Duration::from_millis(3))),
            now + Duration::from_millis(3)
        );
        assert_eq!(
            waiting.next_attempt(now, None),
            now + Duration::from_millis(25)
        );
        tokio::time::advance(Duration::from_millis(25)).await;
        assert!(matches!(waiting.check(), Err(Error::Timeout { .. })));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_deadline_it_never_times_out() {
        let key = LockKey::new("k").expect("valid key");
        let retry = steady();
        let mut waiting = Waiting::new(&key, None, &retry);
        tokio::time::advance(Duration::from_secs(3600)).await;
        let now = waiting.check().expect("no deadline");
        assert_eq!(
            waiting.next_attempt(now, None),
            now + Duration::from_millis(10)
        );
    }
}
