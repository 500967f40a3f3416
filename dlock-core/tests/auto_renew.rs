//! Auto-renew: keeps a lease past many TTLs, reports trouble, stops when told.

mod support;

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{
    AutoRenew, DistributedLock, DistributedLockExt, Lease, LeaseState, LockOptions, LostReason,
};
use support::{assert_no_more_calls, grants, settle, Scripted};
use tokio::time::Instant;

fn renewing(ttl_ms: u64) -> LockOptions {
    LockOptions::new(Duration::from_millis(ttl_ms)).with_auto_renew()
}

/// A scripted backend and a lease of "k" on it, renewed automatically with a 900 ms TTL.
async fn renewing_lease() -> (Scripted, Arc<dyn DistributedLock>, Lease) {
    let backend = Scripted::new();
    let locks = backend.shared();
    match locks.acquire("k", &renewing(900)).await {
        Ok(lease) => (backend, locks, lease),
        Err(e) => panic!("acquire: {e}"),
    }
}

#[tokio::test(start_paused = true)]
async fn keeps_the_lock_past_several_ttls_and_stops_after_release() {
    let (backend, locks, lease) = renewing_lease().await;
    tokio::time::sleep(Duration::from_millis(900 * 5)).await;
    assert!(lease.is_held());
    assert!(!grants(&locks, "k", &renewing(900)).await);
    let renewals = Scripted::count(&backend.calls.extend);
    assert!(
        (14..=16).contains(&renewals),
        "about every ttl/3: {renewals}"
    );
    lease.release().await.unwrap();
    let wait = Duration::from_millis(900 * 5);
    assert_no_more_calls(&backend.calls.extend, renewals, wait).await;
}

#[tokio::test(start_paused = true)]
async fn stops_when_the_lease_is_dropped() {
    let (backend, _locks, lease) = renewing_lease().await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    drop(lease);
    settle().await;
    let renewals = Scripted::count(&backend.calls.extend);
    let wait = Duration::from_millis(5_000);
    assert_no_more_calls(&backend.calls.extend, renewals, wait).await;
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_make_it_uncertain_then_lost_at_the_deadline() {
    let (backend, _locks, lease) = renewing_lease().await;
    Scripted::set(&backend.faults.fail_extend, true);
    let deadline = lease.valid_until();
    tokio::time::sleep(Duration::from_millis(301)).await;
    assert!(matches!(lease.state(), LeaseState::Uncertain { until } if until == deadline));
    let start = Instant::now();
    assert_eq!(lease.lost().await, LostReason::Expired);
    assert_eq!(start + (deadline - start), Instant::now());
    // Lost is terminal even if the backend recovers.
    Scripted::set(&backend.faults.fail_extend, false);
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert!(lease.state().is_lost());
}

#[tokio::test(start_paused = true)]
async fn a_renewal_that_recovers_in_time_returns_to_held() {
    let (backend, _locks, lease) = renewing_lease().await;
    Scripted::set(&backend.faults.fail_extend, true);
    tokio::time::sleep(Duration::from_millis(301)).await;
    assert!(matches!(lease.state(), LeaseState::Uncertain { .. }));
    Scripted::set(&backend.faults.fail_extend, false);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(lease.is_held(), "{:?}", lease.state());
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    assert!(lease.is_held());
}

#[tokio::test(start_paused = true)]
async fn a_renewal_that_finds_another_owner_marks_the_lease_lost_at_once() {
    let (backend, _locks, lease) = renewing_lease().await;
    Scripted::set(&backend.faults.extend_taken_over, true);
    let start = Instant::now();
    assert_eq!(lease.lost().await, LostReason::TakenOver);
    assert_eq!(start.elapsed(), Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn max_hold_ends_renewal() {
    let backend = Scripted::new();
    let locks = backend.shared();
    let opts = LockOptions::new(Duration::from_millis(900)).with_renewal(AutoRenew {
        interval: None,
        max_hold: Some(Duration::from_millis(2_000)),
    });
    let start = Instant::now();
    let lease = locks.acquire("k", &opts).await.unwrap();
    assert_eq!(lease.lost().await, LostReason::Expired);
    let held = start.elapsed();
    assert!(
        held >= Duration::from_millis(2_000) && held <= Duration::from_millis(2_000 + 900),
        "held {held:?}"
    );
    // The server frees it too.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(grants(&locks, "k", &opts).await);
}
