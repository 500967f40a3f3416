//! The tracing layer ([`Traced`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tracing::{field, Instrument, Span};

use super::Layer;
use crate::backend::{
    Attempt, DistributedLock, ExtendRequest, Extension, Grant, LeaseRef, LockRequest, Outcome,
    Released,
};
use crate::error::Result;
use crate::inspect::{Eviction, HeldLock, Holding};
use crate::key::LockKey;
use crate::primitive::Primitive;
use crate::retry::Backoff;
use crate::token::FencingToken;

/// The tracing layer: one span per lock call, the same fields for every backend.
///
/// Wrap any service in [`Traced`] (on the facade: `dlock::builder(url).with_tracing()`) and each
/// call runs inside a span named after what the caller did:
///
/// | span | call | fields |
/// |---|---|---|
/// | `dlock.acquire` | a waiting acquire ([`lock`](DistributedLock::lock)) | `key`, `backend`, `outcome`, `wait_ms`, `fencing` |
/// | `dlock.try_acquire` | one attempt ([`try_lock`](DistributedLock::try_lock)) | `key`, `backend`, `outcome`, `wait_ms`, `fencing` |
/// | `dlock.extend` | an explicit extend | `key`, `backend`, `outcome`, `fencing` |
/// | `dlock.renew` | each lease of an auto-renew batch ([`extend_many`](DistributedLock::extend_many)) | `key`, `backend`, `outcome`, `fencing` |
/// | `dlock.release` | a release | `key`, `backend`, `outcome`, `fencing` |
/// | `dlock.inspect`, `dlock.list` | the read-only looks | `key` or `prefix`, `backend`, `outcome` |
/// | `dlock.evict` | a forced unlock, at `INFO` with an event naming the evicted holder | `key`, `backend`, `outcome`, `fencing` |
///
/// `outcome` is the call's [`Outcome`] word. The backend's own detail (reconnects, watches,
/// script retries) is logged as events, which a subscriber shows inside these spans. Without the
/// layer nothing is traced and nothing is paid.
#[derive(Clone)]
pub struct Traced<S>(S);

impl<S> Traced<S> {
    /// `service`, traced.
    pub fn new(service: S) -> Self {
        Traced(service)
    }
}

/// The service's own `Debug`: the tracing is no state worth showing.
impl<S: fmt::Debug> fmt::Debug for Traced<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A span's name must be a literal, hence a macro.
macro_rules! lock_span {
    ($name:literal, $backend:expr, $key:expr) => {
        tracing::debug_span!(
            $name,
            key = %$key,
            backend = $backend,
            outcome = field::Empty,
            wait_ms = field::Empty,
            fencing = field::Empty,
        )
    };
}

fn record_grant(span: &Span, started: Instant, fencing: Option<FencingToken>, outcome: &str) {
    span.record("outcome", outcome);
    span.record("wait_ms", millis(started.elapsed()));
    if let Some(token) = fencing {
        span.record("fencing", token.0);
    }
}

fn millis(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
}

fn record_lease(span: &Span, lease: &LeaseRef<'_>, outcome: &str) {
    span.record("outcome", outcome);
    if let Some(token) = lease.fencing {
        span.record("fencing", token.0);
    }
}

#[async_trait]
impl<S: DistributedLock> Layer for Traced<S> {
    fn inner(&self) -> &dyn DistributedLock {
        &self.0
    }

    /// The primitive's view is traced too.
    fn primitive(&self, primitive: &Primitive) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(Traced::new(self.0.primitive(primitive)?)))
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        let span = lock_span!("dlock.try_acquire", self.0.backend_name(), req.key);
        let started = Instant::now();
        let result = self.0.try_lock(req).instrument(span.clone()).await;
        let fencing = match &result {
            Ok(Attempt::Acquired(grant)) => Some(grant.fencing),
            _ => None,
        };
        record_grant(&span, started, fencing, result.outcome());
        result
    }

    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        let span = lock_span!("dlock.acquire", self.0.backend_name(), req.key);
        let started = Instant::now();
        let result = self
            .0
            .lock(req, deadline, retry)
            .instrument(span.clone())
            .await;
        let fencing = result.as_ref().ok().map(|grant| grant.fencing);
        record_grant(&span, started, fencing, result.outcome());
        result
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        let span = lock_span!("dlock.extend", self.0.backend_name(), lease.key);
        let result = self.0.extend(lease, ttl).instrument(span.clone()).await;
        record_lease(&span, lease, result.outcome());
        result
    }

    /// The service's own batch (one round trip where it batches), with one span per lease that
    /// records that lease's answer.
    async fn extend_many(&self, requests: &[ExtendRequest<'_>]) -> Vec<Result<Extension>> {
        let spans: Vec<Span> = requests
            .iter()
            .map(|r| lock_span!("dlock.renew", self.0.backend_name(), r.lease.key))
            .collect();
        let results = self.0.extend_many(requests).await;
        for ((span, request), result) in spans.iter().zip(requests).zip(&results) {
            record_lease(span, &request.lease, result.outcome());
        }
        results
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        let span = lock_span!("dlock.release", self.0.backend_name(), lease.key);
        let result = self.0.release(lease).instrument(span.clone()).await;
        record_lease(&span, lease, result.outcome());
        result
    }

    async fn inspect(&self, key: &LockKey) -> Result<Holding> {
        let span = tracing::debug_span!(
            "dlock.inspect",
            key = %key,
            backend = self.0.backend_name(),
            outcome = field::Empty,
        );
        let result = self.0.inspect(key).instrument(span.clone()).await;
        let outcome = match &result {
            Ok(Holding::Free) => "free",
            Ok(Holding::Held(_)) => "held",
            Ok(_) => "unknown",
            Err(error) => error.outcome(),
        };
        span.record("outcome", outcome);
        result
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let span = tracing::debug_span!(
            "dlock.list",
            prefix,
            backend = self.0.backend_name(),
            outcome = field::Empty,
        );
        let result = self.0.list(prefix).instrument(span.clone()).await;
        match &result {
            Ok(held) => span.record("outcome", held.len()),
            Err(error) => span.record("outcome", error.outcome()),
        };
        result
    }

    /// An eviction is an operator's intervention: it is traced at `INFO`, with an event that
    /// names the holder it removed.
    async fn evict(&self, key: &LockKey, expected: Option<FencingToken>) -> Result<Eviction> {
        let span = tracing::info_span!(
            "dlock.evict",
            key = %key,
            backend = self.0.backend_name(),
            outcome = field::Empty,
            fencing = field::Empty,
        );
        let result = self.0.evict(key, expected).instrument(span.clone()).await;
        let outcome = match &result {
            Ok(Eviction::Evicted(holder)) => {
                if let Some(token) = holder.fencing {
                    span.record("fencing", token.0);
                }
                span.in_scope(|| match &holder.owner {
                    Some(owner) => tracing::info!(%owner, "forced unlock: holder evicted"),
                    None => tracing::info!("forced unlock: holder without owner record evicted"),
                });
                "evicted"
            }
            Ok(Eviction::Free) => "free",
            Ok(_) => "changed",
            Err(error) => error.outcome(),
        };
        span.record("outcome", outcome);
        result
    }
}
