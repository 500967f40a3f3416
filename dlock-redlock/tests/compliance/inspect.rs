//! Looking at a lock without taking it: what a quorum of masters shows, with the holder's token
//! and remaining TTL; a minority's key is not a holder; too few masters is an error.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use dlock_core::{DistributedLock, DistributedLockExt, Error, Holding, LockKey, LockOptions};
use dlock_redis::protocol::keys::fence_key;
use dlock_testkit::fixtures::RedisMasters;
use redis::aio::MultiplexedConnection;

use crate::support::{self, unique};

/// A dlock owner token's form, as a foreign client might also write it.
const STRANGER: &str = "0123456789abcdef0123456789abcdef";

/// Each verdict here needs every master's answer (a master that did not answer in time can turn
/// "free" into "unknown"): a per-node timeout no loaded machine reaches, while the rest of the
/// suite freezes and restarts other masters.
const PATIENT: Duration = Duration::from_secs(2);

/// Free, then held with the lease's token and a TTL no longer than the lease's, then free after
/// the release; keys planted by hand on a minority or split between owners are not "held".
pub async fn a_quorum_decides_held_or_free() -> anyhow::Result<()> {
    let masters = RedisMasters::start(5).await?;
    let urls = masters.urls();
    let client = Arc::new(
        support::builder(&urls)
            .with_node_timeout(PATIENT)
            .connect()
            .await?,
    );
    let name = unique("inspect");
    let key = LockKey::new(&name)?;
    ensure!(client.inspect(&key).await? == Holding::Free, "a new key");

    let ttl = Duration::from_secs(30);
    let lease = client.acquire(&name, &LockOptions::new(ttl)).await?;
    match client.inspect(&key).await? {
        Holding::Held {
            fencing,
            expires_in: Some(left),
        } => {
            ensure!(
                fencing == Some(lease.fencing_token()),
                "token {fencing:?}, the lease has {}",
                lease.fencing_token()
            );
            // Generous: the lease was taken moments ago on a possibly loaded machine.
            ensure!(
                left <= ttl && left > ttl - Duration::from_secs(10),
                "expires in {left:?}"
            );
        }
        other => anyhow::bail!("a held lock shows as {other:?}"),
    }
    ensure!(
        lease.is_held(),
        "looking took the lock: {:?}",
        lease.state()
    );
    lease.release().await?;
    ensure!(client.inspect(&key).await? == Holding::Free, "released");

    let mut cons = Vec::new();
    for url in &urls {
        cons.push(support::raw(url).await?);
    }
    // Two of five masters hold a key: three show none, so nobody holds the lock.
    plant(&mut cons[..2], &name, STRANGER).await?;
    ensure!(
        client.inspect(&key).await? == Holding::Free,
        "a key on a minority counts as held"
    );
    // Two and two between owners, one without: no quorum shows anything.
    plant(&mut cons[2..4], &name, "fedcba9876543210fedcba9876543210").await?;
    ensure!(
        client.inspect(&key).await? == Holding::Unknown,
        "a split counts as decided"
    );
    // A quorum with a value that is not a dlock owner token: held, token unknown.
    plant(&mut cons[..3], &name, "someone-else").await?;
    match client.inspect(&key).await? {
        Holding::Held {
            fencing: None,
            expires_in: Some(_),
        } => {}
        other => anyhow::bail!("a foreign holder shows as {other:?}"),
    }
    masters.shutdown().await?;
    Ok(())
}

/// With two of five masters down the holder is still seen, token included (the three left agree
/// on the counter); with three down the answer is an error naming reached and needed, not a
/// guess.
pub async fn a_minority_down_still_answers_and_no_quorum_is_an_error() -> anyhow::Result<()> {
    let masters = RedisMasters::start(5).await?;
    let client = Arc::new(
        support::builder(&masters.urls())
            .with_node_timeout(PATIENT)
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
        matches!(seen, Holding::Held { fencing: Some(t), .. } if t == token),
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
    masters.shutdown().await?;
    Ok(())
}

/// Sets `name` to `value` (for a minute) on each of `cons`, as another client would.
async fn plant(cons: &mut [MultiplexedConnection], name: &str, value: &str) -> anyhow::Result<()> {
    for con in cons {
        let _: () = redis::cmd("SET")
            .arg(name)
            .arg(value)
            .arg("PX")
            .arg(60_000)
            .query_async(con)
            .await?;
    }
    Ok(())
}
