//! One master's wall clock jumps while a lease is renewed on all five (the test image's clock shim):
//! the clock watch shortens the lease and counts the jump (see `dlock_testkit::clock_watch`).

use std::sync::Arc;

use dlock_core::DistributedLock;
use dlock_testkit::case;
use dlock_testkit::clock_watch;
use dlock_testkit::fixtures::RedisMasters;
use dlock_testkit::trials::Case;

use crate::support::{self, unique};

/// The cases of this module, in the order they run.
pub fn cases() -> Vec<(&'static str, Case<Arc<RedisMasters>>)> {
    vec![
        case!(a_server_clock_that_jumps_shortens_the_lease_and_is_counted),
        case!(the_clock_check_catches_a_client_that_ignores_the_jump),
    ]
}

/// With two masters down, the lease's quorum needs the master whose clock jumps 4.5 s ahead: the
/// renewal after the jump grants that much less validity (that master's key goes that much
/// earlier), and the jump, then the jump back, are counted.
pub async fn a_server_clock_that_jumps_shortens_the_lease_and_is_counted(
    masters: Arc<RedisMasters>,
) -> anyhow::Result<()> {
    let client: Arc<dyn DistributedLock> = bare_quorum(&masters).await?;
    let key = unique("clock");
    let url = masters.urls().into_iter().next().unwrap_or_default();
    clock_watch::check(&client, "redlock", &key, masters.member(0)?, &url).await
}

/// The same check fails on a client that takes every renewal at face value.
pub async fn the_clock_check_catches_a_client_that_ignores_the_jump(
    masters: Arc<RedisMasters>,
) -> anyhow::Result<()> {
    let client: Arc<dyn DistributedLock> = bare_quorum(&masters).await?;
    let key = unique("clock-teeth");
    let url = masters.urls().into_iter().next().unwrap_or_default();
    clock_watch::check_catches_a_client_without_the_watch(
        client,
        "redlock",
        &key,
        masters.member(0)?,
        &url,
    )
    .await
}

/// A client of all five masters with the last two stopped, so that every renewal needs the first
/// one, whose clock jumps (the next case brings the two back).
async fn bare_quorum(masters: &RedisMasters) -> anyhow::Result<Arc<dyn DistributedLock>> {
    let client = support::serving_client(masters).await?;
    for member in &masters.members()?[3..] {
        member.stop().await?;
    }
    Ok(client)
}
