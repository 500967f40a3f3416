//! The in-process backend: real TTLs, fencing tokens, ownership and wake-ups, inside one process.
//!
//! It is the embedded default: it serves unit tests of code that takes a lock, single-process
//! deployments, and the quickstart. It behaves like the network backends (a lease that is not
//! renewed expires; a stale owner cannot release or extend), so code tested against it keeps its
//! semantics when the URL changes to a server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{
    Attempt, Capabilities, DistributedLock, Extension, FencingGuarantee, Grant, LeaseRef,
    LockRequest, Released,
};
use crate::error::Result;
use crate::key::LockKey;
use crate::token::{FencingToken, OwnerToken};

/// How many operations pass between sweeps of abandoned, expired entries.
const SWEEP_EVERY: u32 = 1024;

/// Locks that live in this process.
///
/// Clones share the same locks. Fencing tokens come from one counter for all keys, so they are
/// strictly increasing per key (and across keys) for the life of the value.
///
/// Waiting is woken by releases (one waiter per release, no herd) and by the holder's expiry
/// time; there is no polling loop.
#[derive(Debug, Clone, Default)]
pub struct InMemoryLock {
    table: Arc<Mutex<Table>>,
}

#[derive(Debug, Default)]
struct Table {
    last_token: u64,
    slots: HashMap<LockKey, Slot>,
    ops_since_sweep: u32,
}

#[derive(Debug, Default)]
struct Slot {
    holder: Option<Holder>,
    waiters: Arc<Notify>,
}

#[derive(Debug, Clone, Copy)]
struct Holder {
    owner: OwnerToken,
    expires: Instant,
}

impl Holder {
    fn live(&self, now: Instant) -> bool {
        now < self.expires
    }
}

impl InMemoryLock {
    /// An empty lock table.
    pub fn new() -> Self {
        InMemoryLock::default()
    }

    /// How many keys have an entry (held, or with waiters, or expired and not yet swept).
    pub fn entries(&self) -> usize {
        self.table().slots.len()
    }

    /// The keys that have an entry, for diagnostics and tests that check what a call left behind.
    pub fn keys(&self) -> Vec<String> {
        self.table().slots.keys().map(|k| k.to_string()).collect()
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // Every mutation below leaves the table consistent before anything can panic.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Table {
    fn sweep_now_and_then(&mut self, now: Instant) {
        self.ops_since_sweep += 1;
        if self.ops_since_sweep < SWEEP_EVERY {
            return;
        }
        self.ops_since_sweep = 0;
        self.slots.retain(|_, slot| {
            slot.holder.is_some_and(|h| h.live(now)) || Arc::strong_count(&slot.waiters) > 1
        });
    }

    /// Frees the slot of `key` and wakes one waiter, dropping the entry if nobody waits.
    fn vacate(&mut self, key: &LockKey) {
        if let Some(slot) = self.slots.get_mut(key) {
            slot.holder = None;
            if Arc::strong_count(&slot.waiters) > 1 {
                slot.waiters.notify_one();
            } else {
                self.slots.remove(key);
            }
        }
    }
}

#[async_trait]
impl DistributedLock for InMemoryLock {
    fn backend_name(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(FencingGuarantee::Monotonic).with_notifications()
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        let now = Instant::now();
        let mut table = self.table();
        table.sweep_now_and_then(now);
        if let Some(holder) = table.slots.get(req.key).and_then(|s| s.holder) {
            if holder.live(now) {
                return Ok(Attempt::Busy {
                    retry_after: Some(holder.expires - now),
                });
            }
        }
        table.last_token += 1;
        let fencing = FencingToken(table.last_token);
        let holder = Holder {
            owner: req.owner,
            expires: now + req.ttl,
        };
        match table.slots.get_mut(req.key) {
            Some(slot) => slot.holder = Some(holder),
            None => {
                table.slots.insert(
                    req.key.clone(),
                    Slot {
                        holder: Some(holder),
                        waiters: Arc::default(),
                    },
                );
            }
        }
        Ok(Attempt::Acquired(Grant::new(fencing, now)))
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        let now = Instant::now();
        let mut table = self.table();
        let Some(slot) = table.slots.get_mut(lease.key) else {
            return Ok(Extension::Expired);
        };
        Ok(match &mut slot.holder {
            Some(h) if h.live(now) && h.owner == lease.owner => {
                h.expires = now + ttl;
                Extension::Extended
            }
            Some(h) if h.live(now) => Extension::TakenOver,
            _ => Extension::Expired,
        })
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        let now = Instant::now();
        let mut table = self.table();
        let outcome = match table.slots.get(lease.key).and_then(|s| s.holder) {
            Some(h) if h.live(now) && h.owner == lease.owner => Released::Released,
            Some(h) if h.live(now) => return Ok(Released::TakenOver),
            Some(_) => Released::Expired,
            None => return Ok(Released::Expired),
        };
        table.vacate(lease.key);
        Ok(outcome)
    }

    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        let (waiters, wake_at) = {
            let table = self.table();
            match table.slots.get(key) {
                None => return Ok(()),
                Some(slot) => {
                    let expires = slot.holder.map_or(until, |h| h.expires);
                    (slot.waiters.clone(), expires.min(until))
                }
            }
        };
        // A release between reading the table and awaiting leaves a permit in `Notify`, so the
        // wake-up is not lost.
        tokio::select! {
            _ = waiters.notified() => {}
            _ = tokio::time::sleep_until(wake_at) => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
