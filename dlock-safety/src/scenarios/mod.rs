//! The scenarios, one file each. Every scenario drives clients of one [`Target`] through one
//! fault, recording into the cell's [`Run`]; the verdict is left to the history's analysis.

mod clock_jump;
mod contention;
mod crash;
mod cut_off;
mod delayed_reply;
mod delayed_write;
mod failover;
mod paused;
mod release_after_expiry;
mod restart;
mod take_over;
mod working_holder;

use std::time::Duration;

use crate::run::Run;
use crate::targets::Target;
use crate::Scenario;

/// What a scenario reports besides the history.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Whether the client meant to get the lock next (after the fault) got it.
    pub handed_on: bool,
    /// For crashes, cut-offs and partitions: from the fault until the next holder had the lock.
    pub recovery: Option<Duration>,
    /// The bound the backend promises for that recovery.
    pub bound: Option<Duration>,
    /// What else is worth knowing, in a few words.
    pub note: String,
    /// A warning the holder's client gave about the fault (scenario 9: its clock watch saw the
    /// jump), shown in the matrix.
    pub warning: Option<String>,
}

/// Runs `scenario` against `target`.
pub async fn run(scenario: Scenario, target: &dyn Target, run: &Run) -> anyhow::Result<Outcome> {
    match scenario {
        Scenario::Contention => contention::run(target, run).await,
        Scenario::HolderPaused => paused::run(target, run).await,
        Scenario::WriteDelayed => delayed_write::run(target, run).await,
        Scenario::ReplyDelayed => delayed_reply::run(target, run).await,
        Scenario::HolderCrashed => crash::run(target, run).await,
        Scenario::HolderCutOff => cut_off::run_cut_off(target, run).await,
        Scenario::ServicePartitioned => cut_off::run_partition(target, run).await,
        Scenario::RestartWithoutData => restart::run(target, run).await,
        Scenario::ReleaseAfterExpiry => release_after_expiry::run(target, run).await,
        Scenario::LaggingReplicaPromoted => failover::run(target, run).await,
        Scenario::ClockJump => clock_jump::run(target, run).await,
    }
}

fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}
