//! A small in-process lock with switchable defects, each a classic way to get a lock wrong.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{
    Attempt, Capabilities, ExtendRequest, Extension, FencingGuarantee, Grant, LeaseRef, LockKey,
    LockRequest,
};
use dlock_core::inspect::{Eviction, HeldLock, Holder as HolderView, Holding};
use dlock_core::layer::Layer;
use dlock_core::{
    Backoff, DistributedLock, FencingToken, Owner, OwnerRecord, OwnerToken, Released, Result,
};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The defects. Each must be caught by at least one case of the suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defect {
    /// Release deletes the lock whoever holds it.
    ReleaseWithoutOwnershipCheck,
    /// Locks never expire.
    NoTtl,
    /// The fencing counter is per key and starts again at 1 whenever the key is freed.
    FencingRepeats,
    /// Extend re-arms the lock whoever holds it.
    ExtendIgnoresOwnership,
    /// Acquire checks, yields, then sets: two contenders can both pass the check.
    CheckThenSetNotAtomic,
    /// A waiting acquire starts the validity when its slow reply arrives, not before the request.
    ValidityIgnoresElapsed,
    /// Now and then a busy lock is granted anyway.
    AcquireWhileHeld,
    /// Extend reports success without checking or re-arming anything, so a renewing holder is
    /// never told that its lock is gone.
    LostSignalNeverFires,
    /// A waiting acquire checks its deadline before its first attempt, so a zero wait times out
    /// on a free key.
    DeadlineCutsFirstAttempt,
    /// A waiter that gives up (times out or is dropped) leaves its place in the queue until its
    /// session ends, and the waiters behind it wait for that.
    QueueEntryOutlivesWaiter,
    /// A client keeps a connection on which a request timed out, and so fails every later call
    /// (see `link.rs`; the service itself is correct).
    SilentConnectionKept,
    /// Grants leave no owner record, so nobody can tell who holds a lock.
    OwnerNotRecorded,
    /// A fair queue that takes new waiters at its front: the last to ask is served first.
    QueueOutOfOrder,
    /// A fair queue that a new acquire bypasses when it finds the lock free, so a releaser that
    /// asks again at once takes the lock back ahead of the waiters.
    ReleaserJumpsQueue,
    /// A fair queue whose places never lapse: a waiter that crashed while queued holds the
    /// waiters behind it up for good (the wake-up went to the dead waiter and was lost).
    CrashedWaiterBlocksQueue,
    /// A forced unlock answers "evicted" but leaves the holder in place.
    EvictionKeepsHolder,
    /// A forced unlock winds the fencing counter back, so the next holder gets the evicted
    /// holder's token again and the fence admits the evicted holder's late write.
    EvictionReusesToken,
    /// A key held by one task of a client is granted to another task of the same client, as a
    /// lock that lives in the client's session (a PostgreSQL session-level advisory lock) is
    /// unless the client refuses the second owner itself.
    ReentrantPerClient,
    /// Releases are declared to wake waiters, but wake none: waiters find out by polling.
    ReleaseWakesNobody,
    /// A try that failed on the link leaves its key busy in the client for a while, though the
    /// server holds nothing (see `link.rs`; the service itself is correct).
    FailedAttemptKeepsKeyBusy,
    /// A batch of extensions (what auto-renew sends) extends only its last lease and answers the
    /// others expired, as a client that confirms only one of the sessions its leases live in.
    BatchExtendsOnlyItsLast,
    /// Grants made while another call of the client is out get that call's answer, as a client
    /// that hands the answers of calls sent together to its callers one place off.
    AnswersSwappedWhenOutTogether,
}

impl Defect {
    pub const ALL: [Defect; 22] = [
        Defect::ReleaseWithoutOwnershipCheck,
        Defect::NoTtl,
        Defect::FencingRepeats,
        Defect::ExtendIgnoresOwnership,
        Defect::CheckThenSetNotAtomic,
        Defect::ValidityIgnoresElapsed,
        Defect::AcquireWhileHeld,
        Defect::LostSignalNeverFires,
        Defect::DeadlineCutsFirstAttempt,
        Defect::QueueEntryOutlivesWaiter,
        Defect::SilentConnectionKept,
        Defect::OwnerNotRecorded,
        Defect::QueueOutOfOrder,
        Defect::ReleaserJumpsQueue,
        Defect::CrashedWaiterBlocksQueue,
        Defect::EvictionKeepsHolder,
        Defect::EvictionReusesToken,
        Defect::ReentrantPerClient,
        Defect::ReleaseWakesNobody,
        Defect::FailedAttemptKeepsKeyBusy,
        Defect::BatchExtendsOnlyItsLast,
        Defect::AnswersSwappedWhenOutTogether,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Defect::ReleaseWithoutOwnershipCheck => "release without ownership check",
            Defect::NoTtl => "no TTL",
            Defect::FencingRepeats => "fencing token repeats or goes down",
            Defect::ExtendIgnoresOwnership => "extend ignores ownership",
            Defect::CheckThenSetNotAtomic => "check-then-set not atomic",
            Defect::ValidityIgnoresElapsed => "validity ignores elapsed time",
            Defect::AcquireWhileHeld => "acquire returns while someone holds it",
            Defect::LostSignalNeverFires => "lost signal never fires",
            Defect::DeadlineCutsFirstAttempt => "deadline cuts the first attempt",
            Defect::QueueEntryOutlivesWaiter => "queue entry outlives its waiter",
            Defect::SilentConnectionKept => "a connection that stopped answering is kept",
            Defect::OwnerNotRecorded => "grants leave no owner record",
            Defect::QueueOutOfOrder => "waiters are served out of arrival order",
            Defect::ReleaserJumpsQueue => "a releaser that asks again jumps the queue",
            Defect::CrashedWaiterBlocksQueue => "a crashed queued waiter blocks the queue",
            Defect::EvictionKeepsHolder => "a forced unlock keeps the holder",
            Defect::EvictionReusesToken => "a forced unlock reuses the evicted token",
            Defect::ReentrantPerClient => "a client grants its held key to its other tasks",
            Defect::ReleaseWakesNobody => "a release wakes no waiter",
            Defect::FailedAttemptKeepsKeyBusy => {
                "a failed attempt keeps its key busy in the client"
            }
            Defect::BatchExtendsOnlyItsLast => "a batch of extensions extends only its last lease",
            Defect::AnswersSwappedWhenOutTogether => "calls out together get each other's answers",
        }
    }
}

#[derive(Debug, Clone)]
struct Holder {
    /// Which client ([`Broken::connected`]) took it.
    client: u64,
    owner: OwnerToken,
    expires: Instant,
    fencing: FencingToken,
    record: Option<OwnerRecord>,
}

impl Holder {
    fn view(&self, now: Instant) -> HolderView {
        HolderView::new()
            .with_fencing(self.fencing)
            .with_expiry(self.expires - now)
            .with_owner(self.record.clone())
    }
}

#[derive(Debug, Default)]
struct Table {
    counter: u64,
    clients: u64,
    per_key: HashMap<String, u64>,
    holders: HashMap<String, Holder>,
    busy_answers: u64,
    /// Attempts out at this moment, and the token of the last grant made while others were out
    /// ([`Defect::AnswersSwappedWhenOutTogether`]).
    out: usize,
    last_together: Option<FencingToken>,
}

impl Table {
    fn live(&self, key: &str, now: Instant) -> Option<Holder> {
        self.holders.get(key).cloned().filter(|h| now < h.expires)
    }
}

/// One lock service with at most one defect. Clones share the service. A release (or an
/// eviction) wakes the service's waiters, as the backends that declare notifications do.
#[derive(Debug, Clone)]
pub struct Broken {
    defect: Option<Defect>,
    table: Arc<Mutex<Table>>,
    released: Arc<Notify>,
    /// This handle's client: handles of one client share it.
    client: u64,
}

impl Broken {
    pub fn new(defect: Option<Defect>) -> Self {
        Broken {
            defect,
            table: Arc::default(),
            released: Arc::default(),
            client: 0,
        }
    }

    /// A handle of a new client of the same service.
    pub fn connected(&self) -> Broken {
        let mut table = self.table();
        table.clients += 1;
        Broken {
            defect: self.defect,
            table: self.table.clone(),
            released: self.released.clone(),
            client: table.clients,
        }
    }

    fn has(&self, defect: Defect) -> bool {
        self.defect == Some(defect)
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An attempt that stays out a moment; a grant made while other attempts were out answers
    /// with the token of the grant made before it ([`Defect::AnswersSwappedWhenOutTogether`]).
    async fn answered_one_place_off(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        self.table().out += 1;
        tokio::time::sleep(Duration::from_millis(1)).await;
        let now = Instant::now();
        let mut table = self.table();
        let together = table.out > 1;
        table.out -= 1;
        if let Some(holder) = table.live(req.key.as_str(), now) {
            return Ok(Attempt::Busy {
                retry_after: Some(holder.expires - now),
            });
        }
        let grant = self.grant(&mut table, req, now);
        if !together {
            return Ok(Attempt::Acquired(grant));
        }
        let answer = table
            .last_together
            .replace(grant.fencing)
            .unwrap_or(grant.fencing);
        Ok(Attempt::Acquired(Grant::new(answer, now)))
    }

    fn grant(&self, table: &mut Table, req: &LockRequest<'_>, now: Instant) -> Grant {
        let key = req.key.to_string();
        let ttl = if self.has(Defect::NoTtl) {
            Duration::from_secs(3600)
        } else {
            req.ttl
        };
        let token = if self.has(Defect::FencingRepeats) {
            if table.live(&key, now).is_none() {
                table.per_key.remove(&key);
            }
            let counter = table.per_key.entry(key.clone()).or_default();
            *counter += 1;
            *counter
        } else {
            table.counter += 1;
            table.counter
        };
        table.holders.insert(
            key,
            Holder {
                client: self.client,
                owner: req.owner,
                expires: now + ttl,
                fencing: FencingToken(token),
                record: (!self.has(Defect::OwnerNotRecorded))
                    .then(|| Owner::this_process().record()),
            },
        );
        Grant::new(FencingToken(token), now)
    }
}

#[async_trait]
impl DistributedLock for Broken {
    fn backend_name(&self) -> &'static str {
        "broken"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(FencingGuarantee::Monotonic).with_notifications()
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        if self.has(Defect::AnswersSwappedWhenOutTogether) {
            return self.answered_one_place_off(req).await;
        }
        let now = Instant::now();
        let key = req.key.as_str();
        if self.has(Defect::CheckThenSetNotAtomic) {
            let free = self.table().live(key, now).is_none();
            if !free {
                return Ok(Attempt::Busy { retry_after: None });
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
            let mut table = self.table();
            return Ok(Attempt::Acquired(self.grant(&mut table, req, now)));
        }
        let mut table = self.table();
        if let Some(holder) = table.live(key, now) {
            table.busy_answers += 1;
            let overrule = (self.has(Defect::AcquireWhileHeld)
                && table.busy_answers.is_multiple_of(4))
                || (self.has(Defect::ReentrantPerClient) && holder.client == self.client);
            if !overrule {
                return Ok(Attempt::Busy {
                    retry_after: Some(holder.expires - now),
                });
            }
        }
        Ok(Attempt::Acquired(self.grant(&mut table, req, now)))
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        if self.has(Defect::LostSignalNeverFires) {
            return Ok(Extension::Extended);
        }
        let now = Instant::now();
        let ignore_owner = self.has(Defect::ExtendIgnoresOwnership);
        let mut table = self.table();
        match table.holders.get_mut(lease.key.as_str()) {
            Some(h) if now < h.expires && (h.owner == lease.owner || ignore_owner) => {
                h.expires = now + ttl;
                Ok(Extension::Extended)
            }
            Some(h) if now < h.expires => Ok(Extension::TakenOver),
            _ => Ok(Extension::Expired),
        }
    }

    async fn extend_many(&self, requests: &[ExtendRequest<'_>]) -> Vec<Result<Extension>> {
        let mut answers = Vec::with_capacity(requests.len());
        for (i, request) in requests.iter().enumerate() {
            answers.push(
                if self.has(Defect::BatchExtendsOnlyItsLast) && i + 1 < requests.len() {
                    Ok(Extension::Expired)
                } else {
                    self.extend(&request.lease, request.ttl).await
                },
            );
        }
        answers
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        let now = Instant::now();
        let key = lease.key.as_str();
        let mut table = self.table();
        let Some(holder) = table.live(key, now) else {
            return Ok(Released::Expired);
        };
        if holder.owner == lease.owner || self.has(Defect::ReleaseWithoutOwnershipCheck) {
            table.holders.remove(key);
            self.released.notify_waiters();
            Ok(Released::Released)
        } else {
            Ok(Released::TakenOver)
        }
    }

    /// Until any release of the service (or `until`); with [`Defect::ReleaseWakesNobody`],
    /// until `until`.
    async fn wait_for_release(&self, _key: &LockKey, until: Instant) -> Result<()> {
        if self.has(Defect::ReleaseWakesNobody) {
            tokio::time::sleep_until(until).await;
        } else {
            let _ = tokio::time::timeout_at(until, self.released.notified()).await;
        }
        Ok(())
    }

    async fn inspect(&self, key: &LockKey) -> Result<Holding> {
        let now = Instant::now();
        Ok(match self.table().live(key.as_str(), now) {
            Some(holder) => Holding::Held(holder.view(now)),
            None => Holding::Free,
        })
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let now = Instant::now();
        let table = self.table();
        Ok(table
            .holders
            .iter()
            .filter(|(key, holder)| key.starts_with(prefix) && now < holder.expires)
            .map(|(key, holder)| HeldLock::new(key.as_str(), holder.view(now)))
            .collect())
    }

    async fn evict(&self, key: &LockKey, expected: Option<FencingToken>) -> Result<Eviction> {
        let now = Instant::now();
        let mut table = self.table();
        let Some(holder) = table.live(key.as_str(), now) else {
            return Ok(Eviction::Free);
        };
        if expected.is_some_and(|token| token != holder.fencing) {
            return Ok(Eviction::Changed(holder.view(now)));
        }
        if !self.has(Defect::EvictionKeepsHolder) {
            table.holders.remove(key.as_str());
            self.released.notify_waiters();
        }
        if self.has(Defect::EvictionReusesToken) {
            table.counter = holder.fencing.0 - 1;
        }
        Ok(Eviction::Evicted(holder.view(now)))
    }
}

/// A backend with its own waiting loop (as queue-based backends have), where the defects of the
/// [`Broken`] service it wraps that live in such a loop show:
/// [`Defect::DeadlineCutsFirstAttempt`], a waiting acquire that gives up at its deadline before
/// trying even once, and [`Defect::ValidityIgnoresElapsed`], a slow reply whose grant is stamped
/// on arrival.
#[derive(Debug, Clone)]
pub struct OwnWaitingLoop(pub Broken);

#[async_trait]
impl Layer for OwnWaitingLoop {
    fn inner(&self) -> &dyn DistributedLock {
        &self.0
    }

    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        if self.0.has(Defect::DeadlineCutsFirstAttempt)
            && deadline.is_some_and(|d| Instant::now() >= d)
        {
            return Err(dlock_core::Error::Timeout {
                key: req.key.to_string(),
                waited: Duration::ZERO,
            });
        }
        let grant = self.0.lock(req, deadline, retry).await?;
        if !self.0.has(Defect::ValidityIgnoresElapsed) {
            return Ok(grant);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(Grant::new(grant.fencing, Instant::now()))
    }
}

/// How long a place in a [`Queued`] line lasts unless its waiter, still waiting, renews it: the
/// "session" of a waiter that is gone.
const PLACE_LIFETIME: Duration = Duration::from_secs(5);

/// One waiter's place in a [`Queued`] line.
#[derive(Debug, Clone, Copy)]
struct Place {
    owner: OwnerToken,
    until: Instant,
}

/// The lock with a fair waiting line in front of it, as ZooKeeper and etcd have: a waiter takes
/// the last place, renews it while it waits, and only the first place may take the free lock; a
/// place whose waiter stopped renewing it (crashed) lapses after [`PLACE_LIFETIME`]. Correct, a
/// waiter that gives up (its deadline, its future dropped, a release by its owner token) leaves
/// the line at once. With a defect: [`Defect::QueueEntryOutlivesWaiter`] (a place stays until
/// it lapses), [`Defect::QueueOutOfOrder`], [`Defect::ReleaserJumpsQueue`] or
/// [`Defect::CrashedWaiterBlocksQueue`].
#[derive(Debug, Clone)]
pub struct Queued {
    inner: Broken,
    defect: Option<Defect>,
    lines: Arc<Mutex<HashMap<String, VecDeque<Place>>>>,
}

impl Queued {
    pub fn new(inner: Broken, defect: Option<Defect>) -> Self {
        Queued {
            inner,
            defect,
            lines: Arc::default(),
        }
    }

    fn orphans(&self) -> bool {
        self.defect == Some(Defect::QueueEntryOutlivesWaiter)
    }

    /// When a place taken or renewed now lapses.
    fn lapses(&self) -> Instant {
        if self.defect == Some(Defect::CrashedWaiterBlocksQueue) {
            return Instant::now() + Duration::from_secs(3600);
        }
        Instant::now() + PLACE_LIFETIME
    }

    /// The key's line without lapsed places.
    fn with_line<T>(&self, key: &str, f: impl FnOnce(&mut VecDeque<Place>) -> T) -> T {
        let mut lines = self
            .lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let line = lines.entry(key.to_owned()).or_default();
        let now = Instant::now();
        line.retain(|p| now < p.until);
        f(line)
    }

    fn leave(&self, key: &str, owner: OwnerToken) {
        self.with_line(key, |line| line.retain(|p| p.owner != owner));
    }
}

/// Takes a waiter out of the line when its acquire ends, however it ends (unless orphaning).
struct LeaveOnDrop<'a> {
    queued: &'a Queued,
    key: &'a str,
    owner: OwnerToken,
}

impl Drop for LeaveOnDrop<'_> {
    fn drop(&mut self) {
        if !self.queued.orphans() {
            self.queued.leave(self.key, self.owner);
        }
    }
}

#[async_trait]
impl Layer for Queued {
    fn inner(&self) -> &dyn DistributedLock {
        &self.inner
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        let waiters = self.with_line(req.key.as_str(), |line| {
            line.iter().any(|p| p.owner != req.owner)
        });
        if waiters {
            return Ok(Attempt::Busy { retry_after: None });
        }
        self.inner.try_lock(req).await
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities().with_fair_queue()
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        if !self.orphans() {
            self.leave(lease.key.as_str(), lease.owner);
        }
        self.inner.release(lease).await
    }

    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        _retry: &Backoff,
    ) -> Result<Grant> {
        let key = req.key.as_str();
        let started = Instant::now();
        if self.defect == Some(Defect::ReleaserJumpsQueue) {
            if let Attempt::Acquired(grant) = self.inner.try_lock(req).await? {
                return Ok(grant);
            }
        }
        let place = Place {
            owner: req.owner,
            until: self.lapses(),
        };
        self.with_line(key, |line| {
            if self.defect == Some(Defect::QueueOutOfOrder) {
                line.push_front(place);
            } else {
                line.push_back(place);
            }
        });
        let _place = LeaveOnDrop {
            queued: self,
            key,
            owner: req.owner,
        };
        loop {
            let until = self.lapses();
            let first = self.with_line(key, |line| {
                for place in line.iter_mut().filter(|p| p.owner == req.owner) {
                    place.until = until;
                }
                line.front().is_none_or(|p| p.owner == req.owner)
            });
            if first {
                if let Attempt::Acquired(grant) = self.inner.try_lock(req).await? {
                    self.leave(key, req.owner);
                    return Ok(grant);
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(dlock_core::Error::Timeout {
                    key: key.to_owned(),
                    waited: started.elapsed(),
                });
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}
