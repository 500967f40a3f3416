//! Auto-renew batches: one scheduler per backend handle renews every due lease in one call.

mod support;

use std::time::Duration;

use dlock_core::{DistributedLockExt, Lease, LockOptions, LostReason};
use support::{assert_no_more_calls, settle, Scripted};

fn renewing(ttl_ms: u64) -> LockOptions {
    LockOptions::new(Duration::from_millis(ttl_ms)).with_auto_renew()
}

async fn take(
    backend: &Scripted,
    count: usize,
    opts: &LockOptions,
) -> dlock_core::Result<Vec<Lease>> {
    let locks = backend.shared();
    let mut leases = Vec::with_capacity(count);
    for i in 0..count {
        leases.push(locks.acquire(&format!("k{i}"), opts).await?);
    }
    Ok(leases)
}

#[tokio::test(start_paused = true)]
async fn leases_taken_together_renew_in_one_batch_per_tick_on_one_timer() {
    let backend = Scripted::new();
    let leases = take(&backend, 1_000, &renewing(900)).await.unwrap();
    // One scheduler task, not one task per lease.
    let tasks = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    assert!(tasks <= 2, "{tasks} tasks alive for 1,000 renewing leases");
    tokio::time::sleep(Duration::from_millis(900 * 3)).await;
    // Renewals every 300 ms: at 300, 600, …, 2,700.
    let batches = Scripted::count(&backend.calls.extend_many);
    assert!((8..=9).contains(&batches), "{batches} batches");
    assert_eq!(Scripted::count(&backend.calls.extend), 1_000 * batches);
    assert_eq!(Scripted::count(&backend.calls.largest_batch), 1_000);
    assert!(leases.iter().all(Lease::is_held));
    for lease in leases {
        lease.release().await.unwrap();
    }
    settle().await;
    let wait = Duration::from_millis(900 * 3);
    assert_no_more_calls(&backend.calls.extend_many, batches, wait).await;
}

#[tokio::test(start_paused = true)]
async fn leases_taken_at_different_times_cost_a_bounded_number_of_batches() {
    let backend = Scripted::new();
    // Answers take a while, as on a network: an answer must not pull in the next few leases.
    backend
        .faults
        .batch_delay_ms
        .store(5, std::sync::atomic::Ordering::SeqCst);
    let locks = backend.shared();
    let opts = renewing(900);
    let mut leases = Vec::new();
    // 1,000 leases, one per millisecond.
    for i in 0..1_000 {
        leases.push(locks.acquire(&format!("k{i}"), &opts).await.unwrap());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (batches, extends) = (
        Scripted::count(&backend.calls.extend_many),
        Scripted::count(&backend.calls.extend),
    );
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let batches = Scripted::count(&backend.calls.extend_many) - batches;
    let extends = Scripted::count(&backend.calls.extend) - extends;
    // Each lease renews every 300 ms or a little earlier: 10 to 12 times in 3 s.
    assert!(
        (10_000..=12_000).contains(&extends),
        "{extends} renewals in 3 s"
    );
    // The scheduler wakes at most about eight times per interval, whatever the number of leases.
    assert!(batches <= 3_000 / 300 * 8 + 8, "{batches} batches in 3 s");
    assert!(leases.iter().all(Lease::is_held));
}

#[tokio::test(start_paused = true)]
async fn one_lease_taken_over_in_a_batch_is_lost_and_the_others_stay_held() {
    let backend = Scripted::new();
    let leases = take(&backend, 10, &renewing(900)).await.unwrap();
    backend
        .faults
        .taken_over_keys
        .lock()
        .unwrap()
        .insert("k3".to_owned());
    tokio::time::sleep(Duration::from_millis(301)).await;
    assert_eq!(leases[3].lost().await, LostReason::TakenOver);
    let extends = Scripted::count(&backend.calls.extend);
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    for (i, lease) in leases.iter().enumerate() {
        assert_eq!(lease.is_held(), i != 3, "lease {i}: {:?}", lease.state());
    }
    assert_eq!(
        Scripted::count(&backend.calls.extend) - extends,
        9 * 10,
        "the lost lease is not renewed again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failing_batch_makes_every_lease_uncertain_then_lost_at_its_deadline() {
    let backend = Scripted::new();
    let leases = take(&backend, 5, &renewing(900)).await.unwrap();
    support::Scripted::set(&backend.faults.fail_extend, true);
    tokio::time::sleep(Duration::from_millis(301)).await;
    assert!(leases
        .iter()
        .all(|l| matches!(l.state(), dlock_core::LeaseState::Uncertain { .. })));
    for lease in &leases {
        assert_eq!(lease.lost().await, LostReason::Expired);
    }
}

#[tokio::test(start_paused = true)]
async fn each_backend_handle_has_its_own_schedule() {
    let (a, b) = (Scripted::new(), Scripted::new());
    let _on_a = take(&a, 3, &renewing(900)).await.unwrap();
    let _on_b = take(&b, 4, &renewing(900)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(301)).await;
    assert_eq!(Scripted::count(&a.calls.extend_many), 1);
    assert_eq!(Scripted::count(&a.calls.largest_batch), 3);
    assert_eq!(Scripted::count(&b.calls.extend_many), 1);
    assert_eq!(Scripted::count(&b.calls.largest_batch), 4);
}

#[tokio::test(start_paused = true)]
async fn a_renewal_that_saw_the_server_clock_ahead_shortens_the_lease_and_renews_sooner() {
    let backend = Scripted::new();
    let locks = backend.shared();
    // TTL 900 ms: validity 889 ms (drift 11 ms), renewed every 300 ms.
    let lease = locks.acquire("k", &renewing(900)).await.unwrap();
    backend
        .faults
        .clock_ahead_ms
        .store(600, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(310)).await;
    // The renewal at 300 ms counted 889 − 600 = 289 ms of validity.
    let left = lease.valid_until() - tokio::time::Instant::now();
    assert!(
        left <= Duration::from_millis(289),
        "{left:?} left after a renewal that saw the clock 600 ms ahead"
    );
    assert!(lease.is_held());
    let renewals = Scripted::count(&backend.calls.extend_many);
    backend
        .faults
        .clock_ahead_ms
        .store(0, std::sync::atomic::Ordering::SeqCst);
    // The next renewal comes before half of that validity is gone (at 300 + 144 ms), not at
    // 600 ms, and grants the whole validity again.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(Scripted::count(&backend.calls.extend_many), renewals + 1);
    let left = lease.valid_until() - tokio::time::Instant::now();
    assert!(
        left > Duration::from_millis(800),
        "{left:?} left after a plain renewal"
    );
    lease.release().await.unwrap();
}
