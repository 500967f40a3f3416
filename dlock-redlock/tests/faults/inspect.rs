//! Looking at a lock while masters are down: a minority down still answers, no quorum is an error.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use dlock_core::{DistributedLock, DistributedLockExt, Error, Holding, LockKey, LockOptions};
use dlock_redis::protocol::keys::fence_key;
use dlock_testkit::case;
use dlock_testkit::fixtures::RedisMasters;
use dlock_testkit::trials::Case;

use crate::support::{self, unique, PATIENT};

/// The cases of this module, in the order they run.
pub fn cases() -> Vec<(&'static str, Case<Arc<RedisMasters>>)> {
    vec![case!(
        a_minority_down_still_answers_and_no_quorum_is_an_error
    )]
}

/// With two of five masters down the holder is still seen, token included (the three left agree
/// on the counter); with three down the answer is an error naming reached and needed, not a
/// guess.
pub async fn a_minority_down_still_answers_and_no_quorum_is_an_error(
    masters: Arc<RedisMasters>,
) -> anyhow::Result<()> {
    support::all_serving(&masters).await?;
    let client = Arc::new(
        support::builder(&masters.urls())
            .with_request_timeout(PATIENT)
            .connect()
            .await?,
    );
    let name = unique("inspect-down");
    let key = LockKey::new(&name)?;
    let lease = client
        .acquire(&name, &LockOptions::new(Duration::from_secs(60)))
        .await?;
    // Stop two masters, those whose counter is not the token first (a master may have granted
    // after the client had its quorum, with a larger counter): the three left agree on it.
    let token = lease.fencing_token();
    let mut order = Vec::new();
    for (i, url) in masters.urls().iter().enumerate() {
        let mut con = support::raw(url).await?;
        let counter: Option<u64> = redis::cmd("GET")
            .arg(fence_key(&name))
            .query_async(&mut con)
            .await?;
        order.push((counter == Some(token.0), i));
    }
    order.sort();
    for &(_, i) in &order[..2] {
        masters.member(i)?.stop().await?;
    }
    let seen = client.inspect(&key).await.context("two masters down")?;
    ensure!(
        matches!(&seen, Holding::Held(h) if h.fencing == Some(token)),
        "with two masters down: {seen:?}"
    );
    masters.member(order[2].1)?.stop().await?;
    match client.inspect(&key).await {
        Err(e @ Error::Unavailable { .. }) => {
            let shown = format!("{e} / {:?}", std::error::Error::source(&e));
            ensure!(shown.contains("needed 3"), "{shown}");
        }
        other => anyhow::bail!("with three masters down: {other:?}"),
    }
    drop(lease);
    Ok(())
}
