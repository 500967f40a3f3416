//! Backend-level tests of the in-process lock: the raw contract, on tokio's paused clock.

use super::*;
use crate::error::Error;
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

/// `owner`'s waiting `lock` of `key`, spawned: the grant when it comes.
fn wait_for(
    m: &InMemoryLock,
    key: &LockKey,
    owner: OwnerToken,
    ttl_ms: u64,
    deadline: Option<Instant>,
) -> tokio::task::JoinHandle<Result<Grant>> {
    let (m, key) = (m.clone(), key.clone());
    tokio::spawn(async move {
        m.lock(&req(&key, owner, ttl_ms), deadline, &Backoff::default())
            .await
    })
}

/// How many wait in `key`'s queue, as `inspect` tells.
async fn queued(m: &InMemoryLock, key: &LockKey) -> usize {
    match m.inspect(key).await.unwrap() {
        Holding::Held(holder) => holder.waiting.unwrap_or(0),
        _ => 0,
    }
}

/// Lets the spawned waiters run up to their next wait.
async fn let_run() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn releases_hand_the_key_to_waiters_in_arrival_order() {
    let m = InMemoryLock::new();
    let k = key("k");
    let first = OwnerToken::random();
    let mut last = take(&m, &k, first, 60_000).await.fencing;
    let owners: Vec<OwnerToken> = (0..4).map(|_| OwnerToken::random()).collect();
    let mut waiters = Vec::new();
    for owner in &owners {
        waiters.push(wait_for(&m, &k, *owner, 60_000, None));
        let_run().await;
    }
    assert_eq!(queued(&m, &k).await, 4);
    let mut holder = first;
    for (owner, waiter) in owners.iter().zip(waiters) {
        assert_eq!(
            m.release(&lease(&k, holder)).await.unwrap(),
            Released::Released
        );
        let grant = waiter.await.unwrap().unwrap();
        assert!(grant.fencing > last, "tokens grow along the queue");
        last = grant.fencing;
        holder = *owner;
    }
    m.release(&lease(&k, holder)).await.unwrap();
    assert_eq!(m.entries(), 0, "an emptied queue leaves no entry");
}

#[tokio::test(start_paused = true)]
async fn a_releaser_that_asks_again_queues_behind_earlier_waiters() {
    let (m, k, a, b) = two_owners();
    take(&m, &k, a, 60_000).await;
    let b_waits = wait_for(&m, &k, b, 60_000, None);
    let_run().await;
    m.release(&lease(&k, a)).await.unwrap();
    let a_again = OwnerToken::random();
    // The key is B's now, though B's task has not run yet: neither a try nor a wait jumps ahead.
    assert!(matches!(
        m.try_lock(&req(&k, a_again, 60_000)).await.unwrap(),
        Attempt::Busy { .. }
    ));
    let a_waits = wait_for(&m, &k, a_again, 60_000, None);
    b_waits.await.unwrap().unwrap();
    let_run().await;
    assert!(!a_waits.is_finished(), "A went ahead of B");
    m.release(&lease(&k, b)).await.unwrap();
    a_waits.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_expired_holder_hands_the_key_to_the_head_at_its_expiry() {
    let (m, k, a, b) = two_owners();
    take(&m, &k, a, 700).await;
    let start = Instant::now();
    let b_waits = wait_for(&m, &k, b, 60_000, None);
    let_run().await;
    // Past the expiry, before B's task runs: a stranger's try finds the key B's.
    tokio::time::advance(Duration::from_millis(700)).await;
    assert!(matches!(
        m.try_lock(&req(&k, OwnerToken::random(), 10))
            .await
            .unwrap(),
        Attempt::Busy { .. }
    ));
    let grant = b_waits.await.unwrap().unwrap();
    assert_eq!(grant.sent_at - start, Duration::from_millis(700));
}

#[tokio::test(start_paused = true)]
async fn the_next_head_wakes_at_a_shorter_lease_of_the_holder_before_it() {
    let (m, k, a, b) = two_owners();
    let c = OwnerToken::random();
    take(&m, &k, a, 60_000).await;
    // B asks for a short lease and never releases it; C must not sleep until A's long expiry.
    let b_waits = wait_for(&m, &k, b, 100, None);
    let_run().await;
    let c_waits = wait_for(&m, &k, c, 60_000, None);
    let_run().await;
    m.release(&lease(&k, a)).await.unwrap();
    let handed = Instant::now();
    b_waits.await.unwrap().unwrap();
    let grant = c_waits.await.unwrap().unwrap();
    assert_eq!(grant.sent_at - handed, Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_times_out_or_is_dropped_leaves_the_queue_and_passes_its_turn() {
    let m = InMemoryLock::new();
    let k = key("k");
    let holder = OwnerToken::random();
    take(&m, &k, holder, 60_000).await;
    let timed_out = wait_for(
        &m,
        &k,
        OwnerToken::random(),
        60_000,
        Some(Instant::now() + Duration::from_millis(50)),
    );
    let_run().await;
    let dropped = wait_for(&m, &k, OwnerToken::random(), 60_000, None);
    let_run().await;
    let last = OwnerToken::random();
    let last_waits = wait_for(&m, &k, last, 60_000, None);
    let_run().await;
    assert_eq!(queued(&m, &k).await, 3);
    assert!(matches!(
        timed_out.await.unwrap(),
        Err(Error::Timeout { .. })
    ));
    dropped.abort();
    let_run().await;
    assert_eq!(queued(&m, &k).await, 1, "only the last waiter is left");
    let released = Instant::now();
    m.release(&lease(&k, holder)).await.unwrap();
    let grant = last_waits.await.unwrap().unwrap();
    assert_eq!(grant.sent_at, released);
    m.release(&lease(&k, last)).await.unwrap();
    assert_eq!(m.entries(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_dropped_after_the_hand_off_passes_the_key_on() {
    let (m, k, a, b) = two_owners();
    let c = OwnerToken::random();
    take(&m, &k, a, 60_000).await;
    let b_waits = wait_for(&m, &k, b, 60_000, None);
    let_run().await;
    let c_waits = wait_for(&m, &k, c, 60_000, None);
    let_run().await;
    // Handed to B, whose task is dropped before it saw the grant: C is next at once.
    m.release(&lease(&k, a)).await.unwrap();
    b_waits.abort();
    let dropped = Instant::now();
    let grant = c_waits.await.unwrap().unwrap();
    assert_eq!(grant.sent_at, dropped);
    assert_eq!(m.release(&lease(&k, b)).await.unwrap(), Released::TakenOver);
}

#[tokio::test(start_paused = true)]
async fn a_zero_wait_on_a_busy_key_queues_nothing() {
    let (m, k, a, b) = two_owners();
    take(&m, &k, a, 60_000).await;
    let answer = m
        .lock(&req(&k, b, 1000), Some(Instant::now()), &Backoff::default())
        .await;
    assert!(matches!(answer, Err(Error::Timeout { .. })));
    assert_eq!(queued(&m, &k).await, 0);
}

#[tokio::test(start_paused = true)]
async fn the_lock_declares_its_fair_queue_and_the_primitives_do_not() {
    let m = InMemoryLock::new();
    assert!(m.capabilities().fair_queue);
    let view = m.primitive(&Primitive::semaphore(2)).unwrap();
    assert!(!view.capabilities().fair_queue);
}
