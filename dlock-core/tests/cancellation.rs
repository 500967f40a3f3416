//! Cancellation: a dropped acquire never leaves a lock held until its TTL.

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{DistributedLock, DistributedLockExt, Lease};
use support::{grants, grants_once_settled, opts, settle, Scripted};
use tokio::time::Instant;

/// A scripted backend whose key "k" is held for a minute, and that lease.
async fn k_held() -> (Scripted, Arc<dyn DistributedLock>, Lease) {
    let backend = Scripted::new();
    let locks = backend.shared();
    let holder = locks
        .acquire("k", &opts(60_000))
        .await
        .expect("the free key \"k\"");
    (backend, locks, holder)
}

#[tokio::test(start_paused = true)]
async fn an_acquire_dropped_after_the_grant_releases_what_it_took() {
    let backend = Scripted::new();
    Scripted::set(&backend.faults.hang_after_grant, true);
    let locks = backend.shared();
    let dropped =
        tokio::time::timeout(Duration::from_millis(50), locks.acquire("k", &opts(60_000))).await;
    assert!(dropped.is_err(), "the reply never came");
    Scripted::set(&backend.faults.hang_after_grant, false);
    settle().await;
    let start = Instant::now();
    assert!(grants(&locks, "k", &opts(60_000)).await);
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "released at once, not after the 60 s TTL"
    );
    assert_eq!(Scripted::count(&backend.calls.release), 1);
}

#[tokio::test(start_paused = true)]
async fn a_try_acquire_dropped_after_the_grant_releases_too() {
    let backend = Scripted::new();
    Scripted::set(&backend.faults.hang_after_grant, true);
    let locks = backend.shared();
    let dropped = tokio::time::timeout(
        Duration::from_millis(50),
        locks.try_acquire("k", &opts(60_000)),
    )
    .await;
    assert!(dropped.is_err());
    Scripted::set(&backend.faults.hang_after_grant, false);
    assert!(grants_once_settled(&locks, "k", &opts(60_000)).await);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_dropped_mid_wait_leaves_nothing_held() {
    let (_backend, locks, holder) = k_held().await;
    let waiting = tokio::time::timeout(
        Duration::from_millis(300),
        locks.acquire("k", &opts(60_000)),
    )
    .await;
    assert!(waiting.is_err());
    holder.release().await.unwrap();
    assert!(grants_once_settled(&locks, "k", &opts(60_000)).await);
}

#[tokio::test(start_paused = true)]
async fn a_busy_answer_costs_no_cleanup_round_trip() {
    let (backend, locks, _holder) = k_held().await;
    for _ in 0..5 {
        assert!(!grants(&locks, "k", &opts(60_000)).await);
    }
    settle().await;
    assert_eq!(backend.calls.release.load(Ordering::SeqCst), 0);
}
