//! How long and how hard a run is: the quick CI run, or the full one.

use std::time::Duration;

use dlock_core::LockOptions;

use crate::Scenario;

/// The time scale and load of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Whether this is the shortened CI run.
    pub quick: bool,
    /// The lease TTL of the fault scenarios.
    pub ttl: Duration,
    /// Extra time allowed on top of every promised bound (the machines are noisy).
    pub slack: Duration,
    /// Clients contending in scenario 1.
    pub clients: usize,
    /// Acquisitions per client in scenario 1.
    pub rounds: usize,
}

impl Plan {
    /// The CI run: short leases, light contention.
    pub fn quick() -> Plan {
        Plan {
            quick: true,
            ttl: Duration::from_secs(1),
            slack: Duration::from_secs(4),
            clients: 4,
            rounds: 25,
        }
    }

    /// The full run: thousands of acquisitions, longer leases.
    pub fn full() -> Plan {
        Plan {
            quick: false,
            ttl: Duration::from_secs(2),
            slack: Duration::from_secs(5),
            clients: 8,
            rounds: 250,
        }
    }

    /// The scenarios run on each primitive a backend declares (the lock runs all of them): the
    /// paused holder's fenced write in the quick run; in the full run also contention, the
    /// delayed write and reply, the crashed and the cut-off holder, and the late release. The
    /// scenarios left out break servers or a single node's clock, and cost a restart each.
    pub fn primitive_scenarios(&self) -> &'static [Scenario] {
        if self.quick {
            &[Scenario::HolderPaused]
        } else {
            &[
                Scenario::Contention,
                Scenario::HolderPaused,
                Scenario::WriteDelayed,
                Scenario::ReplyDelayed,
                Scenario::HolderCrashed,
                Scenario::HolderCutOff,
                Scenario::ReleaseAfterExpiry,
            ]
        }
    }

    /// The lease of a holder that must outlive a server restart (scenarios 8 to 10).
    pub fn long_ttl(&self) -> Duration {
        self.ttl.mul_f64(10.0).max(Duration::from_secs(15))
    }

    /// Options for a holder: the plan's TTL, waiting up to `wait`.
    pub fn opts(&self, wait: Duration) -> LockOptions {
        LockOptions::new(self.ttl).with_wait(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primitives_run_the_paused_holder_quickly_and_seven_scenarios_in_full() {
        assert_eq!(
            Plan::quick().primitive_scenarios(),
            &[Scenario::HolderPaused]
        );
        let full: Vec<u8> = Plan::full()
            .primitive_scenarios()
            .iter()
            .map(|s| s.number())
            .collect();
        assert_eq!(full, [1, 2, 3, 4, 5, 6, 11]);
    }
}
