//! `--only SCENARIO/BACKEND[/PRIMITIVE]`: which cells to run.

use dlock_testkit::registry::{backend, BACKENDS};

use crate::subject::Subject;
use crate::Backend;
use crate::Scenario;

/// One selector: each part `None` for any.
type Selector = (Option<Scenario>, Option<&'static Backend>, Option<Subject>);

/// Selected cells; no selector selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    selectors: Vec<Selector>,
}

impl Filter {
    /// Adds a selector `SCENARIO/BACKEND` or `SCENARIO/BACKEND/PRIMITIVE`, any part `*`, e.g.
    /// `2/redis`, `*/zk`, `8/*`, `2/redis/semaphore`, `*/*/lock`; a bare `SCENARIO`, `BACKEND` or
    /// `PRIMITIVE` means that one with any of the others. Without a primitive part, the lock and
    /// every primitive are selected. Primitives are `lock`, `write`, `semaphore` and `election`.
    pub fn add(&mut self, selector: &str) -> Result<(), String> {
        let parts: Vec<&str> = selector.split('/').collect();
        let parsed = match parts.as_slice() {
            [s, b] => (parse_scenario(s)?, parse_backend(b)?, None),
            [s, b, p] => (parse_scenario(s)?, parse_backend(b)?, parse_subject(p)?),
            [one] => match (Scenario::parse(one), backend(one), Subject::parse(one)) {
                (Some(s), _, _) => (Some(s), None, None),
                (None, Some(b), _) => (None, Some(b), None),
                (None, None, Some(p)) => (None, None, Some(p)),
                (None, None, None) => return Err(unknown(one)),
            },
            _ => return Err(unknown(selector)),
        };
        self.selectors.push(parsed);
        Ok(())
    }

    /// Whether the cell is selected.
    pub fn selects(&self, scenario: Scenario, backend: &Backend, subject: Subject) -> bool {
        self.selectors.is_empty()
            || self.selectors.iter().any(|(s, b, p)| {
                s.is_none_or(|s| s == scenario)
                    && b.is_none_or(|b| b == backend)
                    && p.is_none_or(|p| p == subject)
            })
    }
}

fn parse_scenario(s: &str) -> Result<Option<Scenario>, String> {
    if s == "*" {
        return Ok(None);
    }
    Scenario::parse(s).map(Some).ok_or_else(|| unknown(s))
}

fn parse_backend(s: &str) -> Result<Option<&'static Backend>, String> {
    if s == "*" {
        return Ok(None);
    }
    backend(s).map(Some).ok_or_else(|| unknown(s))
}

fn parse_subject(s: &str) -> Result<Option<Subject>, String> {
    if s == "*" {
        return Ok(None);
    }
    Subject::parse(s).map(Some).ok_or_else(|| unknown(s))
}

fn unknown(s: &str) -> String {
    let backends: Vec<&str> = BACKENDS.iter().map(|b| b.name).collect();
    let subjects: Vec<&str> = Subject::ALL.iter().map(|p| p.name()).collect();
    format!(
        "unknown scenario, backend or primitive {s:?}: scenarios are 1 to {}, backends are {}, \
         primitives are {}",
        Scenario::ALL.len(),
        backends.join(", "),
        subjects.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_pick_cells_and_bad_ones_are_explained() {
        let named = |name| backend(name).unwrap();
        let lock = Subject::Lock;
        let mut f = Filter::default();
        assert!(f.selects(Scenario::Contention, named("etcd"), lock));
        assert!(f.selects(Scenario::Contention, named("etcd"), Subject::Election));
        f.add("2/redis").unwrap();
        f.add("*/zk").unwrap();
        f.add("8").unwrap();
        assert!(f.selects(Scenario::HolderPaused, named("redis"), lock));
        assert!(f.selects(Scenario::HolderPaused, named("redis"), Subject::Semaphore));
        assert!(!f.selects(Scenario::HolderPaused, named("etcd"), lock));
        assert!(f.selects(Scenario::Contention, named("zk"), lock));
        assert!(f.selects(Scenario::RestartWithoutData, named("naive-expire"), lock));
        let err = f.add("13/redis").unwrap_err();
        assert!(err.contains("scenarios are 1 to 11"), "{err}");
        assert!(f.add("2/mysql").unwrap_err().contains("naive-expire"));
    }

    #[test]
    fn a_primitive_part_narrows_the_selection() {
        let named = |name| backend(name).unwrap();
        let mut f = Filter::default();
        f.add("2/redis/semaphore").unwrap();
        f.add("*/*/lock").unwrap();
        assert!(f.selects(Scenario::HolderPaused, named("redis"), Subject::Semaphore));
        assert!(!f.selects(Scenario::HolderPaused, named("redis"), Subject::Write));
        assert!(!f.selects(Scenario::HolderCrashed, named("redis"), Subject::Semaphore));
        assert!(f.selects(Scenario::HolderCrashed, named("etcd"), Subject::Lock));

        let mut bare = Filter::default();
        bare.add("election").unwrap();
        assert!(bare.selects(Scenario::Contention, named("zk"), Subject::Election));
        assert!(!bare.selects(Scenario::Contention, named("zk"), Subject::Lock));

        let err = f.add("2/redis/mutex").unwrap_err();
        assert!(err.contains("semaphore"), "{err}");
        assert!(f.add("2/redis/write/x").is_err());
    }
}
