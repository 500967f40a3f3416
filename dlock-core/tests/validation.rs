//! Bad input: a clear error naming the field, nothing sent to the backend, nothing changed.

mod support;

use std::time::Duration;

use dlock_core::limits::{MAX_KEY_LEN, MAX_TTL, MAX_WAIT};
use dlock_core::{AutoRenew, Backoff, DistributedLockExt, Drift, Error, LockOptions};
use support::Scripted;

fn bad_options() -> Vec<(&'static str, LockOptions)> {
    let base = LockOptions::new(Duration::from_secs(1));
    vec![
        ("ttl", base.clone().with_ttl(Duration::ZERO)),
        ("ttl", base.clone().with_ttl(Duration::from_millis(1))),
        ("ttl", base.clone().with_ttl(MAX_TTL * 2)),
        ("ttl", base.clone().with_ttl(Duration::MAX)),
        ("wait", base.clone().with_wait(MAX_WAIT * 2)),
        ("wait", base.clone().with_wait(Duration::MAX)),
        (
            "drift",
            base.clone().with_drift(Drift {
                factor: 0.5,
                fixed: Duration::from_millis(500),
            }),
        ),
        (
            "drift.factor",
            base.clone().with_drift(Drift {
                factor: 2.0,
                fixed: Duration::ZERO,
            }),
        ),
        (
            "retry.initial",
            base.clone().with_retry(Backoff {
                initial: Duration::ZERO,
                ..Backoff::default()
            }),
        ),
        (
            "retry.max",
            base.clone().with_retry(Backoff {
                max: Duration::from_millis(1),
                ..Backoff::default()
            }),
        ),
        (
            "retry.multiplier",
            base.clone().with_retry(Backoff {
                multiplier: 0.0,
                ..Backoff::default()
            }),
        ),
        (
            "retry.jitter",
            base.clone().with_retry(Backoff {
                jitter: 7.0,
                ..Backoff::default()
            }),
        ),
        (
            "auto_renew.interval",
            base.clone().with_renewal(AutoRenew {
                interval: Some(Duration::from_secs(2)),
                max_hold: None,
            }),
        ),
        (
            "auto_renew.max_hold",
            base.clone().with_renewal(AutoRenew {
                interval: None,
                max_hold: Some(Duration::ZERO),
            }),
        ),
    ]
}

#[tokio::test(start_paused = true)]
async fn every_invalid_input_is_rejected_before_reaching_the_backend() {
    let backend = Scripted::new();
    let locks = backend.shared();
    let ok = LockOptions::new(Duration::from_secs(1));
    let long_key = "k".repeat(MAX_KEY_LEN + 1);
    let mut cases: Vec<(&str, &str, LockOptions)> = vec![
        ("key", "", ok.clone()),
        ("key", long_key.as_str(), ok.clone()),
    ];
    for (field, opts) in bad_options() {
        cases.push((field, "k", opts));
    }
    for (field, key, opts) in &cases {
        for attempt in 0..2 {
            let result = if attempt == 0 {
                locks.try_acquire(key, opts).await.map(|_| ())
            } else {
                locks.acquire(key, opts).await.map(|_| ())
            };
            match result {
                Err(Error::InvalidInput { field: f, message }) => {
                    assert_eq!(f, *field, "{message}");
                    assert!(!message.is_empty());
                }
                other => panic!("{field}: expected InvalidInput, got {other:?}"),
            }
        }
    }
    assert_eq!(Scripted::count(&backend.calls.try_lock), 0);
    assert_eq!(backend.inner.entries(), 0, "nothing was created");
}

#[tokio::test(start_paused = true)]
async fn an_invalid_extend_changes_nothing() {
    let backend = Scripted::new();
    let locks = backend.shared();
    let mut lease = locks
        .acquire("k", &LockOptions::new(Duration::from_secs(1)))
        .await
        .unwrap();
    let until = lease.valid_until();
    for ttl in [Duration::ZERO, MAX_TTL * 2] {
        let err = lease.extend(ttl).await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidInput { field: "ttl", .. }),
            "{err}"
        );
    }
    assert_eq!(Scripted::count(&backend.calls.extend), 0);
    assert_eq!(lease.valid_until(), until);
    assert!(lease.is_held());
}
