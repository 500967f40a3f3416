//! A small in-process lock with switchable defects, each a classic way to get a lock wrong.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{
    Attempt, Backoff, Capabilities, DistributedLock, Extension, FencingGuarantee, FencingToken,
    Grant, LeaseRef, LockKey, LockRequest, OwnerToken, Released, Result,
};
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
    /// A client keeps a connection on which a request timed out, and so fails every later call
    /// (see `link.rs`; the service itself is correct).
    SilentConnectionKept,
}

impl Defect {
    pub const ALL: [Defect; 9] = [
        Defect::ReleaseWithoutOwnershipCheck,
        Defect::NoTtl,
        Defect::FencingRepeats,
        Defect::ExtendIgnoresOwnership,
        Defect::CheckThenSetNotAtomic,
        Defect::ValidityIgnoresElapsed,
        Defect::AcquireWhileHeld,
        Defect::LostSignalNeverFires,
        Defect::SilentConnectionKept,
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
            Defect::SilentConnectionKept => "a connection that stopped answering is kept",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Holder {
    owner: OwnerToken,
    expires: Instant,
}

#[derive(Debug, Default)]
struct Table {
    counter: u64,
    per_key: HashMap<String, u64>,
    holders: HashMap<String, Holder>,
    busy_answers: u64,
}

impl Table {
    fn live(&self, key: &str, now: Instant) -> Option<Holder> {
        self.holders.get(key).copied().filter(|h| now < h.expires)
    }
}

/// One lock service with at most one defect. Clones share the service.
#[derive(Debug, Clone)]
pub struct Broken {
    defect: Option<Defect>,
    table: Arc<Mutex<Table>>,
}

impl Broken {
    pub fn new(defect: Option<Defect>) -> Self {
        Broken {
            defect,
            table: Arc::default(),
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
                owner: req.owner,
                expires: now + ttl,
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
        Capabilities::new(FencingGuarantee::Monotonic)
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
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
            let overrule =
                self.has(Defect::AcquireWhileHeld) && table.busy_answers.is_multiple_of(4);
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

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        let now = Instant::now();
        let key = lease.key.as_str();
        let mut table = self.table();
        let Some(holder) = table.live(key, now) else {
            return Ok(Released::Expired);
        };
        if holder.owner == lease.owner || self.has(Defect::ReleaseWithoutOwnershipCheck) {
            table.holders.remove(key);
            Ok(Released::Released)
        } else {
            Ok(Released::TakenOver)
        }
    }
}

/// [`Defect::ValidityIgnoresElapsed`]: a backend with its own waiting loop (as queue-based
/// backends have) whose reply is slow and whose grant is stamped on arrival.
#[derive(Debug, Clone)]
pub struct StampsOnArrival(pub Broken);

#[async_trait]
impl DistributedLock for StampsOnArrival {
    fn backend_name(&self) -> &'static str {
        "broken"
    }

    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        self.0.try_lock(req).await
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        self.0.extend(lease, ttl).await
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        self.0.release(lease).await
    }

    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        self.0.wait_for_release(key, until).await
    }

    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        let grant = self.0.lock(req, deadline, retry).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(Grant::new(grant.fencing, Instant::now()))
    }
}
