//! Scenario 4: the reply to an acquire arrives after the lease it grants has run out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Attempt, Grant, LockRequest};
use dlock_core::layer::Layer;
use dlock_core::{Backoff, DistributedLock, Result};
use tokio::time::Instant;

use super::Outcome;
use crate::run::Run;
use crate::targets::Target;

/// The holder's first grant is delivered `1.5 × TTL` late; meanwhile another client takes the
/// expired lock and works. The holder's client must not use the late lease; it may acquire again
/// later and work then.
pub async fn run(target: &dyn Target, run: &Run) -> anyhow::Result<Outcome> {
    let delay = run.ttls(1.5);
    let holder: Arc<dyn DistributedLock> = Arc::new(SlowFirstGrant {
        inner: target.client().await?,
        delay,
        armed: AtomicBool::new(true),
    });
    let next = target.client().await?;
    let wait = delay + target.abandon_bound(run.plan.ttl) + run.plan.ttl * 2 + run.plan.slack;
    let first = {
        let run = run.clone();
        let opts = run.plan.opts(wait);
        tokio::spawn(async move {
            if let Some(lease) = run.acquire(0, &holder, &opts).await {
                run.work_and_release(0, lease).await;
            }
        })
    };
    // Start once the late grant's lease has run out on the server, before its reply arrives.
    tokio::time::sleep(run.ttls(1.1)).await;
    let successor = run.acquire(1, &next, &run.plan.opts(wait)).await;
    let handed_on = run.hand_on(successor).await;
    first.await?;
    Ok(Outcome {
        handed_on,
        ..Outcome::default()
    })
}

/// Delivers the first grant `delay` late: the reply was slow on the wire.
#[derive(Debug)]
struct SlowFirstGrant {
    inner: Arc<dyn DistributedLock>,
    delay: Duration,
    armed: AtomicBool,
}

impl SlowFirstGrant {
    async fn deliver<T>(&self, granted: bool, reply: T) -> T {
        if granted && self.armed.swap(false, Ordering::SeqCst) {
            tokio::time::sleep(self.delay).await;
        }
        reply
    }
}

#[async_trait]
impl Layer for SlowFirstGrant {
    fn inner(&self) -> &dyn DistributedLock {
        self.inner.as_ref()
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        let reply = self.inner.try_lock(req).await;
        let granted = matches!(reply, Ok(Attempt::Acquired(_)));
        self.deliver(granted, reply).await
    }

    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        let reply = self.inner.lock(req, deadline, retry).await;
        let granted = reply.is_ok();
        self.deliver(granted, reply).await
    }
}
