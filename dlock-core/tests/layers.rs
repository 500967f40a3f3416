//! The tracing and metrics layers around the in-process backend: what they record for each call.
#![allow(clippy::unwrap_used)] // test helpers, not only #[test] functions

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::layer::{Metered, Traced};
use dlock_core::{Admin, DistributedLock, DistributedLockExt, InMemoryLock, LockOptions};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// One metric: its kind, name, labels and value.
type Metric = (MetricKind, String, Vec<(String, String)>, DebugValue);

/// Every metric of one snapshot, looked up by name and exact labels.
struct Seen(Vec<Metric>);

impl Seen {
    fn take(snapshotter: &Snapshotter) -> Seen {
        Seen(
            snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .map(|(key, _, _, value)| {
                    let labels = key
                        .key()
                        .labels()
                        .map(|l| (l.key().to_owned(), l.value().to_owned()))
                        .collect();
                    (key.kind(), key.key().name().to_owned(), labels, value)
                })
                .collect(),
        )
    }

    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<&DebugValue> {
        self.0.iter().find_map(|(_, n, l, value)| {
            let same = l.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v));
            (n == name && same).then_some(value)
        })
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.get(name, labels) {
            Some(DebugValue::Counter(n)) => *n,
            None => 0,
            other => panic!("{name} is {other:?}"),
        }
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        match self.get(name, labels) {
            Some(DebugValue::Gauge(v)) => v.into_inner(),
            other => panic!("{name} is {other:?}"),
        }
    }

    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        match self.get(name, labels) {
            Some(DebugValue::Histogram(v)) => v.iter().map(|x| x.into_inner()).collect(),
            other => panic!("{name} is {other:?}"),
        }
    }

    fn names_with_label(&self, label: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(_, _, l, _)| l.iter().any(|(k, _)| k == label))
            .map(|(_, n, _, _)| n.as_str())
            .collect()
    }
}

const MEMORY: &[(&str, &str)] = &[("backend", "memory")];

#[test]
fn metrics_count_outcomes_waits_holds_renewals_and_losses() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    runtime().block_on(async {
        let backend = InMemoryLock::new();
        let locks: Arc<dyn DistributedLock> = Arc::new(Metered::new(backend.clone()));
        let opts = LockOptions::new(Duration::from_secs(10));

        let mut first = locks.acquire("jobs/a", &opts).await.unwrap();
        assert!(locks.try_acquire("jobs/a", &opts).await.unwrap().is_none());
        let timed_out = locks
            .acquire("jobs/a", &opts.clone().with_wait(Duration::from_millis(50)))
            .await;
        assert!(timed_out.is_err());
        first.extend(Duration::from_secs(10)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        first.release().await.unwrap();

        // A waiter that is dropped leaves the waiting gauge where it was.
        let holder = locks.acquire("jobs/b", &opts).await.unwrap();
        let waiter = locks.acquire("jobs/b", &opts);
        assert!(tokio::time::timeout(Duration::from_millis(30), waiter)
            .await
            .is_err());

        // An eviction behind the holder's back: found lost at its next renewal.
        let mut evicted = holder;
        Admin::new(&locks)
            .force_unlock("jobs/b", Some(evicted.fencing_token()))
            .await
            .unwrap();
        assert!(evicted.extend(Duration::from_secs(10)).await.is_err());
        drop(evicted);
        tokio::task::yield_now().await;
    });
    let seen = Seen::take(&snapshotter);
    let with = |outcome| [("backend", "memory"), ("outcome", outcome)];
    assert_eq!(
        seen.counter("dlock_acquisitions_total", &with("acquired")),
        2
    );
    assert_eq!(seen.counter("dlock_acquisitions_total", &with("busy")), 1);
    assert_eq!(
        seen.counter("dlock_acquisitions_total", &with("timeout")),
        1
    );
    assert_eq!(seen.samples("dlock_acquire_wait_seconds", MEMORY).len(), 2);
    assert_eq!(seen.counter("dlock_renewals_total", MEMORY), 1);
    let expired = [("backend", "memory"), ("reason", "expired")];
    assert_eq!(seen.counter("dlock_leases_lost_total", &expired), 1);
    let holds = seen.samples("dlock_hold_seconds", MEMORY);
    assert_eq!(holds.len(), 2, "{holds:?}");
    assert!(holds[0] >= 0.02, "{holds:?}");
    assert_eq!(seen.gauge("dlock_leases_held", MEMORY), 0.0);
    assert_eq!(seen.gauge("dlock_acquires_waiting", MEMORY), 0.0);
    assert!(
        seen.names_with_label("key").is_empty(),
        "key labels without opting in"
    );
}

#[test]
fn key_labels_are_opt_in() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    runtime().block_on(async {
        let locks: Arc<dyn DistributedLock> =
            Arc::new(Metered::new(InMemoryLock::new()).with_key_labels());
        let lease = locks
            .acquire("jobs/c", &LockOptions::new(Duration::from_secs(10)))
            .await
            .unwrap();
        lease.release().await.unwrap();
    });
    let seen = Seen::take(&snapshotter);
    let labels = [
        ("backend", "memory"),
        ("key", "jobs/c"),
        ("outcome", "acquired"),
    ];
    assert_eq!(seen.counter("dlock_acquisitions_total", &labels), 1);
    assert_eq!(
        seen.gauge(
            "dlock_leases_held",
            &[("backend", "memory"), ("key", "jobs/c")]
        ),
        0.0
    );
}

/// Collects what the fmt subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn tracing_gives_each_call_a_span_with_its_outcome_and_token() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    runtime().block_on(async {
        let locks: Arc<dyn DistributedLock> = Arc::new(Traced::new(InMemoryLock::new()));
        let opts = LockOptions::new(Duration::from_secs(10));
        let mut lease = locks.acquire("jobs/d", &opts).await.unwrap();
        assert!(locks.try_acquire("jobs/d", &opts).await.unwrap().is_none());
        lease.extend(Duration::from_secs(10)).await.unwrap();
        lease.release().await.unwrap();
        let stuck = locks.acquire("jobs/e", &opts).await.unwrap();
        Admin::new(&locks)
            .force_unlock("jobs/e", None)
            .await
            .unwrap();
        drop(stuck);
    });
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let line = |span: &str, outcome: &str| {
        text.lines()
            .find(|l| {
                l.contains(&format!("{span}{{")) && l.contains(&format!("outcome=\"{outcome}\""))
            })
            .unwrap_or_else(|| panic!("no {span} span with outcome {outcome} in:\n{text}"))
            .to_owned()
    };
    let acquired = line("dlock.acquire", "acquired");
    assert!(acquired.contains("key=jobs/d"), "{acquired}");
    assert!(acquired.contains("backend=\"memory\""), "{acquired}");
    assert!(acquired.contains("fencing=1"), "{acquired}");
    assert!(acquired.contains("wait_ms="), "{acquired}");
    let busy = line("dlock.try_acquire", "busy");
    assert!(!busy.contains("fencing="), "{busy}");
    assert!(line("dlock.extend", "extended").contains("fencing=1"));
    assert!(line("dlock.release", "released").contains("fencing=1"));
    let evicted = line("dlock.evict", "evicted");
    assert!(evicted.contains("fencing=2"), "{evicted}");
    assert!(
        text.contains("forced unlock: holder evicted"),
        "no event names the evicted holder:\n{text}"
    );
}
