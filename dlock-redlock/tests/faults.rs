//! Faults against five Redis masters, the ones the algorithm is about: masters down (a minority,
//! then a majority), one frozen, one restarted without its data (with and without the
//! delayed-restart rule); fencing tokens, looking at a lock and batched renewal while masters are
//! down.
//!
//! The cases share the five masters and break them, so they run one after another (in the order
//! listed); each starts by bringing back every master a case before left stopped.
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-redlock --test faults
//! ```
//!
//! With `DLOCK_TEST_NO_DOCKER=1` every trial is reported as ignored.

mod support;

#[path = "faults/batch.rs"]
mod batch;
#[path = "faults/fencing.rs"]
mod fencing;
#[path = "faults/inspect.rs"]
mod inspect;
#[path = "faults/masters.rs"]
mod masters;

use std::sync::Arc;

use dlock_testkit::fixtures::{docker_opt_out, RedisMasters};
use dlock_testkit::trials;
use libtest_mimic::Arguments;

const PREFIX: &str = "redlock-faults";

fn main() {
    let mut args = Arguments::from_args();
    // The cases stop, freeze and restart the masters they share: never two at a time.
    args.test_threads = Some(1);
    let cases: Vec<_> = [
        masters::cases(),
        fencing::cases(),
        inspect::cases(),
        batch::cases(),
    ]
    .concat();
    if docker_opt_out() {
        trials::run_ignored(&args, trials::placeholders(trials::names(PREFIX, &cases)));
    }
    let runtime = trials::fixture_runtime();
    let masters = Arc::new(trials::start(
        &runtime,
        "five Redis masters",
        RedisMasters::start(5),
    ));
    let trials = trials::cases(PREFIX, &cases, &masters, support::TRIAL_BUDGET);
    trials::run_then(&args, trials, &runtime, || async move {
        match Arc::try_unwrap(masters) {
            Ok(masters) => masters.shutdown().await,
            // A trial still holds them (it hung); dropping the last reference removes them.
            Err(_) => Ok(()),
        }
    })
}
