//! One cell of the matrix: a scenario on a backend, declared, observed and compared.

use dlock_testkit::Analysis;
use serde::Serialize;

use crate::class::Class;
use crate::Scenario;
use crate::{Backend, Declared};

/// The counts of a cell's history: its [`Analysis`].
pub type Counts = Analysis;

/// A finished cell.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// The scenario's number.
    pub scenario: u8,
    /// The scenario's title.
    pub scenario_title: &'static str,
    /// The backend.
    pub backend: &'static Backend,
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
        backend: &'static Backend,
        observed: Class,
        expected: Declared,
        note: String,
    ) -> Cell {
        Cell {
            scenario: scenario.number(),
            scenario_title: scenario.title(),
            backend,
            expected: expected.class,
            reason: expected.reason,
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
