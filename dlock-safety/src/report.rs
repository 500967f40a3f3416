//! The report: a Markdown matrix (what `docs/safety-matrix.md` shows), Markdown details, and JSON.

use std::fmt::Write as _;

use serde::Serialize;

use dlock_testkit::BACKENDS;

use crate::cell::Cell;
use crate::class::Class;
use crate::plan::Plan;
use crate::subject::Subject;
use crate::Backend;
use crate::Scenario;

/// Everything the JSON holds.
#[derive(Debug, Serialize)]
pub struct Report<'a> {
    /// `"quick"` or `"full"`.
    pub run: &'static str,
    /// The fault scenarios' lease TTL in milliseconds.
    pub ttl_ms: u64,
    /// Clients × rounds of scenario 1.
    pub contention: (usize, usize),
    /// Whether every cell matched its declaration.
    pub all_match: bool,
    /// The cells, in matrix order.
    pub cells: &'a [Cell],
}

impl<'a> Report<'a> {
    /// The report of `cells` run with `plan`.
    pub fn new(plan: Plan, cells: &'a [Cell]) -> Self {
        Report {
            run: if plan.quick { "quick" } else { "full" },
            ttl_ms: u64::try_from(plan.ttl.as_millis()).unwrap_or(u64::MAX),
            contention: (plan.clients, plan.rounds),
            all_match: cells.iter().all(|c| c.matches),
            cells,
        }
    }

    /// The report as pretty JSON.
    pub fn json(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(self)
    }

    /// The matrix: scenarios down, backends across, each cell its observed class and whether that
    /// matches the declaration; then, if any primitive's cells were selected, the same for each
    /// scenario and primitive.
    pub fn matrix(&self) -> String {
        let backends: Vec<&Backend> = BACKENDS
            .iter()
            .filter(|b| self.cells.iter().any(|c| c.backend == *b))
            .collect();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "`safety-report` ({} run: lease TTL {} ms, contention {} clients × {} rounds). \
             ✓: the backend declared this outcome beforehand (it says the outcome was predicted, \
             not that it is safe); ✗: the outcome contradicts the declaration.\n",
            self.run, self.ttl_ms, self.contention.0, self.contention.1
        );
        if self.cells.iter().any(|c| c.primitive == Subject::Lock) {
            table_header(&mut out, &["scenario"], &backends);
            for s in Scenario::ALL {
                let title = format!("{}. {}", s.number(), s.title());
                self.table_row(&mut out, &title, &backends, s, Subject::Lock);
            }
        }
        if self.cells.iter().any(|c| c.primitive != Subject::Lock) {
            out.push_str(
                "\nPrimitives: the same scenarios on each primitive's exclusive view (the write side of \
                 the read-write lock, a semaphore of 1 permit, an election candidate), each expected \
                 to behave as the backend declares for its lock; *n/a* where the backend does not \
                 declare the primitive.\n\n",
            );
            table_header(&mut out, &["scenario", "primitive"], &backends);
            for s in Scenario::ALL {
                for p in Subject::PRIMITIVES {
                    let title = format!("{}. {} | {}", s.number(), s.title(), p.title());
                    self.table_row(&mut out, &title, &backends, s, p);
                }
            }
        }
        out.push_str(
            "\n*safe*: no violation and the lock was handed on; *caught by fencing*: holds overlapped or \
             a stale holder wrote, and the fenced resource refused every stale write; *unsafe: violation \
             not caught*: a stale write was admitted or an update lost, so the guarded data is wrong; *unavailable*: no violation, but \
             no hand-over within the bound; *n/a*: the scenario does not apply (reason in the details).\n",
        );
        out
    }

    /// The row of `scenario` on `subject`, titled `title`: each backend's cell, `—` where it has
    /// none; nothing if no backend has one.
    fn table_row(
        &self,
        out: &mut String,
        title: &str,
        backends: &[&Backend],
        scenario: Scenario,
        subject: Subject,
    ) {
        let row: Vec<&Cell> = self
            .cells
            .iter()
            .filter(|c| c.primitive == subject && c.scenario == scenario.number())
            .collect();
        if row.is_empty() {
            return;
        }
        let _ = write!(out, "| {title} |");
        for b in backends {
            let cell = row.iter().find(|c| c.backend == *b);
            let _ = write!(out, " {} |", cell.map_or(String::from("—"), |c| short(c)));
        }
        out.push('\n');
    }

    /// One line per cell with its counts, times, declaration and notes.
    pub fn details(&self) -> String {
        let mut out = String::from(
            "| # | backend | primitive | observed | expected (why) | ok | acq | overlaps | token regr. | stale acc./rej. | lost upd. | indet. | recovery (bound) | notes |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for c in self.cells {
            let k = &c.counts;
            let recovery = match (c.recovery_ms, c.bound_ms) {
                (Some(r), Some(b)) => format!("{r} ms ({b} ms)"),
                (None, Some(b)) => format!("— ({b} ms)"),
                _ => String::new(),
            };
            let (counts, mark) = if c.ran() {
                (
                    format!(
                        "{} | {} | {} | {}/{} | {} | {}",
                        k.acquisitions,
                        k.overlaps,
                        k.token_regressions,
                        k.stale_writes_accepted,
                        k.stale_writes_rejected,
                        k.lost_updates,
                        k.indeterminate
                    ),
                    if c.matches { "✓" } else { "✗" },
                )
            } else {
                ("| | | | | ".to_owned(), if c.matches { "" } else { "✗" })
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} ({}) | {mark} | {counts} | {recovery} | {} |",
                c.scenario,
                c.backend.title,
                c.primitive.title(),
                c.observed.label(),
                c.expected.label(),
                c.reason,
                c.note.replace('|', "/")
            );
        }
        out
    }

    /// The cells that contradict their declaration, one paragraph each.
    pub fn mismatches(&self) -> Vec<String> {
        self.cells
            .iter()
            .filter(|c| !c.matches)
            .map(|c| {
                let mut paragraph = format!(
                    "scenario {} ({}) on {}, {}: observed {}, declared {} because {:?}; {}",
                    c.scenario,
                    c.scenario_title,
                    c.backend.title,
                    c.primitive.title(),
                    c.observed,
                    c.expected,
                    c.reason,
                    c.note
                );
                // The errors the clients met say why a lock was not handed on; CI keeps only
                // this output, not the history file.
                let errors: Vec<&String> = c
                    .history
                    .iter()
                    .filter(|e| e.contains("indeterminate"))
                    .collect();
                for e in errors.iter().take(MISMATCH_ERRORS) {
                    let _ = write!(paragraph, "\n      {e}");
                }
                if errors.len() > MISMATCH_ERRORS {
                    let more = errors.len() - MISMATCH_ERRORS;
                    let _ = write!(paragraph, "\n      … and {more} more");
                }
                paragraph
            })
            .collect()
    }
}

/// How many of a mismatching cell's errors its paragraph quotes.
const MISMATCH_ERRORS: usize = 8;

/// A table's header: the `first` columns, then one per backend.
fn table_header(out: &mut String, first: &[&str], backends: &[&Backend]) {
    let _ = write!(out, "|");
    for title in first
        .iter()
        .copied()
        .chain(backends.iter().map(|b| b.title))
    {
        let _ = write!(out, " {title} |");
    }
    out.push_str("\n|");
    for _ in 0..first.len() + backends.len() {
        out.push_str("---|");
    }
    out.push('\n');
}

fn short(c: &Cell) -> String {
    match c.observed {
        Class::NotApplicable => "n/a".to_owned(),
        Class::NotRun if c.matches => "not yet run".to_owned(),
        Class::NotRun => "error ✗".to_owned(),
        observed => {
            let label = if observed == Class::NotCaught {
                format!("**unsafe: {observed}**")
            } else {
                observed.to_string()
            };
            let warned = if c.warning.is_some() {
                ", holder warned"
            } else {
                ""
            };
            if c.matches {
                format!("{label} ✓{warned}")
            } else {
                format!("{label} ✗ (declared {})", c.expected)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primitive_cells_get_a_table_of_their_own_and_a_column_in_the_details() {
        use crate::cell::Expected;
        use dlock_core::backend::Primitives;
        use dlock_testkit::registry::backend;

        let memory = backend("memory").unwrap();
        let redis = backend("redis").unwrap();
        let cell = |b: &'static Backend, subject, served| {
            let expected = Expected::of(b, Scenario::HolderPaused, subject, Some(served));
            let note = expected.reason.clone();
            let observed = match expected.class {
                Class::NotApplicable => Class::NotApplicable,
                _ => Class::NotRun,
            };
            Cell::skipped(Scenario::HolderPaused, b, subject, observed, expected, note)
        };
        let cells = vec![
            cell(memory, Subject::Lock, Primitives::ALL),
            cell(memory, Subject::Semaphore, Primitives::ALL),
            cell(redis, Subject::Semaphore, Primitives::NONE),
        ];
        let report = Report::new(Plan::quick(), &cells);
        let matrix = report.matrix();
        assert!(
            matrix.contains("| 2. holder paused past its lease | not yet run | — |"),
            "{matrix}"
        );
        assert!(
            matrix.contains(
                "| 2. holder paused past its lease | semaphore, 1 permit | not yet run | n/a |"
            ),
            "{matrix}"
        );
        assert!(cells[1]
            .reason
            .starts_with("as the lock: a permit is a lease"));
        assert_eq!(
            cells[2].reason,
            "Redis does not declare the semaphore in capabilities().primitives"
        );
        assert!(report
            .details()
            .contains("| 2 | in-process | semaphore, 1 permit |"));
        assert!(report
            .json()
            .unwrap()
            .contains("\"primitive\": \"semaphore\""));
    }
}
