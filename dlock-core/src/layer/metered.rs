//! The metrics layer ([`Metered`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram, Label};
use tokio::time::Instant;

use super::Layer;
use crate::backend::{
    Attempt, DistributedLock, ExtendRequest, Extension, Grant, LeaseRef, LockRequest, Outcome,
    Released,
};
use crate::error::Result;
use crate::key::LockKey;
use crate::primitive::Primitive;
use crate::retry::Backoff;
use crate::token::OwnerToken;

/// The metrics layer: how often locks are contended, how long callers wait and hold, and how
/// leases end, on the [`metrics`] facade (any exporter: Prometheus, StatsD, OpenTelemetry).
///
/// Wrap any service in [`Metered`] (on the facade: `dlock::builder(url).with_metrics()`) and
/// install an exporter in the application. Every metric is labelled `backend`; with
/// [`Metered::with_key_labels`] also `key` — off by default, since lock names can be unbounded
/// (one per invoice, say) and every name would become a time series.
///
/// | metric | kind | labels | what |
/// |---|---|---|---|
/// | `dlock_acquisitions_total` | counter | `outcome` | acquire attempts by outcome: `acquired`, `busy` (a try that found the lock held), `timeout`, or the error's kind (`unavailable`, `backend_error`, …) |
/// | `dlock_acquire_wait_seconds` | histogram | | from the start of an acquire to its grant |
/// | `dlock_hold_seconds` | histogram | | from a grant to its release, or to the moment the lease was found lost |
/// | `dlock_leases_lost_total` | counter | `reason` | leases found gone at a renewal or release: `expired` (nobody held it any more) or `taken_over` (another owner held it) |
/// | `dlock_renewals_total` | counter | | successful renewals (auto-renew and explicit extends) |
/// | `dlock_renewal_failures_total` | counter | `outcome` | renewals that got no answer, by the error's kind (the lease is uncertain, not lost) |
/// | `dlock_leases_held` | gauge | | leases granted through this handle and not yet released or found lost |
/// | `dlock_acquires_waiting` | gauge | | waiting acquires in flight |
/// | `dlock_clock_jumps_total` | counter | `direction` | a server's clock seen running `ahead` of the client's or going `behind` it at a renewal (Redis and Redlock; see [`clock`](crate::backend::clock)). Counted by the backend itself, with or without this layer |
///
/// A lease that a session-based backend (ZooKeeper, etcd) loses when its session ends is counted
/// when its holder next renews or releases it, since only then does a call pass this layer.
pub struct Metered<S> {
    inner: S,
    key_labels: bool,
    /// The instruments without a key label, registered once, at the first call (with the
    /// recorder installed by then): a call then costs an atomic update, not a registry lookup.
    /// `None` with key labels.
    fixed: Option<OnceLock<Fixed>>,
    /// When each lease still held through this handle was granted, by its (random) owner token.
    held: Mutex<HashMap<OwnerToken, Instant>>,
}

/// The outcome words an acquire is counted by (see [`Outcome`]).
const ACQUIRE_OUTCOMES: [&str; 9] = [
    "acquired",
    "busy",
    "timeout",
    "lost",
    "not_owner",
    "unavailable",
    "invalid_input",
    "backend_error",
    "unsupported",
];

/// The reasons a lease is found lost.
const LOST_REASONS: [&str; 2] = ["expired", "taken_over"];

/// Instruments registered once, each with its metric name and the value of its extra label.
struct Fixed {
    counters: Vec<(&'static str, Option<&'static str>, Counter)>,
    histograms: Vec<(&'static str, Histogram)>,
    gauges: Vec<(&'static str, Gauge)>,
}

impl Fixed {
    fn new(backend: &'static str) -> Self {
        let labels = |extra: Option<(&'static str, &'static str)>| {
            let mut labels = vec![Label::new("backend", backend)];
            labels.extend(extra.map(|(name, value)| Label::new(name, value)));
            labels
        };
        let mut counters = Vec::new();
        let mut add = |name: &'static str, label: &'static str, values: &[&'static str]| {
            for &value in values {
                let counter = counter!(name, labels(Some((label, value))));
                counters.push((name, Some(value), counter));
            }
        };
        add("dlock_acquisitions_total", "outcome", &ACQUIRE_OUTCOMES);
        add(
            "dlock_renewal_failures_total",
            "outcome",
            &ACQUIRE_OUTCOMES[2..],
        );
        add("dlock_leases_lost_total", "reason", &LOST_REASONS);
        counters.push((
            "dlock_renewals_total",
            None,
            counter!("dlock_renewals_total", labels(None)),
        ));
        Fixed {
            counters,
            histograms: ["dlock_acquire_wait_seconds", "dlock_hold_seconds"]
                .map(|name| (name, histogram!(name, labels(None))))
                .into(),
            gauges: ["dlock_leases_held", "dlock_acquires_waiting"]
                .map(|name| (name, gauge!(name, labels(None))))
                .into(),
        }
    }
}

impl<S: DistributedLock> Metered<S> {
    /// `service`, metered, with `backend` labels only.
    pub fn new(service: S) -> Self {
        describe();
        Metered {
            inner: service,
            key_labels: false,
            fixed: Some(OnceLock::new()),
            held: Mutex::default(),
        }
    }

    /// Adds a `key` label to every metric. Only for a bounded set of lock names.
    pub fn with_key_labels(mut self) -> Self {
        self.key_labels = true;
        self.fixed = None;
        self
    }

    fn labels(&self, key: &LockKey, extra: Option<(&'static str, &'static str)>) -> Vec<Label> {
        let mut labels = vec![Label::new("backend", self.inner.backend_name())];
        if self.key_labels {
            labels.push(Label::new("key", key.as_str().to_owned()));
        }
        if let Some((name, value)) = extra {
            labels.push(Label::new(name, value));
        }
        labels
    }

    fn fixed(&self) -> Option<&Fixed> {
        let cell = self.fixed.as_ref()?;
        Some(cell.get_or_init(|| Fixed::new(self.inner.backend_name())))
    }

    fn counter(
        &self,
        key: &LockKey,
        name: &'static str,
        extra: Option<(&'static str, &'static str)>,
    ) -> Counter {
        let value = extra.map(|(_, value)| value);
        let fixed = self.fixed().and_then(|fixed| {
            fixed
                .counters
                .iter()
                .find(|(n, v, _)| *n == name && *v == value)
        });
        match fixed {
            Some((_, _, counter)) => counter.clone(),
            None => counter!(name, self.labels(key, extra)),
        }
    }

    fn histogram(&self, key: &LockKey, name: &'static str) -> Histogram {
        let fixed = self
            .fixed()
            .and_then(|fixed| fixed.histograms.iter().find(|(n, _)| *n == name));
        match fixed {
            Some((_, histogram)) => histogram.clone(),
            None => histogram!(name, self.labels(key, None)),
        }
    }

    fn gauge(&self, key: &LockKey, name: &'static str) -> Gauge {
        let fixed = self
            .fixed()
            .and_then(|fixed| fixed.gauges.iter().find(|(n, _)| *n == name));
        match fixed {
            Some((_, gauge)) => gauge.clone(),
            None => gauge!(name, self.labels(key, None)),
        }
    }

    fn held(&self) -> MutexGuard<'_, HashMap<OwnerToken, Instant>> {
        // The map is consistent after every statement; a panic elsewhere cannot break it.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn attempted<T: Outcome>(&self, key: &LockKey, result: &T) {
        let outcome = result.outcome();
        self.counter(key, "dlock_acquisitions_total", Some(("outcome", outcome)))
            .increment(1);
    }

    fn granted(&self, req: &LockRequest<'_>, started: Instant) {
        self.histogram(req.key, "dlock_acquire_wait_seconds")
            .record(started.elapsed().as_secs_f64());
        let fresh = self.held().insert(req.owner, Instant::now()).is_none();
        if fresh {
            self.gauge(req.key, "dlock_leases_held").increment(1.0);
        }
    }

    /// The lease ended (released, or found lost): its hold time, once. Whether it was still
    /// counted as held: a lease found lost again, or an abandoned acquire cleaned up by owner
    /// token, is not a new ending.
    fn ended(&self, lease: &LeaseRef<'_>) -> bool {
        let Some(since) = self.held().remove(&lease.owner) else {
            return false;
        };
        self.histogram(lease.key, "dlock_hold_seconds")
            .record(since.elapsed().as_secs_f64());
        self.gauge(lease.key, "dlock_leases_held").decrement(1.0);
        true
    }

    fn lost(&self, lease: &LeaseRef<'_>, reason: &'static str) {
        if self.ended(lease) {
            self.counter(
                lease.key,
                "dlock_leases_lost_total",
                Some(("reason", reason)),
            )
            .increment(1);
        }
    }

    fn renewed(&self, lease: &LeaseRef<'_>, result: &Result<Extension>) {
        match result {
            Ok(answer) if answer.is_extended() => self
                .counter(lease.key, "dlock_renewals_total", None)
                .increment(1),
            Ok(answer) => self.lost(lease, answer.outcome()),
            Err(error) => self
                .counter(
                    lease.key,
                    "dlock_renewal_failures_total",
                    Some(("outcome", error.outcome())),
                )
                .increment(1),
        }
    }
}

/// Names the metrics once per process for exporters that print help texts; repeating it is
/// harmless.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "dlock_acquisitions_total",
        "Lock acquire attempts by outcome."
    );
    describe_histogram!(
        "dlock_acquire_wait_seconds",
        Unit::Seconds,
        "Time from the start of an acquire to its grant."
    );
    describe_histogram!(
        "dlock_hold_seconds",
        Unit::Seconds,
        "Time from a grant to its release or to the lease found lost."
    );
    describe_counter!(
        "dlock_leases_lost_total",
        "Leases found gone at a renewal or release, by reason."
    );
    describe_counter!("dlock_renewals_total", "Successful lease renewals.");
    describe_counter!(
        "dlock_renewal_failures_total",
        "Lease renewals that got no answer, by error kind."
    );
    describe_gauge!(
        "dlock_leases_held",
        "Leases granted through this handle and not yet ended."
    );
    describe_gauge!("dlock_acquires_waiting", "Waiting acquires in flight.");
}

/// Counts one waiting acquire while it is in flight, however it ends (a dropped acquire too).
struct Waiting(Gauge);

impl Waiting {
    fn start(gauge: Gauge) -> Self {
        gauge.increment(1.0);
        Waiting(gauge)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// The service's own `Debug`: the counters are no state worth showing.
impl<S: fmt::Debug> fmt::Debug for Metered<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

#[async_trait]
impl<S: DistributedLock> Layer for Metered<S> {
    fn inner(&self) -> &dyn DistributedLock {
        &self.inner
    }

    /// The primitive's view is metered too, with the same labels.
    fn primitive(&self, primitive: &Primitive) -> Result<Arc<dyn DistributedLock>> {
        let view = Metered::new(self.inner.primitive(primitive)?);
        Ok(Arc::new(if self.key_labels {
            view.with_key_labels()
        } else {
            view
        }))
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        let started = Instant::now();
        let result = self.inner.try_lock(req).await;
        self.attempted(req.key, &result);
        if let Ok(Attempt::Acquired(_)) = &result {
            self.granted(req, started);
        }
        result
    }

    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        let started = Instant::now();
        let waiting = Waiting::start(self.gauge(req.key, "dlock_acquires_waiting"));
        let result = self.inner.lock(req, deadline, retry).await;
        drop(waiting);
        self.attempted(req.key, &result);
        if result.is_ok() {
            self.granted(req, started);
        }
        result
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        let result = self.inner.extend(lease, ttl).await;
        self.renewed(lease, &result);
        result
    }

    async fn extend_many(&self, requests: &[ExtendRequest<'_>]) -> Vec<Result<Extension>> {
        let results = self.inner.extend_many(requests).await;
        for (request, result) in requests.iter().zip(&results) {
            self.renewed(&request.lease, result);
        }
        results
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        let result = self.inner.release(lease).await;
        match &result {
            Ok(Released::Released) | Err(_) => {
                self.ended(lease);
            }
            Ok(answer) => self.lost(lease, answer.outcome()),
        }
        result
    }
}
