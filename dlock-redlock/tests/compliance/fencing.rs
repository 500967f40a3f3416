//! Fencing turned off, and the expiry of the fence counters. (Tokens while masters fail are fault
//! cases, in the faults binary.)

use std::time::Duration;

use anyhow::{ensure, Context};
use dlock_core::backend::FencingGuarantee;
use dlock_core::{DistributedLock, DistributedLockExt, LockOptions};
use dlock_redis::protocol::keys::fence_key;
use dlock_testkit::case;
use dlock_testkit::trials::Case;
use redis::aio::MultiplexedConnection;

use crate::support::{self, unique};

/// The cases of this module, each given the shared masters' URLs.
pub fn cases() -> Vec<(&'static str, Case<Vec<String>>)> {
    vec![
        case!(fencing_off_declares_no_guarantee),
        case!(fence_ttl_is_armed_on_every_master_and_rearmed_by_each_grant),
        case!(a_fresh_key_starts_every_masters_counter_alike),
    ]
}

/// The first grant of a key nobody used finds no counter on any master; each starts one at the
/// client's one least start (its clock, ahead by a second), not at its own clock, so every
/// master holds the lease's token at once and no write-back round is needed. The token is above
/// the client's clock, as a counter started at a clock is above the tokens before a data loss.
pub async fn a_fresh_key_starts_every_masters_counter_alike(
    urls: Vec<String>,
) -> anyhow::Result<()> {
    let client = support::client_with(&urls, |b| b).await?;
    let opts = LockOptions::new(Duration::from_secs(10));
    for round in 0..5 {
        let key = unique("fresh-counter");
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros();
        let lease = client.try_acquire(&key, &opts).await?.context("busy")?;
        let token = lease.fencing_token();
        ensure!(
            u128::from(token.0) > before,
            "round {round}: token {token:?} is below the client's clock ({before} µs)"
        );
        for (i, url) in urls.iter().enumerate() {
            let mut con = support::raw(url).await?;
            let counter: Option<u64> = redis::cmd("GET")
                .arg(fence_key(&key))
                .query_async(&mut con)
                .await?;
            ensure!(
                counter == Some(token.0),
                "round {round}: master {i}'s counter is {counter:?}, the lease's token {token:?}"
            );
        }
        lease.release().await?;
    }
    Ok(())
}

/// With fencing off the client declares no ordering, and locks work the same.
pub async fn fencing_off_declares_no_guarantee(urls: Vec<String>) -> anyhow::Result<()> {
    let client = support::client_with(&urls, |b| b.with_fencing(false)).await?;
    ensure!(
        client.capabilities().fencing == FencingGuarantee::None,
        "declares {:?}",
        client.capabilities()
    );
    let key = unique("unfenced");
    let opts = LockOptions::new(Duration::from_secs(10));
    let lease = client.try_acquire(&key, &opts).await?.context("busy")?;
    ensure!(
        client.try_acquire(&key, &opts).await?.is_none(),
        "a held lock was granted again"
    );
    lease.release().await?;
    Ok(())
}

/// The fence TTL of the expiry trial.
const FENCE_TTL: Duration = Duration::from_secs(2 * 24 * 3600);

/// Fails unless the counter `fence` on every master has close to [`FENCE_TTL`] left, `after`
/// what. Generous: the grant happened moments before the check on a possibly loaded machine.
async fn all_fresh(
    cons: &mut [MultiplexedConnection],
    fence: &str,
    after: &str,
) -> anyhow::Result<()> {
    for (i, con) in cons.iter_mut().enumerate() {
        let pttl: i64 = redis::cmd("PTTL").arg(fence).query_async(con).await?;
        let fresh = u64::try_from(pttl).is_ok_and(|ms| {
            let left = Duration::from_millis(ms);
            left <= FENCE_TTL && left > FENCE_TTL - Duration::from_secs(60)
        });
        ensure!(
            fresh,
            "master {i}: after {after} the counter's PTTL is {pttl} ms"
        );
    }
    Ok(())
}

/// With a fence TTL every master's counter gets that expiry with the grant — also those the
/// write-back raised, since raising rewrites the counter — and the next grant re-arms it; tokens
/// still grow. Without it, counters never expire.
pub async fn fence_ttl_is_armed_on_every_master_and_rearmed_by_each_grant(
    urls: Vec<String>,
) -> anyhow::Result<()> {
    let mut cons = Vec::new();
    for url in &urls {
        cons.push(support::raw(url).await?);
    }
    let opts = LockOptions::new(Duration::from_secs(10));

    let forever = support::client_with(&urls, |b| b).await?;
    let key = unique("fence-forever");
    let lease = forever.try_acquire(&key, &opts).await?.context("busy")?;
    lease.release().await?;
    for (i, con) in cons.iter_mut().enumerate() {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(fence_key(&key))
            .query_async(con)
            .await?;
        ensure!(
            pttl == -1,
            "master {i}: a default counter has a TTL ({pttl} ms)"
        );
    }

    let client = support::client_with(&urls, |b| b.with_fence_ttl(FENCE_TTL)).await?;
    let key = unique("fence-ttl");
    let fence = fence_key(&key);
    // One master's counter, ahead of where the others start theirs, without an expiry: the
    // masters disagree and the write-back runs on the others.
    let _: () = redis::cmd("SET")
        .arg(&fence)
        .arg(1u64 << 52)
        .query_async(&mut cons[0])
        .await?;
    let first = client.try_acquire(&key, &opts).await?.context("busy")?;
    let token = first.fencing_token();
    first.release().await?;
    all_fresh(&mut cons, &fence, "the first grant").await?;
    for con in cons.iter_mut() {
        // As if most of the fence TTL had passed without a grant.
        let _: () = redis::cmd("PEXPIRE")
            .arg(&fence)
            .arg(100_000)
            .query_async(con)
            .await?;
    }
    let second = client.try_acquire(&key, &opts).await?.context("busy")?;
    ensure!(
        second.fencing_token() > token,
        "token {} after {token}",
        second.fencing_token()
    );
    second.release().await?;
    all_fresh(&mut cons, &fence, "the next grant").await?;
    Ok(())
}
