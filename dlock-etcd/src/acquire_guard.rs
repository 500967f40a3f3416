//! An acquire in progress: the key's local turn, and what to undo if the acquire never completes.
//!
//! An acquire can end without a lock in many ways: busy, a deadline, an error, the caller dropping
//! the future half-way. Once a request that may create our contender key has been sent, every one
//! of those endings must delete that key again (if it exists and still carries this acquire's
//! value, its owner record with its owner token), or it would stand in the queue until the session ends. [`AcquireGuard`] does that in the
//! background when dropped, and passes the local turn on at once: the next local task that finds
//! such a key in its way deletes it itself (see `contention::remove_leftover`), so it never waits
//! for a clean-up that cannot reach the server.
//!
//! A request of a dropped acquire may still reach the server after its withdrawal, so the
//! withdrawal is repeated once after a grace period. (Deleting "if the value is this acquire's" is
//! harmless to repeat.)

use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::LockKey;
use tokio::sync::OwnedMutexGuard;

use crate::contention::{delete_by_value, delete_on_lease, delete_own, Owner};
use crate::local_queue::LocalQueue;
use crate::requests::{RequestError, Requests};

/// How often a withdrawal is tried before the key is left to the session's expiry.
const WITHDRAW_ATTEMPTS: u32 = 3;

/// How long after the first withdrawal the second one follows, in request timeouts: longer than
/// any request of the dropped acquire can take to be answered.
const GRACE_TIMEOUTS: u32 = 2;

/// How an unfinished acquire's key is told from any other.
enum Withdrawal {
    /// A lock's key, deleted only while it carries this acquire's value (the owner record with
    /// its owner token), whether or not its creation was confirmed.
    ByValue(String),
    /// A key only this acquire writes, whose creation the server has not confirmed: a write of
    /// it may still be on its way, so the deletion is repeated after a grace period.
    Unconfirmed { lease: i64 },
    /// A key only this acquire writes, created at `revision` (no write of it is in flight).
    Created { revision: i64, lease: i64 },
}

/// What an unfinished acquire may have written.
pub(crate) struct Written {
    requests: Requests,
    prefix: Vec<u8>,
    key: Vec<u8>,
    how: Withdrawal,
    /// For a key that later acquires of this client write too (an election candidate's, named
    /// after the session): the turn they take, which a background withdrawal of an unconfirmed
    /// key takes around each deletion. While it is taken, a live acquire of this client owns
    /// the key (it clears a leftover itself, and its key is never a late write of ours), so the
    /// deletion is skipped.
    shared: Option<(Arc<LocalQueue>, LockKey)>,
}

impl Written {
    /// A key of `prefix` that only this acquire writes (a primitive's), not yet confirmed; with
    /// `shared`, one that this client's later acquires take turns to write.
    pub(crate) fn own_key(
        requests: &Requests,
        prefix: &[u8],
        key: &[u8],
        lease: i64,
        shared: Option<(Arc<LocalQueue>, LockKey)>,
    ) -> Self {
        Written {
            requests: requests.clone(),
            prefix: prefix.to_vec(),
            key: key.to_vec(),
            how: Withdrawal::Unconfirmed { lease },
            shared,
        }
    }

    /// The server confirmed the key's creation at `revision`.
    pub(crate) fn created(&mut self, revision: i64) {
        if let Withdrawal::Unconfirmed { lease } = self.how {
            self.how = Withdrawal::Created { revision, lease };
        }
    }

    /// Whether a write of the key may still be on its way to the server.
    pub(crate) fn in_flight(&self) -> bool {
        !matches!(self.how, Withdrawal::Created { .. })
    }

    /// One deletion of the key, if it is still this acquire's.
    pub(crate) async fn delete(&self) -> Result<Owner, RequestError> {
        let (requests, prefix, key) = (&self.requests, &self.prefix, &self.key);
        match &self.how {
            Withdrawal::ByValue(value) => delete_by_value(requests, prefix, key, value).await,
            Withdrawal::Unconfirmed { lease } => {
                delete_on_lease(requests, prefix, key, *lease).await
            }
            Withdrawal::Created { revision, lease } => {
                delete_own(requests, prefix, key, *revision, *lease).await
            }
        }
    }

    /// Deletes the key if it is still this acquire's; a few attempts, then gives up (the key then
    /// goes with its session lease, or with the next local contender for the same lock).
    async fn withdraw_once(&self) {
        for attempt in 0..WITHDRAW_ATTEMPTS {
            // The turn is taken around the deletion only, never across the pause before the
            // next attempt: a live acquire that finds it taken waits for this one request.
            let turn = match &self.shared {
                Some((queue, key)) if self.in_flight() => match queue.try_withdrawal_turn(key) {
                    Some(turn) => Some(turn),
                    None => return,
                },
                _ => None,
            };
            let deleted = self.delete().await;
            drop(turn);
            match deleted {
                Ok(_) => return,
                Err(error) => {
                    tracing::debug!(%error, attempt, "withdrawing an abandoned contender key failed");
                    tokio::time::sleep(Duration::from_millis(100) * (attempt + 1)).await;
                }
            }
        }
    }

    /// Withdraws in the background: once now and, while a write may still be on its way, once
    /// more after a grace period.
    pub(crate) async fn withdraw(self) {
        self.withdraw_once().await;
        if self.in_flight() {
            tokio::time::sleep(self.requests.timeout() * GRACE_TIMEOUTS).await;
            self.withdraw_once().await;
        }
    }
}

/// A key's local turn, held by one acquire, which withdraws what the acquire may have written
/// unless it ends with the lock.
pub(crate) struct AcquireGuard {
    local_queue: Arc<LocalQueue>,
    key: LockKey,
    guard: Option<OwnedMutexGuard<()>>,
    written: Option<Written>,
}

impl AcquireGuard {
    pub(crate) fn new(
        local_queue: Arc<LocalQueue>,
        key: LockKey,
        guard: OwnedMutexGuard<()>,
    ) -> Self {
        AcquireGuard {
            local_queue,
            key,
            guard: Some(guard),
            written: None,
        }
    }

    /// To be called before sending a request that may create `key` with value `value`.
    pub(crate) fn may_write(
        &mut self,
        requests: &Requests,
        prefix: &[u8],
        key: &[u8],
        value: &str,
    ) {
        self.written = Some(Written {
            requests: requests.clone(),
            prefix: prefix.to_vec(),
            key: key.to_vec(),
            how: Withdrawal::ByValue(value.to_owned()),
            shared: None,
        });
    }

    /// The server answered that nothing was written.
    pub(crate) fn nothing_written(&mut self) {
        self.written = None;
    }

    /// Deletes what the acquire may have written before a wait that ran out returns, as the
    /// `lock` contract asks, within dlock-core's withdrawal bound; past it the drop finishes in
    /// the background. (No request of the acquire is in flight then, so once is enough.)
    pub(crate) async fn withdraw(&mut self) {
        let Some(w) = &self.written else {
            return;
        };
        if dlock_core::backend::withdraw(&self.key, w.delete()).await {
            self.written = None;
        }
    }

    /// The acquire succeeded: the turn goes to the held lock's record.
    pub(crate) fn into_guard(mut self) -> Option<OwnedMutexGuard<()>> {
        self.written = None;
        self.guard.take()
    }
}

impl Drop for AcquireGuard {
    fn drop(&mut self) {
        let Some(guard) = self.guard.take() else {
            return;
        };
        if let Some(written) = self.written.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(written.withdraw());
            }
        }
        drop(guard);
        self.local_queue.tidy(&self.key);
    }
}
