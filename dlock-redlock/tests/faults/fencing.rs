//! Fencing tokens while masters fail: they keep growing across holders, and the maximum written
//! back to a quorum survives the master that was ahead.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use dlock_core::{DistributedLockExt, FencingToken, LockOptions};
use dlock_redis::protocol::keys::fence_key;
use dlock_testkit::case;
use dlock_testkit::fixtures::RedisMasters;
use dlock_testkit::trials::{ensure_token_above, Case};

use crate::support::{self, unique};

/// The cases of this module, in the order they run.
pub fn cases() -> Vec<(&'static str, Case<Arc<RedisMasters>>)> {
    vec![
        case!(tokens_increase_while_masters_fail_one_at_a_time),
        case!(the_maximum_is_written_back_to_a_quorum),
    ]
}

/// Masters fail one at a time — stopped, then started again empty (no persistence) — while
/// holders from three clients take turns: every holder's token is larger than the one before.
pub async fn tokens_increase_while_masters_fail_one_at_a_time(
    masters: Arc<RedisMasters>,
) -> anyhow::Result<()> {
    support::all_serving(&masters).await?;
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
    Ok(())
}

/// The masters' counters disagree (one is far ahead): the client writes the maximum it saw back,
/// so that a quorum of masters count from there, and the next holder's token is larger still —
/// even without the master that was ahead.
pub async fn the_maximum_is_written_back_to_a_quorum(
    masters: Arc<RedisMasters>,
) -> anyhow::Result<()> {
    support::all_serving(&masters).await?;
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
    ensure_token_above(
        &next,
        token,
        "the release, without the master that was ahead",
    )?;
    next.release().await?;
    Ok(())
}
