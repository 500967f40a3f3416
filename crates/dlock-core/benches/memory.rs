//! The cost of a lock cycle on the in-process backend, next to `tokio::sync::Mutex` as the floor.
//!
//! All cases sit in one criterion group, `lock_cycle`, so they print side by side:
//!
//! * `tokio_mutex/lock_unlock` — uncontended `lock().await` + drop: the floor.
//! * `memory/try_acquire_release` — uncontended `try_acquire` + `release().await` through
//!   `Arc<dyn DistributedLock>` wrapping [`InMemoryLock`], default [`LockOptions`] (no auto-renew).
//! * `memory/acquire_release` — the same with `acquire`.
//! * `memory/backend_try_lock_release` — the backend trait alone (`try_lock` + `release` on the
//!   trait object, no lease): what the user-facing layer adds is the difference to the line above.
//! * `tokio_mutex/contended_4` and `memory/contended_4` — four tasks on a four-thread runtime
//!   taking one key in a loop; the time reported is per acquisition (total time / total
//!   acquisitions, releases included).
//!
//! The uncontended cases run on one current-thread runtime, the contended ones on a multi-thread
//! runtime. Quick run: `cargo bench -p dlock-core --bench memory -- --quick`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use dlock_core::{
    Attempt, DistributedLock, DistributedLockExt, InMemoryLock, LeaseRef, LockKey, LockOptions,
    LockRequest, OwnerToken,
};
use tokio::runtime::{Builder, Runtime};

const KEY: &str = "bench/lock";
const CONTENDERS: usize = 4;

fn current_thread() -> Runtime {
    Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
}

fn multi_thread() -> Runtime {
    Builder::new_multi_thread()
        .worker_threads(CONTENDERS)
        .enable_all()
        .build()
        .expect("a multi-thread runtime")
}

fn memory() -> Arc<dyn DistributedLock> {
    Arc::new(InMemoryLock::new())
}

/// How many of `total` acquisitions contender `i` of [`CONTENDERS`] makes (they add up to `total`).
fn share(total: u64, i: usize) -> u64 {
    let n = CONTENDERS as u64;
    total / n + u64::from((i as u64) < total % n)
}

fn lock_cycle(c: &mut Criterion) {
    let single = current_thread();
    let multi = multi_thread();
    let opts = LockOptions::default();
    let mut group = c.benchmark_group("lock_cycle");

    // ---- uncontended, current-thread runtime ----

    let mutex = tokio::sync::Mutex::new(0u64);
    group.bench_function("tokio_mutex/lock_unlock", |b| {
        b.to_async(&single).iter(|| async {
            let mut guard = mutex.lock().await;
            *guard += 1;
            drop(guard);
        })
    });

    let locks = memory();
    group.bench_function("memory/try_acquire_release", |b| {
        b.to_async(&single).iter(|| async {
            let lease = locks
                .try_acquire(KEY, &opts)
                .await
                .expect("try_acquire")
                .expect("the key is free");
            black_box(lease.fencing_token());
            lease.release().await.expect("release")
        })
    });

    let locks = memory();
    group.bench_function("memory/acquire_release", |b| {
        b.to_async(&single).iter(|| async {
            let lease = locks.acquire(KEY, &opts).await.expect("acquire");
            black_box(lease.fencing_token());
            lease.release().await.expect("release")
        })
    });

    let locks = memory();
    let key = LockKey::new(KEY).expect("a valid key");
    group.bench_function("memory/backend_try_lock_release", |b| {
        b.to_async(&single).iter(|| async {
            let owner = OwnerToken::random();
            let request = LockRequest {
                key: &key,
                owner,
                ttl: opts.ttl,
            };
            let fencing = match locks.try_lock(&request).await.expect("try_lock") {
                Attempt::Acquired(grant) => grant.fencing,
                Attempt::Busy { .. } => panic!("the key is busy"),
            };
            let lease = LeaseRef {
                key: &key,
                owner,
                fencing: Some(fencing),
            };
            locks.release(&lease).await.expect("release")
        })
    });

    // ---- contended: CONTENDERS tasks, one key, multi-thread runtime ----

    let mutex = Arc::new(tokio::sync::Mutex::new(0u64));
    group.bench_function(format!("tokio_mutex/contended_{CONTENDERS}"), |b| {
        b.to_async(&multi).iter_custom(|iters| {
            let mutex = mutex.clone();
            async move {
                let start = Instant::now();
                let tasks: Vec<_> = (0..CONTENDERS)
                    .map(|i| {
                        let mutex = mutex.clone();
                        tokio::spawn(async move {
                            for _ in 0..share(iters, i) {
                                let mut guard = mutex.lock().await;
                                *guard += 1;
                                drop(guard);
                            }
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await.expect("contender");
                }
                start.elapsed()
            }
        })
    });

    let locks = memory();
    group.bench_function(format!("memory/contended_{CONTENDERS}"), |b| {
        b.to_async(&multi).iter_custom(|iters| {
            let (locks, opts) = (locks.clone(), opts.clone());
            async move {
                let start = Instant::now();
                let tasks: Vec<_> = (0..CONTENDERS)
                    .map(|i| {
                        let (locks, opts) = (locks.clone(), opts.clone());
                        tokio::spawn(async move {
                            for _ in 0..share(iters, i) {
                                let lease = locks.acquire(KEY, &opts).await.expect("acquire");
                                black_box(lease.fencing_token());
                                lease.release().await.expect("release");
                            }
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await.expect("contender");
                }
                start.elapsed()
            }
        })
    });

    group.finish();
}

// What `criterion_group!`/`criterion_main!` expand to, written out so that the generated public
// function does not trip the workspace's `missing_docs` lint. Command-line flags (`--quick`,
// `--measurement-time`, a filter) override the defaults set here.
fn main() {
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    lock_cycle(&mut criterion);
    criterion.final_summary();
}
