//! Faults against one Redis server: it freezes, restarts without its data, loses its script
//! cache, its clock jumps; the subscriber connection is killed or goes silent; servers refuse or
//! never answer.
//!
//! The cases share one server and break it, so they run one after another (in the order listed),
//! each leaving it serving again.
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-redis --test faults
//! ```
//!
//! With `DLOCK_TEST_NO_DOCKER=1` every trial is reported as ignored.

mod support;

#[path = "faults/clock.rs"]
mod clock;
#[path = "faults/links.rs"]
mod links;
#[path = "faults/server.rs"]
mod server;

use dlock_testkit::fixtures::{RedisOptions, RedisServer};
use dlock_testkit::trials;

fn main() {
    let cases: Vec<_> = [links::cases(), server::cases(), clock::cases()].concat();
    trials::run_one_at_a_time(
        "redis-faults",
        &cases,
        support::TRIAL_BUDGET,
        "a Redis server",
        || RedisServer::start_with(RedisOptions::default().with_jumping_clock()),
    )
}
