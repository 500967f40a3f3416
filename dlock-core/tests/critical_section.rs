//! Guarded work: released afterwards, cancelled when the lease is lost.

mod support;

use std::time::Duration;

use dlock_core::{DistributedLockExt, LeaseEnd, LockOptions, LostReason, Released};
use support::{grants, memory};

#[tokio::test(start_paused = true)]
async fn finished_work_is_released() {
    let locks = memory();
    let opts = LockOptions::new(Duration::from_secs(5));
    let done = locks
        .with_lock("k", &opts, |lease| async move {
            lease.fencing_token().get() * 10
        })
        .await
        .unwrap();
    assert_eq!(done.output, Some(10));
    assert!(matches!(done.end, LeaseEnd::Released(Released::Released)));
    assert!(done.completed_under_lock());
    assert!(grants(&locks, "k", &opts).await);
}

#[tokio::test(start_paused = true)]
async fn work_outliving_its_lease_is_cancelled() {
    let locks = memory();
    let opts = LockOptions::new(Duration::from_millis(500));
    let done = locks
        .with_lock("k", &opts, |_| async {
            tokio::time::sleep(Duration::from_secs(10)).await;
            "finished"
        })
        .await
        .unwrap();
    assert_eq!(done.output, None);
    assert!(matches!(done.end, LeaseEnd::Lost(LostReason::Expired)));
    assert!(!done.completed_under_lock());
}

#[tokio::test(start_paused = true)]
async fn auto_renew_lets_long_work_finish() {
    let locks = memory();
    let opts = LockOptions::new(Duration::from_millis(500)).with_auto_renew();
    let done = locks
        .with_lock("k", &opts, |lease| async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            lease.is_held()
        })
        .await
        .unwrap();
    assert_eq!(done.output, Some(true));
    assert!(done.completed_under_lock());
}
