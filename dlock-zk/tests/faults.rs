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
use libtest_mimic::{Arguments, Trial};

use support::{fixture_runtime, TICK};

fn main() {
    let mut args = Arguments::from_args();
    // The cases stop and cut off members of the one ensemble: never two at a time.
    args.test_threads = Some(1);
    if docker_opt_out() {
        let trials: Vec<Trial> = cases::names()
            .into_iter()
            .map(|n| Trial::test(n, || Ok(())).with_ignored_flag(true))
            .collect();
        libtest_mimic::run(&args, trials).exit();
    }
    let runtime = fixture_runtime();
    let started = std::time::Instant::now();
    let ensemble = match runtime.block_on(ZkEnsemble::start_with(
        3,
        ZkOptions::default().with_tick_time(TICK),
    )) {
        Ok(ensemble) => Arc::new(ensemble),
        Err(e) => {
            eprintln!("cannot start the ZooKeeper ensemble: {e}");
            std::process::exit(1);
        }
    };
    eprintln!(
        "[timing] three-member ZooKeeper ensemble: {:.2?}",
        started.elapsed()
    );
    let emptied = match runtime.block_on(cases::empty_a_parent(&ensemble)) {
        Ok(emptied) => emptied,
        Err(e) => {
            eprintln!("cannot take a first lock: {e:#}");
            std::process::exit(1);
        }
    };
    let trials = cases::trials(&ensemble, runtime.handle().clone(), emptied);
    let conclusion = libtest_mimic::run(&args, trials);
    match Arc::try_unwrap(ensemble) {
        Ok(ensemble) => {
            if let Err(e) = runtime.block_on(ensemble.shutdown()) {
                eprintln!("fixture shutdown: {e}");
            }
        }
        // A trial still holds it (it hung); dropping the last reference removes the containers.
        Err(shared) => drop(shared),
    }
    conclusion.exit();
}
