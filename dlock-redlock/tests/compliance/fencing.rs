//! Fencing tokens across holders while masters fail, the write-back of the maximum, and fencing
//! turned off.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use dlock_core::{
    DistributedLock, DistributedLockExt, FencingGuarantee, FencingToken, LockOptions,
};
use dlock_redis::protocol::keys::fence_key;
use dlock_testkit::fixtures::RedisMasters;

use crate::support::{self, unique};

/// Masters fail one at a time — stopped, then started again empty (no persistence) — while
/// holders from three clients take turns: every holder's token is larger than the one before.
pub async fn tokens_increase_while_masters_fail_one_at_a_time() -> anyhow::Result<()> {
    let masters = RedisMasters::start(5).await?;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(Arc::new(support::builder(&masters.urls()).connect().await?));
    }
    let key = unique("tokens");
    let opts = LockOptions::new(Duration::from_secs(5)).with_wait(Duration::from_secs(10));
    let mut last: Option<FencingToken> = None;
    let mut holders = 0;
    let take_turns = |round: &str| {
        let (clients, key, opts) = (clients.clone(), key.clone(), opts.clone());
        let round = round.to_owned();
        async move {
            let mut tokens = Vec::new();
            for client in &clients {
                let lease = client
                    .acquire(&key, &opts)
                    .await
                    .with_context(|| round.clone())?;
                tokens.push(lease.fencing_token());
                lease.release().await?;
            }
            anyhow::Ok(tokens)
        }
    };
    for i in 0..masters.len() {
        let member = masters.member(i)?;
        member.stop().await?;
        let mut tokens = take_turns(&format!("master {i} down")).await?;
        member.start().await?;
        tokens.extend(take_turns(&format!("master {i} back empty")).await?);
        for token in tokens {
            if let Some(last) = last {
                ensure!(token > last, "holder {holders} got {token} after {last}");
            }
            last = Some(token);
            holders += 1;
        }
    }
    ensure!(holders == 30, "{holders} holders");
    masters.shutdown().await?;
    Ok(())
}

/// The masters' counters disagree (one is far ahead): the client writes the maximum it saw back,
/// so that a quorum of masters count from there, and the next holder's token is larger still —
/// even without the master that was ahead.
pub async fn the_maximum_is_written_back_to_a_quorum() -> anyhow::Result<()> {
    let masters = RedisMasters::start(5).await?;
    let urls = masters.urls();
    let client = support::builder(&urls).connect().await?;
    let key = unique("write-back");
    let fence = fence_key(&key);
    let ahead: u64 = 9_000_000_000_000_000;
    let mut con = support::raw(&urls[4]).await?;
    let _: () = redis::cmd("SET")
        .arg(&fence)
        .arg(ahead)
        .query_async(&mut con)
        .await?;
    let client = Arc::new(client);
    let opts = LockOptions::new(Duration::from_secs(10));
    let lease = client
        .try_acquire(&key, &opts)
        .await?
        .context("a free key was busy")?;
    // The token is the maximum over the quorum that answered first, which may or may not
    // include the master that was ahead; either way the counters disagreed.
    let token = lease.fencing_token();
    let mut at_least = 0;
    for url in &urls {
        let mut con = support::raw(url).await?;
        let counter: Option<u64> = redis::cmd("GET").arg(&fence).query_async(&mut con).await?;
        if counter.is_some_and(|c| c >= token.0) {
            at_least += 1;
        }
    }
    ensure!(
        at_least >= client.quorum(),
        "only {at_least} masters count from the token {token}"
    );
    lease.release().await?;
    // Without the master that was ahead, the rest still know the maximum.
    masters.member(4)?.stop().await?;
    let next = client
        .try_acquire(&key, &opts)
        .await?
        .context("the key was busy after release")?;
    ensure!(
        next.fencing_token() > token,
        "next token {} after {token}",
        next.fencing_token()
    );
    next.release().await?;
    masters.shutdown().await?;
    Ok(())
}

/// With fencing off the client declares no ordering, and locks work the same.
pub async fn fencing_off_declares_no_guarantee() -> anyhow::Result<()> {
    let masters = RedisMasters::start(3).await?;
    let client = Arc::new(
        support::builder(&masters.urls())
            .with_fencing(false)
            .connect()
            .await?,
    );
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
    masters.shutdown().await?;
    Ok(())
}

/// With a fence TTL every master's counter gets that expiry with the grant — also those the
/// write-back raised, since raising rewrites the counter — and the next grant re-arms it; tokens
/// still grow. Without it, counters never expire.
pub async fn fence_ttl_is_armed_on_every_master_and_rearmed_by_each_grant() -> anyhow::Result<()> {
    let fence_ttl = Duration::from_secs(2 * 24 * 3600);
    // Generous: the grant happened moments before the check on a possibly loaded machine.
    let fresh = |pttl: i64| {
        u64::try_from(pttl).is_ok_and(|ms| {
            let left = Duration::from_millis(ms);
            left <= fence_ttl && left > fence_ttl - Duration::from_secs(60)
        })
    };
    let masters = RedisMasters::start(5).await?;
    let urls = masters.urls();
    let mut cons = Vec::new();
    for url in &urls {
        cons.push(support::raw(url).await?);
    }
    let opts = LockOptions::new(Duration::from_secs(10));

    let forever = Arc::new(support::builder(&urls).connect().await?);
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

    let client = Arc::new(
        support::builder(&urls)
            .with_fence_ttl(fence_ttl)
            .connect()
            .await?,
    );
    let key = unique("fence-ttl");
    let fence = fence_key(&key);
    // Masters start a new counter at their own clock, so they disagree and the write-back runs.
    let first = client.try_acquire(&key, &opts).await?.context("busy")?;
    let token = first.fencing_token();
    first.release().await?;
    for (i, con) in cons.iter_mut().enumerate() {
        let pttl: i64 = redis::cmd("PTTL").arg(&fence).query_async(con).await?;
        ensure!(
            fresh(pttl),
            "master {i}: after the first grant the counter's PTTL is {pttl} ms"
        );
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
    for (i, con) in cons.iter_mut().enumerate() {
        let pttl: i64 = redis::cmd("PTTL").arg(&fence).query_async(con).await?;
        ensure!(
            fresh(pttl),
            "master {i}: after the next grant the counter's PTTL is {pttl} ms"
        );
    }
    masters.shutdown().await?;
    Ok(())
}
