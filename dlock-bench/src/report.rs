//! The results of a run: one table for people, one JSON file for tools.

use std::fmt::Write as _;

use serde::Serialize;

use crate::locker::Kind;
use crate::plan::Plan;
use crate::stats::{bytes, micros, rate, ratio, Latency};
use crate::workloads::{Frozen, HotKey, Renewing, Throughput, TASKS};

#[derive(Debug, Serialize)]
pub struct Report {
    pub quick: bool,
    pub plan: Plan,
    pub machine: String,
    pub backends: Vec<BackendReport>,
    /// Backends not measured, and why.
    pub skipped: Vec<(String, String)>,
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
    /// Per-lease renewal, then batched; or the session alone.
    pub renewing: Vec<Renewing>,
}

#[derive(Debug, Serialize)]
pub struct SideReport {
    pub kind: Kind,
    pub label: String,
    pub cycle: Latency,
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
                        "{}{ratio}{}",
                        rate(hot.handoffs_per_s),
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
                let lost = if backend.renewing.iter().all(|r| r.all_held) {
                    ""
                } else {
                    " (some leases lost)"
                };
                let modes: Vec<&str> = backend.renewing.iter().map(|r| r.mode).collect();
                let memory: Vec<String> = backend
                    .renewing
                    .iter()
                    .map(|r| bytes(r.bytes_per_lease))
                    .collect();
                let requests: Vec<String> = backend
                    .renewing
                    .iter()
                    .map(|r| rate(r.requests_per_s))
                    .collect();
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

/// The table with a heading that says how it was made.
pub fn print(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "dlock-bench{}: {} uncontended cycles per side; throughput {:?} per side and task count; hot key {:?} with {} contenders; {} leases held with auto-renew (TTL {:?}); {:.0} s in all",
        if report.quick { " --quick" } else { "" },
        report.plan.cycles,
        report.plan.window,
        report.plan.hot_for,
        report.plan.contenders,
        report.plan.leases,
        report.plan.renew_ttl,
        report.seconds
    );
    let _ = writeln!(out, "machine: {}", report.machine);
    for backend in &report.backends {
        let _ = writeln!(out, "{}: {}", backend.name, backend.servers);
    }
    for (name, why) in &report.skipped {
        let _ = writeln!(out, "{name}: not measured: {why}");
    }
    let _ = writeln!(out);
    out.push_str(&table(report));
    out
}
