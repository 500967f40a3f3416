//! How much work each workload does: the full run (about fifteen minutes for every backend on two cores) and the
//! quick one (about a minute, run by `scripts/test` so the tool cannot rot).

use std::time::Duration;

/// The size of a run.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Plan {
    /// Uncontended cycles per side, after `warmup` more.
    pub cycles: usize,
    pub warmup: usize,
    /// Sides take turns in this many blocks, so load from elsewhere on the machine hits all alike.
    pub rounds: usize,
    /// Time per side and task count for throughput, split over the rounds.
    pub window: Duration,
    /// Time per side for the hot key.
    pub hot_for: Duration,
    /// Contenders (each with a client of its own) on the hot key, on every side that has one.
    pub contenders: usize,
    /// Tasks on one key (each with a client of its own) for how hand-offs grow with waiters:
    /// one holds, the others wait. dlock only; the count equal to `contenders` is the hot key's.
    pub waiting_tasks: &'static [usize],
    /// Acquires timed while one server or member is frozen.
    pub frozen_cycles: usize,
    /// Leases held at once for the per-lease against batched renewal comparison.
    pub leases: usize,
    /// Leases held at once with auto-renew (or in the session), for how cost grows per lease.
    pub lease_counts: &'static [usize],
    /// How long taking the leases of one count may take; past it the count is reported as not
    /// held, with how many were taken.
    pub taking_budget: Duration,
    /// Their TTL (renewed every third of it).
    pub renew_ttl: Duration,
    /// How long renewal traffic is counted.
    pub observe: Duration,
}

pub const FULL: Plan = Plan {
    cycles: 2_000,
    warmup: 200,
    rounds: 4,
    window: Duration::from_secs(2),
    hot_for: Duration::from_secs(3),
    contenders: 16,
    waiting_tasks: &[2, 16, 256],
    frozen_cycles: 100,
    leases: 10_000,
    lease_counts: &[1, 100, 10_000, 100_000],
    taking_budget: Duration::from_secs(120),
    renew_ttl: Duration::from_secs(6),
    observe: Duration::from_secs(6),
};

/// Every workload of the full run, each just long enough to run through once: it shows that the
/// tool works, not what the figures are.
pub const QUICK: Plan = Plan {
    cycles: 100,
    warmup: 10,
    rounds: 2,
    window: Duration::from_millis(200),
    hot_for: Duration::from_millis(400),
    contenders: 16,
    waiting_tasks: &[2, 16],
    frozen_cycles: 10,
    leases: 1_000,
    lease_counts: &[1, 1_000],
    taking_budget: Duration::from_secs(20),
    renew_ttl: Duration::from_millis(1_200),
    observe: Duration::from_millis(600),
};
