//! The server's wall clock jumps while a lease is renewed on it (the test image's clock shim):
//! the clock watch shortens the lease and counts the jump (see `dlock_testkit::clock_watch`).

use std::sync::Arc;

use dlock_core::DistributedLock;
use dlock_redis::RedisLock;
use dlock_testkit::case;
use dlock_testkit::clock_watch;
use dlock_testkit::fixtures::RedisServer;
use dlock_testkit::trials::Case;

use crate::support::unique;

/// The cases of this module, in the order they run.
pub fn cases() -> Vec<(&'static str, Case<Arc<RedisServer>>)> {
    vec![
        case!(a_server_clock_that_jumps_shortens_the_lease_and_is_counted),
        case!(the_clock_check_catches_a_client_that_ignores_the_jump),
    ]
}

/// A renewal after the server's clock jumped 4.5 s ahead grants that much less validity, and
/// the jump, then the jump back, are counted.
pub async fn a_server_clock_that_jumps_shortens_the_lease_and_is_counted(
    server: Arc<RedisServer>,
) -> anyhow::Result<()> {
    let client: Arc<dyn DistributedLock> = Arc::new(RedisLock::connect(&server.url()).await?);
    let key = unique("clock");
    clock_watch::check(&client, "redis", &key, server.member()?, &server.url()).await
}

/// The same check fails on a client that takes every renewal at face value.
pub async fn the_clock_check_catches_a_client_that_ignores_the_jump(
    server: Arc<RedisServer>,
) -> anyhow::Result<()> {
    let client: Arc<dyn DistributedLock> = Arc::new(RedisLock::connect(&server.url()).await?);
    let key = unique("clock-teeth");
    clock_watch::check_catches_a_client_without_the_watch(
        client,
        "redis",
        &key,
        server.member()?,
        &server.url(),
    )
    .await
}
