//! `--only SCENARIO/BACKEND`: which cells to run.

use dlock_testkit::registry::{backend, BACKENDS};

use crate::Backend;
use crate::Scenario;

/// Selected cells; no selector selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    selectors: Vec<(Option<Scenario>, Option<&'static Backend>)>,
}

impl Filter {
    /// Adds a selector `SCENARIO/BACKEND`, either side `*`, e.g. `2/redis`, `*/zk`, `8/*`; a bare
    /// `SCENARIO` or `BACKEND` means that one with any of the other.
    pub fn add(&mut self, selector: &str) -> Result<(), String> {
        let (scenario, backend) = match selector.split_once('/') {
            Some((s, b)) => (parse_scenario(s)?, parse_backend(b)?),
            None => match (Scenario::parse(selector), backend(selector)) {
                (Some(s), _) => (Some(s), None),
                (None, Some(b)) => (None, Some(b)),
                (None, None) => return Err(unknown(selector)),
            },
        };
        self.selectors.push((scenario, backend));
        Ok(())
    }

    /// Whether the cell is selected.
    pub fn selects(&self, scenario: Scenario, backend: &Backend) -> bool {
        self.selectors.is_empty()
            || self
                .selectors
                .iter()
                .any(|(s, b)| s.is_none_or(|s| s == scenario) && b.is_none_or(|b| b == backend))
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

fn unknown(s: &str) -> String {
    let backends: Vec<&str> = BACKENDS.iter().map(|b| b.name).collect();
    format!(
        "unknown scenario or backend {s:?}: scenarios are 1 to {}, backends are {}",
        Scenario::ALL.len(),
        backends.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_pick_cells_and_bad_ones_are_explained() {
        let named = |name| backend(name).unwrap();
        let mut f = Filter::default();
        assert!(f.selects(Scenario::Contention, named("etcd")));
        f.add("2/redis").unwrap();
        f.add("*/zk").unwrap();
        f.add("8").unwrap();
        assert!(f.selects(Scenario::HolderPaused, named("redis")));
        assert!(!f.selects(Scenario::HolderPaused, named("etcd")));
        assert!(f.selects(Scenario::Contention, named("zk")));
        assert!(f.selects(Scenario::RestartWithoutData, named("naive-expire")));
        let err = f.add("13/redis").unwrap_err();
        assert!(err.contains("scenarios are 1 to 11"), "{err}");
        assert!(f.add("2/mysql").unwrap_err().contains("naive-expire"));
    }
}
