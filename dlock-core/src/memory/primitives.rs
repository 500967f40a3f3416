//! The in-process semaphore, read-write lock and election: one table of named groups of holders.
//!
//! A group is what one name means for one primitive: its live holders, a semaphore's permits, and
//! how many writers wait. Releases wake every waiter of the group (several readers or permits may
//! have become grantable at once); a waiter re-checks the table, so a wake-up that finds the name
//! still busy costs one look.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{
    retry_until_granted, Attempt, Capabilities, DistributedLock, Extension, Grant, LeaseRef,
    LockRequest, Released,
};
use crate::error::{Error, Result};
use crate::inspect::{Holder as HolderView, Holding};
use crate::key::LockKey;
use crate::owner::{Owner, OwnerRecord};
use crate::primitive::Primitive;
use crate::retry::Backoff;
use crate::token::{FencingToken, OwnerToken};

/// The three families of names: the same name in two families names two things.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Family {
    Semaphore,
    ReadWrite,
    Election,
}

impl Family {
    fn of(primitive: &Primitive) -> Family {
        match primitive {
            Primitive::Semaphore { .. } => Family::Semaphore,
            Primitive::Read | Primitive::Write => Family::ReadWrite,
            Primitive::Election { .. } => Family::Election,
        }
    }
}

/// Every group of every family, and the one counter their fencing tokens come from.
#[derive(Debug, Default)]
pub(super) struct Groups {
    last_token: u64,
    /// One map a family, indexed by [`Family`], so that a name is looked up without a copy.
    families: [HashMap<LockKey, Group>; 3],
}

impl Groups {
    fn family(&mut self, family: Family) -> &mut HashMap<LockKey, Group> {
        &mut self.families[family as usize]
    }

    fn group(&mut self, family: Family, key: &LockKey) -> Option<&mut Group> {
        self.family(family).get_mut(key)
    }

    /// The group of `key`, made empty if it has none.
    fn group_or_new(&mut self, family: Family, key: &LockKey) -> &mut Group {
        self.family(family).entry(key.clone()).or_default()
    }
}

#[derive(Debug, Default)]
struct Group {
    /// In grant order.
    holders: Vec<Member>,
    /// The permits the holders agreed on (semaphores).
    permits: Option<u32>,
    /// Writers inside a waiting [`DistributedLock::lock`]: readers wait behind them.
    writers_waiting: usize,
    /// Made by the first waiter, so that a name nobody waits for costs no allocation.
    wake: Option<Arc<Notify>>,
}

#[derive(Debug, Clone)]
struct Member {
    owner: OwnerToken,
    fencing: FencingToken,
    expires: Instant,
    record: OwnerRecord,
    writer: bool,
    value: Option<Arc<str>>,
}

impl Group {
    fn prune(&mut self, now: Instant) {
        self.holders.retain(|m| now < m.expires);
    }

    fn idle(&self) -> bool {
        self.holders.is_empty()
            && self.writers_waiting == 0
            && self.wake.as_ref().is_none_or(|w| Arc::strong_count(w) == 1)
    }

    fn wake_waiters(&self) {
        if let Some(wake) = &self.wake {
            wake.notify_waiters();
        }
    }

    fn busy(&self, now: Instant) -> Attempt {
        Attempt::Busy {
            retry_after: self.holders.iter().map(|m| m.expires - now).min(),
        }
    }

    /// The earliest holder, with how many share the name where they share it (a semaphore's
    /// permits, readers).
    fn view(&self, now: Instant, family: Family) -> Holding {
        let Some(first) = self.holders.first() else {
            return Holding::Free;
        };
        let shared = match family {
            Family::Semaphore => true,
            Family::ReadWrite => !first.writer,
            Family::Election => false,
        };
        let holder = HolderView::new()
            .with_fencing(first.fencing)
            .with_expiry(first.expires - now)
            .with_owner(Some(first.record.clone()))
            .with_value(first.value.as_deref().map(str::to_owned));
        Holding::Held(if shared {
            holder.with_holders(self.holders.len())
        } else {
            holder
        })
    }
}

/// One primitive served from the table, as a lock service of its own.
#[derive(Debug, Clone)]
pub(super) struct View {
    pub(super) groups: Arc<Mutex<Groups>>,
    pub(super) owner: Arc<Owner>,
    pub(super) primitive: Primitive,
    pub(super) capabilities: Capabilities,
}

impl View {
    fn groups(&self) -> MutexGuard<'_, Groups> {
        // Every mutation below leaves the table consistent before anything can panic.
        self.groups.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn family(&self) -> Family {
        Family::of(&self.primitive)
    }

    /// Counts a waiting writer for as long as the returned guard lives.
    fn writer_waits(&self, key: &LockKey) -> WriterWaiting {
        self.groups()
            .group_or_new(Family::ReadWrite, key)
            .writers_waiting += 1;
        WriterWaiting {
            view: self.clone(),
            key: key.clone(),
        }
    }

    /// Runs `present` on the group of `lease`'s name and the lease's place in it, or answers
    /// `absent`; a name left with no holder and no waiter leaves the table.
    fn with_member<T>(
        &self,
        lease: &LeaseRef<'_>,
        absent: T,
        present: impl FnOnce(&mut Group, usize) -> T,
    ) -> T {
        let now = Instant::now();
        let mut groups = self.groups();
        let family = groups.family(self.family());
        let Some(group) = family.get_mut(lease.key) else {
            return absent;
        };
        group.prune(now);
        let outcome = match group.holders.iter().position(|m| m.owner == lease.owner) {
            Some(index) => present(group, index),
            None => absent,
        };
        if group.idle() {
            family.remove(lease.key);
        }
        outcome
    }
}

/// Takes a waiting writer off the count when its wait ends, however it ends.
struct WriterWaiting {
    view: View,
    key: LockKey,
}

impl Drop for WriterWaiting {
    fn drop(&mut self) {
        if let Some(group) = self.view.groups().group(Family::ReadWrite, &self.key) {
            group.writers_waiting = group.writers_waiting.saturating_sub(1);
            // Readers held back by this writer may go now.
            group.wake_waiters();
        }
    }
}

#[async_trait]
impl DistributedLock for View {
    fn backend_name(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        let now = Instant::now();
        let value = match &self.primitive {
            Primitive::Election { .. } => Some(self.primitive.value()?.clone()),
            _ => None,
        };
        let mut guard = self.groups();
        let Groups {
            last_token,
            families,
        } = &mut *guard;
        let group = families[self.family() as usize]
            .entry(req.key.clone())
            .or_default();
        group.prune(now);
        let free = match &self.primitive {
            Primitive::Semaphore { permits } => {
                if let Some(agreed) = group.permits.filter(|_| !group.holders.is_empty()) {
                    if agreed != *permits {
                        return Err(Error::mismatch(
                            req.key,
                            format!("the semaphore has {agreed} permits; asked with {permits}"),
                        ));
                    }
                }
                group.permits = Some(*permits);
                group.holders.len() < *permits as usize
            }
            Primitive::Read => {
                group.writers_waiting == 0 && group.holders.iter().all(|m| !m.writer)
            }
            Primitive::Write | Primitive::Election { .. } => group.holders.is_empty(),
        };
        if !free {
            return Ok(group.busy(now));
        }
        *last_token += 1;
        let fencing = FencingToken(*last_token);
        group.holders.push(Member {
            owner: req.owner,
            fencing,
            expires: now + req.ttl,
            record: self.owner.record(),
            writer: self.primitive == Primitive::Write,
            value,
        });
        Ok(Attempt::Acquired(Grant::new(fencing, now)))
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        Ok(self.with_member(lease, Extension::Expired, |group, index| {
            group.holders[index].expires = Instant::now() + ttl;
            Extension::Extended
        }))
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        Ok(self.with_member(lease, Released::Expired, |group, index| {
            group.holders.remove(index);
            group.wake_waiters();
            Released::Released
        }))
    }

    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        let (wake, wake_at) = {
            let mut groups = self.groups();
            let group = groups.group_or_new(self.family(), key);
            let expires = group.holders.iter().map(|m| m.expires).min();
            let wake = group.wake.get_or_insert_with(Arc::default).clone();
            (wake, expires.map_or(until, |e| e.min(until)))
        };
        let notified = wake.notified();
        tokio::pin!(notified);
        // Registered before the table is looked at again, so a release in between still wakes.
        notified.as_mut().enable();
        if self.grantable_now(key) {
            return Ok(());
        }
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep_until(wake_at) => {}
        }
        Ok(())
    }

    async fn inspect(&self, key: &LockKey) -> Result<Holding> {
        let now = Instant::now();
        let mut groups = self.groups();
        let Some(group) = groups.group(self.family(), key) else {
            return Ok(Holding::Free);
        };
        group.prune(now);
        Ok(group.view(now, self.family()))
    }

    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        // A waiting writer holds readers back until it is served or gives up.
        let _writer = (self.primitive == Primitive::Write).then(|| self.writer_waits(req.key));
        retry_until_granted(self, req, deadline, retry).await
    }
}

impl View {
    /// Whether a holder left since the caller's last attempt, so that waiting would miss it: the
    /// group is gone or has room again.
    fn grantable_now(&self, key: &LockKey) -> bool {
        let now = Instant::now();
        let mut groups = self.groups();
        let Some(group) = groups.group(self.family(), key) else {
            return true;
        };
        let live = group.holders.iter().filter(|m| now < m.expires);
        match &self.primitive {
            Primitive::Semaphore { permits } => live.count() < *permits as usize,
            Primitive::Read => group.writers_waiting == 0 && live.clone().all(|m| !m.writer),
            Primitive::Write | Primitive::Election { .. } => live.count() == 0,
        }
    }
}
