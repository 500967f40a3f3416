//! One cell's run: the history it records, the fenced resource its holders write to, and the
//! recording versions of acquire, write and release that every scenario uses.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{
    DistributedLock, DistributedLockExt, Error, Fenced, FencingToken, Lease, LockOptions,
};
use dlock_testkit::History;
use tokio::time::Instant;

use crate::plan::Plan;

/// A counter guarded by a fence, written read-modify-write by every holder: a write admitted on a
/// value that changed since its read is a lost update.
#[derive(Debug, Default)]
pub struct Resource {
    counter: Fenced<u64>,
}

impl Resource {
    /// The counter's value.
    pub fn read(&self) -> u64 {
        self.counter.read(|v| *v)
    }

    /// Writes `read + 1` with `token`: whether the fence admitted it, and whether it overwrote an
    /// update made since `read`.
    pub fn write(&self, token: FencingToken, read: u64) -> (bool, bool) {
        let written = self.counter.write(token, |v| {
            let lost = *v != read;
            *v = read + 1;
            lost
        });
        match written {
            Ok(lost) => (true, lost),
            Err(_) => (false, false),
        }
    }
}

/// The state of one cell while it runs.
#[derive(Debug, Clone)]
pub struct Run {
    /// The run's plan.
    pub plan: Plan,
    /// The lock key, unique to the cell.
    pub key: String,
    /// Everything the clients observed.
    pub history: Arc<History>,
    /// The fenced resource.
    pub resource: Arc<Resource>,
}

impl Run {
    /// A fresh run on `key`.
    pub fn new(plan: Plan, key: String) -> Self {
        Run {
            plan,
            key,
            history: Arc::new(History::new()),
            resource: Arc::new(Resource::default()),
        }
    }

    /// Acquires as `client`, recording the grant and, later, the loss. A timeout is a definite
    /// "not acquired" (dlock-core releases whatever a late grant took); any other error is
    /// recorded as an indeterminate outcome.
    pub async fn acquire(
        &self,
        client: usize,
        lock: &Arc<dyn DistributedLock>,
        opts: &LockOptions,
    ) -> Option<Lease> {
        match lock.acquire(&self.key, opts).await {
            Ok(lease) => {
                self.record_grant(client, &lease);
                Some(lease)
            }
            Err(Error::Timeout { .. }) => None,
            Err(e) => {
                self.history
                    .indeterminate(client, &self.key, format!("acquire: {e}"));
                None
            }
        }
    }

    /// Like [`acquire`](Self::acquire), but retries after errors (a broken connection, a server
    /// that is restarting) until `opts.wait` has passed, as a service's retry loop would. Each
    /// failed attempt stays in the history as an indeterminate outcome.
    pub async fn acquire_retrying(
        &self,
        client: usize,
        lock: &Arc<dyn DistributedLock>,
        opts: &LockOptions,
    ) -> Option<Lease> {
        let deadline = Instant::now() + opts.wait.unwrap_or_default();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let attempt = opts.clone().with_wait(left);
            match lock.acquire(&self.key, &attempt).await {
                Ok(lease) => {
                    self.record_grant(client, &lease);
                    return Some(lease);
                }
                Err(Error::Timeout { .. }) => return None,
                Err(e) => {
                    self.history
                        .indeterminate(client, &self.key, format!("acquire: {e}"));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Records that `client` holds `lease` (from an acquire or a successful extend) and watches
    /// for its loss.
    pub fn record_grant(&self, client: usize, lease: &Lease) {
        let token = lease.fencing_token();
        self.history
            .acquired(client, &self.key, token, lease.valid_until());
        let watch = lease.watch();
        let history = self.history.clone();
        let key = self.key.clone();
        tokio::spawn(async move {
            let reason = watch.lost().await;
            history.lost(client, &key, token, reason, Instant::now());
        });
    }

    /// Reads the resource, as a holder does before its write.
    pub fn read(&self) -> u64 {
        self.resource.read()
    }

    /// Writes `read + 1` as `client` with `token`, recording whether the fence admitted it.
    pub fn write(&self, client: usize, token: FencingToken, read: u64) -> bool {
        let (accepted, lost_update) = self.resource.write(token, read);
        self.history
            .write(client, &self.key, token, accepted, lost_update);
        accepted
    }

    /// Releases as `client`; an error is an indeterminate outcome.
    pub async fn release(&self, client: usize, lease: Lease) {
        self.history
            .releasing(client, &self.key, lease.fencing_token());
        if let Err(e) = lease.release().await {
            self.history
                .indeterminate(client, &self.key, format!("release: {e}"));
        }
    }

    /// The holder (client 0) takes the free lock, as every fault scenario begins; an error if it
    /// cannot, since nothing the scenario would observe then means anything.
    pub async fn hold(
        &self,
        holder: &Arc<dyn DistributedLock>,
        opts: &LockOptions,
    ) -> anyhow::Result<Lease> {
        match self.acquire(0, holder, opts).await {
            Some(lease) => Ok(lease),
            None => anyhow::bail!("the holder could not take the free lock"),
        }
    }

    /// The successor (client 1) works and releases if it got the lock; whether it did, i.e.
    /// whether the lock was handed on.
    pub async fn hand_on(&self, successor: Option<Lease>) -> bool {
        let handed_on = successor.is_some();
        if let Some(lease) = successor {
            self.work_and_release(1, lease).await;
        }
        handed_on
    }

    /// A read-modify-write under `lease`, then its release: one ordinary critical section.
    pub async fn work_and_release(&self, client: usize, lease: Lease) {
        let read = self.read();
        self.write(client, lease.fencing_token(), read);
        self.release(client, lease).await;
    }

    /// The plan's TTL times `factor`.
    pub fn ttls(&self, factor: f64) -> Duration {
        self.plan.ttl.mul_f64(factor)
    }
}
