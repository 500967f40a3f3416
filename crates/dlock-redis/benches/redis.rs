//! The Redis backend against the floor measured in the same run, on one Redis container.
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo bench -p dlock-redis --bench redis
//! ```
//!
//! Prints one table:
//!
//! * uncontended acquire + release, p50/p99, beside the floor: the same connection doing two bare
//!   script round trips (`EVALSHA` of `return 1`), and beside the two lock scripts called directly;
//! * throughput with 1, 16 and 64 tasks on distinct keys, beside the floor with as many tasks;
//! * a hot key: 16 tasks contending for one key (on one client, and on 16 clients), hand-offs per
//!   second and hand-off latency (release called → next holder has the lease), p50/p99; and the
//!   same with waiters that only poll (core's default loop, 10–500 ms backoff), for comparison.
//!
//! Run as a test (`cargo test --all-targets`, no `--bench` argument) it does a few iterations of
//! each part, to prove it works, in a few seconds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_compliance::fixtures::{docker_opt_out, RedisServer};
use dlock_core::{
    Attempt, Capabilities, DistributedLock, DistributedLockExt, Extension, LeaseRef, LockKey,
    LockOptions, LockRequest, OwnerToken, Released,
};
use dlock_redis::{scripts, RedisLock};
use redis::aio::ConnectionManager;
use tokio::time::Instant;

/// How much work each part does.
#[derive(Clone, Copy)]
struct Scale {
    rounds: usize,
    cycles_per_round: usize,
    throughput_for: Duration,
    hot_key_for: Duration,
}

const FULL: Scale = Scale {
    rounds: 10,
    cycles_per_round: 1_000,
    throughput_for: Duration::from_secs(4),
    hot_key_for: Duration::from_secs(3),
};

const SMOKE: Scale = Scale {
    rounds: 2,
    cycles_per_round: 20,
    throughput_for: Duration::from_millis(100),
    hot_key_for: Duration::from_millis(300),
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let full = args.iter().any(|a| a == "--bench");
    // `cargo bench -p dlock-redis --bench redis -- hot` runs only the parts whose name contains
    // one of the words given: `cycle`, `throughput`, `hot`.
    let only: Vec<String> = args.into_iter().filter(|a| !a.starts_with('-')).collect();
    let part = move |name: &str| only.is_empty() || only.iter().any(|o| name.contains(o.as_str()));
    if RedisServer::needs_docker() && docker_opt_out() {
        println!("redis bench: skipped (DLOCK_TEST_NO_DOCKER is set)");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let server = RedisServer::start().await.expect("a Redis server");
        let result = run(&server.url(), if full { FULL } else { SMOKE }, &part).await;
        server.shutdown().await.expect("removing the server");
        result.expect("the benchmark");
    });
}

async fn run(url: &str, scale: Scale, part: &dyn Fn(&str) -> bool) -> anyhow::Result<()> {
    let client = RedisLock::connect(url).await?;
    let locks: Arc<dyn DistributedLock> = Arc::new(client.clone());
    let con = client.connection();
    let noop = redis::Script::new("return 1");
    let mut warm = con.clone();
    let _: i64 = noop.invoke_async(&mut warm).await?;
    let mut table = Table::default();

    let opts = LockOptions::new(Duration::from_secs(10)).with_wait(Duration::from_secs(10));
    // Uncontended cycle.
    if part("cycle") {
        let (mut floor, mut raw, mut backend, mut cycle) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let name = LockKey::new("bench/cycle")?;
        let keys = client.keys(&name);
        let owner = OwnerToken::random().to_hex();
        for _ in 0..scale.cycles_per_round {
            // Warm-up: connections, script cache, allocator.
            locks.acquire("bench/cycle", &opts).await?.release().await?;
        }
        // One cycle of each kind in turn, so that load from elsewhere on the machine hits all
        // three alike.
        for _ in 0..scale.rounds * scale.cycles_per_round {
            let start = Instant::now();
            two_round_trips(&noop, &mut con.clone()).await?;
            floor.push(start.elapsed());

            let mut c = con.clone();
            let start = Instant::now();
            let ttl = Duration::from_secs(10);
            scripts::acquire(&mut c, &keys.lock, &keys.fence, &owner, ttl).await?;
            scripts::release(&mut c, &keys.lock, &owner, &keys.channel).await?;
            raw.push(start.elapsed());

            let request = LockRequest {
                key: &name,
                owner: OwnerToken::random(),
                ttl: Duration::from_secs(10),
            };
            let start = Instant::now();
            client.lock(&request, None, &opts.retry).await?;
            let lease = LeaseRef {
                key: &name,
                owner: request.owner,
                fencing: None,
            };
            client.release(&lease).await?;
            backend.push(start.elapsed());

            let start = Instant::now();
            let lease = locks.acquire("bench/cycle", &opts).await?;
            lease.release().await?;
            cycle.push(start.elapsed());
        }
        let floor = Summary::of(floor);
        table.latency("floor: 2 × EVALSHA `return 1`", &floor, &floor);
        table.latency("scripts: acquire + release", &Summary::of(raw), &floor);
        table.latency(
            "backend: lock + release (no core)",
            &Summary::of(backend),
            &floor,
        );
        table.latency("dlock: acquire + release", &Summary::of(cycle), &floor);
    }

    // Throughput on distinct keys: floor, scripts and dlock take turns in short slices, so that
    // load from elsewhere on the machine hits all three alike; each rate is the median slice.
    for tasks in [1usize, 16, 64] {
        if !part(&format!("throughput{tasks}")) {
            continue;
        }
        let (mut floor, mut raw, mut dlock) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..scale.rounds {
            let slice = scale.throughput_for / scale.rounds as u32;
            floor.push(
                throughput(&con, tasks, slice, {
                    let con = con.clone();
                    let noop = noop.clone();
                    move |_| {
                        let (mut con, noop) = (con.clone(), noop.clone());
                        async move {
                            two_round_trips(&noop, &mut con)
                                .await
                                .map_err(anyhow::Error::from)
                        }
                    }
                })
                .await?,
            );
            raw.push(
                throughput(&con, tasks, slice, {
                    let con = con.clone();
                    move |task| {
                        let mut con = con.clone();
                        async move {
                            let name = LockKey::new(&format!("bench/raw/{task}"))?;
                            let lock = dlock_redis::keys::KeyLayout::default().lock_key(&name);
                            let fence = dlock_redis::keys::fence_key(&lock);
                            let channel = dlock_redis::keys::release_channel(&lock);
                            let owner = OwnerToken::random().to_hex();
                            let ttl = Duration::from_secs(10);
                            scripts::acquire(&mut con, &lock, &fence, &owner, ttl).await?;
                            scripts::release(&mut con, &lock, &owner, &channel).await?;
                            anyhow::Ok(())
                        }
                    }
                })
                .await?,
            );
            dlock.push(
                throughput(&con, tasks, slice, {
                    let locks = locks.clone();
                    let opts = opts.clone();
                    move |task| {
                        let (locks, opts) = (locks.clone(), opts.clone());
                        async move {
                            let lease = locks.acquire(&format!("bench/tput/{task}"), &opts).await?;
                            lease.release().await?;
                            anyhow::Ok(())
                        }
                    }
                })
                .await?,
            );
        }
        let floor = Rate::median(floor);
        table.throughput(tasks, "scripts", floor, Rate::median(raw));
        table.throughput(tasks, "dlock", floor, Rate::median(dlock));
    }

    // A hot key.
    if part("hot") {
        let one_client: Vec<Arc<dyn DistributedLock>> = vec![locks.clone(); 16];
        table.hot_key(
            "16 tasks, 1 client (notified)",
            hot_key(&one_client, "bench/hot/1", scale).await?,
        );
        let mut many = Vec::new();
        for _ in 0..16 {
            let c: Arc<dyn DistributedLock> = Arc::new(RedisLock::connect(url).await?);
            many.push(c);
        }
        table.hot_key(
            "16 tasks, 16 clients (notified)",
            hot_key(&many, "bench/hot/16", scale).await?,
        );
        let polling: Vec<Arc<dyn DistributedLock>> = many
            .iter()
            .map(|c| Arc::new(PollingOnly(c.clone())) as Arc<dyn DistributedLock>)
            .collect();
        table.hot_key(
            "16 tasks, 16 clients (polling only)",
            hot_key(&polling, "bench/hot/poll", scale).await?,
        );
    }

    table.print(scale);
    Ok(())
}

async fn two_round_trips(
    noop: &redis::Script,
    con: &mut ConnectionManager,
) -> redis::RedisResult<()> {
    let _: i64 = noop.invoke_async(con).await?;
    let _: i64 = noop.invoke_async(con).await?;
    Ok(())
}

/// What a throughput run achieved, and the CPU time it cost per operation on each side.
#[derive(Debug, Clone, Copy)]
struct Rate {
    per_second: f64,
    client_cpu: Duration,
    server_cpu: Duration,
}

impl Rate {
    /// The median of each figure over several slices.
    fn median(rates: Vec<Rate>) -> Rate {
        fn mid<T: Copy + PartialOrd>(mut v: Vec<T>) -> T {
            v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
            v[v.len() / 2]
        }
        Rate {
            per_second: mid(rates.iter().map(|r| r.per_second).collect()),
            client_cpu: mid(rates.iter().map(|r| r.client_cpu).collect()),
            server_cpu: mid(rates.iter().map(|r| r.server_cpu).collect()),
        }
    }
}

/// Operations per second of `tasks` tasks repeating `op(task)` for `duration`.
async fn throughput<F, Fut>(
    con: &ConnectionManager,
    tasks: usize,
    duration: Duration,
    op: F,
) -> anyhow::Result<Rate>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let count = Arc::new(AtomicU64::new(0));
    let (client_before, server_before) = (client_cpu()?, server_cpu(con).await?);
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
    let elapsed = start.elapsed();
    let (client_after, server_after) = (client_cpu()?, server_cpu(con).await?);
    let ops = count.load(Ordering::Relaxed).max(1);
    Ok(Rate {
        per_second: ops as f64 / elapsed.as_secs_f64(),
        client_cpu: client_after.saturating_sub(client_before) / ops as u32,
        server_cpu: server_after.saturating_sub(server_before) / ops as u32,
    })
}

/// CPU time this process has used (user + system), from `/proc/self/stat` (10 ms resolution).
fn client_cpu() -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let ticks: u64 = fields.iter().sum();
    Ok(Duration::from_millis(ticks * 10))
}

/// CPU time the Redis server has used (`INFO cpu`, main thread and all).
async fn server_cpu(con: &ConnectionManager) -> anyhow::Result<Duration> {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(&mut con.clone())
        .await?;
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    Ok(Duration::from_secs_f64(
        field("used_cpu_sys:") + field("used_cpu_user:"),
    ))
}

/// Hand-offs per second and hand-off latencies of tasks (one per client entry) contending for
/// `key`. Each task takes the lock, releases it, and immediately contends again; a hand-off is an
/// acquisition by a task other than the previous holder, its latency the time from the previous
/// holder calling release to the new holder having its lease.
async fn hot_key(
    clients: &[Arc<dyn DistributedLock>],
    key: &str,
    scale: Scale,
) -> anyhow::Result<(f64, Summary)> {
    // (previous holder, when it called release)
    let last: Arc<Mutex<Option<(usize, Instant)>>> = Arc::new(Mutex::new(None));
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let opts = LockOptions::new(Duration::from_secs(10)).with_wait(Duration::from_secs(30));
    let start = Instant::now();
    let until = start + scale.hot_key_for;
    let mut handles = Vec::new();
    for (id, client) in clients.iter().enumerate() {
        let (client, opts, key) = (client.clone(), opts.clone(), key.to_owned());
        let (last, latencies) = (last.clone(), latencies.clone());
        handles.push(tokio::spawn(async move {
            while Instant::now() < until {
                let lease = client.acquire(&key, &opts).await?;
                let now = Instant::now();
                if let Some((previous, at)) = *last.lock().unwrap() {
                    if previous != id {
                        latencies.lock().unwrap().push(now - at);
                    }
                }
                *last.lock().unwrap() = Some((id, Instant::now()));
                lease.release().await?;
            }
            anyhow::Ok(())
        }));
    }
    for handle in handles {
        handle.await??;
    }
    let samples = std::mem::take(&mut *latencies.lock().unwrap());
    let rate = samples.len() as f64 / start.elapsed().as_secs_f64();
    Ok((rate, Summary::of(samples)))
}

/// The backend with its waiting replaced by core's default polling loop.
#[derive(Debug)]
struct PollingOnly(Arc<dyn DistributedLock>);

#[async_trait]
impl DistributedLock for PollingOnly {
    fn backend_name(&self) -> &'static str {
        self.0.backend_name()
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    async fn try_lock(&self, req: &LockRequest<'_>) -> dlock_core::Result<Attempt> {
        self.0.try_lock(req).await
    }
    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> dlock_core::Result<Extension> {
        self.0.extend(lease, ttl).await
    }
    async fn release(&self, lease: &LeaseRef<'_>) -> dlock_core::Result<Released> {
        self.0.release(lease).await
    }
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

impl Table {
    fn latency(&mut self, what: &str, s: &Summary, floor: &Summary) {
        let ratio = s.p50.as_secs_f64() / floor.p50.as_secs_f64().max(f64::MIN_POSITIVE);
        self.rows.push(format!(
            "| {what} | p50 {} | p99 {} | {:.2}× floor p50 | {} cycles |",
            us(s.p50),
            us(s.p99),
            ratio,
            s.samples
        ));
    }

    fn throughput(&mut self, tasks: usize, what: &str, floor: Rate, lock: Rate) {
        self.rows.push(format!(
            "| throughput, {tasks} task(s), distinct keys: {what} | {:.0} cycles/s | floor {:.0}/s | {:.0}% of floor | CPU per cycle, client / server: {} / {} (floor {} / {}) |",
            lock.per_second,
            floor.per_second,
            100.0 * lock.per_second / floor.per_second.max(f64::MIN_POSITIVE),
            us(lock.client_cpu),
            us(lock.server_cpu),
            us(floor.client_cpu),
            us(floor.server_cpu),
        ));
    }

    fn hot_key(&mut self, what: &str, (rate, s): (f64, Summary)) {
        self.rows.push(format!(
            "| hot key: {what} | {rate:.0} hand-offs/s | hand-off p50 {} | p99 {} | {} hand-offs |",
            us(s.p50),
            us(s.p99),
            s.samples
        ));
    }

    fn print(&self, scale: Scale) {
        println!();
        println!(
            "dlock-redis benchmark ({} rounds × {} cycles; throughput {:?} per row; hot key {:?} per row)",
            scale.rounds, scale.cycles_per_round, scale.throughput_for, scale.hot_key_for
        );
        println!("| measurement | | | | |");
        println!("|---|---|---|---|---|");
        for row in &self.rows {
            println!("{row}");
        }
    }
}
