//! Backend-level tests of the in-process lock: the raw contract, on tokio's paused clock.

use super::*;
use crate::inspect::Holder;

fn key(k: &str) -> LockKey {
    LockKey::new(k).unwrap()
}

fn req(key: &LockKey, owner: OwnerToken, ttl_ms: u64) -> LockRequest<'_> {
    LockRequest {
        key,
        owner,
        ttl: Duration::from_millis(ttl_ms),
    }
}

fn lease(key: &LockKey, owner: OwnerToken) -> LeaseRef<'_> {
    LeaseRef {
        key,
        owner,
        fencing: None,
    }
}

/// A fresh lock, the key "k" and two owners.
fn two_owners() -> (InMemoryLock, LockKey, OwnerToken, OwnerToken) {
    (
        InMemoryLock::new(),
        key("k"),
        OwnerToken::random(),
        OwnerToken::random(),
    )
}

/// `owner` takes the free `key` for `ttl_ms`: the grant.
async fn take(m: &InMemoryLock, key: &LockKey, owner: OwnerToken, ttl_ms: u64) -> Grant {
    match m.try_lock(&req(key, owner, ttl_ms)).await.unwrap() {
        Attempt::Acquired(g) => g,
        Attempt::Busy { .. } => panic!("expected a grant, got busy"),
    }
}

#[tokio::test(start_paused = true)]
async fn second_owner_is_busy_until_expiry() {
    let (m, k, a, b) = two_owners();
    let first = take(&m, &k, a, 1000).await;
    match m.try_lock(&req(&k, b, 1000)).await.unwrap() {
        Attempt::Busy { retry_after } => assert_eq!(retry_after, Some(Duration::from_millis(1000))),
        other => panic!("{other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let second = take(&m, &k, b, 1000).await;
    assert!(second.fencing > first.fencing);
}

#[tokio::test(start_paused = true)]
async fn release_and_extend_check_ownership() {
    let (m, k, a, b) = two_owners();
    take(&m, &k, a, 1000).await;
    assert_eq!(m.release(&lease(&k, b)).await.unwrap(), Released::TakenOver);
    assert_eq!(
        m.extend(&lease(&k, b), Duration::from_secs(5))
            .await
            .unwrap(),
        Extension::TakenOver
    );
    assert_eq!(
        m.extend(&lease(&k, a), Duration::from_secs(5))
            .await
            .unwrap(),
        Extension::Extended
    );
    tokio::time::sleep(Duration::from_millis(4999)).await;
    assert!(matches!(
        m.try_lock(&req(&k, b, 10)).await.unwrap(),
        Attempt::Busy { .. }
    ));
    assert_eq!(m.release(&lease(&k, a)).await.unwrap(), Released::Released);
    assert_eq!(m.release(&lease(&k, a)).await.unwrap(), Released::Expired);
    assert_eq!(
        m.entries(),
        0,
        "a released key with no waiters leaves no entry"
    );
}

#[tokio::test(start_paused = true)]
async fn expired_lease_cannot_be_extended_or_released_over_the_successor() {
    let (m, k, a, b) = two_owners();
    take(&m, &k, a, 100).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        m.extend(&lease(&k, a), Duration::from_secs(1))
            .await
            .unwrap(),
        Extension::Expired,
        "extend must not revive an expired lock"
    );
    take(&m, &k, b, 1000).await;
    assert_eq!(m.release(&lease(&k, a)).await.unwrap(), Released::TakenOver);
    assert!(matches!(
        m.try_lock(&req(&k, a, 10)).await.unwrap(),
        Attempt::Busy { .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn tokens_increase_across_keys_and_holders() {
    let m = InMemoryLock::new();
    let mut last = FencingToken(0);
    for i in 0..50 {
        let k = key(if i % 2 == 0 { "even" } else { "odd" });
        let owner = OwnerToken::random();
        let g = take(&m, &k, owner, 1000).await;
        assert!(g.fencing > last);
        last = g.fencing;
        m.release(&lease(&k, owner)).await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn release_wakes_a_waiter_at_once() {
    let m = InMemoryLock::new();
    let k = key("k");
    let a = OwnerToken::random();
    take(&m, &k, a, 60_000).await;
    let waiter = {
        let m = m.clone();
        let k = k.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            m.wait_for_release(&k, start + Duration::from_secs(30))
                .await
                .unwrap();
            start.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    m.release(&lease(&k, a)).await.unwrap();
    let waited = waiter.await.unwrap();
    assert_eq!(waited, Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn waiter_wakes_at_the_holders_expiry() {
    let m = InMemoryLock::new();
    let k = key("k");
    take(&m, &k, OwnerToken::random(), 700).await;
    let start = Instant::now();
    m.wait_for_release(&k, start + Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(700));
}

#[tokio::test(start_paused = true)]
async fn abandoned_entries_are_swept() {
    let m = InMemoryLock::new();
    for i in 0..(SWEEP_EVERY as usize) {
        let k = key(&format!("k{i}"));
        take(&m, &k, OwnerToken::random(), 10).await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        m.entries(),
        SWEEP_EVERY as usize,
        "expired entries linger until a sweep"
    );
    let k = key("busy");
    for _ in 0..SWEEP_EVERY {
        let owner = OwnerToken::random();
        take(&m, &k, owner, 10).await;
        m.release(&lease(&k, owner)).await.unwrap();
    }
    assert!(m.entries() <= 1, "{} entries left", m.entries());
}

#[tokio::test(start_paused = true)]
async fn inspect_reads_the_holder_without_taking_the_lock() {
    let locks = InMemoryLock::new();
    let k = key("k");
    assert_eq!(locks.inspect(&k).await.unwrap(), Holding::Free);
    let grant = take(&locks, &k, OwnerToken::random(), 100).await;
    match locks.inspect(&k).await.unwrap() {
        Holding::Held(Holder {
            fencing,
            expires_in,
            ..
        }) => {
            assert_eq!(fencing, Some(grant.fencing));
            assert!(expires_in.is_some_and(|left| left <= Duration::from_millis(100)));
        }
        other => panic!("expected held, got {other:?}"),
    }
    // Looking did not take anything: once the TTL passes the key is free for the next owner.
    tokio::time::advance(Duration::from_millis(101)).await;
    assert_eq!(locks.inspect(&k).await.unwrap(), Holding::Free);
    let next = take(&locks, &k, OwnerToken::random(), 100).await;
    assert_eq!(next.fencing.0, grant.fencing.0 + 1);
}
