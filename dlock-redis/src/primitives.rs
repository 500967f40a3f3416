//! The semaphore, the read-write lock and the election on Redis: views of a [`RedisLock`] that
//! run the scripts of [`protocol::primitives`](crate::protocol::primitives) on the same
//! connection (single server, Sentinel or Cluster), with `WAIT` behind each grant, extension and
//! release when the client has `min_replicas` (as for the lock), and wake waiters with the same
//! release notifications.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{
    Attempt, Capabilities, Extension, Grant, LeaseRef, LockKey, LockRequest, Primitive, Waiting,
};
use dlock_core::inspect::Holding;
use dlock_core::{Backoff, DistributedLock, Error, Released, Result};
use tokio::time::Instant;

use crate::client::{on_server, RedisLock};
use crate::error::BACKEND;
use crate::protocol::primitives::{self, Family, Mode, PrimitiveKeys, PrimitiveReply};

/// One primitive served by a Redis client.
#[derive(Clone)]
pub(crate) struct RedisView {
    lock: RedisLock,
    primitive: Primitive,
    family: Family,
}

impl RedisView {
    pub(crate) fn new(lock: RedisLock, primitive: Primitive) -> Self {
        RedisView {
            family: Family::of(&primitive),
            lock,
            primitive,
        }
    }

    fn keys(&self, key: &LockKey) -> PrimitiveKeys {
        PrimitiveKeys::new(&self.lock.layout().lock_key(key), self.family)
    }

    fn publish(&self) -> &'static str {
        if self.lock.is_cluster() {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }

    /// One run of the acquire script; `intent` registers a waiting writer's intent when busy.
    async fn attempt(
        &self,
        req: &LockRequest<'_>,
        keys: &PrimitiveKeys,
        record: &str,
        intent: Option<Duration>,
    ) -> Result<Attempt> {
        let mode = match &self.primitive {
            Primitive::Semaphore { permits } => Mode::Semaphore(*permits),
            Primitive::Read => Mode::Read,
            Primitive::Write => Mode::Write(intent),
            other => Mode::Election(other.value()?),
        };
        let owner = req.owner.to_hex();
        let (ttl, fence_ttl) = (req.ttl, self.lock.fence_ttl());
        let sent = Instant::now();
        let owner_ = owner.clone();
        let (reply, acknowledged) = on_server!(self.lock, "acquire", |con| {
            primitives::acquire(&mut con, keys, mode, &owner_, record, ttl, fence_ttl, None).await
        })?;
        if let (PrimitiveReply::Granted(_), Some(acks)) = (&reply, self.lock.inner.acks) {
            if let Err(unacknowledged) = acks.check("acquire", acknowledged) {
                let publish = self.publish();
                let release = |mut con| async move {
                    primitives::release(&mut con, keys, &owner, publish, None).await
                };
                return Err(self.lock.take_back(unacknowledged, release).await);
            }
        }
        match reply {
            PrimitiveReply::Granted(token) => Ok(Attempt::Acquired(Grant::new(token, sent))),
            PrimitiveReply::Busy { pttl } => Ok(Attempt::Busy { retry_after: pttl }),
            PrimitiveReply::Mismatch(agreed) => {
                let asked = match &self.primitive {
                    Primitive::Semaphore { permits } => *permits,
                    _ => 0,
                };
                Err(Error::mismatch(
                    req.key,
                    format!("the semaphore has {agreed} permits; asked with {asked}"),
                ))
            }
        }
    }

    /// The waiting loop of the lock's (see `waiting.rs`), on the group's release channel. A
    /// waiting writer's intent is re-armed by every attempt and lives `req.ttl`; the wait between
    /// two attempts is at most a third of that.
    async fn wait(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
        intent: Option<Duration>,
    ) -> Result<Grant> {
        let mut waiting = Waiting::new(req.key, deadline, retry);
        let keys = self.keys(req.key);
        let record = self.lock.owner().record().to_json();
        if let Attempt::Acquired(grant) = self.attempt(req, &keys, &record, intent).await? {
            return Ok(grant);
        }
        waiting.check()?;
        let wakeups = self.lock.wakeups();
        let registration = wakeups.register(&keys.channel, None);
        let ready_by = waiting.bound(Instant::now() + self.lock.request_timeout());
        wakeups.subscribed(&registration, ready_by).await;
        loop {
            let notified = registration.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let retry_after = match self.attempt(req, &keys, &record, intent).await? {
                Attempt::Acquired(grant) => return Ok(grant),
                Attempt::Busy { retry_after } => retry_after,
            };
            let now = waiting.check()?;
            let until = crate::waiting::next_poll(&mut waiting, now, retry_after, intent);
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }
}

#[async_trait]
impl DistributedLock for RedisView {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    /// The lock's, but for the fair queue: a primitive's waiters are not queued.
    fn capabilities(&self) -> Capabilities {
        let mut capabilities = self.lock.capabilities();
        capabilities.fair_queue = false;
        capabilities
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        let keys = self.keys(req.key);
        let record = self.lock.owner().record().to_json();
        self.attempt(req, &keys, &record, None).await
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        let keys = self.keys(lease.key);
        let holders = keys.holders.clone();
        let owner = lease.owner.to_hex();
        let (timed, acknowledged) = on_server!(self.lock, "extend", |con| {
            primitives::extend(&mut con, &keys, &owner, ttl).await
        })?;
        let extension = self.lock.watch_clock(&holders, timed);
        if let (true, Some(acks)) = (extension.is_extended(), self.lock.inner.acks) {
            acks.check("extend", acknowledged)?;
        }
        Ok(extension)
    }

    /// Removes the holder (and a waiting writer's intent of the same owner token, which is how
    /// a dropped `lock()` of a writer is cleaned up) and announces it.
    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        let keys = self.keys(lease.key);
        let owner = lease.owner.to_hex();
        let publish = self.publish();
        let (released, acknowledged) = on_server!(self.lock, "release", |con| {
            primitives::release(&mut con, &keys, &owner, publish, None).await
        })?;
        if let (Released::Released, Some(acks)) = (released, self.lock.inner.acks) {
            acks.check("release", acknowledged)?;
        }
        Ok(released)
    }

    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        let keys = self.keys(key);
        let wakeups = self.lock.wakeups();
        let registration = wakeups.register(&keys.channel, None);
        let notified = registration.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        wakeups.subscribed(&registration, until).await;
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep_until(until) => {}
        }
        Ok(())
    }

    async fn inspect(&self, key: &LockKey) -> Result<Holding> {
        let keys = self.keys(key);
        let seen = self
            .lock
            .inner
            .connection
            .run("inspect", |mut con| async move {
                primitives::peek(&mut con, &keys).await
            })
            .await?;
        Ok(match seen {
            Some(group) => Holding::Held(group.holder(self.family)),
            None => Holding::Free,
        })
    }

    /// Waits like the lock; a writer registers its intent while it waits (see
    /// [`ACQUIRE`](primitives::ACQUIRE)) and withdraws it, within
    /// [`WITHDRAW_BOUND`](dlock_core::backend::WITHDRAW_BOUND), when it gives up.
    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        let intent = (self.primitive == Primitive::Write).then_some(req.ttl);
        let result = self.wait(req, deadline, retry, intent).await;
        if intent.is_some() && result.is_err() {
            crate::waiting::withdraw(self, req).await;
        }
        result
    }
}

impl fmt::Debug for RedisView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisView")
            .field("primitive", &self.primitive)
            .field("client", &self.lock)
            .finish()
    }
}
