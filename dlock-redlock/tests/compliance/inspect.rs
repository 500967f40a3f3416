//! Looking at a lock without taking it: what a quorum of masters shows, with the holder's token
//! and remaining TTL; a minority's key is not a holder. (Masters down are a fault case, in the
//! faults binary.)

use std::time::Duration;

use anyhow::ensure;
use dlock_core::backend::LockKey;
use dlock_core::inspect::{Holder, Holding};
use dlock_core::{DistributedLock, DistributedLockExt, LockOptions};
use dlock_testkit::case;
use dlock_testkit::trials::Case;
use redis::aio::MultiplexedConnection;

use crate::support::{self, unique, PATIENT};

/// The cases of this module, each given the shared masters' URLs.
pub fn cases() -> Vec<(&'static str, Case<Vec<String>>)> {
    vec![case!(a_quorum_decides_held_or_free)]
}

/// A dlock owner token's form, as a foreign client might also write it.
const STRANGER: &str = "0123456789abcdef0123456789abcdef";

/// Free, then held with the lease's token and a TTL no longer than the lease's, then free after
/// the release; keys planted by hand on a minority or split between owners are not "held".
pub async fn a_quorum_decides_held_or_free(urls: Vec<String>) -> anyhow::Result<()> {
    let client = support::client_with(&urls, |b| b.with_request_timeout(PATIENT)).await?;
    let name = unique("inspect");
    let key = LockKey::new(&name)?;
    ensure!(client.inspect(&key).await? == Holding::Free, "a new key");

    let ttl = Duration::from_secs(30);
    let lease = client.acquire(&name, &LockOptions::new(ttl)).await?;
    match client.inspect(&key).await? {
        Holding::Held(Holder {
            fencing,
            expires_in: Some(left),
            ..
        }) => {
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
        Holding::Held(Holder {
            fencing: None,
            expires_in: Some(_),
            ..
        }) => {}
        other => anyhow::bail!("a foreign holder shows as {other:?}"),
    }
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
