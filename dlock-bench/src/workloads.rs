//! The workloads, written once for every backend and side.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{DistributedLock, DistributedLockExt, LockOptions};
use futures::{StreamExt, TryStreamExt};
use serde::Serialize;
use tokio::time::Instant;

use crate::counting::Counting;
use crate::locker::{Locker, Side};
use crate::plan::Plan;
use crate::server::{cpu_time, ServerCount, Window};
use crate::stats::Latency;

/// Task counts for throughput on distinct keys.
pub const TASKS: [usize; 3] = [1, 16, 64];
/// Acquires (and releases) in flight at once while taking the memory workload's leases, up to
/// 10,000 leases; more leases are taken [`TAKING_MANY_AT_ONCE`] at a time, so that 100,000 take
/// seconds rather than minutes.
const TAKING_AT_ONCE: usize = 32;
const TAKING_MANY_AT_ONCE: usize = 128;
/// Clients connected at once for the hot key's contenders.
const CONNECTING_AT_ONCE: usize = 16;
/// The TTL of leases that live in a session, longer than any run.
const SESSION_LEASE_TTL: Duration = Duration::from_secs(3_600);

/// What an uncontended cycle costs the client: this process's CPU time and its allocations,
/// per cycle, over the timed cycles of one side. The process's clock also counts what runs in
/// the background meanwhile (other clients' keep-alives), alike for every side.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ClientCost {
    pub cpu_us: f64,
    pub allocations: f64,
}

/// Uncontended acquire + release, one after the other; sides take turns in rounds. Each side's
/// latencies, and what its cycles cost the client.
pub async fn cycles(sides: &[Side], plan: Plan) -> anyhow::Result<Vec<(Latency, ClientCost)>> {
    let keys: Vec<String> = (0..sides.len())
        .map(|i| format!("bench/{i}/cycle"))
        .collect();
    for (side, key) in sides.iter().zip(&keys) {
        for _ in 0..plan.warmup {
            side.locker.acquire(key).await?.release().await?;
        }
    }
    let mut times = vec![Vec::with_capacity(plan.cycles); sides.len()];
    let mut costs = vec![(Duration::ZERO, 0usize); sides.len()];
    for _ in 0..plan.rounds {
        for (((side, key), times), cost) in sides.iter().zip(&keys).zip(&mut times).zip(&mut costs)
        {
            let (cpu, region) = (cpu_time(), stats_alloc::Region::new(crate::GLOBAL));
            for _ in 0..plan.cycles / plan.rounds {
                let start = Instant::now();
                side.locker.acquire(key).await?.release().await?;
                times.push(start.elapsed());
            }
            cost.0 += cpu_time().saturating_sub(cpu);
            cost.1 += region.change().allocations;
        }
    }
    Ok(times
        .into_iter()
        .zip(costs)
        .map(|(times, (cpu, allocations))| {
            let cycles = times.len().max(1) as f64;
            let cost = ClientCost {
                cpu_us: cpu.as_secs_f64() * 1e6 / cycles,
                allocations: allocations as f64 / cycles,
            };
            (Latency::of(times), cost)
        })
        .collect())
}

/// What one side achieved at one task count.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Throughput {
    pub per_s: f64,
    /// Cycles that ended in an error (not counted in the rate).
    pub failed: u64,
}

/// Cycles per second of `tasks` tasks on keys of their own, for every side; sides take turns in
/// slices and each rate is total cycles over total time. A failed cycle is counted, not fatal:
/// an overloaded server answering with errors is a result too.
pub async fn throughput(
    sides: &[Side],
    tasks: usize,
    plan: Plan,
) -> anyhow::Result<Vec<Throughput>> {
    let slice = plan.window / plan.rounds as u32;
    let mut totals = vec![(0u64, 0u64, Duration::ZERO); sides.len()];
    for _ in 0..plan.rounds {
        for (i, side) in sides.iter().enumerate() {
            let prefix = format!("bench/{i}/tput{tasks}");
            let (done, failed, took) = run_for(&side.locker, &prefix, tasks, slice).await?;
            totals[i].0 += done;
            totals[i].1 += failed;
            totals[i].2 += took;
        }
    }
    Ok(totals
        .into_iter()
        .map(|(done, failed, took)| Throughput {
            per_s: done as f64 / took.as_secs_f64().max(f64::MIN_POSITIVE),
            failed,
        })
        .collect())
}

async fn run_for(
    locker: &Arc<dyn Locker>,
    prefix: &str,
    tasks: usize,
    slice: Duration,
) -> anyhow::Result<(u64, u64, Duration)> {
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let until = start + slice;
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (locker, done, failed) = (locker.clone(), done.clone(), failed.clone());
            let key = format!("{prefix}/{task}");
            tokio::spawn(async move {
                while Instant::now() < until {
                    match cycle(&locker, &key).await {
                        Ok(()) => done.fetch_add(1, Ordering::Relaxed),
                        Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await?;
    }
    Ok((
        done.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        start.elapsed(),
    ))
}

async fn cycle(locker: &Arc<dyn Locker>, key: &str) -> anyhow::Result<()> {
    locker.acquire(key).await?.release().await
}

/// Hand-offs on one hot key between tasks with clients of their own.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct HotKey {
    /// Tasks on the key: one holds, the others wait.
    pub tasks: usize,
    pub acquisitions: u64,
    pub acquisitions_per_s: f64,
    /// Acquisitions by another task than the previous holder, per second.
    pub handoffs_per_s: f64,
    /// Hand-offs to another task as a share of acquisitions (1.0 when every release goes to a
    /// waiter, as a fair queue does; low when the releaser takes the lock again).
    pub handoff_share: f64,
    /// Acquires or releases that ended in an error.
    pub failed: u64,
    /// From the previous holder calling release to the next holder having the lock.
    pub handoff: Latency,
    /// Requests the servers processed per acquisition, where the backend has a server count.
    pub server_per_acquisition: Option<f64>,
}

/// `tasks` tasks, each with a client of its own, take and give back one key for `plan.hot_for`;
/// then every task finishes the acquire it is waiting on. `None` for sides without contenders.
pub async fn hot_key(
    side: &Side,
    index: usize,
    tasks: usize,
    plan: Plan,
    counter: Option<&dyn ServerCount>,
) -> anyhow::Result<Option<HotKey>> {
    let Some(connect) = &side.connect else {
        return Ok(None);
    };
    let contenders: Vec<Arc<dyn Locker>> = futures::stream::iter(0..tasks)
        .map(|_| connect())
        .buffer_unordered(CONNECTING_AT_ONCE)
        .try_collect()
        .await?;
    let key = format!("bench/{index}/hot{tasks}");
    // (previous holder, when it called release)
    let last: Arc<Mutex<Option<(usize, Instant)>>> = Arc::default();
    let samples: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let failed = Arc::new(AtomicU64::new(0));
    let acquisitions = Arc::new(AtomicU64::new(0));
    let window = Window::open(counter).await;
    let until = Instant::now() + plan.hot_for;
    let handles: Vec<_> = contenders
        .into_iter()
        .enumerate()
        .map(|(id, locker)| {
            let (key, last, samples) = (key.clone(), last.clone(), samples.clone());
            let (failed, acquisitions) = (failed.clone(), acquisitions.clone());
            tokio::spawn(async move {
                while Instant::now() < until {
                    let Ok(held) = locker.acquire(&key).await else {
                        failed.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let now = Instant::now();
                    acquisitions.fetch_add(1, Ordering::Relaxed);
                    {
                        let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
                        if let Some((previous, at)) = *last {
                            if previous != id {
                                samples
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .push(now - at);
                            }
                        }
                        *last = Some((id, Instant::now()));
                    }
                    if held.release().await.is_err() {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                locker
            })
        })
        .collect();
    // The clients stay open until the window is closed: what a client sends as it goes away (an
    // etcd lease revoked, a ZooKeeper session closed) is not part of a hand-off.
    let mut finished = Vec::with_capacity(handles.len());
    for handle in handles {
        finished.push(handle.await?);
    }
    let counted = window.close().await;
    drop(finished);
    let took = counted.took.as_secs_f64();
    let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|e| e.into_inner()));
    let acquisitions = acquisitions.load(Ordering::Relaxed);
    Ok(Some(HotKey {
        tasks,
        acquisitions,
        acquisitions_per_s: acquisitions as f64 / took,
        handoffs_per_s: samples.len() as f64 / took,
        // The first acquisition follows nobody.
        handoff_share: samples.len() as f64 / acquisitions.saturating_sub(1).max(1) as f64,
        failed: failed.load(Ordering::Relaxed),
        handoff: Latency::of(samples),
        server_per_acquisition: counted
            .server
            .filter(|_| acquisitions > 0)
            .map(|n| n as f64 / acquisitions as f64),
    }))
}

/// Uncontended acquire + release on a fresh key every cycle (a key nobody has used), for each
/// locker; they take turns in rounds as in [`cycles`].
pub async fn fresh_cycles(
    lockers: &[&Arc<dyn Locker>],
    plan: Plan,
) -> anyhow::Result<Vec<Latency>> {
    let mut times = vec![Vec::with_capacity(plan.cycles); lockers.len()];
    let mut n = 0u64;
    for (i, locker) in lockers.iter().enumerate() {
        for _ in 0..plan.warmup {
            n += 1;
            cycle(locker, &format!("bench/fresh/{i}/{n}")).await?;
        }
    }
    for _ in 0..plan.rounds {
        for (i, (locker, times)) in lockers.iter().zip(&mut times).enumerate() {
            for _ in 0..plan.cycles / plan.rounds {
                n += 1;
                let key = format!("bench/fresh/{i}/{n}");
                let start = Instant::now();
                cycle(locker, &key).await?;
                times.push(start.elapsed());
            }
        }
    }
    Ok(times.into_iter().map(Latency::of).collect())
}

/// Acquires while one server or member is frozen (`docker pause`).
#[derive(Debug, Clone, Serialize)]
pub struct Frozen {
    pub frozen: String,
    /// Successful acquires only.
    pub acquire: Latency,
    pub failures: usize,
}

pub async fn frozen(
    locks: &Arc<dyn DistributedLock>,
    member: &dlock_testkit::fixtures::Member,
    what: String,
    plan: Plan,
) -> anyhow::Result<Frozen> {
    let opts = LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(5));
    member.pause().await?;
    let mut times = Vec::with_capacity(plan.frozen_cycles);
    let mut failures = 0;
    for i in 0..plan.frozen_cycles {
        let start = Instant::now();
        match locks.acquire(&format!("bench/frozen/{i}"), &opts).await {
            Ok(lease) => {
                times.push(start.elapsed());
                // A failed release is freed by the TTL; it does not change the acquire figure.
                let _ = lease.release().await;
            }
            Err(_) => failures += 1,
        }
    }
    member.unpause().await?;
    Ok(Frozen {
        frozen: what,
        acquire: Latency::of(times),
        failures,
    })
}

/// Client memory, client CPU and renewal traffic of many held leases in one way of renewing.
#[derive(Debug, Clone, Serialize)]
pub struct Renewing {
    pub mode: &'static str,
    /// Leases asked for.
    pub leases: usize,
    /// Leases taken within the plan's taking budget (the figures are per taken lease).
    pub taken: usize,
    /// Seconds taking them took.
    pub taking_s: f64,
    /// Net bytes allocated per held lease (lease, renewal state, the client's share).
    pub bytes_per_lease: f64,
    pub renewals_per_s: f64,
    pub requests_per_s: f64,
    /// CPU time of the whole process per second while the leases were held (1.0 = one core).
    pub cpu_per_s: f64,
    /// Requests the servers processed per second meanwhile, where the backend has a count.
    pub server_per_s: Option<f64>,
    pub all_held: bool,
    /// Why not every lease asked for was held.
    pub note: Option<String>,
}

/// How the memory workload renews.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// A task per lease that sleeps and calls `Lease::extend`: one timer and one request per
    /// lease and interval, as auto-renew did before it was batched.
    PerLease,
    /// dlock's auto-renew: one scheduler per client, one `extend_many` per tick.
    Batched,
    /// No renewal by dlock: the leases live in the client's session, which the client library
    /// keeps alive with one keep-alive for all of them (ZooKeeper, etcd).
    Session,
}

impl Renewal {
    pub fn name(self) -> &'static str {
        match self {
            Renewal::PerLease => "per-lease",
            Renewal::Batched => "batched",
            Renewal::Session => "session",
        }
    }
}

pub async fn renewing(
    client: Arc<dyn DistributedLock>,
    wire_batch: Option<usize>,
    mode: Renewal,
    leases: usize,
    plan: Plan,
    counter: Option<&dyn ServerCount>,
) -> anyhow::Result<Renewing> {
    let counting = Arc::new(Counting::new(client, wire_batch));
    let locks: Arc<dyn DistributedLock> = counting.clone();
    let ttl = match mode {
        // The session holds these leases; a TTL longer than the run leaves it at that.
        Renewal::Session => SESSION_LEASE_TTL,
        Renewal::PerLease | Renewal::Batched => plan.renew_ttl,
    };
    let interval = plan.renew_ttl / 3;
    let mut opts = LockOptions::new(ttl).with_wait(Duration::from_secs(30));
    if mode == Renewal::Batched {
        opts = opts.with_auto_renew();
    }
    let at_once = if leases > 10_000 {
        TAKING_MANY_AT_ONCE
    } else {
        TAKING_AT_ONCE
    };
    let tag = mode.name();
    let region = stats_alloc::Region::new(crate::GLOBAL);
    let taking = Instant::now();
    let deadline = taking + plan.taking_budget;
    let mut acquiring = futures::stream::iter(0..leases)
        .map(|i| {
            let (locks, opts) = (locks.clone(), opts.clone());
            async move {
                locks
                    .acquire(&format!("bench/renew/{tag}/{leases}/{i}"), &opts)
                    .await
            }
        })
        .buffer_unordered(at_once);
    let mut taken = Vec::with_capacity(leases);
    let mut note = None;
    // An overloaded backend may refuse some acquires (unavailable, timed out): that is counted
    // and reported, and the figures are for the leases taken. Any other error ends the run.
    let (mut failed, mut first_failure) = (0usize, None);
    while let Some(lease) = acquiring.next().await {
        match lease {
            Ok(lease) => taken.push(lease),
            Err(error) if error.is_temporary() => {
                failed += 1;
                first_failure.get_or_insert_with(|| error.to_string());
            }
            Err(error) => return Err(error.into()),
        }
        if taken.len() + failed < leases && Instant::now() > deadline {
            note = Some(format!(
                "took {} of {leases} leases in the {:?} budget ({:.0}/s); the figures are for those",
                taken.len(),
                plan.taking_budget,
                taken.len() as f64 / taking.elapsed().as_secs_f64()
            ));
            break;
        }
    }
    if let Some(first) = first_failure {
        let failures = format!("{failed} acquires failed (the first: {first})");
        note = Some(match note {
            Some(note) => format!("{note}; {failures}"),
            None => format!(
                "took {} of {leases} leases: {failures}; the figures are for those taken",
                taken.len()
            ),
        });
    }
    // Dropping the stream cancels the acquires still in flight; the core releases them.
    drop(acquiring);
    let taking_s = taking.elapsed().as_secs_f64();
    let taken_n = taken.len();
    let count = taken_n.max(1);
    let watches: Vec<_> = taken.iter().map(|l| l.watch()).collect();
    let mut tasks = Vec::new();
    let mut held = Vec::new();
    match mode {
        Renewal::Batched | Renewal::Session => {
            // Held in a vector of exactly their number, as the per-lease tasks hold one each.
            held = taken;
            held.shrink_to_fit();
        }
        Renewal::PerLease => {
            for mut lease in taken {
                tasks.push(tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(interval).await;
                        if lease.extend(ttl).await.is_err() && !lease.state().is_held() {
                            return;
                        }
                    }
                }));
            }
        }
    }
    // Steady state: every lease has been renewed at least once.
    tokio::time::sleep(interval + interval / 2).await;
    let change = region.change();
    let net = change.bytes_allocated as f64 - change.bytes_deallocated as f64;
    counting.take();
    let window = Window::open(counter).await;
    tokio::time::sleep(plan.observe).await;
    let counted = window.close().await;
    let (renewals, requests) = counting.take();
    let took = counted.took.as_secs_f64();
    let all_held = note.is_none() && watches.iter().all(|w| w.is_held());
    drop(watches);
    for task in tasks {
        // Aborting drops the task's lease, which releases it in the background.
        task.abort();
    }
    // A release refused by an overloaded backend leaves its key to the TTL; it is not measured.
    let _ = futures::stream::iter(held)
        .map(|lease| async move { lease.release().await })
        .buffer_unordered(at_once)
        .collect::<Vec<_>>()
        .await;
    Ok(Renewing {
        mode: mode.name(),
        leases,
        taken: taken_n,
        taking_s,
        bytes_per_lease: net / count as f64,
        renewals_per_s: renewals as f64 / took,
        requests_per_s: requests as f64 / took,
        cpu_per_s: counted.cpu.as_secs_f64() / took,
        server_per_s: counted.server.map(|n| n as f64 / took),
        all_held,
        note,
    })
}
