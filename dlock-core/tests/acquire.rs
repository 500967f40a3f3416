//! Acquiring: busy answers, waiting, deadlines, expiry of abandoned locks, validity, fencing.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{DistributedLockExt, Drift, Error, FencingToken, LostReason};
use support::{grants, grants_once_settled, memory, opts, take, Scripted};
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn try_acquire_answers_busy_without_waiting() {
    let locks = memory();
    let held = take(&locks, "k", &opts(10_000)).await;
    let start = Instant::now();
    assert!(!grants(&locks, "k", &opts(10_000)).await);
    assert_eq!(start.elapsed(), Duration::ZERO);
    held.release().await.unwrap();
    assert!(grants(&locks, "k", &opts(10_000)).await);
}

#[tokio::test(start_paused = true)]
async fn acquire_is_woken_by_release() {
    let locks = memory();
    let held = locks.acquire("k", &opts(60_000)).await.unwrap();
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let lease = locks.acquire("k", &opts(60_000)).await.unwrap();
            (start.elapsed(), lease)
        })
    };
    tokio::time::sleep(Duration::from_millis(1234)).await;
    let first = held.fencing_token();
    held.release().await.unwrap();
    let (waited, lease) = waiter.await.unwrap();
    assert_eq!(
        waited,
        Duration::from_millis(1234),
        "woken by the release, not a timer"
    );
    assert!(lease.fencing_token() > first);
}

#[tokio::test(start_paused = true)]
async fn acquire_gives_up_at_its_deadline() {
    let locks = memory();
    let _held = locks.acquire("k", &opts(60_000)).await.unwrap();
    let start = Instant::now();
    let err = locks
        .acquire("k", &opts(60_000).with_wait(Duration::from_millis(750)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert_eq!(start.elapsed(), Duration::from_millis(750));
    assert!(err.is_temporary());
}

#[tokio::test(start_paused = true)]
async fn abandoned_lock_is_taken_after_its_ttl() {
    let locks = memory();
    let abandoned = locks.acquire("k", &opts(2_000)).await.unwrap();
    std::mem::forget(abandoned); // a crashed holder: no release, no drop
    let start = Instant::now();
    let lease = locks.acquire("k", &opts(2_000)).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(2_000));
    assert_eq!(lease.fencing_token(), FencingToken(2));
}

#[tokio::test(start_paused = true)]
async fn validity_is_measured_from_before_the_request_minus_drift() {
    let backend = Scripted::new();
    backend.faults.reply_delay_ms.store(100, Ordering::SeqCst);
    let locks = backend.shared();
    let sent = Instant::now();
    let lease = locks.acquire("k", &opts(10_000)).await.unwrap();
    // ttl 10 s, allowance 10 s × 0.01 + 2 ms = 102 ms; the 100 ms reply delay is not added back.
    assert_eq!(
        lease.valid_until(),
        sent + Duration::from_millis(10_000 - 102)
    );
    assert_eq!(lease.remaining(), Duration::from_millis(10_000 - 102 - 100));
    assert_eq!(lease.acquired_at(), sent);
}

#[tokio::test(start_paused = true)]
async fn a_grant_that_arrives_too_late_is_released_not_returned() {
    let backend = Scripted::new();
    backend.faults.reply_delay_ms.store(500, Ordering::SeqCst);
    let locks = backend.shared();
    let err = locks.try_acquire("k", &opts(400)).await.unwrap_err();
    // No answer within the lease's validity reads as an unavailable service; a grant that did
    // arrive, too late, as a lease that expired.
    assert!(
        matches!(
            err,
            Error::Lost {
                reason: LostReason::Expired,
                ..
            } | Error::Unavailable { .. }
        ),
        "{err}"
    );
    backend.faults.reply_delay_ms.store(0, Ordering::SeqCst);
    // Nothing is left held by the useless grant.
    assert!(grants_once_settled(&locks, "k", &opts(400)).await);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_acquire_retries_after_a_late_grant() {
    let backend = Scripted::new();
    backend.faults.reply_delay_ms.store(500, Ordering::SeqCst);
    let locks = backend.shared();
    let err = locks
        .acquire("k", &opts(400).with_wait(Duration::from_secs(2)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(
        support::Scripted::count(&backend.calls.try_lock) >= 2,
        "it retried"
    );
    backend.faults.reply_delay_ms.store(0, Ordering::SeqCst);
    assert!(grants_once_settled(&locks, "k", &opts(400)).await);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_acquire_tries_again_after_passing_failures() {
    let backend = Scripted::new();
    backend
        .faults
        .unavailable_try_locks
        .store(3, Ordering::SeqCst);
    let locks = backend.shared();
    let lease = locks
        .acquire("k", &opts(10_000).with_wait(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(Scripted::count(&backend.calls.try_lock), 4);
    lease.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn failures_end_an_acquire_without_a_wait_limit_and_a_try_at_once() {
    let backend = Scripted::new();
    let locks = backend.shared();
    backend
        .faults
        .unavailable_try_locks
        .store(1, Ordering::SeqCst);
    let err = locks.acquire("k", &opts(10_000)).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    backend
        .faults
        .unavailable_try_locks
        .store(1, Ordering::SeqCst);
    let err = locks.try_acquire("k", &opts(10_000)).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    assert_eq!(Scripted::count(&backend.calls.try_lock), 2);
}

#[tokio::test(start_paused = true)]
async fn a_failure_that_persists_is_reported_after_a_few_tries_not_at_the_wait_s_end() {
    let backend = Scripted::new();
    backend
        .faults
        .unavailable_try_locks
        .store(usize::MAX, Ordering::SeqCst);
    let locks = backend.shared();
    let start = Instant::now();
    let err = locks
        .acquire("k", &opts(10_000).with_wait(Duration::from_secs(30)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(Scripted::count(&backend.calls.try_lock), 4, "four tries");
}

#[tokio::test(start_paused = true)]
async fn fencing_tokens_strictly_increase_across_release_and_expiry() {
    let locks = memory();
    let mut last = FencingToken(0);
    for round in 0..40 {
        let lease = locks.acquire("k", &opts(100)).await.unwrap();
        assert!(lease.fencing_token() > last, "round {round}");
        last = lease.fencing_token();
        if round % 2 == 0 {
            lease.release().await.unwrap();
        } else {
            std::mem::forget(lease);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn independent_keys_do_not_block_each_other() {
    let locks = memory();
    let _a = take(&locks, "a", &opts(10_000)).await;
    let _b = take(&locks, "b", &opts(10_000)).await;
    let _c = take(&locks, "a/b", &opts(10_000)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_under_contention() {
    let locks = memory();
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (locks, inside, overlaps) = (locks.clone(), inside.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            let o = opts(5_000).with_wait(Duration::from_secs(30));
            for _ in 0..100 {
                let lease = locks.acquire("hot", &o).await.unwrap();
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                lease.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn drift_is_subtracted_as_configured() {
    let locks = memory();
    let start = Instant::now();
    let o = opts(1_000).with_drift(Drift {
        factor: 0.1,
        fixed: Duration::from_millis(50),
    });
    let lease = locks.acquire("k", &o).await.unwrap();
    assert_eq!(lease.valid_until(), start + Duration::from_millis(850));
}

/// A task that takes and gives back a free lock in a loop, with no other await, still lets the
/// other tasks of its runtime run: an acquire spends the task's cooperative budget, as tokio's
/// own locks do. (The in-process lock answers at once, so such a loop never gave its thread
/// back: on a two-thread runtime, fifteen tasks that were to wait for the same key sat
/// unscheduled behind it for a whole 3 s benchmark window, while it took the key 3.4 million
/// times in a row.) On one thread, the task spawned after the loop runs before the loop ends.
#[tokio::test(flavor = "current_thread")]
async fn a_loop_of_acquires_lets_the_runtime_s_other_tasks_run() {
    const CYCLES: usize = 10_000;
    let locks = memory();
    let done = Arc::new(AtomicUsize::new(0));
    let looping = {
        let (locks, done) = (locks.clone(), done.clone());
        tokio::spawn(async move {
            for _ in 0..CYCLES {
                let lease = locks.acquire("tight", &opts(10_000)).await.unwrap();
                lease.release().await.unwrap();
                done.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let seen = tokio::spawn(async move { done.load(Ordering::Relaxed) })
        .await
        .unwrap();
    looping.await.unwrap();
    assert!(
        seen < CYCLES,
        "a task spawned after the loop ran only once all {CYCLES} cycles were done"
    );
}
