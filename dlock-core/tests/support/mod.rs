//! What dlock-core's test binaries share: the in-process backend, options by TTL, a probe that
//! asks whether a lock is free, and a test wrapper around the backend that counts calls and
//! injects faults.
#![allow(dead_code)]

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{
    Attempt, Capabilities, ExtendRequest, Extension, LeaseRef, LockKey, LockRequest,
};
use dlock_core::{
    DistributedLock, DistributedLockExt, Error, InMemoryLock, LockOptions, Released, Result,
};
use tokio::time::Instant;

/// Faults to inject, switchable while a test runs.
#[derive(Debug, Default)]
pub struct Faults {
    /// Extends fail with a temporary backend error.
    pub fail_extend: AtomicBool,
    /// Extends answer "taken over" without asking the inner backend.
    pub extend_taken_over: AtomicBool,
    /// Extends of these keys answer "taken over" without asking the inner backend.
    pub taken_over_keys: Mutex<HashSet<String>>,
    /// Each try_lock is delayed by this many milliseconds after the inner backend answered.
    pub reply_delay_ms: AtomicU64,
    /// Each extend_many answers this many milliseconds late.
    pub batch_delay_ms: AtomicU64,
    /// After the inner backend granted, the reply never arrives.
    pub hang_after_grant: AtomicBool,
    /// This many of the next try_locks fail as unavailable, without asking the inner backend.
    pub unavailable_try_locks: AtomicUsize,
    /// Extends that succeed say the server's clock ran this many milliseconds ahead.
    pub clock_ahead_ms: AtomicU64,
}

/// Call counts.
#[derive(Debug, Default)]
pub struct Calls {
    pub try_lock: AtomicUsize,
    pub extend: AtomicUsize,
    /// Batches, each also counted once per lease in `extend`.
    pub extend_many: AtomicUsize,
    /// The size of the largest batch.
    pub largest_batch: AtomicUsize,
    pub release: AtomicUsize,
}

#[derive(Debug, Clone, Default)]
pub struct Scripted {
    pub inner: InMemoryLock,
    pub faults: Arc<Faults>,
    pub calls: Arc<Calls>,
}

impl Scripted {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn shared(&self) -> Arc<dyn DistributedLock> {
        Arc::new(self.clone())
    }

    pub fn count(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::SeqCst)
    }

    pub fn set(flag: &AtomicBool, on: bool) {
        flag.store(on, Ordering::SeqCst);
    }
}

#[async_trait]
impl DistributedLock for Scripted {
    fn backend_name(&self) -> &'static str {
        "scripted"
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        self.calls.try_lock.fetch_add(1, Ordering::SeqCst);
        let failing = &self.faults.unavailable_try_locks;
        if failing
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Error::unreachable("connection being replaced"));
        }
        let answer = self.inner.try_lock(req).await?;
        if matches!(answer, Attempt::Acquired(_))
            && self.faults.hang_after_grant.load(Ordering::SeqCst)
        {
            std::future::pending::<()>().await;
        }
        let delay = self.faults.reply_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        Ok(answer)
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        self.calls.extend.fetch_add(1, Ordering::SeqCst);
        if self.faults.fail_extend.load(Ordering::SeqCst) {
            return Err(Error::backend("scripted", true, "connection reset"));
        }
        if self.faults.extend_taken_over.load(Ordering::SeqCst)
            || self
                .faults
                .taken_over_keys
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(lease.key.as_str())
        {
            return Ok(Extension::TakenOver);
        }
        let ahead = self.faults.clock_ahead_ms.load(Ordering::SeqCst);
        let answer = self.inner.extend(lease, ttl).await?;
        Ok(answer.with_clock_ahead((ahead > 0).then(|| Duration::from_millis(ahead))))
    }

    async fn extend_many(&self, requests: &[ExtendRequest<'_>]) -> Vec<Result<Extension>> {
        self.calls.extend_many.fetch_add(1, Ordering::SeqCst);
        self.calls
            .largest_batch
            .fetch_max(requests.len(), Ordering::SeqCst);
        let delay = self.faults.batch_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let mut answers = Vec::with_capacity(requests.len());
        for request in requests {
            answers.push(self.extend(&request.lease, request.ttl).await);
        }
        answers
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        self.calls.release.fetch_add(1, Ordering::SeqCst);
        self.inner.release(lease).await
    }

    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        self.inner.wait_for_release(key, until).await
    }
}

/// Lets spawned background work (drop releases) run on the current-thread runtime.
pub async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// Takes the free `key` at once (no wait): the lease; panics when it was busy or failed.
pub async fn take<L: DistributedLockExt + ?Sized>(
    locks: &L,
    key: &str,
    opts: &LockOptions,
) -> dlock_core::Lease {
    match locks.try_acquire(key, opts).await {
        Ok(Some(lease)) => lease,
        Ok(None) => panic!("{key} was busy"),
        Err(e) => panic!("try_acquire of {key}: {e}"),
    }
}

/// Whether `key` is free once spawned background work (drop releases, releases of late
/// grants) has run: nothing was left held behind the caller's back.
pub async fn grants_once_settled<L: DistributedLockExt + ?Sized>(
    locks: &L,
    key: &str,
    opts: &LockOptions,
) -> bool {
    settle().await;
    grants(locks, key, opts).await
}

/// Waits `wait` and asserts `counter` still reads `before`: no renewal (or other call) went
/// out after the lease ended.
pub async fn assert_no_more_calls(counter: &AtomicUsize, before: usize, wait: Duration) {
    tokio::time::sleep(wait).await;
    assert_eq!(
        Scripted::count(counter),
        before,
        "calls went on after the lease ended"
    );
}

/// The in-process backend, as the trait object the tests use.
pub fn memory() -> Arc<dyn DistributedLock> {
    Arc::new(InMemoryLock::new())
}

/// Options for a lease of `ttl_ms` milliseconds.
pub fn opts(ttl_ms: u64) -> LockOptions {
    LockOptions::new(Duration::from_millis(ttl_ms))
}

/// Whether one attempt on `key` is granted now: the lock is free. The lease it may get is
/// dropped at once.
pub async fn grants<L: DistributedLockExt + ?Sized>(
    locks: &L,
    key: &str,
    opts: &LockOptions,
) -> bool {
    match locks.try_acquire(key, opts).await {
        Ok(lease) => lease.is_some(),
        Err(e) => panic!("try_acquire of {key}: {e}"),
    }
}
