//! Waiting: releases wake waiters through pub/sub (not a timer), one per release and client; an
//! expiring holder is followed at its TTL. (Losing the subscriber connection is a fault case, in
//! the faults binary.)
//!
//! The waiters here poll so slowly (a fixed 30 s backoff) that only a notification or the holder's
//! TTL can explain a prompt hand-over.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use dlock_core::{DistributedLockExt, LockOptions, Released};
use dlock_testkit::case;
use dlock_testkit::trials::Case;

use crate::support::{clients, unique, waiting_without_polling, PROMPT};

/// The cases of this module, each given the shared server's URL.
pub fn cases() -> Vec<(&'static str, Case<String>)> {
    vec![
        case!(a_release_wakes_a_waiter_without_polling),
        case!(waiters_of_one_client_are_woken_one_per_release),
        case!(an_expiring_holder_is_followed_at_its_ttl),
    ]
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
