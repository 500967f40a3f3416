//! The Redlock backend beside the `rslock` crate (the most used Rust Redlock), on the same five
//! Redis containers in the same run, and beside the single-Redis backend on one of them.
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo bench -p dlock-redlock --bench redlock
//! ```
//!
//! Prints one table:
//!
//! * uncontended acquire + release, p50/p99: dlock-redlock (fencing on), dlock-redlock (fencing
//!   off), rslock, and dlock-redis on master 0 (the 1.5× target compares the first with the last);
//!   beside them the floors measured on the same connections: two rounds of a bare script
//!   (`EVALSHA` of `return 1`) to one master, and to all five in parallel;
//! * throughput with 1, 16 and 64 tasks on distinct keys, dlock-redlock and rslock taking turns in
//!   short slices so that load from elsewhere hits both alike (median slice);
//! * a hot key: 16 tasks contending for one key, hand-offs per second;
//! * acquire latency with one master frozen (`docker pause`), p50/p99. rslock has no per-node
//!   timeout: its requests to the frozen master wait for redis-rs's response timeout.
//!
//! Run as a test (`cargo test --all-targets`, no `--bench` argument) it does a few iterations of
//! each part, to prove it works, in a few seconds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_compliance::fixtures::{docker_opt_out, RedisMasters};
use dlock_core::{DistributedLock, DistributedLockExt, LockOptions};
use dlock_redis::RedisLock;
use dlock_redlock::RedlockBuilder;
use rslock::LockManager;
use tokio::time::Instant;

/// How much work each part does.
#[derive(Clone, Copy)]
struct Scale {
    cycles: usize,
    throughput_rounds: usize,
    throughput_for: Duration,
    hot_key_for: Duration,
    frozen_acquires: usize,
}

const FULL: Scale = Scale {
    cycles: 3_000,
    throughput_rounds: 6,
    throughput_for: Duration::from_secs(3),
    hot_key_for: Duration::from_secs(3),
    frozen_acquires: 40,
};

const SMOKE: Scale = Scale {
    cycles: 20,
    throughput_rounds: 2,
    throughput_for: Duration::from_millis(100),
    hot_key_for: Duration::from_millis(300),
    frozen_acquires: 3,
};

const TTL: Duration = Duration::from_secs(10);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let full = args.iter().any(|a| a == "--bench");
    // `cargo bench -p dlock-redlock --bench redlock -- hot` runs only the parts whose name
    // contains one of the words given: `cycle`, `throughput`, `hot`, `frozen`.
    let only: Vec<String> = args.into_iter().filter(|a| !a.starts_with('-')).collect();
    let part = move |name: &str| only.is_empty() || only.iter().any(|o| name.contains(o.as_str()));
    if RedisMasters::needs_docker() && docker_opt_out() {
        println!("redlock bench: skipped (DLOCK_TEST_NO_DOCKER is set)");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let masters = RedisMasters::start(5).await.expect("five Redis masters");
        let result = run(&masters, if full { FULL } else { SMOKE }, &part).await;
        masters.shutdown().await.expect("removing the masters");
        result.expect("the benchmark");
    });
}

/// The two clients under comparison, as one operation each: acquire `key`, then release it.
#[derive(Clone)]
struct Contenders {
    dlock: Arc<dyn DistributedLock>,
    rslock: LockManager,
}

async fn dlock_cycle(
    locks: &Arc<dyn DistributedLock>,
    key: &str,
    wait: bool,
) -> anyhow::Result<()> {
    let opts = LockOptions::new(TTL);
    let lease = if wait {
        locks
            .acquire(key, &opts.with_wait(Duration::from_secs(30)))
            .await?
    } else {
        locks
            .try_acquire(key, &opts)
            .await?
            .ok_or_else(|| anyhow::anyhow!("{key} is busy"))?
    };
    lease.release().await?;
    Ok(())
}

async fn rslock_cycle(rl: &LockManager, key: &str, wait: bool) -> anyhow::Result<()> {
    let lock = if wait {
        rl.acquire_no_guard(key, TTL)
            .await
            .map_err(|e| anyhow::anyhow!("rslock: {e:?}"))?
    } else {
        rl.lock(key, TTL)
            .await
            .map_err(|e| anyhow::anyhow!("rslock: {e:?}"))?
    };
    rl.unlock(&lock).await;
    Ok(())
}

async fn run(
    masters: &RedisMasters,
    scale: Scale,
    part: &dyn Fn(&str) -> bool,
) -> anyhow::Result<()> {
    let urls = masters.urls();
    let fenced: Arc<dyn DistributedLock> =
        Arc::new(RedlockBuilder::from_urls(urls.clone()).connect().await?);
    let unfenced: Arc<dyn DistributedLock> = Arc::new(
        RedlockBuilder::from_urls(urls.clone())
            .fencing(false)
            .connect()
            .await?,
    );
    let single: Arc<dyn DistributedLock> = Arc::new(RedisLock::connect(&urls[0]).await?);
    let rl = LockManager::new(urls.clone());
    let mut raw = Vec::new();
    for url in &urls {
        raw.push(
            redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?,
        );
    }
    let noop = redis::Script::new("return 1");
    let both = Contenders {
        dlock: fenced.clone(),
        rslock: rl.clone(),
    };
    let mut table = Table::default();

    if part("cycle") {
        // Warm-up: connections, script caches, allocator.
        for _ in 0..scale.cycles / 10 + 5 {
            dlock_cycle(&fenced, "bench/cycle", false).await?;
            dlock_cycle(&unfenced, "bench/cycle-unfenced", false).await?;
            dlock_cycle(&single, "bench/cycle-single", false).await?;
            rslock_cycle(&rl, "bench/cycle-rslock", false).await?;
        }
        for _ in 0..10 {
            floor_rounds(&noop, &raw[..1]).await?;
            floor_rounds(&noop, &raw).await?;
        }
        let mut samples: [Vec<Duration>; 6] = Default::default();
        // One cycle of each in turn, so that load from elsewhere hits all alike.
        for _ in 0..scale.cycles {
            let start = Instant::now();
            dlock_cycle(&fenced, "bench/cycle", false).await?;
            samples[0].push(start.elapsed());
            let start = Instant::now();
            dlock_cycle(&unfenced, "bench/cycle-unfenced", false).await?;
            samples[1].push(start.elapsed());
            let start = Instant::now();
            rslock_cycle(&rl, "bench/cycle-rslock", false).await?;
            samples[2].push(start.elapsed());
            let start = Instant::now();
            dlock_cycle(&single, "bench/cycle-single", false).await?;
            samples[3].push(start.elapsed());
            let start = Instant::now();
            floor_rounds(&noop, &raw[..1]).await?;
            samples[4].push(start.elapsed());
            let start = Instant::now();
            floor_rounds(&noop, &raw).await?;
            samples[5].push(start.elapsed());
        }
        let [fenced_s, unfenced_s, rslock_s, single_s, floor1, floor5] = samples.map(Summary::of);
        table.cycle(
            "dlock-redlock (fencing on)",
            &fenced_s,
            &rslock_s,
            &single_s,
        );
        table.cycle(
            "dlock-redlock (fencing off)",
            &unfenced_s,
            &rslock_s,
            &single_s,
        );
        table.cycle("rslock", &rslock_s, &rslock_s, &single_s);
        table.cycle("dlock-redis, one master", &single_s, &rslock_s, &single_s);
        table.cycle(
            "floor: 2 × EVALSHA `return 1`, one master",
            &floor1,
            &rslock_s,
            &single_s,
        );
        table.cycle(
            "floor: 2 rounds of EVALSHA `return 1` to all 5 masters in parallel",
            &floor5,
            &rslock_s,
            &single_s,
        );
    }

    for tasks in [1usize, 16, 64] {
        if !part(&format!("throughput{tasks}")) {
            continue;
        }
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..scale.throughput_rounds {
            let slice = scale.throughput_for / scale.throughput_rounds as u32;
            let c = both.clone();
            ours.push(
                throughput(tasks, slice, move |task| {
                    let locks = c.dlock.clone();
                    async move { dlock_cycle(&locks, &format!("bench/tput/{task}"), false).await }
                })
                .await?,
            );
            let c = both.clone();
            theirs.push(
                throughput(tasks, slice, move |task| {
                    let rl = c.rslock.clone();
                    async move { rslock_cycle(&rl, &format!("bench/tput-rs/{task}"), false).await }
                })
                .await?,
            );
        }
        table.throughput(tasks, median(ours), median(theirs));
    }

    if part("hot") {
        let ours = hot_key(16, scale.hot_key_for, {
            let locks = fenced.clone();
            move || {
                let locks = locks.clone();
                async move { dlock_cycle(&locks, "bench/hot", true).await }
            }
        })
        .await?;
        let theirs = hot_key(16, scale.hot_key_for, {
            let rl = rl.clone();
            move || {
                let rl = rl.clone();
                async move { rslock_cycle(&rl, "bench/hot-rs", true).await }
            }
        })
        .await?;
        table.hot_key(ours, theirs);
    }

    if part("frozen") {
        let frozen = masters.member(2)?;
        frozen.pause().await?;
        let measured = async {
            let mut ours = Vec::new();
            let mut theirs = Vec::new();
            for _ in 0..scale.frozen_acquires {
                let start = Instant::now();
                let lease = fenced
                    .try_acquire("bench/frozen", &LockOptions::new(TTL))
                    .await?
                    .ok_or_else(|| anyhow::anyhow!("busy with one master frozen"))?;
                ours.push(start.elapsed());
                lease.release().await?;
                let start = Instant::now();
                let lock = rl
                    .lock("bench/frozen-rs", TTL)
                    .await
                    .map_err(|e| anyhow::anyhow!("rslock with one master frozen: {e:?}"))?;
                theirs.push(start.elapsed());
                rl.unlock(&lock).await;
            }
            anyhow::Ok((Summary::of(ours), Summary::of(theirs)))
        }
        .await;
        frozen.unpause().await?;
        let (ours, theirs) = measured?;
        table.frozen(&ours, &theirs);
    }

    table.print(scale);
    Ok(())
}

/// Two rounds of a bare script, each sent to every connection in parallel and waiting for all.
async fn floor_rounds(
    noop: &redis::Script,
    connections: &[redis::aio::MultiplexedConnection],
) -> anyhow::Result<()> {
    for _ in 0..2 {
        let calls = connections.iter().map(|con| {
            let mut con = con.clone();
            async move { noop.invoke_async::<_, i64>(&mut con).await }
        });
        for result in futures::future::join_all(calls).await {
            result?;
        }
    }
    Ok(())
}

/// Cycles per second of `tasks` tasks repeating `op(task)` for `duration`.
async fn throughput<F, Fut>(tasks: usize, duration: Duration, op: F) -> anyhow::Result<f64>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let count = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let until = start + duration;
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (op, count) = (op.clone(), count.clone());
        handles.push(tokio::spawn(async move {
            while Instant::now() < until {
                op(task).await?;
                count.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for handle in handles {
        handle.await??;
    }
    Ok(count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

/// Hand-offs per second of `tasks` tasks each repeating `cycle` (acquire with waiting, release)
/// on one key for `duration`. Every completed cycle is one holder, so cycles per second is the
/// hand-off rate.
async fn hot_key<F, Fut>(tasks: usize, duration: Duration, cycle: F) -> anyhow::Result<f64>
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let holders = Arc::new(Mutex::new(0u64));
    let start = Instant::now();
    let until = start + duration;
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (cycle, holders) = (cycle.clone(), holders.clone());
        handles.push(tokio::spawn(async move {
            while Instant::now() < until {
                cycle().await?;
                *holders.lock().unwrap() += 1;
            }
            anyhow::Ok(())
        }));
    }
    for handle in handles {
        handle.await??;
    }
    let holders = *holders.lock().unwrap();
    Ok(holders as f64 / start.elapsed().as_secs_f64())
}

fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(|a, b| a.total_cmp(b));
    rates.get(rates.len() / 2).copied().unwrap_or_default()
}

#[derive(Debug, Clone, Copy)]
struct Summary {
    p50: Duration,
    p99: Duration,
    samples: usize,
}

impl Summary {
    fn of(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        let at = |q: f64| {
            samples
                .get(((samples.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or_default()
        };
        Summary {
            p50: at(0.50),
            p99: at(0.99),
            samples: samples.len(),
        }
    }
}

#[derive(Default)]
struct Table {
    rows: Vec<String>,
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(f64::MIN_POSITIVE)
}

impl Table {
    fn cycle(&mut self, what: &str, s: &Summary, rslock: &Summary, single: &Summary) {
        self.rows.push(format!(
            "| uncontended acquire + release: {what} | p50 {} | p99 {} | {:.2}× rslock p50 | {:.2}× dlock-redis p50 | {} cycles |",
            us(s.p50),
            us(s.p99),
            ratio(s.p50, rslock.p50),
            ratio(s.p50, single.p50),
            s.samples
        ));
    }

    fn throughput(&mut self, tasks: usize, ours: f64, theirs: f64) {
        self.rows.push(format!(
            "| throughput, {tasks} task(s), distinct keys | dlock-redlock {ours:.0} cycles/s | rslock {theirs:.0} cycles/s | {:.2}× rslock | |",
            ours / theirs.max(f64::MIN_POSITIVE)
        ));
    }

    fn hot_key(&mut self, ours: f64, theirs: f64) {
        self.rows.push(format!(
            "| hot key, 16 tasks, 1 client | dlock-redlock {ours:.0} hand-offs/s | rslock {theirs:.0} hand-offs/s | {:.2}× rslock | |",
            ours / theirs.max(f64::MIN_POSITIVE)
        ));
    }

    fn frozen(&mut self, ours: &Summary, theirs: &Summary) {
        self.rows.push(format!(
            "| acquire, one of 5 masters frozen | dlock-redlock p50 {} / p99 {} | rslock p50 {} / p99 {} | {:.2}× rslock p99 | {} acquires each |",
            us(ours.p50),
            us(ours.p99),
            us(theirs.p50),
            us(theirs.p99),
            ratio(ours.p99, theirs.p99),
            ours.samples
        ));
    }

    fn print(&self, scale: Scale) {
        println!();
        println!(
            "dlock-redlock benchmark, 5 masters ({} cycles; throughput {} × {:?} slices per row; hot key {:?}; {} acquires with a frozen master)",
            scale.cycles,
            scale.throughput_rounds,
            scale.throughput_for / scale.throughput_rounds as u32,
            scale.hot_key_for,
            scale.frozen_acquires
        );
        println!("| measurement | | | | |");
        println!("|---|---|---|---|---|");
        for row in &self.rows {
            println!("{row}");
        }
    }
}
