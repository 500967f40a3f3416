//! Fault cases against a three-member ZooKeeper ensemble: a follower stops, the leader stops, a
//! holder's server is cut off until its session expires, fifty waiters and one release, and the
//! server's cleanup of empty lock parents.
//!
//! The cases break the one ensemble they share, so they run one after another (in the order
//! listed), each leaving the ensemble whole again.
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-zk --test faults
//! ```

mod support;

#[path = "faults/cases.rs"]
mod cases;

use std::sync::Arc;

use dlock_testkit::fixtures::{docker_opt_out, ZkEnsemble, ZkOptions};
use dlock_testkit::trials;
use libtest_mimic::Arguments;

use support::TICK;

fn main() {
    let mut args = Arguments::from_args();
    // The cases stop and cut off members of the one ensemble: never two at a time.
    args.test_threads = Some(1);
    if docker_opt_out() {
        trials::run_ignored(&args, trials::placeholders(cases::names()));
    }
    let runtime = trials::fixture_runtime();
    let ensemble = Arc::new(trials::start(
        &runtime,
        "a three-member ZooKeeper ensemble",
        ZkEnsemble::start_with(3, ZkOptions::default().with_tick_time(TICK)),
    ));
    let emptied = trials::start(&runtime, "a first lock", cases::empty_a_parent(&ensemble));
    let trials = cases::trials(&ensemble, runtime.handle().clone(), emptied);
    trials::run_then(&args, trials, &runtime, || async move {
        match Arc::try_unwrap(ensemble) {
            Ok(ensemble) => ensemble.shutdown().await,
            // A trial still holds it (it hung); dropping the last reference removes the containers.
            Err(_) => Ok(()),
        }
    })
}
