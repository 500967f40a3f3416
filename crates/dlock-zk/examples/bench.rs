//! Benchmark of the ZooKeeper backend against the floor of its own recipe.
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo run -p dlock-zk --release --example bench
//! ```
//!
//! Starts a three-member ensemble (or uses `DLOCK_TEST_ZK_URL`), then, in one run and on the same
//! member:
//!
//! 1. one task: the acquire + release cycle beside the raw requests the recipe needs (create an
//!    ephemeral sequential node, list the parent, delete the node) sent with the same client
//!    library, alternating in rounds so that both see the same server state;
//! 2. throughput at 1, 16 and 64 tasks, each task on a key of its own, and on one hot key;
//! 3. hot-key hand-off: the time from a holder's release to the next waiter's grant.
//!
//! Prints tables; asserts nothing.

use std::sync::Arc;
use std::time::Duration;

use dlock_compliance::fixtures::{ZkEnsemble, ZkOptions};
use dlock_core::{DistributedLock, DistributedLockExt, LockOptions};
use dlock_zk::ZkLock;
use tokio::time::Instant;
use zookeeper_client as zk;

const CYCLES_PER_ROUND: usize = 250;
const ROUNDS: usize = 8;
/// Each throughput figure sums this many windows, alternating raw and dlock so that both see
/// the same machine load.
const THROUGHPUT_ROUNDS: u32 = 3;
const THROUGHPUT_WINDOW: Duration = Duration::from_secs(1);
const HANDOFFS: usize = 300;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let ensemble = ZkEnsemble::start_with(
        3,
        ZkOptions::default().with_tick_time(Duration::from_millis(500)),
    )
    .await?;
    let result = run(&ensemble).await;
    ensemble.shutdown().await?;
    result
}

async fn run(ensemble: &ZkEnsemble) -> anyhow::Result<()> {
    // Everything talks to one member, so that the raw floor and the lock pay the same hops.
    let endpoint = ensemble.endpoints()[0].clone();
    let url = format!("zk://{endpoint}");
    let session = Duration::from_secs(10);
    let lock: Arc<ZkLock> = Arc::new(
        ZkLock::builder(&url)
            .with_session_timeout(session)
            .build()
            .await?,
    );
    let raw = zk::Client::connector()
        .with_session_timeout(session)
        .connect(&endpoint)
        .await?;
    let opts = LockOptions::new(Duration::from_secs(30));
    println!(
        "ZooKeeper 3.8, 3 members on one host (Docker), client on member 0 ({endpoint}); \
         debug={}",
        cfg!(debug_assertions)
    );

    // 1. One task: cycle against floor, interleaved.
    let key = "bench/cycle";
    let parent = lock.lock_path(key)?;
    // Warm up both, and make the parent exist for the raw requests too.
    for _ in 0..200 {
        lock.acquire(key, &opts).await?.release().await?;
        raw_cycle(&raw, &parent).await?;
    }
    let mut floor = Vec::new();
    let mut cycle = Vec::new();
    for _ in 0..ROUNDS {
        for _ in 0..CYCLES_PER_ROUND {
            let t = Instant::now();
            raw_cycle(&raw, &parent).await?;
            floor.push(t.elapsed());
        }
        for _ in 0..CYCLES_PER_ROUND {
            let t = Instant::now();
            let lease = lock.acquire(key, &opts).await?;
            lease.release().await?;
            cycle.push(t.elapsed());
        }
    }
    let (floor_stats, cycle_stats) = (Stats::of(floor), Stats::of(cycle));
    println!();
    println!(
        "## One task, {} cycles each, interleaved in {ROUNDS} rounds",
        ROUNDS * CYCLES_PER_ROUND
    );
    println!();
    println!("| | mean | p50 | p90 | p99 | cycles/s |");
    println!("|---|---|---|---|---|---|");
    floor_stats.row("raw create + list + delete (floor)");
    cycle_stats.row("dlock acquire + release");
    println!(
        "| ratio (dlock / floor) | {:.2}× | {:.2}× | {:.2}× | {:.2}× | |",
        ratio(cycle_stats.mean, floor_stats.mean),
        ratio(cycle_stats.p50, floor_stats.p50),
        ratio(cycle_stats.p90, floor_stats.p90),
        ratio(cycle_stats.p99, floor_stats.p99),
    );

    // 2. Throughput.
    println!();
    println!(
        "## Throughput (cycles/s; {THROUGHPUT_ROUNDS} alternating windows of {THROUGHPUT_WINDOW:?} each)"
    );
    println!();
    println!("| tasks | raw floor, own keys | dlock, own keys | ratio | dlock, one hot key |");
    println!("|---|---|---|---|---|");
    for tasks in [1usize, 16, 64] {
        let (mut raw_rate, mut own, mut hot) = (0.0, 0.0, 0.0);
        for _ in 0..THROUGHPUT_ROUNDS {
            raw_rate += raw_throughput(&raw, &lock, tasks).await? / f64::from(THROUGHPUT_ROUNDS);
            own += lock_throughput(&lock, tasks, false).await? / f64::from(THROUGHPUT_ROUNDS);
            hot += lock_throughput(&lock, tasks, true).await? / f64::from(THROUGHPUT_ROUNDS);
        }
        println!(
            "| {tasks} | {raw_rate:.0} | {own:.0} | {:.2} | {hot:.0} |",
            own / raw_rate
        );
    }

    // 3. Hot-key hand-off.
    let handoff = handoff_latency(&url, session).await?;
    println!();
    println!("## Hot-key hand-off ({HANDOFFS} releases to a queued waiter on another client)");
    println!();
    println!("| | mean | p50 | p90 | p99 |");
    println!("|---|---|---|---|---|");
    println!(
        "| release → waiter's grant | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms |",
        ms(handoff.mean),
        ms(handoff.p50),
        ms(handoff.p90),
        ms(handoff.p99)
    );
    println!();
    println!("stats: {:?}", lock.stats());
    Ok(())
}

/// The requests the recipe needs for one uncontended cycle, straight through the library.
async fn raw_cycle(raw: &zk::Client, parent: &str) -> anyhow::Result<()> {
    let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let prefix = format!("{parent}/{:032x}__lock__", rand::random::<u128>());
    let (_, sequence) = raw.create(&prefix, b"dlock", &options).await?;
    let children = raw.list_children(parent).await?;
    anyhow::ensure!(!children.is_empty());
    raw.delete(&format!("{prefix}{sequence}"), None).await?;
    Ok(())
}

async fn raw_throughput(raw: &zk::Client, lock: &ZkLock, tasks: usize) -> anyhow::Result<f64> {
    let mut parents = Vec::new();
    for t in 0..tasks {
        // Real lock parents, created by a lock cycle, so both measure the same tree.
        let key = format!("bench/raw-{tasks}-{t}");
        let shared: Arc<dyn DistributedLock> = Arc::new(lock.clone());
        shared
            .acquire(&key, &LockOptions::new(Duration::from_secs(30)))
            .await?
            .release()
            .await?;
        parents.push(lock.lock_path(&key)?);
    }
    let until = Instant::now() + THROUGHPUT_WINDOW;
    let started = Instant::now();
    let mut handles = Vec::new();
    for parent in parents {
        let raw = raw.clone();
        handles.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < until {
                raw_cycle(&raw, &parent).await?;
                n += 1;
            }
            anyhow::Ok(n)
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

async fn lock_throughput(lock: &Arc<ZkLock>, tasks: usize, hot: bool) -> anyhow::Result<f64> {
    let opts = LockOptions::new(Duration::from_secs(30));
    let until = Instant::now() + THROUGHPUT_WINDOW;
    let started = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (lock, opts) = (lock.clone(), opts.clone());
        let key = if hot {
            format!("bench/hot-{tasks}")
        } else {
            format!("bench/own-{tasks}-{t}")
        };
        handles.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < until {
                lock.acquire(&key, &opts).await?.release().await?;
                n += 1;
            }
            anyhow::Ok(n)
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// Two clients pass one key back and forth: each release is timed to the other's grant.
async fn handoff_latency(url: &str, session: Duration) -> anyhow::Result<Stats> {
    let a: Arc<ZkLock> = Arc::new(
        ZkLock::builder(url)
            .with_session_timeout(session)
            .build()
            .await?,
    );
    let b: Arc<ZkLock> = Arc::new(
        ZkLock::builder(url)
            .with_session_timeout(session)
            .build()
            .await?,
    );
    let key = "bench/handoff";
    let opts = LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(30));
    let mut samples = Vec::new();
    let mut holder = a.acquire(key, &opts).await?;
    let mut holder_is_a = true;
    for _ in 0..HANDOFFS {
        let waiter = if holder_is_a { b.clone() } else { a.clone() };
        let waiting = {
            let opts = opts.clone();
            tokio::spawn(async move {
                let lease = waiter.acquire(key, &opts).await;
                (lease, Instant::now())
            })
        };
        // Let the waiter queue behind the holder (create, list, watch).
        let queued = Instant::now() + Duration::from_millis(30);
        tokio::time::sleep_until(queued).await;
        let released = Instant::now();
        holder.release().await?;
        let (lease, granted) = waiting.await?;
        samples.push(granted - released);
        holder = lease?;
        holder_is_a = !holder_is_a;
    }
    holder.release().await?;
    Ok(Stats::of(samples))
}

struct Stats {
    n: usize,
    mean: Duration,
    p50: Duration,
    p90: Duration,
    p99: Duration,
}

impl Stats {
    fn of(mut samples: Vec<Duration>) -> Stats {
        samples.sort();
        let n = samples.len().max(1);
        let at = |q: f64| samples[((n as f64 * q) as usize).min(n - 1)];
        Stats {
            n: samples.len(),
            mean: samples.iter().sum::<Duration>() / n as u32,
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
        }
    }

    fn row(&self, name: &str) {
        println!(
            "| {name} | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms | {:.0} |",
            ms(self.mean),
            ms(self.p50),
            ms(self.p90),
            ms(self.p99),
            self.n as f64 / (self.mean.as_secs_f64() * self.n as f64)
        );
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}
