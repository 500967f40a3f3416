//! One cell of the matrix: a scenario on a backend, declared, observed and compared.

use dlock_testkit::Analysis;
use serde::Serialize;

use crate::backend::Backend;
use crate::class::Class;
use crate::scenario::Scenario;

/// The counts of a cell's history (see [`Analysis`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Holds granted.
    pub acquisitions: u64,
    /// Holds that began while another was still valid.
    pub overlaps: u64,
    /// Holds whose token did not exceed every earlier one (only judged where tokens are promised).
    pub token_regressions: u64,
    /// Stale writes the fence admitted.
    pub stale_writes_accepted: u64,
    /// Stale writes the fence refused.
    pub stale_writes_rejected: u64,
    /// The current holder's writes the fence refused.
    pub current_writes_rejected: u64,
    /// Admitted writes that overwrote an update they had not read.
    pub lost_updates: u64,
    /// Operations with an unknown outcome.
    pub indeterminate: u64,
}

impl From<Analysis> for Counts {
    fn from(a: Analysis) -> Self {
        Counts {
            acquisitions: a.acquisitions,
            overlaps: a.overlaps,
            token_regressions: a.token_regressions,
            stale_writes_accepted: a.stale_writes_accepted,
            stale_writes_rejected: a.stale_writes_rejected,
            current_writes_rejected: a.current_writes_rejected,
            lost_updates: a.lost_updates,
            indeterminate: a.indeterminate,
        }
    }
}

/// A finished cell.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// The scenario's number.
    pub scenario: u8,
    /// The scenario's title.
    pub scenario_title: &'static str,
    /// The backend.
    pub backend: Backend,
    /// What the backend declares.
    pub expected: Class,
    /// Why it declares that.
    pub reason: &'static str,
    /// What was observed.
    pub observed: Class,
    /// Whether the observation agrees with the declaration (always true for cells not run).
    pub matches: bool,
    /// The history's counts (zero for cells not run).
    pub counts: Counts,
    /// Fault to next holder, where the scenario measures it.
    pub recovery_ms: Option<u64>,
    /// The bound the backend promises for that recovery.
    pub bound_ms: Option<u64>,
    /// Details: what the scenario saw, or why it did not run, or the error that stopped it.
    pub note: String,
    /// Wall time of the cell.
    pub elapsed_ms: u64,
    /// For a cell that contradicts its declaration: its history, one event a line.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<String>,
}

impl Cell {
    /// A cell that was not run (`observed` is n/a or not yet run), with why.
    pub fn skipped(
        scenario: Scenario,
        backend: Backend,
        observed: Class,
        expected: (Class, &'static str),
        note: String,
    ) -> Cell {
        Cell {
            scenario: scenario.number(),
            scenario_title: scenario.title(),
            backend,
            expected: expected.0,
            reason: expected.1,
            observed,
            matches: true,
            counts: Counts::default(),
            recovery_ms: None,
            bound_ms: None,
            note,
            elapsed_ms: 0,
            history: Vec::new(),
        }
    }

    /// Whether the cell ran.
    pub fn ran(&self) -> bool {
        !matches!(self.observed, Class::NotApplicable | Class::NotRun)
    }
}
