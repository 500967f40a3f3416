//! The in-process backend: real TTLs, fencing tokens, ownership and wake-ups, inside one process.
//!
//! It is the embedded default: it serves unit tests of code that takes a lock, single-process
//! deployments, and the quickstart. It behaves like the network backends (a lease that is not
//! renewed expires; a stale owner cannot release or extend), so code tested against it keeps its
//! semantics when the URL changes to a server.

use std::collections::hash_map::Entry;
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
use crate::inspect::{Eviction, HeldLock, Holder as HolderView, Holding};
use crate::key::LockKey;
use crate::owner::{Owner, OwnerRecord};
use crate::primitive::{Primitive, Primitives};
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
    /// The semaphores, read-write locks and elections.
    groups: Arc<Mutex<primitives::Groups>>,
    /// Who takes locks through this clone (clones may carry different labels).
    owner: Owner,
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
    /// Created by the first waiter; a slot nobody waited on never allocates one.
    waiters: Option<Arc<Notify>>,
}

impl Slot {
    fn has_waiters(&self) -> bool {
        self.waiting() > 0
    }

    /// Each waiter holds a clone of the wake-up while it waits.
    fn waiting(&self) -> usize {
        self.waiters
            .as_ref()
            .map_or(0, |w| Arc::strong_count(w) - 1)
    }

    fn view(&self, holder: &Holder, now: Instant) -> HolderView {
        HolderView::new()
            .with_fencing(holder.fencing)
            .with_expiry(holder.expires - now)
            .with_owner(Some(holder.record.clone()))
            .with_waiting(self.waiting())
    }

    /// Frees the slot and wakes one waiter.
    fn free(&mut self) {
        self.holder = None;
        if let Some(waiters) = &self.waiters {
            waiters.notify_one();
        }
    }
}

#[derive(Debug, Clone)]
struct Holder {
    owner: OwnerToken,
    fencing: FencingToken,
    expires: Instant,
    record: OwnerRecord,
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

    /// A clone that records `label` as the application label of the locks it takes (see
    /// [`OwnerRecord`]); it shares the locks of `self`.
    pub fn with_owner(&self, label: &str) -> Result<Self> {
        Ok(InMemoryLock {
            table: self.table.clone(),
            groups: self.groups.clone(),
            owner: self.owner.clone().with_label(label)?,
        })
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
            slot.holder.as_ref().is_some_and(|h| h.live(now)) || slot.has_waiters()
        });
    }
}

#[async_trait]
impl DistributedLock for InMemoryLock {
    fn backend_name(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(FencingGuarantee::Monotonic)
            .with_notifications()
            .with_primitives(Primitives::ALL)
    }

    fn primitive(&self, primitive: &Primitive) -> Result<Arc<dyn DistributedLock>> {
        primitive.validate()?;
        Ok(Arc::new(primitives::View {
            groups: self.groups.clone(),
            owner: self.owner.clone(),
            primitive: primitive.clone(),
            capabilities: self.capabilities(),
        }))
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        let now = Instant::now();
        let mut guard = self.table();
        let table = &mut *guard;
        table.sweep_now_and_then(now);
        let slot = table.slots.entry(req.key.clone()).or_default();
        if let Some(holder) = slot.holder.as_ref().filter(|h| h.live(now)) {
            return Ok(Attempt::Busy {
                retry_after: Some(holder.expires - now),
            });
        }
        table.last_token += 1;
        let fencing = FencingToken(table.last_token);
        slot.holder = Some(Holder {
            owner: req.owner,
            fencing,
            expires: now + req.ttl,
            record: self.owner.record(),
        });
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
        let Entry::Occupied(mut slot) = table.slots.entry(lease.key.clone()) else {
            return Ok(Released::Expired);
        };
        let outcome = match &slot.get().holder {
            Some(h) if h.live(now) && h.owner == lease.owner => Released::Released,
            Some(h) if h.live(now) => return Ok(Released::TakenOver),
            _ => Released::Expired,
        };
        // Free the slot and wake one waiter; drop the entry if nobody waits.
        if slot.get().has_waiters() {
            slot.get_mut().free();
        } else {
            slot.remove();
        }
        Ok(outcome)
    }

    async fn inspect(&self, key: &LockKey) -> Result<Holding> {
        let now = Instant::now();
        let table = self.table();
        let Some(slot) = table.slots.get(key) else {
            return Ok(Holding::Free);
        };
        Ok(match &slot.holder {
            Some(h) if h.live(now) => Holding::Held(slot.view(h, now)),
            _ => Holding::Free,
        })
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let now = Instant::now();
        let table = self.table();
        Ok(table
            .slots
            .iter()
            .filter(|(key, _)| key.as_str().starts_with(prefix))
            .filter_map(|(key, slot)| {
                let holder = slot.holder.as_ref().filter(|h| h.live(now))?;
                Some(HeldLock::new(key.as_str(), slot.view(holder, now)))
            })
            .collect())
    }

    async fn evict(&self, key: &LockKey, expected: Option<FencingToken>) -> Result<Eviction> {
        let now = Instant::now();
        let mut table = self.table();
        let Some(slot) = table.slots.get_mut(key) else {
            return Ok(Eviction::Free);
        };
        let Some(holder) = slot.holder.as_ref().filter(|h| h.live(now)) else {
            return Ok(Eviction::Free);
        };
        let view = slot.view(holder, now);
        if expected.is_some_and(|token| token != holder.fencing) {
            return Ok(Eviction::Changed(view));
        }
        // The next grant takes the next value of the one counter: greater than the evicted one.
        slot.free();
        Ok(Eviction::Evicted(view))
    }

    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        let (waiters, wake_at) = {
            let mut table = self.table();
            let Some(slot) = table.slots.get_mut(key) else {
                return Ok(());
            };
            let expires = slot.holder.as_ref().map_or(until, |h| h.expires);
            let waiters = slot.waiters.get_or_insert_with(Arc::default).clone();
            (waiters, expires.min(until))
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

mod primitives;
#[cfg(test)]
mod tests;
