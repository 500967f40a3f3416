//! `dlock-bench`: every dlock backend beside its floor and its peers, in one run.
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo run --release -p dlock-bench            # the full run, about fifteen minutes
//! cargo run --release -p dlock-bench -- --quick # about a minute
//! ```
//!
//! For each backend it starts the servers through the compliance fixtures (or uses the servers
//! given with `--redis-url`, `--redlock-urls`, `--zk-url`, `--etcd-url` or the `DLOCK_TEST_*`
//! variables), then
//! runs the same workloads on dlock, on the server's floor (the bare round trips a lock cycle
//! cannot avoid) and on the peers (another lock implementation on the same server):
//!
//! * uncontended acquire + release, p50/p99/p999;
//! * throughput at 1, 16 and 64 tasks on keys of their own;
//! * a hot key: contenders with clients of their own, hand-offs per second and hand-off latency;
//! * acquire latency while one server or member is frozen (`docker pause`);
//! * many held leases with auto-renew: client memory per lease and renewal requests per second,
//!   renewing per lease (a timer and a request per lease) and batched (dlock's auto-renew).
//!
//! Sides take turns in rounds, so load from elsewhere on a noisy machine hits them alike; the
//! ratios beside the absolute figures are what to compare between runs. Progress goes to standard
//! error; the table to standard output; everything to a JSON file. Nothing is asserted on speed.

mod backends;
mod counting;
mod locker;
mod plan;
mod progress;
mod report;
mod server;
mod stats;
mod workloads;

use std::alloc::System;
use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use dlock_testkit::fixtures::{host_network, NETWORK_ENV};
use dlock_testkit::page::{self, Stamp};
use dlock_testkit::registry::{self, dlock_backends};

use crate::locker::Kind;
use crate::progress::Progress;
use crate::report::{BackendReport, Fresh, Report, SideReport};
use crate::server::ServerCount;
use crate::workloads::{Renewal, TASKS};

/// Counts allocations, for the client memory per held lease.
#[global_allocator]
pub static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// One comparative benchmark of every dlock backend, its floor and its peers.
#[derive(Debug, Parser)]
#[command(name = "dlock-bench", version)]
struct Args {
    /// About one minute instead of ten: fewer samples, shorter windows, 1,000 leases.
    #[arg(long)]
    quick: bool,
    /// Where to write the JSON report.
    #[arg(long, default_value = "target/dlock-bench.json")]
    json: PathBuf,
    /// Also rewrite the generated section of this Markdown page (between its `dlock-bench`
    /// markers) with the run's tables, stamped with its command, date, commit and machine:
    /// `--page docs/performance.md`.
    #[arg(long)]
    page: Option<PathBuf>,
    /// Only these backends (comma-separated names: memory, redis, redlock, zk, etcd, postgres).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Use this Redis server instead of a container (as DLOCK_TEST_REDIS_URL).
    #[arg(long)]
    redis_url: Option<String>,
    /// Use these Redis masters for Redlock instead of containers, comma-separated (as
    /// DLOCK_TEST_REDLOCK_URLS).
    #[arg(long)]
    redlock_urls: Option<String>,
    /// Use this ZooKeeper ensemble instead of containers (as DLOCK_TEST_ZK_URL).
    #[arg(long)]
    zk_url: Option<String>,
    /// Use this etcd cluster instead of containers (as DLOCK_TEST_ETCD_URL).
    #[arg(long)]
    etcd_url: Option<String>,
    /// Use this PostgreSQL server instead of a container (as DLOCK_TEST_POSTGRES_URL); the
    /// renewal workload's larger counts need a lock table of 100,000 slots or more
    /// (max_locks_per_transaction × max_connections).
    #[arg(long)]
    postgres_url: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(unknown) = args
        .only
        .iter()
        .find(|name| registry::backend(name).is_none_or(|b| b.role != registry::Role::Backend))
    {
        let known: Vec<&str> = dlock_backends().map(|b| b.name).collect();
        anyhow::bail!("unknown backend {unknown:?}; known: {}", known.join(", "));
    }
    // The fixtures read these variables; the flags are a shorter way to set them.
    for (flag, env) in [
        (&args.redis_url, "DLOCK_TEST_REDIS_URL"),
        (&args.redlock_urls, "DLOCK_TEST_REDLOCK_URLS"),
        (&args.zk_url, "DLOCK_TEST_ZK_URL"),
        (&args.etcd_url, "DLOCK_TEST_ETCD_URL"),
        (&args.postgres_url, "DLOCK_TEST_POSTGRES_URL"),
    ] {
        if let Some(url) = flag {
            std::env::set_var(env, url);
        }
    }
    // Servers the run starts listen on the host's network, as a server on the client's own
    // machine would: Docker's bridge would add its cost to every request of every side and hide
    // the server's own. `DLOCK_TEST_NETWORK=bridge` measures through the bridge instead.
    if std::env::var_os(NETWORK_ENV).is_none() {
        std::env::set_var(NETWORK_ENV, "host");
    }
    // What a service that turns the layers on runs with: a metrics exporter installed, and a
    // subscriber at INFO for dlock (its per-call spans are DEBUG, so they are created disabled)
    // and at WARN for the libraries under it, whose INFO lines (ZooKeeper's client logs every
    // connection) would drown the report; `RUST_LOG` (`target=level,…`) says otherwise.
    metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    let quiet = || {
        tracing_subscriber::filter::Targets::new()
            .with_default(tracing::Level::WARN)
            .with_target("dlock", tracing::Level::INFO)
    };
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) => directives.parse().unwrap_or_else(|e| {
            eprintln!("RUST_LOG={directives:?} is not `target=level,…` ({e}); using the default");
            quiet()
        }),
        Err(_) => quiet(),
    };
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(filter)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = runtime.block_on(run(&args))?;
    let text = report::print(&report);
    println!("{text}");
    if let Some(dir) = args.json.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)?)?;
    eprintln!("wrote {}", args.json.display());
    if let Some(path) = &args.page {
        let command = std::iter::once("dlock-bench".to_owned())
            .chain(std::env::args().skip(1))
            .collect::<Vec<_>>()
            .join(" ");
        page::write_section(
            path,
            "dlock-bench",
            &Stamp::now(command),
            &report::page(&report),
        )
        .map_err(anyhow::Error::msg)?;
        eprintln!("rewrote the generated section of {}", path.display());
    }
    Ok(())
}

async fn run(args: &Args) -> anyhow::Result<Report> {
    let plan = if args.quick { plan::QUICK } else { plan::FULL };
    let progress = Progress::new();
    let started = Instant::now();
    let mut backends = Vec::new();
    let mut skipped = Vec::new();
    for entry in dlock_backends() {
        if !args.only.is_empty() && !args.only.iter().any(|n| n == entry.name) {
            continue;
        }
        if entry.fixture.needs_docker() && dlock_testkit::fixtures::docker_opt_out() {
            progress.say(
                entry.name,
                "skipped: DLOCK_TEST_NO_DOCKER=1 and no server given",
            );
            skipped.push((entry.name.to_owned(), "DLOCK_TEST_NO_DOCKER=1".to_owned()));
            continue;
        }
        progress.say(entry.name, "starting servers");
        let setup = backends::start(entry).await?;
        let result = measure(entry.name, &setup, plan, &progress).await;
        progress.say(entry.name, "removing servers");
        setup.deployment.shutdown().await?;
        backends.push(result?);
    }
    let mut report = Report {
        quick: args.quick,
        plan,
        date: report::utc_now(),
        machine: machine(),
        backends,
        skipped,
        goals: Vec::new(),
        seconds: started.elapsed().as_secs_f64(),
    };
    report.goals = report::goals(&report);
    Ok(report)
}

async fn measure(
    name: &str,
    setup: &backends::Setup,
    plan: plan::Plan,
    progress: &Progress,
) -> anyhow::Result<BackendReport> {
    progress.say(
        name,
        format!("uncontended cycles ({} per side)", plan.cycles),
    );
    let cycles = workloads::cycles(&setup.sides, plan).await?;
    let mut throughput = vec![Vec::new(); setup.sides.len()];
    for tasks in TASKS {
        progress.say(name, format!("throughput, {tasks} task(s)"));
        for (side, rate) in workloads::throughput(&setup.sides, tasks, plan)
            .await?
            .into_iter()
            .enumerate()
        {
            throughput[side].push(rate);
        }
    }
    let counter: Option<&dyn ServerCount> = setup.server_count.as_ref().ok().map(|c| &**c);
    let fresh = match &setup.fresh_floor {
        Some((label, floor)) => {
            progress.say(name, "uncontended cycles on fresh keys");
            let dlock = &setup.sides[0].locker;
            let times = workloads::fresh_cycles(&[dlock, floor], plan).await?;
            Some(Fresh {
                floor_label: label.clone(),
                dlock: times[0],
                floor: times[1],
            })
        }
        None => None,
    };
    let mut sides = Vec::new();
    let mut waiting = Vec::new();
    let mut waiting_note = None;
    for (i, ((side, cycle), throughput)) in
        setup.sides.iter().zip(cycles).zip(throughput).enumerate()
    {
        if side.connect.is_some() {
            progress.say(
                name,
                format!("hot key, {} tasks: {}", plan.contenders, side.label),
            );
        }
        let hot_key = workloads::hot_key(side, i, plan.contenders, plan, counter).await?;
        if side.kind == Kind::Dlock {
            for &wanted in plan.waiting_tasks {
                let tasks = match setup.max_clients {
                    Some((max, why)) if wanted > max => {
                        waiting_note = Some(format!("{wanted} tasks capped at {max}: {why}"));
                        max
                    }
                    _ => wanted,
                };
                if tasks == plan.contenders {
                    waiting.extend(hot_key);
                    continue;
                }
                progress.say(name, format!("hot key, {tasks} tasks: {}", side.label));
                waiting.extend(workloads::hot_key(side, i, tasks, plan, counter).await?);
            }
            waiting.sort_by_key(|h| h.tasks);
        }
        let (cycle, client) = cycle;
        sides.push(SideReport {
            kind: side.kind,
            label: side.label.clone(),
            cycle,
            client,
            throughput,
            hot_key,
        });
    }
    // Session backends need no renewal per lease: the client keeps its one session alive. The
    // growth is measured in the way dlock renews (auto-renew, batched, or the session); renewing
    // per lease only at the plan's one count, beside it.
    let (growing, beside) = if setup.locks.capabilities().session_based {
        (Renewal::Session, None)
    } else {
        (Renewal::Batched, Some(Renewal::PerLease))
    };
    let runs = plan
        .lease_counts
        .iter()
        .map(|&n| (growing, n))
        .chain(beside.map(|mode| (mode, plan.leases)));
    let mut renewing = Vec::new();
    for (mode, leases) in runs {
        progress.say(
            name,
            format!("{leases} leases held, renewal: {}", mode.name()),
        );
        let client = (setup.client)().await?;
        renewing.push(
            workloads::renewing(client, setup.wire_batch, mode, leases, plan, counter).await?,
        );
    }
    let frozen = match &setup.freeze {
        Ok((member, what)) => {
            progress.say(name, format!("acquires with {what} frozen"));
            Ok(workloads::frozen(&setup.locks, member, what.clone(), plan).await?)
        }
        Err(why) => Err(why.clone()),
    };
    Ok(BackendReport {
        name: name.to_owned(),
        servers: setup.servers.clone(),
        sides,
        frozen,
        renewal_note: setup.renewal_note.to_owned(),
        renewing,
        server_count: match &setup.server_count {
            Ok(c) => Ok(c.what().to_owned()),
            Err(why) => Err(why.clone()),
        },
        waiting,
        waiting_note,
        fresh,
    })
}

/// Cores and CPU model, and where the servers ran, as the report states them.
fn machine() -> String {
    let servers = match host_network() {
        Ok(true) => "servers in Docker containers on the host's network, reached on loopback (no bridge or port proxy in the path), except those given by URL",
        _ => "servers in Docker containers on Docker's bridge networks, reached at their bridge addresses (not through the port proxy), except those given by URL",
    };
    format!(
        "{}; {servers}; the machine is shared, so figures are noisy",
        page::machine()
    )
}
