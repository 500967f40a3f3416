//! Faults against five Redis masters, the ones the algorithm is about: masters down (a minority,
//! then a majority), one frozen, one restarted without its data (with and without the
//! delayed-restart rule); fencing tokens, looking at a lock, batched renewal, and the read-write
//! lock and the election while masters are down.
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
// The Redis crate's cases of the primitives, run here with masters down.
#[path = "faults/clock.rs"]
mod clock;
#[allow(dead_code)]
#[path = "../../dlock-redis/tests/compliance/primitives.rs"]
mod primitives;
#[path = "faults/primitives.rs"]
mod primitives_down;

use dlock_testkit::fixtures::{RedisMasters, RedisOptions};
use dlock_testkit::trials;

fn main() {
    let cases = [
        masters::cases(),
        fencing::cases(),
        inspect::cases(),
        batch::cases(),
        primitives_down::cases(),
        clock::cases(),
    ]
    .concat();
    trials::run_one_at_a_time(
        "redlock-faults",
        &cases,
        support::TRIAL_BUDGET,
        "five Redis masters",
        || RedisMasters::start_with(5, RedisOptions::default().with_jumping_clock()),
    )
}
