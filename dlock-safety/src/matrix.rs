//! Running the matrix: every selected scenario on every selected backend, the backends of one
//! deployment one after the other and the deployments at once, with progress on stderr.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{Capabilities, Primitives};
use dlock_testkit::fixtures::{
    FixtureError, PostgresServer, RedisMasters, RedisOptions, RedisReplicated, RedisServer,
};
use dlock_testkit::registry::{Fixture, Role, BACKENDS};
use tokio::time::Instant;

use crate::cell::{Cell, Expected};
use crate::class::{classify, Class};
use crate::filter::Filter;
use crate::plan::Plan;
use crate::run::Run;
use crate::scenarios;
use crate::subject::{PrimitiveTarget, Subject};
use crate::targets::{
    ConsensusTarget, FaultUnavailable, MemoryTarget, PostgresTarget, RedisFlavor, RedisTarget,
    RedlockTarget, Target,
};
use crate::Backend;
use crate::Scenario;

/// Members of the ZooKeeper and etcd deployments: the smallest that survives losing one.
const CLUSTER_SIZE: usize = 3;

/// The servers the run started, shared by the targets that need them.
#[derive(Default)]
struct Servers {
    redis: Option<Arc<RedisServer>>,
    replicated: Option<Result<Arc<RedisReplicated>, String>>,
    masters: Option<Arc<RedisMasters>>,
}

impl Servers {
    async fn redis(&mut self) -> anyhow::Result<Arc<RedisServer>> {
        if let Some(server) = &self.redis {
            return Ok(server.clone());
        }
        // The clock shim lets scenario 9 move the servers' clocks.
        let server =
            Arc::new(RedisServer::start_with(RedisOptions::default().with_jumping_clock()).await?);
        self.redis = Some(server.clone());
        Ok(server)
    }

    /// The Redlock masters, shared by both Redlock rows.
    async fn masters(&mut self) -> anyhow::Result<Arc<RedisMasters>> {
        if let Some(masters) = &self.masters {
            return Ok(masters.clone());
        }
        let masters = Arc::new(
            RedisMasters::start_with(
                RedisMasters::DEFAULT_COUNT,
                RedisOptions::default().with_jumping_clock(),
            )
            .await?,
        );
        self.masters = Some(masters.clone());
        Ok(masters)
    }

    /// The primary/replica pair, or why it could not start (only scenario 10 needs it).
    async fn replicated(&mut self) -> Result<Arc<RedisReplicated>, String> {
        if let Some(pair) = &self.replicated {
            return pair.clone();
        }
        let pair = RedisReplicated::start()
            .await
            .map(Arc::new)
            .map_err(|e| e.to_string());
        self.replicated = Some(pair.clone());
        pair
    }

    async fn shutdown(self) {
        if let Some(masters) = self.masters.and_then(|m| Arc::try_unwrap(m).ok()) {
            if let Err(e) = masters.shutdown().await {
                eprintln!("removing the Redlock masters: {e}");
            }
        }
        if let Some(pair) = self
            .replicated
            .and_then(Result::ok)
            .and_then(|p| Arc::try_unwrap(p).ok())
        {
            if let Err(e) = pair.shutdown().await {
                eprintln!("removing the Redis primary and replica: {e}");
            }
        }
        if let Some(server) = self.redis.and_then(|s| Arc::try_unwrap(s).ok()) {
            if let Err(e) = server.shutdown().await {
                eprintln!("removing the Redis server: {e}");
            }
        }
    }
}

/// A started target, and how to stop what it started itself.
enum Started {
    Memory(MemoryTarget),
    Redis(RedisTarget),
    Consensus(ConsensusTarget),
    Redlock(RedlockTarget),
    Postgres(PostgresTarget),
}

impl Started {
    fn target(&self) -> &dyn Target {
        match self {
            Started::Memory(t) => t,
            Started::Redis(t) => t,
            Started::Consensus(t) => t,
            Started::Redlock(t) => t,
            Started::Postgres(t) => t,
        }
    }

    async fn shutdown(self) {
        let result = match self {
            Started::Consensus(t) => t.shutdown().await,
            Started::Postgres(t) => t.shutdown().await,
            Started::Memory(_) | Started::Redis(_) | Started::Redlock(_) => Ok(()),
        };
        if let Err(e) = result {
            eprintln!("removing servers: {e:#}");
        }
    }
}

/// Starts what `backend`'s registry entry names: its fixture (shared between the rows that use
/// the same Redis server or masters) and the target for its client.
async fn start(
    backend: &'static Backend,
    servers: &mut Servers,
    plan: Plan,
    replica_needed: bool,
) -> anyhow::Result<Option<Started>> {
    Ok(Some(match backend.fixture {
        Fixture::InProcess => Started::Memory(MemoryTarget::default()),
        Fixture::RedisServer => redis(servers, RedisFlavor::of(backend)?, replica_needed).await?,
        Fixture::RedisMasters => {
            // Redlock's variant row is its delayed-restart rule, for the plan's longest lease.
            let delayed_restart = matches!(backend.role, Role::Variant(_)).then(|| plan.long_ttl());
            Started::Redlock(RedlockTarget::new(
                backend,
                servers.masters().await?,
                delayed_restart,
            ))
        }
        Fixture::ZkEnsemble | Fixture::EtcdCluster => Started::Consensus(ConsensusTarget::new(
            backend,
            backend.fixture.start(CLUSTER_SIZE).await?,
        )),
        Fixture::PostgresServer => {
            Started::Postgres(PostgresTarget::new(backend, PostgresServer::start().await?))
        }
    }))
}

async fn redis(
    servers: &mut Servers,
    flavor: RedisFlavor,
    replica_needed: bool,
) -> anyhow::Result<Started> {
    let pair = if replica_needed {
        servers.replicated().await
    } else {
        Err("scenario 10 was not selected".to_owned())
    };
    Ok(Started::Redis(RedisTarget::new(
        servers.redis().await?,
        pair,
        flavor,
    )))
}

/// The cells of `backend` that `filter` selects, in matrix order: the lock's, then each
/// primitive's (the plan's [`primitive_scenarios`](Plan::primitive_scenarios)).
fn selected_cells(backend: &Backend, plan: Plan, filter: &Filter) -> Vec<(Scenario, Subject)> {
    Subject::ALL
        .into_iter()
        .flat_map(|subject| {
            let scenarios: &[Scenario] = match subject {
                Subject::Lock => &Scenario::ALL,
                _ => plan.primitive_scenarios(),
            };
            scenarios.iter().map(move |s| (*s, subject))
        })
        .filter(|(s, p)| filter.selects(*s, backend, *p))
        .collect()
}

/// What the registry's entry `backend` declares about itself, taken from its backend crate (a
/// variant's from its base's): `None` for a baseline, which is no dlock backend.
pub fn declared(backend: &Backend) -> Option<Capabilities> {
    let name = match backend.role {
        Role::Backend => backend.name,
        Role::Variant(of) => of,
        Role::Baseline => return None,
    };
    match name {
        "memory" => Some(dlock::InMemoryLock::CAPABILITIES),
        "redis" => Some(dlock::redis::RedisLock::CAPABILITIES),
        "zk" => Some(dlock::zk::ZkLock::CAPABILITIES),
        "etcd" => Some(dlock::etcd::EtcdLock::CAPABILITIES),
        "postgres" => Some(dlock::postgres::PgLock::CAPABILITIES),
        "redlock" => Some(dlock::redlock::RedlockLock::CAPABILITIES),
        _ => None,
    }
}

/// What `backend` declares it serves besides the lock: `None` for a baseline; what its client
/// answers in `capabilities().primitives` once the servers run, else its [declaration](declared).
async fn served(
    backend: &Backend,
    started: Option<&Started>,
) -> Result<Option<Primitives>, String> {
    let Some(declared) = declared(backend) else {
        return Ok(None);
    };
    match started {
        Some(started) => match started.target().client().await {
            Ok(client) => Ok(Some(client.capabilities().primitives)),
            Err(e) => Err(format!("no client to ask for its primitives: {e:#}")),
        },
        None => Ok(Some(declared.primitives)),
    }
}

/// Runs every cell `filter` selects, printing progress, and returns them in matrix order.
///
/// The backends of one kind of deployment (the Redis server, which the baselines and a variant
/// use too; the Redlock masters; ZooKeeper; …) run one after another, on the servers they
/// share; the kinds run at the same time, each on servers of its own. A cell spends its time
/// waiting on leases, pauses and restarts, not computing, and every bound it checks has the
/// plan's slack: the quick run took 173 s with every backend one after another.
pub async fn run(plan: Plan, filter: &Filter) -> Vec<Cell> {
    let total = BACKENDS
        .iter()
        .map(|b| selected_cells(b, plan, filter).len())
        .sum();
    let nonce = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default()
    );
    let done = Arc::new(AtomicUsize::new(0));
    let mut groups: Vec<Vec<&'static Backend>> = Vec::new();
    for backend in BACKENDS {
        match groups.iter_mut().find(|g| g[0].fixture == backend.fixture) {
            Some(group) => group.push(backend),
            None => groups.push(vec![backend]),
        }
    }
    let runs: Vec<_> = groups
        .into_iter()
        .map(|group| {
            let (filter, nonce, done) = (filter.clone(), nonce.clone(), done.clone());
            tokio::spawn(async move {
                let mut servers = Servers::default();
                let mut cells = Vec::new();
                for backend in group {
                    let progress = Progress { done: &done, total };
                    let run = run_backend(backend, &mut servers, plan, &filter, &nonce, progress);
                    cells.push((backend.name, run.await));
                }
                servers.shutdown().await;
                cells
            })
        })
        .collect();
    let mut by_backend = Vec::new();
    for run in runs {
        match run.await {
            Ok(cells) => by_backend.extend(cells),
            Err(e) => eprintln!("a group of backends did not finish: {e}"),
        }
    }
    BACKENDS
        .iter()
        .flat_map(|b| {
            by_backend
                .iter()
                .position(|(name, _)| *name == b.name)
                .map(|i| std::mem::take(&mut by_backend[i].1))
                .unwrap_or_default()
        })
        .collect()
}

/// How many cells are done of how many, for the progress lines.
#[derive(Clone, Copy)]
struct Progress<'a> {
    done: &'a AtomicUsize,
    total: usize,
}

impl Progress<'_> {
    fn print(&self, cell: &Cell) {
        let n = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        progress(n, self.total, cell);
    }
}

/// Runs the cells `filter` selects of `backend`, starting what it needs (or taking it from
/// `servers`), in matrix order.
async fn run_backend(
    backend: &'static Backend,
    servers: &mut Servers,
    plan: Plan,
    filter: &Filter,
    nonce: &str,
    progress: Progress<'_>,
) -> Vec<Cell> {
    let selected = selected_cells(backend, plan, filter);
    let mut cells = Vec::with_capacity(selected.len());
    if selected.is_empty() {
        return cells;
    }
    let needs_servers = selected.iter().any(|(s, _)| {
        !matches!(
            backend.declared(*s).class,
            Class::NotApplicable | Class::NotRun
        )
    });
    let started = if needs_servers {
        eprintln!("starting {} …", backend.title);
        let replica_needed = selected
            .iter()
            .any(|(s, _)| *s == Scenario::LaggingReplicaPromoted);
        start(backend, servers, plan, replica_needed).await
    } else {
        Ok(None)
    };
    let served = if selected.iter().any(|(_, p)| *p != Subject::Lock) {
        served(backend, started.as_ref().ok().and_then(Option::as_ref)).await
    } else {
        Ok(None)
    };
    for (scenario, subject) in selected {
        let expected = match (&served, subject) {
            (Err(e), Subject::Write | Subject::Semaphore | Subject::Election) => {
                let expected = Expected::of(backend, scenario, Subject::Lock, None);
                let cell = failed(scenario, backend, subject, expected, e.clone());
                progress.print(&cell);
                cells.push(cell);
                continue;
            }
            (Err(_), Subject::Lock) => Expected::of(backend, scenario, subject, None),
            (Ok(served), _) => Expected::of(backend, scenario, subject, *served),
        };
        let cell = match &started {
            _ if expected.class == Class::NotApplicable => {
                let note = expected.reason.clone();
                Cell::skipped(
                    scenario,
                    backend,
                    subject,
                    Class::NotApplicable,
                    expected,
                    note,
                )
            }
            Ok(started) => {
                let target = started.as_ref().map(Started::target);
                cell(scenario, backend, subject, expected, target, plan, nonce).await
            }
            Err(e) if opted_out(e) => Cell::skipped(
                scenario,
                backend,
                subject,
                Class::NotRun,
                expected,
                format!("{e:#}"),
            ),
            Err(e) => failed(
                scenario,
                backend,
                subject,
                expected,
                format!("servers did not start: {e:#}"),
            ),
        };
        progress.print(&cell);
        cells.push(cell);
    }
    if let Ok(Some(started)) = started {
        started.shutdown().await;
    }
    cells
}

/// Runs one cell: `scenario` on `subject` (the lock, or the primitive's view of every client)
/// of `backend`'s `target`.
async fn cell(
    scenario: Scenario,
    backend: &'static Backend,
    subject: Subject,
    expected: Expected,
    target: Option<&dyn Target>,
    plan: Plan,
    nonce: &str,
) -> Cell {
    let target = match (expected.class, target) {
        (Class::NotApplicable | Class::NotRun, _) | (_, None) => {
            let observed = match expected.class {
                Class::NotApplicable => Class::NotApplicable,
                _ => Class::NotRun,
            };
            let note = expected.reason.clone();
            return Cell::skipped(scenario, backend, subject, observed, expected, note);
        }
        (_, Some(target)) => target,
    };
    let view;
    let (target, key): (&dyn Target, String) = match subject {
        Subject::Lock => (
            target,
            format!("safety/{nonce}/{}/{}", backend.name, scenario.number()),
        ),
        _ => {
            view = PrimitiveTarget::new(target, subject);
            (
                &view,
                format!(
                    "safety/{nonce}/{}/{}/{}",
                    backend.name,
                    subject.name(),
                    scenario.number()
                ),
            )
        }
    };
    let run = Run::new(plan, key);
    let started = Instant::now();
    let budget = if plan.quick {
        Duration::from_secs(120)
    } else {
        Duration::from_secs(600)
    };
    let result = tokio::time::timeout(budget, scenarios::run(scenario, target, &run)).await;
    // Let loss notifications that are already due reach the history.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let outcome = match result {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(e)) if e.downcast_ref::<FaultUnavailable>().is_some() => {
            let note = format!("{e:#}");
            return Cell::skipped(scenario, backend, subject, Class::NotRun, expected, note);
        }
        Ok(Err(e)) => {
            return Cell {
                elapsed_ms,
                ..failed(
                    scenario,
                    backend,
                    subject,
                    expected,
                    format!("failed: {e:#}"),
                )
            }
        }
        Err(_) => {
            let note = format!("hung: not finished within {budget:?}");
            return Cell {
                elapsed_ms,
                ..failed(scenario, backend, subject, expected, note)
            };
        }
    };
    let analysis = run.history.analyze(target.fencing());
    let observed = classify(&analysis, outcome.handed_on);
    let matches = observed == expected.class;
    let history = if matches {
        Vec::new()
    } else {
        run.history
            .events()
            .iter()
            .map(ToString::to_string)
            .collect()
    };
    let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    Cell {
        scenario: scenario.number(),
        scenario_title: scenario.title(),
        backend,
        primitive: subject,
        expected: expected.class,
        reason: expected.reason,
        observed,
        matches,
        counts: analysis,
        recovery_ms: outcome.recovery.map(millis),
        bound_ms: outcome.bound.map(millis),
        note: outcome.note,
        warning: outcome.warning,
        elapsed_ms,
        history,
    }
}

/// Whether `e` is the fixtures' refusal under `DLOCK_TEST_NO_DOCKER=1`: cells are then not run,
/// and say so, rather than failing.
fn opted_out(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<FixtureError>(),
        Some(FixtureError::DockerOptedOut { .. })
    )
}

/// A cell whose scenario could not be carried out: it fails the run.
fn failed(
    scenario: Scenario,
    backend: &'static Backend,
    subject: Subject,
    expected: Expected,
    note: String,
) -> Cell {
    Cell {
        matches: false,
        ..Cell::skipped(scenario, backend, subject, Class::NotRun, expected, note)
    }
}

fn progress(n: usize, total: usize, cell: &Cell) {
    let verdict = if !cell.matches {
        "MISMATCH"
    } else if cell.ran() {
        "ok"
    } else {
        "skipped"
    };
    eprintln!(
        "[{n:>2}/{total}] {:<24} {:<9} {:>2} {:<36} {:<22} expected {:<22} {verdict:<8} {:>6.1} s  {}",
        cell.backend.title,
        cell.primitive.name(),
        cell.scenario,
        cell.scenario_title,
        cell.observed.label(),
        cell.expected.label(),
        cell.elapsed_ms as f64 / 1e3,
        cell.note
    );
}

#[cfg(test)]
mod tests {
    use dlock_core::backend::FencingGuarantee;
    use dlock_testkit::registry::BACKENDS;
    use Class::CaughtByFencing;

    use super::*;

    /// Every dlock backend of the registry has its crate's declaration, a variant its base's, a
    /// baseline none.
    #[test]
    fn every_backend_entry_has_its_crates_declaration() {
        for b in BACKENDS {
            match b.role {
                Role::Backend | Role::Variant(_) => {
                    assert!(declared(b).is_some(), "{}", b.name)
                }
                Role::Baseline => assert!(declared(b).is_none(), "{}", b.name),
            }
        }
    }

    /// Fencing can only catch what a backend's tokens order: no `CaughtByFencing` line without a
    /// fencing guarantee.
    #[test]
    fn only_fencing_backends_expect_fencing_to_catch() {
        for b in BACKENDS {
            let fences = declared(b).is_some_and(|c| c.fencing != FencingGuarantee::None);
            if !fences {
                assert!(
                    b.safety.iter().all(|(class, _)| *class != CaughtByFencing),
                    "{}",
                    b.name
                );
            }
        }
    }
}
