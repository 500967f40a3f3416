//! What this client holds and waits for, key by key.
//!
//! All locks of a client share its session lease. Tasks of the same client that want the same key
//! queue here first, in FIFO order (a fair `tokio::sync::Mutex` per key, the key's *turn*), and
//! only the task whose turn it is contends on the server: a client's own tasks do not herd the
//! server, and while a task has the turn, any other key of the session under the lock's name
//! was left by an abandoned acquire (see `contention::join`).
//!
//! A held lock is recorded as a [`Held`] entry that keeps the turn until the lock is released or
//! lost.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use dlock_core::backend::LockKey;
use dlock_core::OwnerToken;
use tokio::sync::{watch, OwnedMutexGuard};
use tokio::time::Instant;

use crate::session::Session;
use crate::watchdog::Started;

/// The local time frame of a held lock: when this client deletes its key unless extended. (The
/// lease itself is valid for less — its drift allowance — which dlock-core applies.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LocalExpiry {
    /// The end of the per-acquire TTL: the watchdog deletes the key then.
    pub(crate) delete_at: Instant,
}

/// A lock this client holds.
pub(crate) struct Held {
    /// The owner token of the lease holding it.
    pub(crate) owner: OwnerToken,
    /// The contender key's create revision: the fencing token.
    pub(crate) revision: i64,
    /// The contender key.
    pub(crate) contender: Vec<u8>,
    /// The session the key is attached to.
    pub(crate) session: Arc<Session>,
    /// The lock's expiry, re-armed by extend; the watchdog follows it.
    pub(crate) expiry: watch::Sender<LocalExpiry>,
    /// Set once the watchdog has begun deleting the key at the end of its expiry: from then on
    /// the lock can be neither extended nor released by its owner.
    pub(crate) expiring: bool,
    /// The watchdog, stopped (or never started) when the record goes.
    pub(crate) watchdog: Started,
    /// The key's local turn, kept while the lock is held.
    pub(crate) _turn: OwnedMutexGuard<()>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.watchdog.stop();
    }
}

/// A key's turn taken from a [`LocalQueue`] by a holder that keeps no [`Held`] record there (an
/// election's candidate, or the background withdrawal of an abandoned candidate's key): it
/// passes the turn on and tidies the entry when dropped.
pub(crate) struct Turn {
    queue: Arc<LocalQueue>,
    key: LockKey,
    guard: Option<OwnedMutexGuard<()>>,
    /// Taken by a background withdrawal, which the slot shows while it lasts.
    withdrawal: bool,
}

impl Drop for Turn {
    fn drop(&mut self) {
        {
            // A withdrawal's mark goes with its turn, in one step under the table's lock, so
            // that no `try_turn_or_withdrawal` sees the turn taken and the mark already gone.
            let mut slots = self.withdrawal.then(|| self.queue.slots());
            if let Some(slot) = slots.as_mut().and_then(|s| s.get_mut(&self.key)) {
                slot.withdrawing = false;
            }
            drop(self.guard.take());
        }
        self.queue.tidy(&self.key);
    }
}

/// What [`LocalQueue::try_turn_or_withdrawal`] found.
pub(crate) enum TryTurn {
    /// The turn, taken.
    Taken(Turn),
    /// A live acquire or holder of this client has it.
    Busy,
    /// A background withdrawal has it, for one deletion: worth waiting for.
    Withdrawing,
}

#[derive(Default)]
struct Slot {
    turn: Arc<tokio::sync::Mutex<()>>,
    held: Option<Held>,
    /// Whether the turn is taken by a background withdrawal (see [`Turn`]).
    withdrawing: bool,
}

/// The locks one client holds and the local tasks waiting for each, key by key.
#[derive(Default)]
pub(crate) struct LocalQueue {
    slots: Mutex<HashMap<LockKey, Slot>>,
}

impl LocalQueue {
    fn slots(&self) -> MutexGuard<'_, HashMap<LockKey, Slot>> {
        // Every change below completes before anything can panic; a poisoned table is intact.
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn turn_of(&self, key: &LockKey) -> Arc<tokio::sync::Mutex<()>> {
        self.slots().entry(key.clone()).or_default().turn.clone()
    }

    /// Takes `key`'s turn if no local task has it. If a background withdrawal has it, for one
    /// deletion request, waits for it until `until`: the acquire that finds it so taken would
    /// otherwise answer busy for a lock nobody holds (the key its own failed attempt left).
    pub(crate) async fn try_turn_after_withdrawal(
        &self,
        key: &LockKey,
        until: Instant,
    ) -> Option<OwnedMutexGuard<()>> {
        match self.take(key, false) {
            Ok(guard) => Some(guard),
            Err(true) => self.turn(key, Some(until)).await,
            Err(false) => None,
        }
    }

    /// Waits for `key`'s turn, until `deadline`. `None` when the deadline passed first.
    ///
    /// # Cancel safety
    /// Cancel safe: a task that stops waiting leaves the queue.
    pub(crate) async fn turn(
        &self,
        key: &LockKey,
        deadline: Option<Instant>,
    ) -> Option<OwnedMutexGuard<()>> {
        let turn = self.turn_of(key);
        let waited = match deadline {
            Some(d) => tokio::time::timeout_at(d, turn.lock_owned()).await.ok(),
            None => Some(turn.lock_owned().await),
        };
        if waited.is_none() {
            self.tidy(key);
        }
        waited
    }

    /// [`turn`](Self::turn), as a [`Turn`] that tidies after itself.
    pub(crate) async fn owned_turn(
        self: &Arc<Self>,
        key: &LockKey,
        deadline: Option<Instant>,
    ) -> Option<Turn> {
        let guard = self.turn(key, deadline).await?;
        Some(Turn {
            queue: self.clone(),
            key: key.clone(),
            guard: Some(guard),
            withdrawal: false,
        })
    }

    /// Takes `key`'s turn for a background withdrawal if no local task has it, marking the
    /// slot meanwhile: an acquire that finds the turn so taken waits for the one deletion
    /// rather than answering busy for a lock nobody holds.
    pub(crate) fn try_withdrawal_turn(self: &Arc<Self>, key: &LockKey) -> Option<Turn> {
        self.try_take(key, true).ok()
    }

    /// Takes `key`'s turn if nobody has it; otherwise tells a live local task from a
    /// background withdrawal (both read in one step).
    pub(crate) fn try_turn_or_withdrawal(self: &Arc<Self>, key: &LockKey) -> TryTurn {
        match self.try_take(key, false) {
            Ok(turn) => TryTurn::Taken(turn),
            Err(true) => TryTurn::Withdrawing,
            Err(false) => TryTurn::Busy,
        }
    }

    /// Takes `key`'s turn, for a withdrawal or not, if nobody has it; otherwise whether a
    /// withdrawal has it. The turn and the mark are read and set under the table's lock.
    fn try_take(self: &Arc<Self>, key: &LockKey, withdrawal: bool) -> Result<Turn, bool> {
        let guard = self.take(key, withdrawal)?;
        Ok(Turn {
            queue: self.clone(),
            key: key.clone(),
            guard: Some(guard),
            withdrawal,
        })
    }

    /// [`try_take`](Self::try_take) without the [`Turn`] around the guard, for an acquire that
    /// keeps the guard itself.
    fn take(&self, key: &LockKey, withdrawal: bool) -> Result<OwnedMutexGuard<()>, bool> {
        let taken = {
            let mut slots = self.slots();
            let slot = slots.entry(key.clone()).or_default();
            match slot.turn.clone().try_lock_owned() {
                Ok(guard) => {
                    slot.withdrawing = withdrawal;
                    Ok(guard)
                }
                Err(_) => Err(slot.withdrawing),
            }
        };
        if taken.is_err() {
            self.tidy(key);
        }
        taken
    }

    /// Records `held` as the lock this client holds on `key`.
    pub(crate) fn insert(&self, key: &LockKey, held: Held) {
        let previous = self
            .slots()
            .entry(key.clone())
            .or_default()
            .held
            .replace(held);
        // There is none: the turn is exclusive. Dropped outside the lock if there were.
        drop(previous);
    }

    /// Runs `f` on the lock held on `key`, if any.
    pub(crate) fn with_held<R>(&self, key: &LockKey, f: impl FnOnce(&mut Held) -> R) -> Option<R> {
        self.slots()
            .get_mut(key)
            .and_then(|slot| slot.held.as_mut())
            .map(f)
    }

    /// Removes the record of the lock on `key` if it is still the one with `revision`, and
    /// returns it; dropping it stops its watchdog and passes the turn on.
    pub(crate) fn remove(&self, key: &LockKey, revision: i64) -> Option<Held> {
        let removed = {
            let mut slots = self.slots();
            let slot = slots.get_mut(key)?;
            if slot.held.as_ref().map(|h| h.revision) != Some(revision) {
                return None;
            }
            slot.held.take()
        };
        removed
    }

    /// Removes and drops the record of the lock on `key` if it is still the one with `revision`;
    /// returns whether it was.
    pub(crate) fn discard(&self, key: &LockKey, revision: i64) -> bool {
        let removed = self.remove(key, revision);
        let found = removed.is_some();
        drop(removed);
        self.tidy(key);
        found
    }

    /// Drops the entry of `key` when nobody holds, waits for or uses it any more.
    pub(crate) fn tidy(&self, key: &LockKey) {
        let mut slots = self.slots();
        if let Some(slot) = slots.get(key) {
            if slot.held.is_none() && Arc::strong_count(&slot.turn) == 1 {
                slots.remove(key);
            }
        }
    }

    /// How many keys have an entry (held, waited for, or in use by an acquire).
    pub(crate) fn len(&self) -> usize {
        self.slots().len()
    }

    /// Removes every record (the client is closing); returns them to be dropped by the caller.
    pub(crate) fn clear(&self) -> Vec<Held> {
        self.slots()
            .values_mut()
            .filter_map(|slot| slot.held.take())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(queue: &Arc<LocalQueue>, key: &LockKey) -> &'static str {
        match queue.try_turn_or_withdrawal(key) {
            TryTurn::Taken(_) => "taken",
            TryTurn::Busy => "busy",
            TryTurn::Withdrawing => "withdrawing",
        }
    }

    #[tokio::test]
    async fn a_withdrawal_is_told_from_a_live_turn_and_leaves_no_mark() {
        let queue = Arc::new(LocalQueue::default());
        let key = LockKey::new("election").unwrap();

        let withdrawal = queue.try_withdrawal_turn(&key).unwrap();
        assert_eq!(outcome(&queue, &key), "withdrawing");
        assert!(queue.try_withdrawal_turn(&key).is_none());
        drop(withdrawal);
        assert_eq!(queue.len(), 0, "the entry is tidied with the turn");

        let live = queue.owned_turn(&key, None).await.unwrap();
        assert_eq!(outcome(&queue, &key), "busy");
        assert!(
            queue.try_withdrawal_turn(&key).is_none(),
            "a withdrawal skips a key a live acquire owns"
        );
        drop(live);
        assert_eq!(outcome(&queue, &key), "taken");
        assert_eq!(queue.len(), 0);
    }

    #[tokio::test]
    async fn an_acquire_waiting_for_a_withdrawal_gets_the_turn_when_it_ends() {
        let queue = Arc::new(LocalQueue::default());
        let key = LockKey::new("election").unwrap();
        let withdrawal = queue.try_withdrawal_turn(&key).unwrap();
        let waiter = {
            let (queue, key) = (queue.clone(), key.clone());
            tokio::spawn(async move { queue.owned_turn(&key, None).await.is_some() })
        };
        tokio::task::yield_now().await;
        drop(withdrawal);
        assert!(waiter.await.unwrap());
        assert_eq!(outcome(&queue, &key), "taken");
    }
}
