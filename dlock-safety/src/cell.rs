//! One cell of the matrix: a scenario on a backend, declared, observed and compared.

use dlock_core::backend::Primitives;
use dlock_testkit::Analysis;
use serde::Serialize;

use crate::class::Class;
use crate::subject::Subject;
use crate::Scenario;
use crate::{Backend, Declared};

/// The counts of a cell's history: its [`Analysis`].
pub type Counts = Analysis;

/// What a cell expects, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// The class expected.
    pub class: Class,
    /// The documented guarantee it rests on.
    pub reason: String,
}

impl From<Declared> for Expected {
    fn from(d: Declared) -> Self {
        Expected {
            class: d.class,
            reason: d.reason.to_owned(),
        }
    }
}

impl Expected {
    /// What the cell of `scenario` on `backend`'s `subject` expects. The lock's cell expects the
    /// backend's declaration. A primitive's cell expects the same: its exclusive view's grants
    /// are leases like the lock's, renewed, lost and fenced by the same mechanism. A primitive
    /// that `served` (what the backend declares; `None` for a baseline) leaves out is not
    /// applicable.
    pub fn of(
        backend: &Backend,
        scenario: Scenario,
        subject: Subject,
        served: Option<Primitives>,
    ) -> Expected {
        let lock = backend.declared(scenario);
        if subject == Subject::Lock {
            return lock.into();
        }
        let Some(served) = served else {
            return Expected {
                class: Class::NotApplicable,
                reason: "a baseline client, not a dlock backend: it serves no primitives".into(),
            };
        };
        if !subject.served_by(&served) {
            return Expected {
                class: Class::NotApplicable,
                reason: format!(
                    "{} does not declare the {} in capabilities().primitives",
                    backend.title,
                    subject.declared_as()
                ),
            };
        }
        match lock.class {
            Class::NotApplicable | Class::NotRun => lock.into(),
            class => Expected {
                class,
                reason: format!(
                    "as the lock: {} is a lease granted, renewed and fenced by the same \
                     mechanism; {}",
                    subject.grant(),
                    lock.reason
                ),
            },
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
    pub backend: &'static Backend,
    /// What the scenario ran on: `lock`, or a primitive's exclusive view (`write`, `semaphore`,
    /// `election`).
    pub primitive: Subject,
    /// What the backend declares (for a primitive: what it declares for its lock).
    pub expected: Class,
    /// Why it declares that.
    pub reason: String,
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
    /// A warning the holder's client gave about the fault, shown in the matrix.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
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
        primitive: Subject,
        observed: Class,
        expected: Expected,
        note: String,
    ) -> Cell {
        Cell {
            scenario: scenario.number(),
            scenario_title: scenario.title(),
            backend,
            primitive,
            expected: expected.class,
            reason: expected.reason,
            observed,
            matches: true,
            counts: Counts::default(),
            recovery_ms: None,
            bound_ms: None,
            note,
            warning: None,
            elapsed_ms: 0,
            history: Vec::new(),
        }
    }

    /// Whether the cell ran.
    pub fn ran(&self) -> bool {
        !matches!(self.observed, Class::NotApplicable | Class::NotRun)
    }
}
