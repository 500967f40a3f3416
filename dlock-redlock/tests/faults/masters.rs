//! Masters that fail: some down, one frozen, one restarted without its data.

use std::time::Duration;

use anyhow::{bail, ensure, Context};
use dlock_core::{DistributedLockExt, Error, FencingToken, LockOptions};
use dlock_redis::protocol::scripts;
use dlock_redlock::RedlockLock;
use dlock_testkit::case;
use dlock_testkit::fixtures::RedisMasters;
use dlock_testkit::trials::Case;
use std::sync::Arc;
use tokio::time::Instant;

use crate::support::{self, unique, NODE_TIMEOUT, SLACK};

/// The cases of this module, in the order they run.
pub fn cases() -> Vec<(&'static str, Case<Arc<RedisMasters>>)> {
    vec![
        case!(one_or_two_of_five_masters_down_still_lock),
        case!(three_of_five_masters_down_fail_fast_naming_reached_and_needed),
        case!(a_frozen_master_costs_at_most_the_node_timeout),
        case!(restart_without_persistence_with_delayed_restart_has_one_holder),
        case!(restart_without_persistence_without_delayed_restart_has_two_holders),
        case!(a_waiter_comes_back_by_itself_for_a_master_that_was_down),
        case!(a_master_that_lost_its_scripts_has_them_again_before_the_first_request),
    ]
}

/// Every master forgets its scripts (`SCRIPT FLUSH`, as a restart without persistence does); a
/// client connecting to them loads every script on each new connection before using it, so the
/// first burst of requests finds them cached instead of each sending its source.
pub async fn a_master_that_lost_its_scripts_has_them_again_before_the_first_request(
    masters: Arc<RedisMasters>,
) -> anyhow::Result<()> {
    support::all_serving(&masters).await?;
    let urls = masters.urls();
    let hashes: Vec<&str> = scripts::all().iter().map(|s| s.hash()).collect();
    let mut raws = Vec::new();
    for url in &urls {
        let mut raw = support::raw(url).await?;
        redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async::<()>(&mut raw)
            .await?;
        raws.push(raw);
    }
    let _client = support::client_with(&urls, |b| b).await?;
    for (url, raw) in urls.iter().zip(&mut raws) {
        let cached: Vec<bool> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(&hashes)
            .query_async(raw)
            .await?;
        ensure!(
            cached.iter().all(|c| *c),
            "{url}: scripts cached {cached:?} after connecting, before any request"
        );
    }
    Ok(())
}

/// Acquires and releases `key` once, returning the token; fails on busy.
async fn cycle(client: &Arc<RedlockLock>, key: &str) -> anyhow::Result<FencingToken> {
    let opts = LockOptions::new(Duration::from_secs(10)).with_wait(Duration::from_secs(5));
    let lease = client.acquire(key, &opts).await?;
    let token = lease.fencing_token();
    lease.release().await?;
    Ok(token)
}

/// A client of all five masters serving, a fresh key named after `name`, and the token of one
/// [`cycle`] on it: every master case starts from a lock that works.
async fn working_lock(
    masters: &RedisMasters,
    name: &str,
) -> anyhow::Result<(Arc<RedlockLock>, String, FencingToken)> {
    let client = support::serving_client(masters).await?;
    let key = unique(name);
    let token = cycle(&client, &key).await?;
    Ok((client, key, token))
}

/// With one and then two of five masters stopped, locks are still taken and released (3 of 5 is
/// a quorum), and tokens keep growing.
pub async fn one_or_two_of_five_masters_down_still_lock(
    masters: Arc<RedisMasters>,
) -> anyhow::Result<()> {
    let (client, key, mut last) = working_lock(&masters, "down").await?;
    for down in [0, 1] {
        masters.member(down)?.stop().await?;
        for round in 0..3 {
            let token = cycle(&client, &key)
                .await
                .with_context(|| format!("{} master(s) down, round {round}", down + 1))?;
            ensure!(token > last, "token {token} after {last}");
            last = token;
        }
        // A second client, connecting while masters are down, works too.
        let late = Arc::new(support::builder(&masters.urls()).connect().await?);
        let token = cycle(&late, &key).await?;
        ensure!(token > last, "token {token} after {last}");
        last = token;
    }
    Ok(())
}

/// With three of five masters stopped no quorum is possible: try_acquire and a waiting acquire
/// both fail at once with `Unavailable` saying "reached 2 of 5 nodes, needed 3", and work again
/// once the masters are back.
pub async fn three_of_five_masters_down_fail_fast_naming_reached_and_needed(
    masters: Arc<RedisMasters>,
) -> anyhow::Result<()> {
    let (client, key, _) = working_lock(&masters, "three-down").await?;
    for i in 0..3 {
        masters.member(i)?.stop().await?;
    }
    let opts = LockOptions::new(Duration::from_secs(10));
    for wait in [None, Some(Duration::from_secs(30))] {
        let opts = match wait {
            Some(w) => opts.clone().with_wait(w),
            None => opts.clone(),
        };
        let start = Instant::now();
        let result = match wait {
            Some(_) => client.acquire(&key, &opts).await.map(|_| ()),
            None => client.try_acquire(&key, &opts).await.map(|_| ()),
        };
        let took = start.elapsed();
        match result {
            Err(
                error @ Error::Unavailable {
                    reached: 2,
                    needed: 3,
                    ..
                },
            ) => {
                let text = format!(
                    "{error}: {}",
                    std::error::Error::source(&error)
                        .map(ToString::to_string)
                        .unwrap_or_default()
                );
                ensure!(
                    text.contains("reached 2 of 5 nodes, needed 3"),
                    "the error does not say what was reached: {text}"
                );
            }
            Err(other) => bail!("expected Unavailable (2 of 3), got {other}"),
            Ok(()) => bail!("locked with three of five masters down"),
        }
        // Stopped masters refuse at once; even a timeout would cost one node timeout per round.
        ensure!(
            took <= NODE_TIMEOUT * 2 + SLACK,
            "failing took {took:?} (wait {wait:?})"
        );
    }
    for i in 0..3 {
        masters.member(i)?.start().await?;
    }
    let back = Instant::now();
    loop {
        match cycle(&client, &key).await {
            Ok(_) => break,
            Err(e) if back.elapsed() > Duration::from_secs(20) => {
                bail!("no recovery after the masters came back: {e:#}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    Ok(())
}

/// One master frozen (`docker pause`: a GC pause, a stalled VM, a silent partition): every
/// acquire still succeeds, and none takes longer than the per-node timeout (plus slack) — the
/// frozen master costs at most its timeout, never a TCP timeout.
pub async fn a_frozen_master_costs_at_most_the_node_timeout(
    masters: Arc<RedisMasters>,
) -> anyhow::Result<()> {
    let (client, key, _) = working_lock(&masters, "frozen").await?;
    let frozen = masters.member(2)?;
    frozen.pause().await?;
    let outcome = async {
        let opts = LockOptions::new(Duration::from_secs(10));
        let mut acquires = Vec::new();
        let mut cycles = Vec::new();
        for _ in 0..40 {
            let start = Instant::now();
            let lease = client
                .try_acquire(&key, &opts)
                .await?
                .context("a free key was busy with one master frozen")?;
            acquires.push(start.elapsed());
            lease.release().await?;
            cycles.push(start.elapsed());
        }
        let p50 = support::quantile(&mut acquires, 0.5);
        let p99 = support::quantile(&mut acquires, 0.99);
        let cycle_p99 = support::quantile(&mut cycles, 0.99);
        eprintln!(
            "[timing] one master frozen: acquire p50 {p50:?}, p99 {p99:?}; cycle p99 {cycle_p99:?}"
        );
        // Two rounds at most (grant, fencing write-back), each bounded by the node timeout.
        ensure!(
            p99 <= NODE_TIMEOUT * 2 + SLACK,
            "acquire p99 {p99:?} with one master frozen, node timeout {NODE_TIMEOUT:?}"
        );
        ensure!(
            cycle_p99 <= NODE_TIMEOUT * 3 + SLACK,
            "acquire + release p99 {cycle_p99:?} with one master frozen"
        );
        anyhow::Ok(())
    }
    .await;
    frozen.unpause().await?;
    outcome?;
    Ok(())
}

/// `a`'s lease on `key` held on masters 0, 1 and 2 only: 3 and 4 refuse it (a short-lived
/// foreign lock there), and are free again when this returns.
async fn held_on_first_three(
    a: &Arc<RedlockLock>,
    urls: &[String],
    key: &str,
    ttl: Duration,
) -> anyhow::Result<dlock_core::Lease> {
    let foreign_ttl_ms = 1500u64;
    for url in &urls[3..] {
        let mut con = support::raw(url).await?;
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg("foreign-owner")
            .arg("PX")
            .arg(foreign_ttl_ms)
            .query_async(&mut con)
            .await?;
    }
    let lease = a
        .try_acquire(key, &LockOptions::new(ttl))
        .await?
        .context("A could not take the lock on masters 0, 1, 2")?;
    tokio::time::sleep(Duration::from_millis(foreign_ttl_ms + 200)).await;
    Ok(lease)
}

/// The double-holder scenario of the Redlock debate, on five masters without persistence:
/// holder A gets masters 0, 1, 2 (3 and 4 are held by a short-lived foreign lock); the foreign
/// lock expires; master 2 restarts and forgets A's key; B asks while A's lease is still valid.
/// Returns A's and B's outcome, with A's lease still held.
async fn double_holder_scenario(
    masters: &RedisMasters,
    delayed_restart: Option<Duration>,
) -> anyhow::Result<(bool, Option<dlock_core::Lease>, dlock_core::Lease)> {
    let ttl = Duration::from_secs(12);
    support::all_serving(masters).await?;
    let urls = masters.urls();
    let with_rule = |builder: dlock_redlock::RedlockBuilder| match delayed_restart {
        Some(max_ttl) => builder.with_delayed_restart(max_ttl),
        None => builder,
    };
    let a = support::client_with(&urls, with_rule).await?;
    // Masters started lately (by this binary, or by a case before) are excluded under the rule
    // until their uptime passes it.
    let settled = Instant::now();
    while !a.excluded().is_empty() {
        ensure!(
            settled.elapsed() < ttl * 2,
            "masters {:?} still excluded",
            a.excluded()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let key = unique("two-holders");
    let holder_a = held_on_first_three(&a, &urls, &key, ttl).await?;
    let restarted = Instant::now();
    masters.member(2)?.restart_keep_data().await?;
    eprintln!(
        "[timing] master 2 restarted without data in {:.2?}",
        restarted.elapsed()
    );
    let b = support::client_with(&urls, with_rule).await?;
    let b_excluded_master_2 = b.excluded() == [2];
    let opts = LockOptions::new(ttl).with_wait(Duration::from_secs(2));
    let holder_b = match b.acquire(&key, &opts).await {
        Ok(lease) => Some(lease),
        Err(Error::Timeout { .. }) => None,
        Err(other) => bail!("B failed oddly: {other}"),
    };
    ensure!(
        holder_a.is_held(),
        "A's lease ended before B's attempt was over: the scenario took too long ({:?})",
        holder_a.state()
    );
    Ok((b_excluded_master_2, holder_b, holder_a))
}

/// With the delayed-restart rule, the restarted master does not count: B is refused while A holds
/// the lock.
pub async fn restart_without_persistence_with_delayed_restart_has_one_holder(
    masters: Arc<RedisMasters>,
) -> anyhow::Result<()> {
    let (excluded, holder_b, holder_a) =
        double_holder_scenario(&masters, Some(Duration::from_secs(12))).await?;
    ensure!(excluded, "B did not leave the restarted master out");
    if let Some(b) = holder_b {
        bail!(
            "two holders despite the delayed restart: A ({}, {:?}) and B ({}, {:?})",
            holder_a.fencing_token(),
            holder_a.state(),
            b.fencing_token(),
            b.state()
        );
    }
    Ok(())
}

/// Without the rule the algorithm's author predicts two holders, and here they are: B wins
/// masters 2, 3, 4 while A's lease on 0, 1, 2 is still valid. (The fencing token still orders
/// them: B's is larger, so a fenced resource rejects A's writes from now on.)
pub async fn restart_without_persistence_without_delayed_restart_has_two_holders(
    masters: Arc<RedisMasters>,
) -> anyhow::Result<()> {
    let (_, holder_b, holder_a) = double_holder_scenario(&masters, None).await?;
    let Some(b) = holder_b else {
        bail!("B was refused: the double holder the algorithm predicts did not happen");
    };
    ensure!(
        holder_a.is_held() && b.is_held(),
        "not both held: A {:?}, B {:?}",
        holder_a.state(),
        b.state()
    );
    ensure!(
        b.fencing_token() > holder_a.fencing_token(),
        "B's token {} is not above A's {}",
        b.fencing_token(),
        holder_a.fencing_token()
    );
    Ok(())
}

/// A waiter whose attempt found a master down, where that master's grant would have made a
/// quorum with those that granted, comes back by itself soon after the master is back: the
/// master announces nothing to it. (It used to come back only when its queue entry wanted
/// refreshing, a third of its TTL later, or at the holder's expiry.) A holds masters 0, 1, 2;
/// master 2 stops, losing A's key; B waits; master 2 starts again, empty.
pub async fn a_waiter_comes_back_by_itself_for_a_master_that_was_down(
    masters: Arc<RedisMasters>,
) -> anyhow::Result<()> {
    let ttl = Duration::from_secs(30);
    let a = support::serving_client(&masters).await?;
    let b = support::client_with(&masters.urls(), |b| b).await?;
    let key = unique("down-waiter");
    let holder_a = held_on_first_three(&a, &masters.urls(), &key, ttl).await?;
    masters.member(2)?.stop().await?;
    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            let opts = LockOptions::new(ttl).with_wait(Duration::from_secs(25));
            b.acquire(&key, &opts).await
        })
    };
    // B's first attempt: busy on 0 and 1, no answer from 2, granted on 3 and 4 (given back).
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(!waiter.is_finished(), "B did not wait: {:?}", waiter.await?);
    masters.member(2)?.start().await?;
    let back = Instant::now();
    let holder_b = waiter.await?.context("B's wait")?;
    let after = back.elapsed();
    // Its refresh would come 10 s after its first attempt.
    ensure!(
        after < Duration::from_secs(5),
        "B got the lock {after:?} after master 2 was back"
    );
    ensure!(
        holder_b.fencing_token() > holder_a.fencing_token(),
        "B's token {} is not above A's {}",
        holder_b.fencing_token(),
        holder_a.fencing_token()
    );
    eprintln!("[timing] B got the lock {after:.2?} after master 2 was back");
    holder_b.release().await?;
    // A's key is on masters 0 and 1 only: its release cannot reach a quorum.
    drop(holder_a);
    Ok(())
}
