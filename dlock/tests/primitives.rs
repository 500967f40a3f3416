//! The primitives through the facade: `Locks::semaphore`, `rw`, `election`, `acquire_all` and
//! `try_acquire_all` on `memory://` (also inside the tracing and metrics layers the URL asks
//! for), and the core's `Error::Unsupported` from a backend that serves none of them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use dlock::{
    DistributedLock, Error, InMemoryLock, Layer, LockOptions, Locks, Primitive, Primitives, Result,
};
use futures::StreamExt;

/// Every URL form of the in-process backend the tests use: plain, and inside both layers.
const MEMORY_URLS: [&str; 2] = [
    "memory://?ttl=10s",
    "memory://?ttl=10s&tracing=true&metrics=true",
];

fn opts() -> LockOptions {
    LockOptions::new(Duration::from_secs(10)).with_wait(Duration::from_secs(2))
}

#[tokio::test]
async fn semaphore_hands_out_its_permits_and_refuses_another_count() {
    for url in MEMORY_URLS {
        let locks = dlock::connect(url).await.unwrap();
        assert!(locks.backend().capabilities().primitives.semaphore, "{url}");
        let pool = locks.semaphore("pool", 2).unwrap();
        assert_eq!((pool.name(), pool.permits()), ("pool", 2));
        let one = pool.acquire(&opts()).await.unwrap();
        let two = pool
            .try_acquire(&opts())
            .await
            .unwrap()
            .expect("a second permit");
        assert!(two.fencing_token() > one.fencing_token(), "{url}");
        assert!(pool.try_acquire(&opts()).await.unwrap().is_none(), "{url}");
        // Another count while the name is in use: refused, nothing taken.
        let other = locks.semaphore("pool", 3).unwrap();
        let refused = other.try_acquire(&opts()).await;
        assert!(
            matches!(refused, Err(Error::Mismatch { .. })),
            "{url}: {refused:?}"
        );
        // A name used as a semaphore is another thing than the lock of that name.
        let lock = locks.try_acquire("pool", &opts()).await.unwrap();
        assert!(
            lock.is_some(),
            "{url}: the lock shares the semaphore's name"
        );
        one.release().await.unwrap();
        let three = pool.try_acquire(&opts()).await.unwrap();
        assert!(
            three.is_some(),
            "{url}: the released permit did not come back"
        );
    }
}

#[tokio::test]
async fn rw_shares_reads_and_orders_the_writer_after_them() {
    for url in MEMORY_URLS {
        let locks = dlock::connect(url).await.unwrap();
        let config = locks.rw("config").unwrap();
        let a = config.read(&opts()).await.unwrap();
        let b = config
            .try_read(&opts())
            .await
            .unwrap()
            .expect("readers share");
        assert!(config.try_write(&opts()).await.unwrap().is_none(), "{url}");
        let highest = a.fencing_token().max(b.fencing_token());
        let writing = {
            let config = config.clone();
            tokio::spawn(async move { config.write(&opts()).await })
        };
        // The waiting writer holds back a reader that comes after it.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(config.try_read(&opts()).await.unwrap().is_none(), "{url}");
        a.release().await.unwrap();
        b.release().await.unwrap();
        let writer = writing.await.unwrap().unwrap();
        assert!(writer.fencing_token() > highest, "{url}");
        assert!(config.try_read(&opts()).await.unwrap().is_none(), "{url}");
        writer.release().await.unwrap();
    }
}

#[tokio::test]
async fn election_publishes_the_leader_and_its_terms_in_order() {
    for url in MEMORY_URLS {
        let locks = dlock::connect(url).await.unwrap();
        let election = locks.election("scheduler").unwrap();
        assert_eq!(election.name(), "scheduler");
        assert!(election.leader().await.unwrap().is_none(), "{url}");
        let mut changes = Box::pin(election.observe());
        let first = election
            .campaign("a:1", &opts().with_auto_renew())
            .await
            .unwrap();
        let seen = changes.next().await.unwrap().unwrap();
        assert_eq!(
            (seen.value.as_deref(), seen.term),
            (Some("a:1"), Some(first.term())),
            "{url}"
        );
        let first_term = first.term();
        let next = {
            let election = election.clone();
            tokio::spawn(async move { election.campaign("b:2", &opts()).await })
        };
        first.resign().await.unwrap();
        let second = next.await.unwrap().unwrap();
        let seen = changes.next().await.unwrap().unwrap();
        assert_eq!(
            (seen.value.as_deref(), seen.term),
            (Some("b:2"), Some(second.term())),
            "{url}"
        );
        assert!(second.term() > first_term, "{url}");
        second.resign().await.unwrap();
    }
}

#[tokio::test]
async fn acquire_all_takes_every_key_or_none() {
    for url in MEMORY_URLS {
        let locks = dlock::connect(url).await.unwrap();
        let all = locks.acquire_all(&["b", "a"], &opts()).await.unwrap();
        let keys: Vec<&str> = all.leases().iter().map(|l| l.key()).collect();
        assert_eq!(keys, ["a", "b"], "{url}: not in key order");
        assert!(all.fencing_token("a").is_some() && all.fencing_token("c").is_none());
        // "b" is busy: nothing of ["b", "c"] is kept, and the wait runs out as a timeout.
        let none = locks.try_acquire_all(&["c", "b"], &opts()).await.unwrap();
        assert!(none.is_none(), "{url}");
        let short = opts().with_wait(Duration::from_millis(100));
        let timed_out = locks.acquire_all(&["c", "b"], &short).await;
        assert!(
            matches!(timed_out, Err(Error::Timeout { .. })),
            "{url}: {timed_out:?}"
        );
        assert!(
            locks.try_acquire("c", &opts()).await.unwrap().is_some(),
            "{url}"
        );
        all.release().await.unwrap();
        let bad = locks.try_acquire_all(&[], &opts()).await;
        assert!(
            matches!(bad, Err(Error::InvalidInput { .. })),
            "{url}: {bad:?}"
        );
    }
}

/// A backend that serves the lock and none of the primitives, as a network backend that has not
/// declared them does (the trait's default `primitive`).
#[derive(Debug)]
struct LockOnly(Arc<dyn DistributedLock>);

impl Layer for LockOnly {
    fn inner(&self) -> &dyn DistributedLock {
        self.0.as_ref()
    }

    fn backend_name(&self) -> &'static str {
        "lock-only"
    }

    fn capabilities(&self) -> dlock::Capabilities {
        self.0.capabilities().with_primitives(Primitives::NONE)
    }

    fn primitive(&self, primitive: &Primitive) -> Result<Arc<dyn DistributedLock>> {
        primitive.validate()?;
        Err(Error::Unsupported {
            backend: "lock-only",
            what: primitive.name(),
        })
    }
}

#[tokio::test]
async fn a_backend_without_primitives_says_unsupported_and_still_locks_several_keys() {
    let backend: Arc<dyn DistributedLock> = Arc::new(LockOnly(Arc::new(InMemoryLock::new())));
    let locks = Locks::new(backend, opts(), "lock-only://");
    let unsupported = |result: Result<()>, what: &str| match result {
        Err(e @ Error::Unsupported { .. }) => {
            assert_eq!(
                e.to_string(),
                format!("unsupported by the lock-only backend: {what}")
            );
        }
        other => panic!("{what}: expected Unsupported, got {other:?}"),
    };
    unsupported(locks.semaphore("s", 2).map(drop), "semaphore");
    unsupported(locks.rw("r").map(drop), "read lock");
    unsupported(locks.election("e").map(drop), "election");
    // Bad input is still bad input, checked first.
    assert!(matches!(
        locks.semaphore("s", 0),
        Err(Error::InvalidInput { .. })
    ));
    // acquire_all needs nothing but the lock.
    let all = locks.acquire_all(&["x", "y"], &opts()).await.unwrap();
    assert!(all.is_held());
    all.release().await.unwrap();
}
