//! The read-write lock and the election with two of five masters down: a quorum of three still
//! serves them, with the same cases as when every master is up.

use std::sync::Arc;

use anyhow::Context;
use dlock_core::DistributedLock;
use dlock_testkit::case;
use dlock_testkit::fixtures::RedisMasters;
use dlock_testkit::trials::Case;

use crate::primitives::{self, Connect};
use crate::support;

/// The cases of this module, in the order they run.
pub fn cases() -> Vec<(&'static str, Case<Arc<RedisMasters>>)> {
    vec![case!(rw_and_election_work_with_two_of_five_masters_down)]
}

/// Stops two masters, then runs every read-write lock and election case of the primitives.
pub async fn rw_and_election_work_with_two_of_five_masters_down(
    masters: Arc<RedisMasters>,
) -> anyhow::Result<()> {
    support::all_serving(&masters).await?;
    for down in [0, 1] {
        masters.member(down)?.stop().await?;
    }
    let urls = masters.urls();
    let connect: Connect = Arc::new(move || {
        let urls = urls.clone();
        Box::pin(async move {
            let client: Arc<dyn DistributedLock> =
                Arc::new(support::builder(&urls).connect().await?);
            Ok(client)
        })
    });
    for (name, case) in primitives::rw_and_election_cases() {
        case(connect.clone())
            .await
            .with_context(|| format!("{name}, two of five masters down"))?;
    }
    Ok(())
}
