//! Faults against one Redis server: it freezes, restarts without its data, loses its script
//! cache; the subscriber connection is killed or goes silent; servers refuse or never answer.
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

#[path = "faults/links.rs"]
mod links;
#[path = "faults/server.rs"]
mod server;

use std::sync::Arc;

use dlock_testkit::fixtures::{docker_opt_out, RedisServer};
use dlock_testkit::trials;
use libtest_mimic::Arguments;

const PREFIX: &str = "redis-faults";

fn main() {
    let mut args = Arguments::from_args();
    // The cases freeze, restart and cut off the one server: never two at a time.
    args.test_threads = Some(1);
    let cases: Vec<_> = links::cases().into_iter().chain(server::cases()).collect();
    if docker_opt_out() {
        trials::run_ignored(&args, trials::placeholders(trials::names(PREFIX, &cases)));
    }
    let runtime = trials::fixture_runtime();
    let server = Arc::new(trials::start(
        &runtime,
        "a Redis server",
        RedisServer::start(),
    ));
    let trials = trials::cases(PREFIX, &cases, &server, support::TRIAL_BUDGET);
    trials::run_then(&args, trials, &runtime, || async move {
        match Arc::try_unwrap(server) {
            Ok(server) => server.shutdown().await,
            // A trial still holds it (it hung); dropping the last reference removes the container.
            Err(_) => Ok(()),
        }
    })
}
