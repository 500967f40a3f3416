//! How much work each workload does: the full run (under ten minutes for every backend) and the
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
    /// Contenders (each with a client of its own) on the hot key.
    pub contenders: usize,
    /// Acquires timed while one server or member is frozen.
    pub frozen_cycles: usize,
    /// Leases held at once with auto-renew, for memory and renewal traffic.
    pub leases: usize,
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
    contenders: 8,
    frozen_cycles: 100,
    leases: 10_000,
    renew_ttl: Duration::from_secs(6),
    observe: Duration::from_secs(6),
};

pub const QUICK: Plan = Plan {
    cycles: 200,
    warmup: 20,
    rounds: 2,
    window: Duration::from_millis(300),
    hot_for: Duration::from_millis(600),
    contenders: 4,
    frozen_cycles: 10,
    leases: 1_000,
    renew_ttl: Duration::from_secs(3),
    observe: Duration::from_secs(2),
};
