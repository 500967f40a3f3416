//! The lease: its three states, the lost signal, extend, release outcomes, drop.

mod support;

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{
    DistributedLock, DistributedLockExt, Error, InMemoryLock, LeaseState, LostReason, Released,
};
use support::{grants, memory, opts, settle};
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn held_until_the_validity_deadline_then_lost() {
    let locks = memory();
    let lease = locks.acquire("k", &opts(1_000)).await.unwrap();
    let until = lease.valid_until();
    assert_eq!(lease.state(), LeaseState::Held { until });
    tokio::time::sleep_until(until).await;
    assert_eq!(lease.state(), LeaseState::Lost(LostReason::Expired));
    assert!(!lease.is_held());
}

#[tokio::test(start_paused = true)]
async fn lost_future_fires_at_expiry_without_a_server_call() {
    let locks = memory();
    let lease = locks.acquire("k", &opts(1_000)).await.unwrap();
    let start = Instant::now();
    assert_eq!(lease.lost().await, LostReason::Expired);
    assert_eq!(start.elapsed(), Duration::from_millis(1_000 - 12));
}

#[tokio::test(start_paused = true)]
async fn watchers_see_release_and_drop_at_once() {
    let locks = memory();
    let lease = locks.acquire("a", &opts(60_000)).await.unwrap();
    let watch = lease.watch();
    assert_eq!(watch.fencing_token(), lease.fencing_token());
    assert_eq!(watch.key(), "a");
    let lost = tokio::spawn(async move { watch.lost().await });
    lease.release().await.unwrap();
    assert_eq!(lost.await.unwrap(), LostReason::Released);

    let lease = locks.acquire("b", &opts(60_000)).await.unwrap();
    let watch = lease.watch();
    drop(lease);
    assert_eq!(watch.state(), LeaseState::Lost(LostReason::Released));
}

#[tokio::test(start_paused = true)]
async fn extend_prolongs_the_deadline() {
    let locks = memory();
    let mut lease = locks.acquire("k", &opts(1_000)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let sent = Instant::now();
    lease.extend(Duration::from_millis(2_000)).await.unwrap();
    assert_eq!(
        lease.valid_until(),
        sent + Duration::from_millis(2_000 - 22)
    );
    assert_eq!(lease.ttl(), Duration::from_millis(2_000));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(lease.is_held());
    // The server agrees: nobody else can take it.
    assert!(!grants(&locks, "k", &opts(1_000)).await);
}

#[tokio::test(start_paused = true)]
async fn extend_after_expiry_fails_as_lost() {
    let locks = memory();
    let mut lease = locks.acquire("k", &opts(1_000)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let err = lease.extend(Duration::from_secs(5)).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Lost {
                reason: LostReason::Expired,
                ..
            }
        ),
        "{err}"
    );
    assert!(lease.state().is_lost());
    // Still lost afterwards: a late extend never resurrects a lease.
    assert!(lease.extend(Duration::from_secs(5)).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn extend_after_takeover_is_not_owner_and_leaves_the_successor_alone() {
    let locks = memory();
    let mut stale = locks.acquire("k", &opts(1_000)).await.unwrap();
    // The client still believes it is valid (huge drift allowance aside), the server does not.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let successor = locks.acquire("k", &opts(5_000)).await.unwrap();
    let err = stale.extend(Duration::from_secs(5)).await.unwrap_err();
    assert!(
        matches!(err, Error::Lost { .. } | Error::NotOwner { .. }),
        "{err}"
    );
    assert_eq!(stale.release().await.unwrap(), Released::TakenOver);
    assert!(successor.is_held());
    assert!(!grants(&locks, "k", &opts(1_000)).await);
    assert_eq!(successor.release().await.unwrap(), Released::Released);
}

#[tokio::test(start_paused = true)]
async fn release_says_what_happened() {
    let locks = memory();
    let lease = locks.acquire("k", &opts(1_000)).await.unwrap();
    assert_eq!(lease.release().await.unwrap(), Released::Released);
    let lease = locks.acquire("k", &opts(1_000)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(lease.release().await.unwrap(), Released::Expired);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_lease_releases_it_promptly() {
    let locks = memory();
    let lease = locks.acquire("k", &opts(60_000)).await.unwrap();
    drop(lease);
    settle().await;
    let start = Instant::now();
    assert!(grants(&locks, "k", &opts(1_000)).await);
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[test]
fn dropping_a_lease_outside_a_runtime_never_blocks_and_the_ttl_frees_it() {
    let backend = InMemoryLock::new();
    let locks: Arc<dyn DistributedLock> = Arc::new(backend.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let lease = rt.block_on(locks.acquire("k", &opts(200))).unwrap();
    drop(rt);
    drop(lease); // no runtime: nothing is spawned, nothing blocks
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        assert!(!grants(&locks, "k", &opts(200)).await);
        let lease = locks
            .acquire("k", &opts(200).with_wait(Duration::from_secs(5)))
            .await
            .unwrap();
        lease.release().await.unwrap();
    });
}

#[tokio::test(start_paused = true)]
async fn debug_output_does_not_reveal_the_owner_token() {
    let locks = memory();
    let lease = locks.acquire("k", &opts(1_000)).await.unwrap();
    let shown = format!("{lease:?}");
    assert!(!shown.contains(&lease.owner().to_hex()), "{shown}");
    assert!(shown.contains("fencing"), "{shown}");
}
