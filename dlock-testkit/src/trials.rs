//! The frame every backend's test binaries share: named trials on runtimes of their own, bounded
//! in time, around fixtures that `main` starts once and removes at the end.
//!
//! The binaries run with `harness = false` (libtest-mimic) because their fixtures — containers —
//! are started once per binary and shared by its trials, which a `#[test]` function cannot do.
//! What is left for each binary is its own list of trials; the frame around them lives here so
//! that every binary reports, times out and cleans up the same way.

use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dlock_core::inspect::Holding;
use dlock_core::{DistributedLock, DistributedLockExt, FencingToken, Lease, LockOptions, Released};
use libtest_mimic::{Arguments, Failed, Trial};
use tokio::runtime::Runtime;

use crate::fixtures::{docker_opt_out, EtcdCluster, RedisMasters, RedisServer, ZkEnsemble};

/// A trial named `name` running `body` on a runtime of its own; it fails as hung when `body` is
/// not done within `budget`, so one stuck trial cannot stall the whole binary.
pub fn trial<F, Fut>(name: impl Into<String>, budget: Duration, body: F) -> Trial
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let name = name.into();
    let label = name.clone();
    Trial::test(name, move || {
        let runtime = new_runtime()?;
        let started = Instant::now();
        let result = runtime.block_on(async {
            match tokio::time::timeout(budget, body()).await {
                Ok(result) => result,
                Err(_) => Err(anyhow::anyhow!("hung: not done within {budget:?}")),
            }
        });
        eprintln!("[timing] {label}: {:.2?}", started.elapsed());
        result.map_err(|e| Failed::from(format!("{e:#}")))
    })
}

/// What a case body returns: boxed, so that cases of one binary fit in one table.
pub type CaseFuture = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// A case: an async function of what the binary's cases share (`C`, cloned for each).
pub type Case<C> = fn(C) -> CaseFuture;

/// `(name, case)` for an async function `name(cx: C) -> anyhow::Result<()>` (or `module::name`):
/// the entry of a case table, named after the function.
#[macro_export]
macro_rules! case {
    ($module:ident :: $name:ident) => {
        (
            stringify!($name),
            (|cx| Box::pin($module::$name(cx)) as $crate::trials::CaseFuture)
                as $crate::trials::Case<_>,
        )
    };
    ($name:ident) => {
        (
            stringify!($name),
            (|cx| Box::pin($name(cx)) as $crate::trials::CaseFuture) as $crate::trials::Case<_>,
        )
    };
}

/// The trial names of a case table: `<prefix>::<case>`, the same with or without fixtures.
pub fn names<C>(prefix: &str, cases: &[(&'static str, Case<C>)]) -> Vec<String> {
    cases
        .iter()
        .map(|(name, _)| format!("{prefix}::{name}"))
        .collect()
}

/// One [`trial`] per case of the table, in its order, each given a clone of `cx`.
pub fn cases<C>(
    prefix: &str,
    cases: &[(&'static str, Case<C>)],
    cx: &C,
    budget: Duration,
) -> Vec<Trial>
where
    C: Clone + Send + 'static,
{
    cases
        .iter()
        .map(|&(name, case)| {
            let cx = cx.clone();
            trial(format!("{prefix}::{name}"), budget, move || case(cx))
        })
        .collect()
}

/// The runtime `main` starts and stops fixtures on; the process ends when there is none, since
/// no trial could run either.
pub fn fixture_runtime() -> Runtime {
    match new_runtime() {
        Ok(runtime) => runtime,
        Err(e) => exit(format_args!("cannot build a tokio runtime: {e}")),
    }
}

/// Starts what the trials of a binary share (`what` names it in messages) and reports how long
/// that took; the process ends when it cannot be started, since every trial needs it.
pub fn start<T, E: Display>(
    runtime: &Runtime,
    what: &str,
    starting: impl Future<Output = Result<T, E>>,
) -> T {
    let started = Instant::now();
    match runtime.block_on(starting) {
        Ok(started_fixture) => {
            eprintln!("[timing] {what}: {:.2?}", started.elapsed());
            started_fixture
        }
        Err(e) => exit(format_args!("cannot start {what}: {e:#}")),
    }
}

/// Cases run at once by a binary whose cases share its servers, unless `--test-threads` says
/// otherwise. A case spends its time waiting on the servers and on its timers, not computing:
/// on the project's 2-core machine the compliance binaries of Redis, Redlock, ZooKeeper and etcd
/// took 44–65 s with one case per core and 24–35 s with four at once, every case passing.
/// PostgreSQL's keeps one per core: its client is busy enough that four at once beside another
/// binary pushed first answers past a 1 s lease's validity.
pub const CASES_AT_ONCE: usize = 4;

/// The command line's arguments, with [`CASES_AT_ONCE`] cases at once unless `--test-threads`
/// says otherwise.
pub fn arguments() -> Arguments {
    let mut args = Arguments::from_args();
    args.test_threads.get_or_insert(CASES_AT_ONCE);
    args
}

/// Reports every trial as ignored and ends the process: the run opted out of Docker
/// (`DLOCK_TEST_NO_DOCKER=1`) yet lists the same names as a real run.
pub fn run_ignored(args: &Arguments, trials: Vec<Trial>) -> ! {
    let trials = trials
        .into_iter()
        .map(|t| t.with_ignored_flag(true))
        .collect();
    libtest_mimic::run(args, trials).exit()
}

/// Placeholder trials with these names, for [`run_ignored`] when the real trials need fixtures
/// to be built.
pub fn placeholders<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Vec<Trial> {
    names
        .into_iter()
        .map(|name| Trial::test(name, || Ok(())))
        .collect()
}

/// Runs the trials, then `clean_up` (which removes the shared fixtures), and ends the process
/// with the trials' verdict; a failed clean-up is reported but does not change the verdict.
pub fn run_then<C, Fut, E>(
    args: &Arguments,
    trials: Vec<Trial>,
    runtime: &Runtime,
    clean_up: C,
) -> !
where
    C: FnOnce() -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Display,
{
    let conclusion = libtest_mimic::run(args, trials);
    if let Err(e) = runtime.block_on(clean_up()) {
        eprintln!("removing the fixtures failed: {e}");
    }
    conclusion.exit()
}

/// A fixture the cases of a binary share: removed once they are all done.
#[async_trait]
pub trait Shared: Send + Sync + Sized + 'static {
    /// Removes the fixture's containers and networks.
    async fn remove(self) -> crate::fixtures::Result<()>;
}

macro_rules! shared {
    ($($fixture:ty),*) => {$(
        #[async_trait]
        impl Shared for $fixture {
            async fn remove(self) -> crate::fixtures::Result<()> {
                self.shutdown().await
            }
        }
    )*};
}

shared!(RedisServer, RedisMasters, EtcdCluster, ZkEnsemble);

/// The whole `main` of a fault binary: its cases share one fixture (`what`, made by `start`) and
/// break it, so they run one at a time in table order, each given the fixture; the fixture is
/// removed at the end. With `DLOCK_TEST_NO_DOCKER=1` every case is reported as ignored.
pub fn run_one_at_a_time<F, E, Fut>(
    prefix: &str,
    table: &[(&'static str, Case<Arc<F>>)],
    budget: Duration,
    what: &str,
    start_fixture: impl FnOnce() -> Fut,
) -> !
where
    F: Shared,
    E: Display,
    Fut: Future<Output = Result<F, E>>,
{
    let mut args = Arguments::from_args();
    args.test_threads = Some(1);
    if docker_opt_out() {
        run_ignored(&args, placeholders(names(prefix, table)));
    }
    let runtime = fixture_runtime();
    let fixture = Arc::new(start(&runtime, what, start_fixture()));
    let trials = cases(prefix, table, &fixture, budget);
    run_then(&args, trials, &runtime, || async move {
        match Arc::try_unwrap(fixture) {
            Ok(fixture) => fixture.remove().await,
            // A trial still holds it (it hung); dropping the last reference removes it.
            Err(_) => Ok(()),
        }
    })
}

fn new_runtime() -> std::io::Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

fn exit(message: std::fmt::Arguments<'_>) -> ! {
    eprintln!("{message}");
    std::process::exit(1)
}

/// Fails unless `lease`'s fencing token is above `before`, the token of an earlier holder;
/// `after` says what came between, for the message.
pub fn ensure_token_above(lease: &Lease, before: FencingToken, after: &str) -> anyhow::Result<()> {
    let token = lease.fencing_token();
    anyhow::ensure!(
        token > before,
        "token {token} after {after} is not above {before}"
    );
    Ok(())
}

/// `observer`'s `holding` follows `holder` without taking anything: `key` reads free, then —
/// once `holder` took it with `opts` — held with the lease's token and no expiry, as a lock that
/// lives as long as the holder's session. Returns the lease, for the backend's own checks.
pub async fn ensure_holding_sees<H, O>(
    holder: &H,
    observer: &O,
    key: &str,
    opts: &LockOptions,
) -> anyhow::Result<Lease>
where
    H: DistributedLockExt,
    O: DistributedLockExt,
{
    anyhow::ensure!(
        observer.holding(key).await? == Holding::Free,
        "a new key is not free"
    );
    let lease = holder
        .try_acquire(key, opts)
        .await?
        .ok_or_else(|| anyhow::anyhow!("a free key was busy"))?;
    let seen = observer.holding(key).await?;
    anyhow::ensure!(
        seen.holder()
            .is_some_and(|h| h.fencing == Some(lease.fencing_token()) && h.expires_in.is_none()),
        "holding() saw {seen:?}, the holder has token {}",
        lease.fencing_token()
    );
    Ok(lease)
}

/// Returns `true` once `observer`'s `holding` shows at least `waiting` contenders waiting for
/// `key`, failing after `within`; `false` at once where the backend does not count its waiters.
/// For cases that rely on a spawned waiter being in line: a fixed pause is outrun on a loaded
/// machine.
pub async fn until_waiting(
    observer: Arc<dyn DistributedLock>,
    key: &str,
    waiting: usize,
    within: Duration,
) -> anyhow::Result<bool> {
    let by = Instant::now() + within;
    loop {
        if let Holding::Held(holder) = observer.holding(key).await? {
            match holder.waiting {
                None => return Ok(false),
                Some(n) if n >= waiting => return Ok(true),
                Some(_) => {}
            }
        }
        anyhow::ensure!(
            Instant::now() < by,
            "{waiting} waiters were not in line within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A lost `lease` stays lost once whatever cut it off is over: `wait` later it still says lost,
/// and releasing it does not release the lock another client took since.
pub async fn ensure_stays_lost(lease: Lease, wait: Duration) -> anyhow::Result<()> {
    tokio::time::sleep(wait).await;
    anyhow::ensure!(
        lease.state().is_lost(),
        "the lease came back: {:?}",
        lease.state()
    );
    anyhow::ensure!(
        lease.release().await? != Released::Released,
        "the lost lease released the successor's lock"
    );
    Ok(())
}
