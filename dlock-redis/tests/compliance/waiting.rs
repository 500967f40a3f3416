//! Waiting: releases wake waiters through pub/sub (not a timer), one per release and client; an
//! expiring holder is followed at its TTL. (Losing the subscriber connection is a fault case, in
//! the faults binary.)
//!
//! The waiters here poll so slowly (a fixed 30 s backoff) that only a notification or the holder's
//! TTL can explain a prompt hand-over.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use dlock_core::inspect::Holding;
use dlock_core::{DistributedLockExt, LockOptions, Released};
use dlock_redis::protocol::keys;
use dlock_redis::protocol::scripts::{
    self, AcquireCall, AcquireReply, Publish, Queueing, ReleaseCall,
};
use dlock_redis::RedisLock;
use dlock_testkit::case;
use dlock_testkit::fixtures::RedisServer;
use dlock_testkit::trials::{until_waiting, Case};
use futures::StreamExt;
use redis::aio::MultiplexedConnection;

use crate::support::{clients, raw, unique, waiting_without_polling, PROMPT};

/// The cases of this module, each given the shared server's URL.
pub fn cases() -> Vec<(&'static str, Case<String>)> {
    vec![
        case!(a_release_wakes_a_waiter_without_polling),
        case!(waiters_of_one_client_are_woken_one_per_release),
        case!(an_expiring_holder_is_followed_at_its_ttl),
        case!(a_hot_key_costs_at_most_four_commands_per_acquisition),
        case!(inspect_counts_the_queued_waiters_and_gone_ones_leave_no_entry),
        case!(a_waiter_that_gives_a_grant_back_keeps_its_place),
        case!(a_release_is_announced_to_the_heads_client_only),
        case!(a_release_without_a_tag_withdraws_the_owners_entries_under_any_tag),
    ]
}

/// A release by owner token without a wake tag — how a Redlock eviction, which knows the
/// holder's value but not its client's tag, releases on a master where the holder only stood in
/// the queue — withdraws that owner's tagged entry, and only that owner's.
pub async fn a_release_without_a_tag_withdraws_the_owners_entries_under_any_tag(
    url: String,
) -> anyhow::Result<()> {
    let mut con = raw(&url).await?;
    let lock = format!("dlock:{}", unique("untagged"));
    ensure!(attempt(&mut con, &lock, "holder", None).await?, "free lock");
    let tag = "00112233445566ff";
    ensure!(!tagged_attempt(&mut con, &lock, "evicted", Some(100), tag).await?);
    ensure!(!tagged_attempt(&mut con, &lock, "other", Some(200), tag).await?);
    ensure!(queue(&mut con, &lock).await? == [format!("evicted:{tag}"), format!("other:{tag}")]);
    scripts::release(&mut con, &lock, "evicted", "").await?;
    ensure!(
        queue(&mut con, &lock).await? == [format!("other:{tag}")],
        "the untagged release left the owner's entry, or took another's"
    );
    scripts::release(&mut con, &lock, "other", "").await?;
    scripts::release(&mut con, &lock, "holder", "").await?;
    ensure!(
        queue(&mut con, &lock).await?.is_empty(),
        "entries left behind"
    );
    Ok(())
}

/// Returns once `waiting` contenders are in `key`'s queue, as `client` inspects it (within 5 s).
async fn until_queued(client: &Arc<RedisLock>, key: &str, waiting: usize) -> anyhow::Result<()> {
    let counted = until_waiting(client.clone(), key, waiting, Duration::from_secs(5)).await?;
    ensure!(counted, "inspect does not count Redis's waiters");
    Ok(())
}

/// The next message `heard` within [`PROMPT`]: its channel and payload.
async fn announced(
    heard: &mut (impl futures::Stream<Item = redis::Msg> + Unpin),
) -> Option<(String, String)> {
    let message = tokio::time::timeout(PROMPT, heard.next()).await.ok()??;
    let payload: String = message.get_payload().ok()?;
    Some((message.get_channel_name().to_owned(), payload))
}

/// A holds the key; B's and then C's client wait on it (never polling). A raw subscriber of
/// every channel that starts with the lock's release channel hears each release exactly once:
/// A's and B's on the wake channel of the next waiter's client (two different channels, each
/// the release channel followed by a tag), none on the release channel all clients share; C's,
/// with nobody queued, as an empty message on the release channel.
pub async fn a_release_is_announced_to_the_heads_client_only(url: String) -> anyhow::Result<()> {
    let [a, b, c] = clients(&url).await?;
    let key = unique("wake-channel");
    let channel = keys::release_channel(&key);
    let mut pubsub = redis::Client::open(url.as_str())?
        .get_async_pubsub()
        .await?;
    pubsub.psubscribe(format!("{channel}*")).await?;
    let mut heard = pubsub.on_message();
    let opts = waiting_without_polling(Duration::from_secs(60), Duration::from_secs(20));
    let held = a.acquire(&key, &opts).await?;
    let wait = |client: Arc<RedisLock>| {
        let (key, opts) = (key.clone(), opts.clone());
        tokio::spawn(async move { client.acquire(&key, &opts).await })
    };
    let b_waits = wait(b);
    until_queued(&a, &key, 1).await?;
    let c_waits = wait(c);
    until_queued(&a, &key, 2).await?;
    let mut wake_channels = Vec::new();
    let mut holder = held;
    for waiter in [b_waits, c_waits] {
        holder.release().await?;
        let (name, owner) = announced(&mut heard)
            .await
            .context("a release was not announced")?;
        let tag = name
            .strip_prefix(&format!("{channel}:"))
            .with_context(|| format!("announced on {name}, not a wake channel of {channel}"))?;
        ensure!(
            tag.len() == 16 && owner.len() == 32,
            "tag {tag:?}, owner {owner:?}"
        );
        ensure!(
            !wake_channels.contains(&name),
            "two clients' waiters were named on one channel"
        );
        wake_channels.push(name);
        holder = waiter.await??;
        ensure!(
            announced(&mut heard).await.is_none(),
            "a release was announced twice"
        );
    }
    holder.release().await?;
    let (name, payload) = announced(&mut heard)
        .await
        .context("the last release was not announced")?;
    ensure!(
        name == channel && payload.is_empty(),
        "with nobody queued: {payload:?} on {name}"
    );
    Ok(())
}

/// One attempt of the acquire script on `lock` for `owner` (of a client without a wake tag): a
/// waiter at `arrival` (with a 30 s entry) or, without one, a `try_lock`. Returns whether it was
/// granted.
async fn attempt(
    con: &mut MultiplexedConnection,
    lock: &str,
    owner: &str,
    arrival: Option<u64>,
) -> anyhow::Result<bool> {
    tagged_attempt(con, lock, owner, arrival, "").await
}

/// [`attempt`] by a client with the wake tag `wake_tag`.
async fn tagged_attempt(
    con: &mut MultiplexedConnection,
    lock: &str,
    owner: &str,
    arrival: Option<u64>,
    wake_tag: &str,
) -> anyhow::Result<bool> {
    let fence = keys::fence_key(lock);
    let reply = AcquireCall {
        lock_key: lock,
        fence_key: &fence,
        owner,
        record: "{}",
        ttl: Duration::from_secs(30),
        fence_ttl: None,
        least_start: None,
        queue: Queueing {
            entry_lifetime: if arrival.is_some() {
                Duration::from_secs(30)
            } else {
                Duration::ZERO
            },
            arrival,
            channel: "",
            publish: Publish::Plain,
            wake_tag,
        },
    }
    .run(con)
    .await?;
    Ok(matches!(reply, AcquireReply::Granted(_)))
}

/// Gives `owner`'s grant of `lock` back, keeping its place in the queue at `arrival`.
async fn give_back(
    con: &mut MultiplexedConnection,
    lock: &str,
    owner: &str,
    arrival: u64,
) -> anyhow::Result<Released> {
    let call = ReleaseCall {
        lock_key: lock,
        owner,
        channel: "",
        publish: Publish::Plain,
        wake_tag: "",
        keep_place: Some((arrival, Duration::from_secs(30))),
    };
    Ok(call.run(con).await?)
}

/// The queue of waiters of `lock`, head first.
async fn queue(con: &mut MultiplexedConnection, lock: &str) -> anyhow::Result<Vec<String>> {
    Ok(redis::cmd("ZRANGE")
        .arg(keys::queue_key(lock))
        .arg(0)
        .arg(-1)
        .query_async(con)
        .await?)
}

/// The give-back Redlock uses for a grant short of a quorum: the lock is free again, and the
/// waiter is back in the queue at its own score (ahead of a later waiter, which therefore cannot
/// take the lock), while a plain release would have withdrawn it. Where it did not hold the lock,
/// the give-back leaves its entry in place.
pub async fn a_waiter_that_gives_a_grant_back_keeps_its_place(url: String) -> anyhow::Result<()> {
    let mut con = raw(&url).await?;
    let lock = format!("dlock:{}", unique("keep-place"));
    ensure!(attempt(&mut con, &lock, "holder", None).await?, "free lock");
    ensure!(!attempt(&mut con, &lock, "late", Some(200)).await?, "held");
    ensure!(!attempt(&mut con, &lock, "early", Some(100)).await?, "held");
    // Queued but not holding: the give-back keeps the entry where a release withdraws it.
    give_back(&mut con, &lock, "early", 100).await?;
    ensure!(queue(&mut con, &lock).await? == ["early", "late"]);
    ensure!(scripts::release(&mut con, &lock, "holder", "").await? == Released::Released);
    ensure!(
        attempt(&mut con, &lock, "early", Some(100)).await?,
        "the head"
    );
    ensure!(
        queue(&mut con, &lock).await? == ["late"],
        "a grant dequeues"
    );
    let given_back = give_back(&mut con, &lock, "early", 100).await?;
    ensure!(given_back == Released::Released, "{given_back:?}");
    ensure!(
        queue(&mut con, &lock).await? == ["early", "late"],
        "back at its score"
    );
    ensure!(
        !attempt(&mut con, &lock, "late", Some(200)).await?,
        "the later waiter took a lock given back to the head"
    );
    ensure!(
        attempt(&mut con, &lock, "early", Some(100)).await?,
        "the head again"
    );
    // A plain release by the owner token withdraws the entry; the later waiter is next.
    scripts::release(&mut con, &lock, "early", "").await?;
    ensure!(
        attempt(&mut con, &lock, "late", Some(200)).await?,
        "next in line"
    );
    scripts::release(&mut con, &lock, "late", "").await?;
    ensure!(
        queue(&mut con, &lock).await?.is_empty(),
        "entries left behind"
    );
    Ok(())
}

/// Two waiters queue behind a holder: `holding` counts them; once one timed out and the other
/// was dropped, the queue is empty again (no entry left behind) and its keys are gone.
pub async fn inspect_counts_the_queued_waiters_and_gone_ones_leave_no_entry(
    url: String,
) -> anyhow::Result<()> {
    let [holder, waiter] = clients(&url).await?;
    let key = unique("inspect-queue");
    let held = holder
        .acquire(&key, &LockOptions::new(Duration::from_secs(60)))
        .await?;
    let timing_out = {
        let (waiter, key) = (waiter.clone(), key.clone());
        let opts = waiting_without_polling(Duration::from_secs(60), Duration::from_secs(4));
        tokio::spawn(async move { waiter.acquire(&key, &opts).await })
    };
    let dropped = {
        let (waiter, key) = (waiter.clone(), key.clone());
        let opts = waiting_without_polling(Duration::from_secs(60), Duration::from_secs(60));
        tokio::spawn(async move { waiter.acquire(&key, &opts).await })
    };
    until_queued(&holder, &key, 2).await?;
    let waiting = |holding: Holding| match holding {
        Holding::Held(holder) => holder.waiting,
        _ => None,
    };
    let queued = waiting(holder.holding(&key).await?);
    ensure!(
        queued == Some(2) && !timing_out.is_finished(),
        "two queued waiters shown as {queued:?}"
    );
    ensure!(
        timing_out.await?.is_err(),
        "a waiter took a held lock instead of timing out"
    );
    dropped.abort();
    let _ = dropped.await;
    // The dropped acquire is withdrawn in the background by dlock-core.
    let mut left = queued;
    for _ in 0..100 {
        left = waiting(holder.holding(&key).await?);
        if left == Some(0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ensure!(
        left == Some(0),
        "the waiters that gave up left queue entries: {left:?}"
    );
    let mut raw = raw(&url).await?;
    let queue_keys: i64 = redis::cmd("EXISTS")
        .arg(dlock_redis::protocol::keys::queue_key(&key))
        .arg(dlock_redis::protocol::keys::lapse_key(&key))
        .query_async(&mut raw)
        .await?;
    ensure!(queue_keys == 0, "{queue_keys} queue key(s) left behind");
    held.release().await?;
    Ok(())
}

/// Rounds each task of [`a_hot_key_costs_at_most_four_commands_per_acquisition`] takes the key.
const HOT_ROUNDS: usize = 8;

/// The commands clients sent the server so far, by `INFO commandstats`: the scripts (`EVALSHA`,
/// `EVAL`) and the subscriptions (`SUBSCRIBE`, `UNSUBSCRIBE`). Not counted: the subscriber
/// connection's health-check `PING`, one per connection every 5 s whatever happens, and the
/// commands that scripts run inside, which the server counts too but are not the clients'; they
/// are in the second number, `total_commands_processed`.
async fn commands_sent(con: &mut MultiplexedConnection) -> anyhow::Result<(u64, u64)> {
    let info: String = redis::cmd("INFO").arg("all").query_async(con).await?;
    let calls = |name: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let sent = ["evalsha", "eval", "subscribe", "unsubscribe"]
        .into_iter()
        .map(calls)
        .sum();
    let processed = info
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    Ok((sent, processed))
}

/// 16 tasks, each with a client of its own, then 256 tasks on 16 clients take one key 8 times
/// each: the clients send at most four commands per acquisition (the attempt that queues, the
/// winning attempt, the release, and a first wait's subscription spread over the rounds),
/// however many wait.
pub async fn a_hot_key_costs_at_most_four_commands_per_acquisition(
    _: String,
) -> anyhow::Result<()> {
    let server = RedisServer::start().await?;
    let mut con = raw(&server.url()).await?;
    for (waiters, client_count) in [(16, 16), (256, 16)] {
        let mut clients = Vec::with_capacity(client_count);
        for _ in 0..client_count {
            clients.push(Arc::new(RedisLock::connect(&server.url()).await?));
        }
        let clients: Vec<Arc<RedisLock>> = (0..waiters)
            .map(|i| clients[i % client_count].clone())
            .collect();
        let key = unique("hot");
        let opts = waiting_without_polling(Duration::from_secs(60), Duration::from_secs(60));
        let (sent_before, processed_before) = commands_sent(&mut con).await?;
        let started = Instant::now();
        let tasks: Vec<_> = clients
            .into_iter()
            .map(|client| {
                let (key, opts) = (key.clone(), opts.clone());
                tokio::spawn(async move {
                    let mut at = Vec::new();
                    for _ in 0..HOT_ROUNDS {
                        let lease = client.acquire(&key, &opts).await?;
                        at.push(Instant::now());
                        lease.release().await?;
                    }
                    anyhow::Ok(at)
                })
            })
            .collect();
        let mut grants = Vec::new();
        for task in tasks {
            grants.extend(task.await??);
        }
        let took = started.elapsed();
        grants.sort();
        let mut gaps: Vec<Duration> = grants.windows(2).map(|w| w[1] - w[0]).collect();
        gaps.sort();
        let median_gap = gaps.get(gaps.len() / 2).copied().unwrap_or_default();
        let (sent_after, processed_after) = commands_sent(&mut con).await?;
        let acquisitions = (waiters * HOT_ROUNDS) as f64;
        // The second INFO is not the clients'.
        let sent = (sent_after - sent_before) as f64 / acquisitions;
        let processed = (processed_after - processed_before - 1) as f64 / acquisitions;
        eprintln!(
            "[commands] {waiters} waiters on {client_count} clients, one key: {sent:.2} client \
             commands and {processed:.1} server commands (with those scripts run) per \
             acquisition; {acquisitions} acquisitions in {took:?}, median gap {median_gap:?}"
        );
        ensure!(
            sent <= 4.0,
            "{waiters} waiters on one key: {sent:.2} client commands per acquisition"
        );
    }
    Ok(())
}

/// Five hand-overs between two clients, each long before any poll could happen.
pub async fn a_release_wakes_a_waiter_without_polling(url: String) -> anyhow::Result<()> {
    let [a, b] = clients(&url).await?;
    let key = unique("wake");
    let opts = waiting_without_polling(Duration::from_secs(60), Duration::from_secs(20));
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
    let [holder_client, waiters] = clients(&url).await?;
    let key = unique("queue");
    let opts = waiting_without_polling(Duration::from_secs(60), Duration::from_secs(20));
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
    let [crashed, next] = clients(&url).await?;
    let key = unique("expiring");
    let ttl = Duration::from_millis(800);
    let lease = crashed.acquire(&key, &LockOptions::new(ttl)).await?;
    let sent = lease.acquired_at();
    std::mem::forget(lease);
    let opts = waiting_without_polling(Duration::from_secs(10), Duration::from_secs(10));
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
