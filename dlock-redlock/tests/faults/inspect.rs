//! Looking at a lock while masters are down: a minority down still answers, no quorum is an error.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use dlock_core::backend::LockKey;
use dlock_core::inspect::{Eviction, Holding};
use dlock_core::{Admin, DistributedLock, DistributedLockExt, Error, FencingToken, LockOptions};
use dlock_redis::protocol::keys::owner_key;
use dlock_testkit::case;
use dlock_testkit::fixtures::RedisMasters;
use dlock_testkit::trials::Case;

use crate::support::{self, unique, PATIENT};

/// The cases of this module, in the order they run.
pub fn cases() -> Vec<(&'static str, Case<Arc<RedisMasters>>)> {
    vec![
        case!(a_minority_down_still_answers_and_no_quorum_is_an_error),
        case!(eviction_with_a_minority_down_evicts_and_without_a_quorum_fails),
    ]
}

/// With two of five masters down the holder is still seen, token included (the three left agree
/// on its owner record's token); with three down the answer is an error naming reached and needed, not a
/// guess.
pub async fn a_minority_down_still_answers_and_no_quorum_is_an_error(
    masters: Arc<RedisMasters>,
) -> anyhow::Result<()> {
    support::all_serving(&masters).await?;
    let client = support::client_with(&masters.urls(), |b| b.with_request_timeout(PATIENT)).await?;
    let name = unique("inspect-down");
    let key = LockKey::new(&name)?;
    let lease = client
        .acquire(&name, &LockOptions::new(Duration::from_secs(60)))
        .await?;
    let token = lease.fencing_token();
    let order = stop_two_not_showing(&masters, &name, token).await?;
    let seen = client.inspect(&key).await.context("two masters down")?;
    ensure!(
        matches!(&seen, Holding::Held(h) if h.fencing == Some(token)),
        "with two masters down: {seen:?}"
    );
    masters.member(order[2])?.stop().await?;
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

/// With two of five masters down an eviction by the shown token still evicts (the three left
/// answered), the evicted lease cannot renew, and the next holder's token is greater; with three
/// down it fails as unavailable and names what it needed.
pub async fn eviction_with_a_minority_down_evicts_and_without_a_quorum_fails(
    masters: Arc<RedisMasters>,
) -> anyhow::Result<()> {
    support::all_serving(&masters).await?;
    let client = support::client_with(&masters.urls(), |b| b.with_request_timeout(PATIENT)).await?;
    let admin = Admin::new(&client);
    let name = unique("evict-down");
    let mut lease = client
        .acquire(&name, &LockOptions::new(Duration::from_secs(60)))
        .await?;
    let order = stop_two_not_showing(&masters, &name, lease.fencing_token()).await?;
    let shown = client
        .inspect(&LockKey::new(&name)?)
        .await
        .context("two masters down")?;
    let token = shown.holder().and_then(|h| h.fencing);
    ensure!(
        token == Some(lease.fencing_token()),
        "with two masters down: {shown}"
    );
    let evicted = admin.force_unlock(&name, token).await?;
    ensure!(
        matches!(evicted, Eviction::Evicted(_)),
        "with two masters down: {evicted:?}"
    );
    ensure!(
        lease.extend(Duration::from_secs(60)).await.is_err(),
        "the evicted lease renewed"
    );
    let successor = client
        .acquire(&name, &LockOptions::new(Duration::from_secs(60)))
        .await?;
    ensure!(
        successor.fencing_token() > lease.fencing_token(),
        "token {} after the evicted {}",
        successor.fencing_token(),
        lease.fencing_token()
    );
    masters.member(order[2])?.stop().await?;
    match admin.force_unlock(&name, None).await {
        Err(e @ Error::Unavailable { .. }) => {
            let shown = format!("{e} / {:?}", std::error::Error::source(&e));
            ensure!(shown.contains("needed 3"), "{shown}");
        }
        other => anyhow::bail!("with three masters down: {other:?}"),
    }
    drop(successor);
    Ok(())
}

/// Stops two masters, those whose owner record of `name` does not show `token` first (a master
/// may have granted after the client had its quorum, with a larger token), so that the three
/// left agree on it; returns the masters in the order they are to be stopped.
async fn stop_two_not_showing(
    masters: &RedisMasters,
    name: &str,
    token: FencingToken,
) -> anyhow::Result<Vec<usize>> {
    let mut order = Vec::new();
    for (i, url) in masters.urls().iter().enumerate() {
        let mut con = support::raw(url).await?;
        let recorded: Option<u64> = redis::cmd("HGET")
            .arg(owner_key(name))
            .arg("fencing")
            .query_async(&mut con)
            .await?;
        order.push((recorded == Some(token.get()), i));
    }
    order.sort();
    let order: Vec<usize> = order.into_iter().map(|(_, i)| i).collect();
    for &i in &order[..2] {
        masters.member(i)?.stop().await?;
    }
    Ok(order)
}
