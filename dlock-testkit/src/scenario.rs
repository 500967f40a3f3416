//! The fault scenarios of the safety matrix, numbered as in the issue that defines them, and the
//! outcome classes a cell can have.
//!
//! They live in the test kit because every backend's [registry](crate::registry) entry declares
//! the class it expects per scenario; `dlock-safety` runs them and re-exports both types.

use std::fmt;

use serde::Serialize;

/// One fault scenario. Scenario 12 of the issue is not a column here: its two baselines are rows
/// of the [registry](crate::registry) (`legacy-getset`, `naive-expire`) run through every other
/// scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Scenario {
    /// 1. No faults, heavy contention.
    Contention,
    /// 2. The holder is paused past its TTL or session, then writes (the GC-pause case).
    HolderPaused,
    /// 3. The holder's write reaches the resource after its TTL, behind the next holder's write.
    WriteDelayed,
    /// 4. The acquire's reply arrives after the TTL.
    ReplyDelayed,
    /// 5. The holder crashes while others wait.
    HolderCrashed,
    /// 6. The holder is cut off from the lock service while it keeps working.
    HolderCutOff,
    /// 7. The lock service is partitioned while the lock is held.
    ServicePartitioned,
    /// 8. The server restarts without persistence.
    RestartWithoutData,
    /// 9. A server's clock jumps ahead past the lease (the Redis server, one Redlock master).
    ClockJump,
    /// 10. An asynchronous replica that missed the last writes is promoted.
    LaggingReplicaPromoted,
    /// 11. A release or extend after expiry must not touch the successor's lock.
    ReleaseAfterExpiry,
}

impl Scenario {
    /// Every scenario, in order.
    pub const ALL: [Scenario; 11] = [
        Scenario::Contention,
        Scenario::HolderPaused,
        Scenario::WriteDelayed,
        Scenario::ReplyDelayed,
        Scenario::HolderCrashed,
        Scenario::HolderCutOff,
        Scenario::ServicePartitioned,
        Scenario::RestartWithoutData,
        Scenario::ClockJump,
        Scenario::LaggingReplicaPromoted,
        Scenario::ReleaseAfterExpiry,
    ];

    /// The scenario's number in the issue.
    pub fn number(self) -> u8 {
        match self {
            Scenario::Contention => 1,
            Scenario::HolderPaused => 2,
            Scenario::WriteDelayed => 3,
            Scenario::ReplyDelayed => 4,
            Scenario::HolderCrashed => 5,
            Scenario::HolderCutOff => 6,
            Scenario::ServicePartitioned => 7,
            Scenario::RestartWithoutData => 8,
            Scenario::ClockJump => 9,
            Scenario::LaggingReplicaPromoted => 10,
            Scenario::ReleaseAfterExpiry => 11,
        }
    }

    /// A short title for tables.
    pub fn title(self) -> &'static str {
        match self {
            Scenario::Contention => "contention, no faults",
            Scenario::HolderPaused => "holder paused past its lease",
            Scenario::WriteDelayed => "write delayed past the TTL",
            Scenario::ReplyDelayed => "acquire reply delayed past the TTL",
            Scenario::HolderCrashed => "holder crashes",
            Scenario::HolderCutOff => "holder cut off from the service",
            Scenario::ServicePartitioned => "service partitioned while held",
            Scenario::RestartWithoutData => "server restart without persistence",
            Scenario::ClockJump => "a server's clock jumps ahead",
            Scenario::LaggingReplicaPromoted => "lagging replica promoted",
            Scenario::ReleaseAfterExpiry => "release/extend after expiry",
        }
    }

    /// Parses a scenario number, as given to `--only`.
    pub fn parse(s: &str) -> Option<Scenario> {
        let n: u8 = s.parse().ok()?;
        Scenario::ALL.into_iter().find(|sc| sc.number() == n)
    }
}

/// What happened in a cell (observed) or what a backend promises for it (declared).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// No violation, and the lock was handed on.
    Safe,
    /// Mutual exclusion failed or a stale holder wrote, and the fence refused every stale write.
    CaughtByFencing,
    /// A stale write reached the resource, an update was lost, or holds overlapped unfenced.
    NotCaught,
    /// No violation, but the lock could not be taken while the fault lasted.
    Unavailable,
    /// The scenario does not apply to the backend.
    NotApplicable,
    /// The scenario was not run (the backend has not landed, or faults cannot be injected).
    NotRun,
}

impl Class {
    /// The short label used in tables.
    pub fn label(self) -> &'static str {
        match self {
            Class::Safe => "safe",
            Class::CaughtByFencing => "caught by fencing",
            Class::NotCaught => "violation not caught",
            Class::Unavailable => "unavailable",
            Class::NotApplicable => "n/a",
            Class::NotRun => "not yet run",
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// A declared expectation: the class a backend expects in one scenario, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Declared {
    /// The class the backend expects.
    pub class: Class,
    /// One line: the documented guarantee the expectation rests on.
    pub reason: &'static str,
}
