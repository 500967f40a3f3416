//! The in-process backend: real TTLs, fencing tokens, ownership and wake-ups, inside one process.
//!
//! It is the embedded default: it serves unit tests of code that takes a lock, single-process
//! deployments, and the quickstart. It behaves like the network backends (a lease that is not
//! renewed expires; a stale owner cannot release or extend), so code tested against it keeps its
//! semantics when the URL changes to a server.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{
    Attempt, Capabilities, DistributedLock, Extension, FencingGuarantee, Grant, LeaseRef,
    LockRequest, Released,
};
use crate::error::{Error, Result};
use crate::inspect::{Eviction, HeldLock, Holder as HolderView, Holding, Waiter};
use crate::key::LockKey;
use crate::owner::{Owner, OwnerRecord};
use crate::primitive::{Primitive, Primitives};
use crate::retry::Backoff;
use crate::token::{FencingToken, OwnerToken};

/// How many operations pass between sweeps of abandoned, expired entries.
const SWEEP_EVERY: u32 = 1024;

/// Locks that live in this process.
///
/// Clones share the same locks. Fencing tokens come from one counter for all keys, so they are
/// strictly increasing per key (and across keys) for the life of the value.
///
/// Waiters are served first in, first out, as the server backends' queues serve them: a waiting
/// [`lock`](DistributedLock::lock) joins the key's queue, and whatever frees the key (a release,
/// an eviction, the holder's lease running out, the head giving up) grants it at once to the
/// head of the queue and wakes that one task. A task that releases and asks again queues behind
/// the earlier waiters, and a [`try_lock`](DistributedLock::try_lock) is busy while anyone
/// queues. There is no polling loop.
#[derive(Debug, Clone, Default)]
pub struct InMemoryLock {
    table: Arc<Mutex<Table>>,
    /// The semaphores, read-write locks and elections.
    groups: Arc<Mutex<primitives::Groups>>,
    /// Who takes locks through this clone (clones may carry different labels); shared with the
    /// primitives' views, which are made for each primitive a caller names.
    owner: Arc<Owner>,
}

#[derive(Debug, Default)]
struct Table {
    last_token: u64,
    slots: HashMap<LockKey, Slot>,
    ops_since_sweep: u32,
}

/// One key: its holder and its queue.
///
/// Kept true by [`Slot::hand_on`], which every change runs: when the key is free (no live
/// holder), the queue is empty. So "free" and "free with nobody ahead" are the same question.
#[derive(Debug, Default)]
struct Slot {
    holder: Option<Holder>,
    /// The waiters inside [`InMemoryLock::lock`], in arrival order; the head is served next.
    queue: VecDeque<Queued>,
    /// Wakes callers of [`wait_for_release`](DistributedLock::wait_for_release), who poll with
    /// `try_lock` outside the queue (a layer's own waiting loop), when the key falls free with
    /// nobody queued. Created by the first such caller.
    watchers: Option<Arc<Notify>>,
}

/// A waiter in a key's queue.
#[derive(Debug)]
struct Queued {
    owner: OwnerToken,
    /// The lease it asked for, which starts when the key is handed to it.
    ttl: Duration,
    record: OwnerRecord,
    /// Its own wake-up: a hand-off wakes this one task, not every waiter.
    wake: Arc<Notify>,
    /// When its timer fires at the latest, so that a new head whose timer would miss the
    /// holder's expiry is woken to re-arm it.
    wakes_at: Instant,
}

impl Queued {
    fn new(req: &LockRequest<'_>, owner: &Owner, wake: &Arc<Notify>, wakes_at: Instant) -> Self {
        Queued {
            owner: req.owner,
            ttl: req.ttl,
            record: owner.record(),
            wake: wake.clone(),
            wakes_at,
        }
    }
}

impl Slot {
    /// Whether anything still needs the entry: a live holder, a waiter, a watcher.
    fn in_use(&self, now: Instant) -> bool {
        self.holder.as_ref().is_some_and(|h| h.live(now))
            || !self.queue.is_empty()
            || self.watching() > 0
    }

    /// Callers of `wait_for_release` each hold a clone of the wake-up while they wait.
    fn watching(&self) -> usize {
        self.watchers
            .as_ref()
            .map_or(0, |w| Arc::strong_count(w) - 1)
    }

    fn view(&self, holder: &Holder, now: Instant) -> HolderView {
        let queue = self
            .queue
            .iter()
            .map(|q| Waiter::new(Some(q.record.clone())))
            .collect();
        HolderView::new()
            .with_fencing(holder.fencing)
            .with_expiry(holder.expires - now)
            .with_owner(Some(holder.record.clone()))
            .with_queue(queue)
    }

    /// The live holder at `now`, if any.
    fn live_holder(&self, now: Instant) -> Option<&Holder> {
        self.holder.as_ref().filter(|h| h.live(now))
    }

    /// Gives a free key to the head of the queue, at once, with the next fencing token from
    /// `last_token`, and wakes that waiter; with nobody queued, wakes a watcher instead. Does
    /// nothing while a live holder holds. Every path that may free the key ends here, so no
    /// wake-up is lost and nobody can take the key ahead of the queue.
    fn hand_on(&mut self, now: Instant, last_token: &mut u64) {
        if self.live_holder(now).is_some() {
            return;
        }
        let was_held = self.holder.take().is_some();
        let Some(next) = self.queue.pop_front() else {
            if let Some(watchers) = self.watchers.as_ref().filter(|_| was_held) {
                watchers.notify_one();
            }
            return;
        };
        *last_token += 1;
        self.holder = Some(Holder {
            owner: next.owner,
            fencing: FencingToken(*last_token),
            granted: now,
            expires: now + next.ttl,
            record: next.record,
        });
        next.wake.notify_one();
        self.alert_head();
    }

    /// Frees the key (released, evicted) and hands it on.
    fn free(&mut self, now: Instant, last_token: &mut u64) {
        if let Some(holder) = &mut self.holder {
            holder.expires = now;
        }
        self.hand_on(now, last_token);
    }

    /// Takes `owner` out of the queue, if it is there; a new head is told to re-arm its timer.
    fn leave_queue(&mut self, owner: OwnerToken) -> bool {
        let Some(place) = self.queue.iter().position(|q| q.owner == owner) else {
            return false;
        };
        self.queue.remove(place);
        if place == 0 {
            self.alert_head();
        }
        true
    }

    /// The head of the queue must wake at the holder's expiry to take the key over; wakes it
    /// now if its timer is set later (it was not the head, or the holder changed).
    fn alert_head(&self) {
        if let (Some(head), Some(holder)) = (self.queue.front(), &self.holder) {
            if head.wakes_at > holder.expires {
                head.wake.notify_one();
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Holder {
    owner: OwnerToken,
    fencing: FencingToken,
    /// When the lease began (the grant's `sent_at`).
    granted: Instant,
    expires: Instant,
    record: OwnerRecord,
}

impl Holder {
    fn live(&self, now: Instant) -> bool {
        now < self.expires
    }

    fn grant(&self) -> Grant {
        Grant::new(self.fencing, self.granted)
    }
}

impl InMemoryLock {
    /// What the in-process lock declares about itself ([`DistributedLock::capabilities`]):
    /// tokens that only grow, releases that wake waiters in arrival order, every primitive.
    pub const CAPABILITIES: Capabilities = PRIMITIVES_DECLARE.with_fair_queue();

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
            owner: Arc::new(Owner::clone(&self.owner).with_label(label)?),
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

/// What the primitives declare: the lock's declaration but the fair queue, which only the lock
/// has.
const PRIMITIVES_DECLARE: Capabilities = Capabilities::new(FencingGuarantee::Monotonic)
    .with_notifications()
    .with_primitives(Primitives::ALL);

impl Table {
    fn sweep_now_and_then(&mut self, now: Instant) {
        self.ops_since_sweep += 1;
        if self.ops_since_sweep < SWEEP_EVERY {
            return;
        }
        self.ops_since_sweep = 0;
        let Table {
            last_token, slots, ..
        } = self;
        slots.retain(|_, slot| {
            slot.hand_on(now, last_token);
            slot.in_use(now)
        });
    }

    /// The slot of `key`, if it has one, with an expired holder's lease handed on.
    fn settled(&mut self, key: &LockKey, now: Instant) -> Option<(&mut Slot, &mut u64)> {
        let slot = self.slots.get_mut(key)?;
        slot.hand_on(now, &mut self.last_token);
        Some((slot, &mut self.last_token))
    }

    /// One attempt at `now`: a grant if the key is free (which means nobody queues either),
    /// else the key's slot and when its live holder's lease ends.
    fn attempt(
        &mut self,
        req: &LockRequest<'_>,
        owner: &Owner,
        now: Instant,
    ) -> std::result::Result<Grant, (&mut Slot, Instant)> {
        self.sweep_now_and_then(now);
        let Table {
            last_token, slots, ..
        } = self;
        let slot = slots.entry(req.key.clone()).or_default();
        slot.hand_on(now, last_token);
        if let Some(expires) = slot.live_holder(now).map(|h| h.expires) {
            return Err((slot, expires));
        }
        *last_token += 1;
        let holder = Holder {
            owner: req.owner,
            fencing: FencingToken(*last_token),
            granted: now,
            expires: now + req.ttl,
            record: owner.record(),
        };
        let grant = holder.grant();
        slot.holder = Some(holder);
        Ok(grant)
    }

    /// Ends `owner`'s part in `key` — its hold, or its place in the queue — and hands the key on:
    /// what a release, a dropped waiter and a waiter that timed out all do.
    fn leave(&mut self, key: &LockKey, owner: OwnerToken, now: Instant) -> Released {
        let Entry::Occupied(mut entry) = self.slots.entry(key.clone()) else {
            return Released::Expired;
        };
        let slot = entry.get_mut();
        let outcome = match &slot.holder {
            Some(h) if h.owner == owner && h.live(now) => Released::Released,
            Some(h) if h.owner == owner => Released::Expired,
            Some(h) if h.live(now) => Released::TakenOver,
            _ => Released::Expired,
        };
        if slot.holder.as_ref().is_some_and(|h| h.owner == owner) {
            slot.free(now, &mut self.last_token);
        } else {
            slot.leave_queue(owner);
            slot.hand_on(now, &mut self.last_token);
        }
        if !slot.in_use(now) {
            entry.remove();
        }
        outcome
    }
}

/// What a waiter finds when it wakes.
enum Step {
    /// The key was handed to it.
    Granted(Grant),
    /// Its deadline passed first.
    TimedOut,
    /// Still queued: sleep until this, or until woken.
    Waits(Instant),
}

impl Table {
    /// A waiter of `req` wakes at `now`: did the key come to it, is its time up, or how long
    /// does it sleep on. A waiter that finds itself neither holding nor queued was handed the
    /// key and did not wake within its lease, which then passed on: it asks again, at the back.
    fn wake_up(
        &mut self,
        req: &LockRequest<'_>,
        owner: &Owner,
        wake: &Arc<Notify>,
        now: Instant,
        deadline: Option<Instant>,
    ) -> Step {
        let mine = |slot: &Slot| {
            slot.holder
                .as_ref()
                .filter(|h| h.owner == req.owner)
                .map(Holder::grant)
        };
        if let Some(grant) = self.slots.get(req.key).and_then(mine) {
            // Even if its lease ran out since: the caller checks a grant's validity.
            return Step::Granted(grant);
        }
        if let Some(grant) = self.settled(req.key, now).and_then(|(slot, _)| mine(slot)) {
            return Step::Granted(grant);
        }
        if deadline.is_some_and(|d| now >= d) {
            return Step::TimedOut;
        }
        let (slot, expires) = match self.attempt(req, owner, now) {
            Ok(grant) => return Step::Granted(grant),
            Err(busy) => busy,
        };
        let wakes_at = bound(deadline, expires);
        match slot.queue.iter_mut().find(|q| q.owner == req.owner) {
            Some(entry) => entry.wakes_at = wakes_at,
            None => slot
                .queue
                .push_back(Queued::new(req, owner, wake, wakes_at)),
        }
        Step::Waits(wakes_at)
    }
}

/// `until`, but never past the caller's deadline.
fn bound(deadline: Option<Instant>, until: Instant) -> Instant {
    deadline.map_or(until, |d| d.min(until))
}

/// A waiter's part in a key while its `lock` runs: dropped before the grant is returned (the
/// wait timed out, or the future was dropped), it gives up its place in the queue, or the key
/// if it was handed over meanwhile, and hands the key on at once.
struct Turn<'a> {
    locks: &'a InMemoryLock,
    key: &'a LockKey,
    owner: OwnerToken,
    granted: bool,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if !self.granted {
            self.locks
                .table()
                .leave(self.key, self.owner, Instant::now());
        }
    }
}

#[async_trait]
impl DistributedLock for InMemoryLock {
    fn backend_name(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        InMemoryLock::CAPABILITIES
    }

    fn primitive(&self, primitive: &Primitive) -> Result<Arc<dyn DistributedLock>> {
        primitive.validate()?;
        Ok(Arc::new(primitives::View {
            groups: self.groups.clone(),
            owner: self.owner.clone(),
            primitive: primitive.clone(),
            capabilities: PRIMITIVES_DECLARE,
        }))
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        let now = Instant::now();
        Ok(match self.table().attempt(req, &self.owner, now) {
            Ok(grant) => Attempt::Acquired(grant),
            Err((_, expires)) => Attempt::Busy {
                retry_after: Some(expires - now),
            },
        })
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
        Ok(self.table().leave(lease.key, lease.owner, Instant::now()))
    }

    async fn inspect(&self, key: &LockKey) -> Result<Holding> {
        let now = Instant::now();
        let mut table = self.table();
        let Some((slot, _)) = table.settled(key, now) else {
            return Ok(Holding::Free);
        };
        Ok(match slot.live_holder(now) {
            Some(h) => Holding::Held(slot.view(h, now)),
            None => Holding::Free,
        })
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let now = Instant::now();
        let mut table = self.table();
        let Table {
            last_token, slots, ..
        } = &mut *table;
        Ok(slots
            .iter_mut()
            .filter(|(key, _)| key.as_str().starts_with(prefix))
            .filter_map(|(key, slot)| {
                slot.hand_on(now, last_token);
                let holder = slot.live_holder(now)?;
                Some(HeldLock::new(key.as_str(), slot.view(holder, now)))
            })
            .collect())
    }

    async fn evict(&self, key: &LockKey, expected: Option<FencingToken>) -> Result<Eviction> {
        let now = Instant::now();
        let mut table = self.table();
        let Some((slot, last_token)) = table.settled(key, now) else {
            return Ok(Eviction::Free);
        };
        let Some(holder) = slot.live_holder(now) else {
            return Ok(Eviction::Free);
        };
        let view = slot.view(holder, now);
        if expected.is_some_and(|token| token != holder.fencing) {
            return Ok(Eviction::Changed(view));
        }
        // The next grant (to the head of the queue, if any) takes the next value of the one
        // counter: greater than the evicted one.
        slot.free(now, last_token);
        Ok(Eviction::Evicted(view))
    }

    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        let (watchers, wake_at) = {
            let now = Instant::now();
            let mut table = self.table();
            let Some((slot, _)) = table.settled(key, now) else {
                return Ok(());
            };
            let Some(expires) = slot.live_holder(now).map(|h| h.expires) else {
                return Ok(());
            };
            let watchers = slot.watchers.get_or_insert_with(Arc::default).clone();
            (watchers, expires.min(until))
        };
        // A release between reading the table and awaiting leaves a permit in `Notify`, so the
        // wake-up is not lost.
        tokio::select! {
            _ = watchers.notified() => {}
            _ = tokio::time::sleep_until(wake_at) => {}
        }
        Ok(())
    }

    /// Joins the key's queue if it is busy, and sleeps until the key is handed over (by whoever
    /// frees it) or its deadline. No polling: `retry` is not used.
    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        _retry: &Backoff,
    ) -> Result<Grant> {
        let started = Instant::now();
        let wake = Arc::new(Notify::new());
        let mut wakes_at = {
            let mut table = self.table();
            let (slot, expires) = match table.attempt(req, &self.owner, started) {
                Ok(grant) => return Ok(grant),
                Err(busy) => busy,
            };
            // The first attempt is made whatever the deadline; only a wait is cut short.
            if deadline.is_some_and(|d| started >= d) {
                return Err(timeout(req.key, started));
            }
            let wakes_at = bound(deadline, expires);
            slot.queue
                .push_back(Queued::new(req, &self.owner, &wake, wakes_at));
            wakes_at
        };
        let mut turn = Turn {
            locks: self,
            key: req.key,
            owner: req.owner,
            granted: false,
        };
        loop {
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep_until(wakes_at) => {}
            }
            let step = self
                .table()
                .wake_up(req, &self.owner, &wake, Instant::now(), deadline);
            match step {
                Step::Granted(grant) => {
                    turn.granted = true;
                    return Ok(grant);
                }
                // `turn` leaves the queue as it drops, handing the key on if it came meanwhile.
                Step::TimedOut => return Err(timeout(req.key, started)),
                Step::Waits(until) => wakes_at = until,
            }
        }
    }
}

/// The error of a wait on `key` that began at `started` and ran out.
fn timeout(key: &LockKey, started: Instant) -> Error {
    Error::Timeout {
        key: key.to_string(),
        waited: started.elapsed(),
    }
}

mod primitives;
#[cfg(test)]
mod tests;
