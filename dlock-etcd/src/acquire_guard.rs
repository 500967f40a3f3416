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

use dlock_core::LockKey;
use tokio::sync::OwnedMutexGuard;

use crate::contention::delete_by_value;
use crate::local_queue::LocalQueue;
use crate::requests::Requests;

/// How often a withdrawal is tried before the key is left to the session's expiry.
const WITHDRAW_ATTEMPTS: u32 = 3;

/// How long after the first withdrawal the second one follows, in request timeouts: longer than
/// any request of the dropped acquire can take to be answered.
const GRACE_TIMEOUTS: u32 = 2;

/// What an unfinished acquire may have written.
struct Written {
    requests: Requests,
    prefix: Vec<u8>,
    key: Vec<u8>,
    /// The value the acquire writes: its owner record with its owner token.
    value: String,
}

impl Written {
    /// Deletes the key if it carries this acquire's value; a few attempts, then gives up (the key then
    /// goes with its session lease, or with the next local contender for the same lock).
    async fn withdraw_once(&self) {
        for attempt in 0..WITHDRAW_ATTEMPTS {
            match delete_by_value(&self.requests, &self.prefix, &self.key, &self.value).await {
                Ok(_) => return,
                Err(error) => {
                    tracing::debug!(%error, attempt, "withdrawing an abandoned contender key failed");
                    tokio::time::sleep(Duration::from_millis(100) * (attempt + 1)).await;
                }
            }
        }
    }

    async fn withdraw(self) {
        self.withdraw_once().await;
        tokio::time::sleep(self.requests.timeout() * GRACE_TIMEOUTS).await;
        self.withdraw_once().await;
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
            value: value.to_owned(),
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
        let deletion = delete_by_value(&w.requests, &w.prefix, &w.key, &w.value);
        if dlock_core::withdraw(&self.key, deletion).await {
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
