//! The results of a run: one table for people, one JSON file for tools.

use std::fmt::Write as _;

use serde::Serialize;

use crate::locker::Kind;
use crate::plan::Plan;
use crate::stats::{bytes, micros, rate, ratio, slope, Latency};
use crate::workloads::{ClientCost, Frozen, HotKey, Renewal, Renewing, Throughput, TASKS};

#[derive(Debug, Serialize)]
pub struct Report {
    pub quick: bool,
    pub plan: Plan,
    /// When the run started, UTC.
    pub date: String,
    pub machine: String,
    pub backends: Vec<BackendReport>,
    /// Backends not measured, and why.
    pub skipped: Vec<(String, String)>,
    /// The issue's goals, each with this run's figure.
    pub goals: Vec<Goal>,
    pub seconds: f64,
}

#[derive(Debug, Serialize)]
pub struct BackendReport {
    pub name: String,
    pub servers: String,
    pub sides: Vec<SideReport>,
    /// Why not, when nothing was frozen.
    pub frozen: Result<Frozen, String>,
    pub renewal_note: String,
    /// dlock's way of renewing (batched auto-renew, or the session) at each of the plan's lease
    /// counts, then per-lease renewal at the plan's `leases` where the backend renews per key.
    pub renewing: Vec<Renewing>,
    /// What the server count counts, or why there is none.
    pub server_count: Result<String, String>,
    /// dlock's hot key at each of the plan's task counts.
    pub waiting: Vec<HotKey>,
    /// Why a task count was not measured as planned.
    pub waiting_note: Option<String>,
    /// Cycles on a fresh key, where the backend has a floor for them.
    pub fresh: Option<Fresh>,
}

/// dlock's cycle on a fresh key beside the floor of one.
#[derive(Debug, Serialize)]
pub struct Fresh {
    pub floor_label: String,
    pub dlock: Latency,
    pub floor: Latency,
}

/// One of the issue's goals and this run's figure.
#[derive(Debug, Serialize)]
pub struct Goal {
    pub measurement: String,
    /// The figure compared with the goal, where measured.
    pub value: Option<f64>,
    /// The figure as the report shows it, or why it was not measured.
    pub shown: String,
    pub goal: String,
    /// `None` when not measured in this run.
    pub met: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct SideReport {
    pub kind: Kind,
    pub label: String,
    pub cycle: Latency,
    /// What the uncontended cycles cost the client.
    pub client: ClientCost,
    /// At each of [`TASKS`].
    pub throughput: Vec<Throughput>,
    pub hot_key: Option<HotKey>,
}

impl BackendReport {
    fn side(&self, kind: Kind) -> Option<&SideReport> {
        self.sides.iter().find(|s| s.kind == kind)
    }
}

/// ` (1.8× floor, 0.9× peer)`: `value` against each labelled reference that was measured, or
/// empty when there is nothing to compare with.
fn ratios(value: Option<f64>, against: &[(&str, Option<f64>)]) -> String {
    let parts: Vec<String> = against
        .iter()
        .filter_map(|(label, other)| ratio(value, *other).map(|r| format!("{r:.2}× {label}")))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

/// The one table: a row per side; dlock's rows carry the ratios and the backend-wide figures.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let tasks: Vec<String> = TASKS
        .iter()
        .map(|t| format!("{t} task{}", if *t == 1 { "" } else { "s" }))
        .collect();
    let _ = writeln!(
        out,
        "| backend | side | cycle p50 | p99 | p999 | {} | hot key hand-offs | hand-off p50 / p99 | acquire, one node frozen (p50 / p99) | client memory per held lease | renewal requests per second |",
        tasks.join(" | ")
    );
    let _ = writeln!(out, "|{}", "---|".repeat(10 + TASKS.len()));
    for backend in &report.backends {
        let floor = backend.side(Kind::Floor);
        let peer = backend.side(Kind::Peer);
        let plain = backend.side(Kind::Dlock);
        for side in &backend.sides {
            let is_dlock = side.kind == Kind::Dlock;
            let compare = |pick: &dyn Fn(&SideReport) -> f64, value: f64| match side.kind {
                Kind::Dlock => ratios(
                    Some(value),
                    &[("floor", floor.map(pick)), ("peer", peer.map(pick))],
                ),
                Kind::Layered => ratio(Some(value), plain.map(pick))
                    .map_or(String::new(), |r| format!(" ({r:.2}× without layers)")),
                Kind::Primitive(recipe) => {
                    let recipe_peer = backend.side(Kind::PrimitivePeer(recipe));
                    ratios(
                        Some(value),
                        &[("lock", plain.map(pick)), ("peer", recipe_peer.map(pick))],
                    )
                }
                Kind::Floor | Kind::Peer | Kind::PrimitivePeer(_) => String::new(),
            };
            let mut cells = vec![
                if is_dlock {
                    backend.name.clone()
                } else {
                    String::new()
                },
                side.label.clone(),
                format!(
                    "{}{}",
                    micros(side.cycle.p50_us),
                    compare(&|s| s.cycle.p50_us, side.cycle.p50_us)
                ),
                micros(side.cycle.p99_us),
                micros(side.cycle.p999_us),
            ];
            for (i, t) in side.throughput.iter().enumerate() {
                let pick = move |s: &SideReport| s.throughput.get(i).map_or(0.0, |t| t.per_s);
                cells.push(format!(
                    "{}{}{}",
                    rate(t.per_s),
                    compare(&pick, t.per_s),
                    failures(t.failed)
                ));
            }
            match &side.hot_key {
                Some(hot) => {
                    let rate_of = |s: Option<&SideReport>| {
                        s.and_then(|s| s.hot_key).map(|h| h.handoffs_per_s)
                    };
                    let ratio = match side.kind {
                        Kind::Dlock => ratios(Some(hot.handoffs_per_s), &[("peer", rate_of(peer))]),
                        Kind::Primitive(recipe) => ratios(
                            Some(hot.handoffs_per_s),
                            &[
                                ("lock", rate_of(plain)),
                                ("peer", rate_of(backend.side(Kind::PrimitivePeer(recipe)))),
                            ],
                        ),
                        _ => String::new(),
                    };
                    cells.push(format!(
                        "{}{ratio}, {:.0}% of acquisitions{}",
                        rate(hot.handoffs_per_s),
                        hot.handoff_share * 100.0,
                        failures(hot.failed)
                    ));
                    cells.push(format!(
                        "{} / {}",
                        micros(hot.handoff.p50_us),
                        micros(hot.handoff.p99_us)
                    ));
                }
                None => cells.extend(["—".to_owned(), "—".to_owned()]),
            }
            if is_dlock {
                cells.push(match &backend.frozen {
                    Ok(f) => format!(
                        "{} / {} ({}; {} of {} failed)",
                        micros(f.acquire.p50_us),
                        micros(f.acquire.p99_us),
                        f.frozen,
                        f.failures,
                        f.failures + f.acquire.samples
                    ),
                    Err(why) => format!("n/a: {why}"),
                });
                // The comparison of ways of renewing, at the plan's one lease count.
                let compared: Vec<&Renewing> = backend
                    .renewing
                    .iter()
                    .filter(|r| r.leases == report.plan.leases)
                    .collect();
                let lost = if compared.iter().all(|r| r.all_held) {
                    ""
                } else {
                    " (some leases lost)"
                };
                let modes: Vec<&str> = compared.iter().map(|r| r.mode).collect();
                let memory: Vec<String> =
                    compared.iter().map(|r| bytes(r.bytes_per_lease)).collect();
                let requests: Vec<String> =
                    compared.iter().map(|r| rate(r.requests_per_s)).collect();
                cells.push(format!(
                    "{}: {}{lost}",
                    modes.join(" → "),
                    memory.join(" → ")
                ));
                cells.push(format!(
                    "{}: {} ({})",
                    modes.join(" → "),
                    requests.join(" → "),
                    backend.renewal_note
                ));
            } else {
                cells.extend(["".to_owned(), "".to_owned(), "".to_owned()]);
            }
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
    }
    out
}

/// ` [12 failed]` when some operations failed.
fn failures(failed: u64) -> String {
    if failed == 0 {
        String::new()
    } else {
        format!(" [{failed} failed]")
    }
}

/// The table with a heading that says how it was made: what the run prints.
pub fn print(report: &Report) -> String {
    format!("{}\n{}", heading(report), tables(report))
}

/// The run as a documentation page shows it: the heading as preformatted text, then the tables.
pub fn page(report: &Report) -> String {
    format!("```text\n{}```\n\n{}", heading(report), tables(report))
}

/// What was run, when, where, and against which servers.
fn heading(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "dlock-bench{}: {} uncontended cycles per side; throughput {:?} per side and task count; hot key {:?} with {} tasks (dlock also with {:?}); leases held with auto-renew (or in the session): {:?} (TTL {:?}, counted over {:?}); {:.0} s in all",
        if report.quick { " --quick" } else { "" },
        report.plan.cycles,
        report.plan.window,
        report.plan.hot_for,
        report.plan.contenders,
        report.plan.waiting_tasks,
        report.plan.lease_counts,
        report.plan.renew_ttl,
        report.plan.observe,
        report.seconds
    );
    let _ = writeln!(out, "date: {}", report.date);
    let _ = writeln!(out, "machine: {}", report.machine);
    for backend in &report.backends {
        let _ = writeln!(out, "{}: {}", backend.name, backend.servers);
    }
    for (name, why) in &report.skipped {
        let _ = writeln!(out, "{name}: not measured: {why}");
    }
    out
}

/// Every table of the run.
fn tables(report: &Report) -> String {
    [
        table(report),
        client_table(report),
        waiting_table(report),
        leases_table(report),
        goals_table(report),
    ]
    .join("\n")
}

/// What an uncontended cycle costs the client, per side: CPU time and allocations, with dlock's
/// ratios against the peer.
pub fn client_table(report: &Report) -> String {
    let mut out = String::from(
        "Uncontended cycle: what it costs the client (this process's CPU clock and allocations over the timed cycles)\n\n\
         | backend | side | client CPU per cycle | allocations per cycle |\n|---|---|---|---|\n",
    );
    for backend in &report.backends {
        let peer = backend.side(Kind::Peer).map(|p| p.client);
        for (i, side) in backend.sides.iter().enumerate() {
            let name = if i == 0 { backend.name.as_str() } else { "" };
            let against = |pick: fn(&ClientCost) -> f64| match (side.kind, peer) {
                (Kind::Dlock, Some(peer)) => {
                    ratios(Some(pick(&side.client)), &[("peer", Some(pick(&peer)))])
                }
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "| {name} | {} | {:.1} µs{} | {:.0}{} |",
                side.label,
                side.client.cpu_us,
                against(|c| c.cpu_us),
                side.client.allocations,
                against(|c| c.allocations),
            );
        }
    }
    out
}

/// How hand-offs grow with the tasks waiting on one key: dlock on every backend, a row per task
/// count, and the slope per waiter.
pub fn waiting_table(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Hot key: tasks on one key, each with a client of its own (one holds, the others wait)\n"
    );
    let _ = writeln!(
        out,
        "| backend | tasks (waiting) | acquisitions | hand-offs to another task | share of acquisitions | hand-off p50 / p99 | server requests per acquisition |"
    );
    let _ = writeln!(out, "|{}", "---|".repeat(7));
    for backend in &report.backends {
        for (i, hot) in backend.waiting.iter().enumerate() {
            let _ = writeln!(
                out,
                "| {} | {} ({}) | {}{} | {} | {:.0}% | {} / {} | {} |",
                if i == 0 { backend.name.as_str() } else { "" },
                hot.tasks,
                hot.tasks.saturating_sub(1),
                rate(hot.acquisitions_per_s),
                failures(hot.failed),
                rate(hot.handoffs_per_s),
                hot.handoff_share * 100.0,
                micros(hot.handoff.p50_us),
                micros(hot.handoff.p99_us),
                per_acquisition(hot, &backend.server_count),
            );
        }
        let waiters = |pick: &dyn Fn(&HotKey) -> Option<f64>| {
            let points: Vec<(f64, f64)> = backend
                .waiting
                .iter()
                .filter_map(|h| pick(h).map(|y| (h.tasks.saturating_sub(1) as f64, y)))
                .collect();
            slope(&points)
        };
        if backend.waiting.len() > 1 {
            let latency = waiters(&|h| Some(h.handoff.p50_us));
            let requests = waiters(&|h| h.server_per_acquisition);
            let _ = writeln!(
                out,
                "| | slope per waiter | | | | {} p50 | {} |",
                latency.map_or("—".to_owned(), |s| format!("{s:+.2} µs")),
                requests.map_or("—".to_owned(), |s| format!("{s:+.4}")),
            );
        }
        if let Some(note) = &backend.waiting_note {
            let _ = writeln!(out, "| | {note} | | | | | |");
        }
    }
    out
}

/// Server requests per acquisition, or why there is no figure.
fn per_acquisition(hot: &HotKey, count: &Result<String, String>) -> String {
    match (hot.server_per_acquisition, count) {
        (Some(n), _) => format!("{n:.2}"),
        (None, Err(why)) => format!("n/a: {why}"),
        (None, Ok(_)) => "n/a: the count could not be read".to_owned(),
    }
}

/// The runs of dlock's own way of renewing (not the per-lease comparison), by lease count.
fn growth(backend: &BackendReport) -> Vec<&Renewing> {
    backend
        .renewing
        .iter()
        .filter(|r| r.mode != Renewal::PerLease.name())
        .collect()
}

/// How the cost of held leases grows: a row per lease count and the slope per lease.
pub fn leases_table(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Held leases with auto-renew (or in the session): cost by lease count\n"
    );
    let _ = writeln!(
        out,
        "| backend | renewal | leases | taking them | client memory per lease | client CPU | server requests | renewal requests (client) |"
    );
    let _ = writeln!(out, "|{}", "---|".repeat(8));
    for backend in &report.backends {
        let runs = growth(backend);
        for (i, r) in runs.iter().enumerate() {
            let lost = match (&r.note, r.all_held) {
                (Some(note), _) => format!(" ({note})"),
                (None, false) => " (some leases lost)".to_owned(),
                (None, true) => String::new(),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {}{lost} | {:.1} s | {} | {:.1} ms/s | {} | {} |",
                if i == 0 { backend.name.as_str() } else { "" },
                r.mode,
                r.leases,
                r.taking_s,
                bytes(r.bytes_per_lease),
                r.cpu_per_s * 1e3,
                server_rate(r.server_per_s, &backend.server_count),
                rate(r.requests_per_s),
            );
        }
        if runs.len() > 1 {
            let per_lease = |pick: &dyn Fn(&Renewing) -> Option<f64>| {
                let points: Vec<(f64, f64)> = runs
                    .iter()
                    .filter_map(|r| pick(r).map(|y| (r.taken as f64, y)))
                    .collect();
                slope(&points)
            };
            let memory = per_lease(&|r| Some(r.bytes_per_lease * r.taken as f64));
            let cpu = per_lease(&|r| Some(r.cpu_per_s * 1e6));
            let server = per_lease(&|r| r.server_per_s);
            let requests = per_lease(&|r| Some(r.requests_per_s));
            let _ = writeln!(
                out,
                "| | slope per lease | | | {} | {} | {} | {} |",
                memory.map_or("—".to_owned(), |s| format!("{s:.0} B")),
                cpu.map_or("—".to_owned(), |s| format!("{s:.3} µs/s")),
                server.map_or("—".to_owned(), |s| format!("{s:.5}/s")),
                requests.map_or("—".to_owned(), |s| format!("{s:.5}/s")),
            );
        }
    }
    out
}

/// Server requests per second, or why there is no figure.
fn server_rate(per_s: Option<f64>, count: &Result<String, String>) -> String {
    match (per_s, count) {
        (Some(n), _) => rate(n),
        (None, Err(why)) => format!("n/a: {why}"),
        (None, Ok(_)) => "n/a: the count could not be read".to_owned(),
    }
}

/// The goals: measurement, figure, goal, met.
pub fn goals_table(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Goals (issue #45), {} run of {} on {}\n",
        if report.quick { "quick" } else { "full" },
        report.date,
        report.machine
    );
    let _ = writeln!(out, "| measurement | value | goal | met |");
    let _ = writeln!(out, "|---|---|---|---|");
    for goal in &report.goals {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            goal.measurement,
            goal.shown,
            goal.goal,
            match goal.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "not measured",
            }
        );
    }
    let met = report.goals.iter().filter(|g| g.met == Some(true)).count();
    let measured = report.goals.iter().filter(|g| g.met.is_some()).count();
    let _ = writeln!(
        out,
        "\n{met} of {measured} measured goals met ({} not measured in this run)",
        report.goals.len() - measured
    );
    out
}

/// Which way a goal bounds its figure.
#[derive(Clone, Copy)]
enum Bound {
    AtMost(f64),
    AtLeast(f64),
}

/// How much a per-lease or per-hand-off figure may grow from the smaller measured count to the
/// larger and still count as flat: the issue asks for flat growth without a number; 1.5 leaves
/// room for a noisy shared machine and still catches a cost that grows with the count.
const FLAT: f64 = 1.5;

/// A goal row: `value` against `bound`, shown with `show`, or `missing` when there is no value.
fn goal(
    measurement: String,
    value: Result<f64, String>,
    bound: Bound,
    show: &dyn Fn(f64) -> String,
) -> Goal {
    let goal = match bound {
        Bound::AtMost(b) => format!("≤ {}", show(b)),
        Bound::AtLeast(b) => format!("≥ {}", show(b)),
    };
    match value {
        Ok(v) => Goal {
            measurement,
            value: Some(v),
            shown: show(v),
            goal,
            met: Some(match bound {
                Bound::AtMost(b) => v <= b,
                Bound::AtLeast(b) => v >= b,
            }),
        },
        Err(why) => Goal {
            measurement,
            value: None,
            shown: why,
            goal,
            met: None,
        },
    }
}

fn times(v: f64) -> String {
    format!("{v:.2}×")
}

fn plain(v: f64) -> String {
    format!("{v:.2}")
}

fn percent(v: f64) -> String {
    format!("{:.0}%", v * 100.0)
}

impl Report {
    fn backend(&self, name: &str) -> Result<&BackendReport, String> {
        self.backends
            .iter()
            .find(|b| b.name == name)
            .ok_or_else(|| format!("{name} not in this run"))
    }
}

impl BackendReport {
    fn dlock(&self) -> Result<&SideReport, String> {
        self.side(Kind::Dlock)
            .ok_or_else(|| format!("{}: no dlock side", self.name))
    }

    fn hot(&self) -> Result<HotKey, String> {
        self.dlock()?
            .hot_key
            .ok_or_else(|| format!("{}: no hot key", self.name))
    }

    /// `pick(dlock) / pick(other)`.
    fn against(
        &self,
        other: Kind,
        pick: &dyn Fn(&SideReport) -> Option<f64>,
    ) -> Result<f64, String> {
        let other = self
            .side(other)
            .ok_or_else(|| format!("{}: no {other:?} side", self.name))?;
        ratio(pick(self.dlock()?), pick(other)).ok_or_else(|| "no figure".to_owned())
    }
}

/// Throughput at `tasks` tasks on keys of their own.
fn at_tasks(tasks: usize) -> impl Fn(&SideReport) -> Option<f64> {
    move |s| {
        TASKS
            .iter()
            .position(|&t| t == tasks)
            .and_then(|i| s.throughput.get(i))
            .map(|t| t.per_s)
    }
}

/// A figure of a side.
type Pick<'a> = &'a dyn Fn(&SideReport) -> Option<f64>;

fn cycle_p50(s: &SideReport) -> Option<f64> {
    Some(s.cycle.p50_us)
}

fn client_cpu(s: &SideReport) -> Option<f64> {
    Some(s.client.cpu_us)
}

fn client_allocations(s: &SideReport) -> Option<f64> {
    Some(s.client.allocations)
}

/// The issue's goals, each with this run's figure (or why it has none): issue #45's, against
/// the peers and floors measured in the same run.
pub fn goals(report: &Report) -> Vec<Goal> {
    let mut goals = Vec::new();
    // dlock against another side of the same backend.
    let (tput16, tput64) = (at_tasks(16), at_tasks(64));
    let compared: [(&str, &str, Kind, Pick, Bound); 10] = [
        (
            "redis",
            "single Redis: 64 tasks on one client ÷ the bare lock",
            Kind::Peer,
            &tput64,
            Bound::AtLeast(1.0),
        ),
        (
            "redis",
            "single Redis: 16 tasks on one client ÷ the bare lock",
            Kind::Peer,
            &tput16,
            Bound::AtLeast(1.0),
        ),
        (
            "redis",
            "single Redis: uncontended cycle p50 ÷ the bare lock's",
            Kind::Peer,
            &cycle_p50,
            Bound::AtMost(1.1),
        ),
        (
            "redlock",
            "Redlock: 64 tasks ÷ rslock",
            Kind::Peer,
            &tput64,
            Bound::AtLeast(1.2),
        ),
        (
            "etcd",
            "etcd: uncontended cycle p50 ÷ etcd's Lock service",
            Kind::Peer,
            &cycle_p50,
            Bound::AtMost(1.0),
        ),
        (
            "etcd",
            "etcd: 64 tasks ÷ etcd's Lock service",
            Kind::Peer,
            &tput64,
            Bound::AtLeast(1.0),
        ),
        (
            "etcd",
            "etcd: client CPU per uncontended cycle ÷ etcd-client lock's",
            Kind::Peer,
            &client_cpu,
            Bound::AtMost(1.0),
        ),
        (
            "etcd",
            "etcd: allocations per uncontended cycle ÷ etcd-client lock's",
            Kind::Peer,
            &client_allocations,
            Bound::AtMost(1.0),
        ),
        (
            "postgres",
            "PostgreSQL: uncontended cycle p50 ÷ its two-statement floor",
            Kind::Floor,
            &cycle_p50,
            Bound::AtMost(1.3),
        ),
        (
            "postgres",
            "PostgreSQL: 64 tasks ÷ its two-statement floor",
            Kind::Floor,
            &tput64,
            Bound::AtLeast(0.6),
        ),
    ];
    for (name, measurement, other, pick, bound) in compared {
        let value = report.backend(name).and_then(|b| b.against(other, pick));
        goals.push(goal(measurement.to_owned(), value, bound, &times));
    }
    let fresh = report.backend("redlock").and_then(|b| {
        b.fresh
            .as_ref()
            .ok_or_else(|| "no fresh-key cycles".to_owned())
    });
    let mut row = goal(
        "Redlock: uncontended cycle on a fresh key p50 ÷ rslock's".to_owned(),
        fresh.clone().and_then(|f| {
            ratio(Some(f.dlock.p50_us), Some(f.floor.p50_us)).ok_or_else(|| "no figure".to_owned())
        }),
        Bound::AtMost(1.1),
        &times,
    );
    if let (Ok(f), Some(_)) = (fresh, row.met) {
        row.shown = format!(
            "{} ({} against {})",
            row.shown,
            micros(f.dlock.p50_us),
            micros(f.floor.p50_us)
        );
    }
    goals.push(row);
    let redis = report.backend("redis");
    let redlock = report.backend("redlock");
    goals.push(goal(
        format!(
            "Redlock: hot-key hand-offs to another task, {} tasks, ÷ single Redis's",
            report.plan.contenders
        ),
        redlock.clone().and_then(|rl| {
            let (a, b) = (rl.hot()?, redis?.hot()?);
            ratio(Some(a.handoffs_per_s), Some(b.handoffs_per_s))
                .ok_or_else(|| "no hand-offs on single Redis".to_owned())
        }),
        Bound::AtLeast(0.5),
        &times,
    ));
    goals.push(goal(
        "Redlock: hand-offs to another task as a share of acquisitions".to_owned(),
        redlock.and_then(|b| Ok(b.hot()?.handoff_share)),
        Bound::AtLeast(0.9),
        &percent,
    ));
    for backend in &report.backends {
        goals.extend(primitives_at_lock_cost(backend));
    }
    for backend in &report.backends {
        goals.push(waiters_flat(backend));
    }
    goals.push(goal(
        "nothing measured before gets slower by more than noise".to_owned(),
        Err("not measured in one run: compare this page with the one it replaces".to_owned()),
        Bound::AtMost(1.0),
        &times,
    ));
    goals
}

/// Each of dlock's primitives: its uncontended cycle p50 ÷ the lock's on the same backend.
fn primitives_at_lock_cost(backend: &BackendReport) -> Vec<Goal> {
    let lock = backend.dlock().map(|s| s.cycle.p50_us);
    backend
        .sides
        .iter()
        .filter(|s| matches!(s.kind, Kind::Primitive(_)))
        .map(|side| {
            let value = lock.clone().and_then(|lock| {
                ratio(Some(side.cycle.p50_us), Some(lock)).ok_or_else(|| "no figure".to_owned())
            });
            goal(
                format!(
                    "{}: {} uncontended cycle p50 ÷ the lock's",
                    backend.name, side.label
                ),
                value,
                Bound::AtMost(1.3),
                &times,
            )
        })
        .collect()
}

/// Hand-offs flat per waiter: hand-off p50 and server requests per acquisition at the most
/// tasks, each ÷ the same at the fewest; the larger of the two against [`FLAT`].
fn waiters_flat(backend: &BackendReport) -> Goal {
    let (first, last) = (backend.waiting.first(), backend.waiting.last());
    let measurement = match (first, last) {
        (Some(a), Some(b)) => format!(
            "{}: hand-off at {} tasks ÷ at {} (p50; server requests per acquisition)",
            backend.name, b.tasks, a.tasks
        ),
        _ => format!("{}: hand-off growth with waiters", backend.name),
    };
    let value = match (first, last) {
        (Some(a), Some(b)) if a.tasks < b.tasks => {
            let latency = ratio(Some(b.handoff.p50_us), Some(a.handoff.p50_us));
            let requests = ratio(b.server_per_acquisition, a.server_per_acquisition);
            latency
                .into_iter()
                .chain(requests)
                .reduce(f64::max)
                .ok_or_else(|| "no figure".to_owned())
        }
        _ => Err("fewer than two task counts".to_owned()),
    };
    let mut row = goal(measurement, value, Bound::AtMost(FLAT), &times);
    if let (Some(a), Some(b)) = (first, last) {
        if row.met.is_some() {
            row.shown = format!(
                "{} (p50 {} → {}; requests {} → {})",
                row.shown,
                micros(a.handoff.p50_us),
                micros(b.handoff.p50_us),
                a.server_per_acquisition.map_or("—".into(), plain),
                b.server_per_acquisition.map_or("—".into(), plain),
            );
        }
    }
    row
}

/// The current time, UTC, as `2026-11-26 10:04 UTC` (RFC 3339 to the minute, as people read it).
pub fn utc_now() -> String {
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    match (now.get(..10), now.get(11..16)) {
        (Some(day), Some(time)) => format!("{day} {time} UTC"),
        _ => now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goals_are_met_or_not_or_unmeasured() {
        let at_most = goal("a".into(), Ok(3.0), Bound::AtMost(4.0), &plain);
        assert_eq!(at_most.met, Some(true));
        assert_eq!(at_most.goal, "≤ 4.00");
        let at_least = goal("b".into(), Ok(0.4), Bound::AtLeast(0.5), &times);
        assert_eq!(at_least.met, Some(false));
        let missing = goal("c".into(), Err("why".into()), Bound::AtLeast(0.5), &times);
        assert_eq!((missing.met, missing.shown.as_str()), (None, "why"));
    }
}
