//! dlock-etcd against etcd's own server-side lock service (etcd-client's `lock`/`unlock` with a
//! lease), on the same three-member cluster in one run.
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo bench -p dlock-etcd            # the full run, prints a table
//! ```
//!
//! Rows: an uncontended lock + unlock cycle (p50/p99); throughput with 1, 16 and 64 tasks, each
//! on its own key; and the hot-key hand-off latency: contenders in separate clients queue on one
//! key, and each hand-off is timed from the holder starting its release to the next holder's
//! acquire returning. Our side uses one `EtcdLock` (one session) for all tasks of a row and a
//! client per contender for the hand-off; the peer uses one etcd client with a lease per task
//! (a lease is what the lock service attaches ownership to; locking twice with one lease is a
//! no-op there) and a client and lease per contender.
//!
//! `DLOCK_BENCH_MEMBERS=1` runs it on a single member instead. Run as a test
//! (`cargo test --all-targets`), it does a few iterations of everything on one member, to prove
//! the benchmark works, and prints the table without verdicts.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use dlock_compliance::fixtures::EtcdCluster;
use dlock_core::{DistributedLockExt, LockOptions};
use dlock_etcd::EtcdLock;
use tokio::time::Instant;

#[derive(Debug, Clone, Copy)]
struct Plan {
    members: usize,
    warmup: usize,
    cycles: usize,
    window: Duration,
    contenders: usize,
    handoffs: usize,
    /// Both sides run in this many alternating blocks, so that a machine that gets busier or
    /// quieter during the run does not favour either.
    blocks: usize,
}

const FULL: Plan = Plan {
    members: 3,
    warmup: 100,
    cycles: 1600,
    window: Duration::from_secs(8),
    contenders: 4,
    handoffs: 800,
    blocks: 8,
};

const SMOKE: Plan = Plan {
    members: 1,
    warmup: 2,
    cycles: 10,
    window: Duration::from_millis(200),
    contenders: 2,
    handoffs: 10,
    blocks: 2,
};

fn main() -> anyhow::Result<()> {
    let full = std::env::args().any(|a| a == "--bench");
    let mut plan = if full { FULL } else { SMOKE };
    if let Some(members) = std::env::var("DLOCK_BENCH_MEMBERS")
        .ok()
        .and_then(|m| m.parse().ok())
    {
        plan.members = members;
    }
    if !EtcdCluster::needs_docker() || !dlock_compliance::fixtures::docker_opt_out() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        runtime.block_on(run(plan))?;
    } else {
        eprintln!("DLOCK_TEST_NO_DOCKER=1: the etcd benchmark needs Docker");
    }
    Ok(())
}

/// One side of the comparison.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Dlock,
    Peer,
}

async fn dlock_client(endpoints: &[String]) -> anyhow::Result<Arc<EtcdLock>> {
    Ok(Arc::new(
        EtcdLock::builder()
            .endpoints(endpoints.iter().cloned())
            .namespace("dlock-bench/")
            .connect()
            .await?,
    ))
}

async fn peer_client(endpoints: &[String]) -> anyhow::Result<etcd_client::Client> {
    Ok(etcd_client::Client::connect(endpoints, None).await?)
}

/// The peer's lock name for `key` (the same prefix shape as ours, in its own namespace).
fn peer_name(key: &str) -> String {
    format!("peer-bench/{key}")
}

/// A task's way to take and give back one lock, timed.
enum Locker {
    Dlock(Arc<EtcdLock>),
    Peer(Box<etcd_client::Client>, i64),
}

impl Locker {
    async fn new(side: Side, shared: &Shared) -> anyhow::Result<Locker> {
        Ok(match side {
            Side::Dlock => Locker::Dlock(shared.dlock.clone()),
            Side::Peer => {
                let mut client = Box::new(shared.peer.clone());
                let lease = client.lease_grant(300, None).await?.id();
                Locker::Peer(client, lease)
            }
        })
    }

    async fn own(side: Side, endpoints: &[String]) -> anyhow::Result<Locker> {
        Ok(match side {
            Side::Dlock => Locker::Dlock(dlock_client(endpoints).await?),
            Side::Peer => {
                let mut client = Box::new(peer_client(endpoints).await?);
                let lease = client.lease_grant(300, None).await?.id();
                Locker::Peer(client, lease)
            }
        })
    }

    /// Takes the lock on `key`, then calls `held` and releases; `before_release` is called just
    /// before the release is sent.
    async fn cycle(
        &mut self,
        key: &str,
        held: impl FnOnce(),
        before_release: impl FnOnce(),
    ) -> anyhow::Result<()> {
        match self {
            Locker::Dlock(locks) => {
                let opts =
                    LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(60));
                let lease = locks.acquire(key, &opts).await?;
                held();
                before_release();
                lease.release().await?;
            }
            Locker::Peer(client, lease) => {
                let options = etcd_client::LockOptions::new().with_lease(*lease);
                let locked = client.lock(peer_name(key), Some(options)).await?;
                held();
                before_release();
                client.unlock(locked.key()).await?;
            }
        }
        Ok(())
    }
}

struct Shared {
    dlock: Arc<EtcdLock>,
    peer: etcd_client::Client,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Uncontended lock + unlock, one after the other, in alternating blocks.
async fn cycles(shared: &Shared, plan: Plan) -> anyhow::Result<[Vec<Duration>; 2]> {
    let key = format!("cycle/{}", unique());
    let mut lockers = [
        Locker::new(Side::Dlock, shared).await?,
        Locker::new(Side::Peer, shared).await?,
    ];
    let mut times = [Vec::new(), Vec::new()];
    for (locker, _) in lockers.iter_mut().zip(0..) {
        for _ in 0..plan.warmup {
            locker.cycle(&key, || {}, || {}).await?;
        }
    }
    for _ in 0..plan.blocks {
        for (side, locker) in lockers.iter_mut().enumerate() {
            for _ in 0..plan.cycles / plan.blocks {
                let start = Instant::now();
                locker.cycle(&key, || {}, || {}).await?;
                times[side].push(start.elapsed());
            }
        }
    }
    for t in &mut times {
        t.sort();
    }
    Ok(times)
}

/// Cycles per second with `tasks` tasks, each on its own key, in alternating windows.
async fn throughput(shared: &Shared, plan: Plan, tasks: usize) -> anyhow::Result<[f64; 2]> {
    let run = unique();
    let mut sides: [Vec<Locker>; 2] = [Vec::new(), Vec::new()];
    for (side, lockers) in [Side::Dlock, Side::Peer].into_iter().zip(sides.iter_mut()) {
        for _ in 0..tasks {
            lockers.push(Locker::new(side, shared).await?);
        }
    }
    let mut cycles = [0u64; 2];
    let mut elapsed = [Duration::ZERO; 2];
    let window = plan.window / u32::try_from(plan.blocks).unwrap_or(1);
    for _ in 0..plan.blocks {
        for side in 0..2 {
            let lockers = std::mem::take(&mut sides[side]);
            let done = Arc::new(AtomicU64::new(0));
            let start = Instant::now();
            let stop = start + window;
            let handles: Vec<_> = lockers
                .into_iter()
                .enumerate()
                .map(|(i, mut locker)| {
                    let done = done.clone();
                    let key = format!("throughput/{run}/{i}");
                    tokio::spawn(async move {
                        while Instant::now() < stop {
                            locker.cycle(&key, || {}, || {}).await?;
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        anyhow::Ok(locker)
                    })
                })
                .collect();
            for handle in handles {
                sides[side].push(handle.await??);
            }
            elapsed[side] += start.elapsed();
            cycles[side] += done.load(Ordering::Relaxed);
        }
    }
    Ok([0, 1].map(|s| cycles[s] as f64 / elapsed[s].as_secs_f64()))
}

/// Hand-off latency on one hot key between contenders in separate clients, in alternating
/// blocks.
async fn handoffs(endpoints: &[String], plan: Plan) -> anyhow::Result<[Vec<Duration>; 2]> {
    let key = format!("hot/{}", unique());
    let mut sides: [Vec<Locker>; 2] = [Vec::new(), Vec::new()];
    for (side, lockers) in [Side::Dlock, Side::Peer].into_iter().zip(sides.iter_mut()) {
        for _ in 0..plan.contenders {
            lockers.push(Locker::own(side, endpoints).await?);
        }
    }
    let mut all = [Vec::new(), Vec::new()];
    for _ in 0..plan.blocks {
        for side in 0..2 {
            let lockers = std::mem::take(&mut sides[side]);
            let origin = Instant::now();
            // When the last holder started to release, in µs since `origin`; 0 = nobody yet.
            let released = Arc::new(AtomicU64::new(0));
            let wanted = plan.handoffs / plan.blocks;
            let samples = Arc::new(std::sync::Mutex::new(Vec::with_capacity(wanted)));
            let handles: Vec<_> = lockers
                .into_iter()
                .map(|mut locker| {
                    let (key, released, samples) = (key.clone(), released.clone(), samples.clone());
                    tokio::spawn(async move {
                        loop {
                            if samples.lock().unwrap().len() >= wanted {
                                return anyhow::Ok(locker);
                            }
                            locker
                                .cycle(
                                    &key,
                                    || {
                                        let at = released.load(Ordering::SeqCst);
                                        if at > 0 {
                                            let now = origin.elapsed().as_micros() as u64;
                                            let gap = Duration::from_micros(now.saturating_sub(at));
                                            samples.lock().unwrap().push(gap);
                                        }
                                    },
                                    || {
                                        let now = origin.elapsed().as_micros() as u64;
                                        released.store(now.max(1), Ordering::SeqCst);
                                    },
                                )
                                .await?;
                        }
                    })
                })
                .collect();
            for handle in handles {
                sides[side].push(handle.await??);
            }
            all[side].extend(samples.lock().unwrap().iter().copied());
        }
    }
    for samples in &mut all {
        samples.sort();
    }
    Ok(all)
}

fn unique() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn micros(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e6)
}

async fn run(plan: Plan) -> anyhow::Result<()> {
    let cluster = EtcdCluster::start(plan.members)
        .await
        .context("starting etcd")?;
    let endpoints = cluster.endpoints();
    let shared = Shared {
        dlock: dlock_client(&endpoints).await?,
        peer: peer_client(&endpoints).await?,
    };
    let mut rows: Vec<(String, String, String, bool)> = Vec::new();
    // (label, ours, peer, higher is better)

    let [ours, theirs] = cycles(&shared, plan).await?;
    for (label, p) in [("cycle p50 (µs)", 0.5), ("cycle p99 (µs)", 0.99)] {
        rows.push((
            label.to_owned(),
            micros(percentile(&ours, p)),
            micros(percentile(&theirs, p)),
            false,
        ));
    }
    for tasks in [1, 16, 64] {
        let [ours, theirs] = throughput(&shared, plan, tasks).await?;
        rows.push((
            format!("throughput, {tasks} task(s) (cycles/s)"),
            format!("{ours:.0}"),
            format!("{theirs:.0}"),
            true,
        ));
    }
    let [ours, theirs] = handoffs(&endpoints, plan).await?;
    for (label, p) in [
        ("hot-key hand-off p50 (µs)", 0.5),
        ("hot-key hand-off p99 (µs)", 0.99),
    ] {
        rows.push((
            format!("{label}, {} contenders", plan.contenders),
            micros(percentile(&ours, p)),
            micros(percentile(&theirs, p)),
            false,
        ));
    }

    println!();
    let smoke = plan.cycles < FULL.cycles;
    println!(
        "etcd {}-member cluster; dlock-etcd vs etcd lock API (etcd-client lock/unlock with a lease){}",
        plan.members,
        if smoke { " — smoke run (test mode): a check that the benchmark works, not a measurement" } else { "" }
    );
    println!();
    println!("| measure | dlock-etcd | etcd lock API | dlock / peer |");
    println!("|---|---:|---:|---:|");
    for (label, ours, theirs, higher_better) in rows {
        let (o, t): (f64, f64) = (ours.parse().unwrap_or(0.0), theirs.parse().unwrap_or(0.0));
        let ratio = if t > 0.0 { o / t } else { 0.0 };
        let verdict = if smoke {
            "not measured"
        } else if (higher_better && ratio >= 1.0) || (!higher_better && ratio <= 1.0) {
            "at least parity"
        } else {
            "behind"
        };
        println!("| {label} | {ours} | {theirs} | {ratio:.2} ({verdict}) |");
    }
    drop(shared);
    cluster.shutdown().await?;
    Ok(())
}
