//! Waiting: releases wake waiters through pub/sub (not a timer), one per release and client; an
//! expiring holder is followed at its TTL; losing the subscriber connection costs only latency, and
//! one that goes silent is replaced.
//!
//! The waiters here poll so slowly (a fixed 30 s backoff) that only a notification or the holder's
//! TTL can explain a prompt hand-over.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use dlock_core::{Backoff, DistributedLockExt, LockOptions, Released};
use dlock_redis::RedisLock;
use dlock_testkit::fixtures::RedisServer;
use dlock_testkit::{url_target, url_via, FreezeProxy};

use crate::support::{self, unique};

/// A backoff that never polls within a trial.
fn no_polling() -> Backoff {
    Backoff {
        initial: Duration::from_secs(30),
        max: Duration::from_secs(30),
        multiplier: 1.0,
        jitter: 0.0,
    }
}

/// What a notified hand-over may take at most on this noisy machine (it takes about a millisecond).
const PROMPT: Duration = Duration::from_millis(750);

/// Five hand-overs between two clients, each long before any poll could happen.
pub async fn a_release_wakes_a_waiter_without_polling(url: String) -> anyhow::Result<()> {
    let a = Arc::new(RedisLock::connect(&url).await?);
    let b = Arc::new(RedisLock::connect(&url).await?);
    let key = unique("wake");
    let opts = LockOptions::new(Duration::from_secs(60))
        .with_retry(no_polling())
        .with_wait(Duration::from_secs(20));
    let mut holder = a.acquire(&key, &opts).await?;
    let mut clients = [a, b];
    for round in 0..5 {
        clients.swap(0, 1);
        let waiting = {
            let (client, key, opts) = (clients[0].clone(), key.clone(), opts.clone());
            tokio::spawn(async move {
                let lease = client.acquire(&key, &opts).await;
                (lease, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        ensure!(
            !waiting.is_finished(),
            "round {round}: a held lock was taken"
        );
        let released_at = Instant::now();
        ensure!(
            holder.release().await? == Released::Released,
            "round {round}: release"
        );
        let (lease, acquired_at) = waiting.await?;
        holder = lease.with_context(|| format!("round {round}: the waiter"))?;
        let gap = acquired_at - released_at;
        ensure!(gap <= PROMPT, "round {round}: hand-over took {gap:?}");
    }
    holder.release().await?;
    Ok(())
}

/// Four tasks of one client wait for one key; each release hands it to exactly the next of them,
/// promptly, until all four held it once.
pub async fn waiters_of_one_client_are_woken_one_per_release(url: String) -> anyhow::Result<()> {
    let holder_client = Arc::new(RedisLock::connect(&url).await?);
    let waiters = Arc::new(RedisLock::connect(&url).await?);
    let key = unique("queue");
    let opts = LockOptions::new(Duration::from_secs(60))
        .with_retry(no_polling())
        .with_wait(Duration::from_secs(20));
    let first = holder_client.acquire(&key, &opts).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for id in 0..4 {
        let (client, key, opts, tx) = (waiters.clone(), key.clone(), opts.clone(), tx.clone());
        tokio::spawn(async move {
            let result = client.acquire(&key, &opts).await;
            let _ = tx.send((id, result, Instant::now()));
        });
    }
    drop(tx);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut released_at = Instant::now();
    ensure!(
        first.release().await? == Released::Released,
        "first release"
    );
    let mut seen = Vec::new();
    while let Some((id, result, acquired_at)) = rx.recv().await {
        let lease = result.with_context(|| format!("waiter {id}"))?;
        let gap = acquired_at - released_at;
        ensure!(
            gap <= PROMPT,
            "waiter {id} got the lock {gap:?} after the release"
        );
        seen.push(id);
        tokio::time::sleep(Duration::from_millis(20)).await;
        released_at = Instant::now();
        ensure!(
            lease.release().await? == Released::Released,
            "waiter {id}: release"
        );
    }
    seen.sort_unstable();
    ensure!(seen == [0, 1, 2, 3], "holders: {seen:?}");
    Ok(())
}

/// A holder that vanishes without releasing is followed when its TTL ends, although nothing is
/// announced and the waiter does not poll.
pub async fn an_expiring_holder_is_followed_at_its_ttl(url: String) -> anyhow::Result<()> {
    let crashed = Arc::new(RedisLock::connect(&url).await?);
    let next = Arc::new(RedisLock::connect(&url).await?);
    let key = unique("expiring");
    let ttl = Duration::from_millis(800);
    let lease = crashed.acquire(&key, &LockOptions::new(ttl)).await?;
    let sent = lease.acquired_at();
    std::mem::forget(lease);
    let opts = LockOptions::new(Duration::from_secs(10))
        .with_retry(no_polling())
        .with_wait(Duration::from_secs(10));
    let successor = next.acquire(&key, &opts).await?;
    let after = sent.elapsed();
    ensure!(
        after >= ttl - Duration::from_millis(50),
        "taken after only {after:?}"
    );
    ensure!(
        after <= ttl + PROMPT,
        "taken {after:?} after the acquire, ttl {ttl:?}"
    );
    successor.release().await?;
    Ok(())
}

/// The server drops the subscriber connections (`CLIENT KILL TYPE pubsub`) while a task waits: the
/// waiter still gets the lock by polling, and the next waits are woken by notifications again.
pub async fn a_lost_subscriber_connection_costs_only_latency(_: String) -> anyhow::Result<()> {
    let server = RedisServer::start().await?;
    let url = server.url();
    let holder_client = Arc::new(RedisLock::connect(&url).await?);
    let waiter = Arc::new(RedisLock::connect(&url).await?);
    let mut raw = support::raw(&url).await?;
    let key = unique("resubscribe");
    let long = LockOptions::new(Duration::from_secs(60));

    // Polling at 200 ms: the fallback this trial relies on.
    let polling = long
        .clone()
        .with_wait(Duration::from_secs(20))
        .with_retry(Backoff {
            initial: Duration::from_millis(200),
            max: Duration::from_millis(200),
            multiplier: 1.0,
            jitter: 0.0,
        });
    let held = holder_client.acquire(&key, &long).await?;
    let waiting = {
        let (waiter, key, polling) = (waiter.clone(), key.clone(), polling.clone());
        tokio::spawn(async move { waiter.acquire(&key, &polling).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut raw)
        .await?;
    ensure!(killed >= 1, "no subscriber connection to kill");
    held.release().await?;
    let lease = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .context("the waiter did not get the lock by polling")???;
    lease.release().await?;

    // The subscription comes back: a non-polling waiter is woken promptly again.
    let opts = long
        .with_retry(no_polling())
        .with_wait(Duration::from_secs(20));
    let mut prompt = false;
    for _ in 0..10 {
        let held = holder_client.acquire(&key, &opts).await?;
        let waiting = {
            let (waiter, key, opts) = (waiter.clone(), key.clone(), opts.clone());
            tokio::spawn(async move { (waiter.acquire(&key, &opts).await, Instant::now()) })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released_at = Instant::now();
        held.release().await?;
        match tokio::time::timeout(Duration::from_secs(2), waiting).await {
            Ok(joined) => {
                let (lease, at) = joined?;
                lease?.release().await?;
                if at - released_at <= PROMPT {
                    prompt = true;
                    break;
                }
            }
            Err(_) => {
                // Still waiting without a notification; take it over below and try again.
                anyhow::bail!("a waiter was not woken 2 s after a release, after the reconnection");
            }
        }
    }
    ensure!(
        prompt,
        "notifications did not come back after the subscriber was killed"
    );
    server.shutdown().await?;
    Ok(())
}

/// The subscriber connection goes silent (a dropping proxy: bytes lost both ways, the connection
/// left open) while a task waits without polling: the client notices by its health check,
/// replaces the connection once the link carries bytes again, and the release then wakes the
/// waiter promptly.
pub async fn a_silent_subscriber_connection_is_replaced(_: String) -> anyhow::Result<()> {
    let server = RedisServer::start().await?;
    let url = server.url();
    let proxy = FreezeProxy::start_dropping(url_target(&url, 6379)?).await?;
    let switch = proxy.switch();
    let holder_client = Arc::new(RedisLock::connect(&url).await?);
    let waiter = Arc::new(RedisLock::connect(&url_via(&url, proxy.addr())?).await?);
    let mut raw = support::raw(&url).await?;
    let key = unique("silent-subscriber");
    let opts = LockOptions::new(Duration::from_secs(60))
        .with_retry(no_polling())
        .with_wait(Duration::from_secs(40));
    let held = holder_client.acquire(&key, &opts).await?;
    let waiting = {
        let (waiter, key, opts) = (waiter.clone(), key.clone(), opts.clone());
        tokio::spawn(async move { waiter.acquire(&key, &opts).await })
    };
    let subscriber = pubsub_ids_when(&mut raw, Duration::from_secs(5), |_| true)
        .await?
        .context("the waiter never subscribed")?;

    // Longer than a health check and its timeout.
    switch.freeze();
    tokio::time::sleep(Duration::from_secs(7)).await;
    switch.thaw();
    pubsub_ids_when(&mut raw, Duration::from_secs(10), |ids| {
        ids != subscriber.as_slice()
    })
    .await?
    .with_context(|| format!("the silent subscriber connection {subscriber:?} was not replaced"))?;

    let released_at = Instant::now();
    held.release().await?;
    let lease = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .context("the waiter was not woken after the subscriber was replaced")???;
    let took = released_at.elapsed();
    ensure!(
        took <= PROMPT,
        "the waiter got the lock {took:?} after the release, not woken by a notification"
    );
    lease.release().await?;
    server.shutdown().await?;
    Ok(())
}

/// The ids of the server's subscriber connections once there are some for which `wanted` holds,
/// checked every 100 ms; `None` if that does not happen `within`.
async fn pubsub_ids_when(
    raw: &mut redis::aio::MultiplexedConnection,
    within: Duration,
    wanted: impl Fn(&[String]) -> bool,
) -> anyhow::Result<Option<Vec<String>>> {
    let start = Instant::now();
    loop {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .arg("TYPE")
            .arg("pubsub")
            .query_async(raw)
            .await?;
        let ids: Vec<String> = list
            .lines()
            .filter_map(|line| line.split(' ').find_map(|f| f.strip_prefix("id=")))
            .map(str::to_owned)
            .collect();
        if !ids.is_empty() && wanted(&ids) {
            return Ok(Some(ids));
        }
        if start.elapsed() > within {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
