//! What operators see and do: the owner record beside each lock (read with a plain client, as
//! `redis-cli HGET` would), `inspect` with the holder's token and owner, `list` by prefix, and a
//! fenced eviction that wakes a waiter and turns the evicted lease lost.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use dlock_core::backend::LockKey;
use dlock_core::inspect::{Eviction, Holding};
use dlock_core::{
    Admin, AutoRenew, DistributedLock, DistributedLockExt, Error, Fenced, FencingToken,
    LockOptions, OwnerRecord, Released,
};
use dlock_redis::{RedisLock, RedisLockBuilder};
use dlock_testkit::case;
use dlock_testkit::trials::Case;
use redis::aio::MultiplexedConnection;

use crate::support::{self, unique, PROMPT, SLACK};

/// The cases of this module, each given the shared server's URL.
pub fn cases() -> Vec<(&'static str, Case<String>)> {
    vec![
        case!(the_owner_record_lives_beside_the_lock_as_long_as_it),
        case!(list_finds_the_held_locks_by_prefix_and_nothing_else),
        case!(eviction_fences_out_a_paused_holder_and_wakes_a_waiter),
        case!(an_unexpected_token_evicts_nothing),
        case!(primitives_wait_for_replicas_with_min_replicas),
    ]
}

/// With `min_replicas`, a primitive's grant that no replica acknowledged (this server has
/// none) is `Unavailable`, never held, and is given back: the semaphore, the read-write lock and
/// the election stay free.
async fn primitives_wait_for_replicas_with_min_replicas(url: String) -> anyhow::Result<()> {
    use dlock_core::backend::Primitives;
    let waiting: Arc<dyn DistributedLock> = Arc::new(
        RedisLockBuilder::new(&url)
            .with_min_replicas(1)
            .with_replica_timeout(Duration::from_millis(50))
            .connect()
            .await?,
    );
    ensure!(waiting.capabilities().primitives == Primitives::ALL);
    let name = unique("acks");
    let opts = LockOptions::new(Duration::from_secs(10));
    let semaphore = waiting.semaphore(&name, 2)?;
    match semaphore.try_acquire(&opts).await {
        Err(dlock_core::Error::Unavailable { .. }) => {}
        other => bail!("an unacknowledged permit: {other:?}"),
    }
    let rw = waiting.rw(&name)?;
    match rw.try_write(&opts).await {
        Err(dlock_core::Error::Unavailable { .. }) => {}
        other => bail!("an unacknowledged write hold: {other:?}"),
    }
    let election = waiting.election(&name)?;
    match election.try_campaign("here", &opts).await {
        Err(dlock_core::Error::Unavailable { .. }) => {}
        other => bail!("an unacknowledged leadership: {other:?}"),
    }
    ensure!(
        matches!(semaphore.holding().await?, Holding::Free),
        "a permit stayed"
    );
    ensure!(
        matches!(rw.holding().await?, Holding::Free),
        "a write hold stayed"
    );
    ensure!(election.leader().await?.is_none(), "a leadership stayed");
    Ok(())
}

/// The owner record's fields, read as a plain client (`HMGET`) does.
async fn owner_record(
    raw: &mut MultiplexedConnection,
    record_key: &str,
) -> anyhow::Result<(Option<String>, Option<u64>, Option<String>)> {
    Ok(redis::cmd("HMGET")
        .arg(record_key)
        .arg(&["token", "fencing", "record"])
        .query_async(raw)
        .await?)
}

async fn pttl(raw: &mut MultiplexedConnection, key: &str) -> anyhow::Result<i64> {
    Ok(redis::cmd("PTTL").arg(key).query_async(raw).await?)
}

/// A grant leaves `dlock:owner:{<lock key>}` with the owner token, the fencing token and the
/// record (this process's pid and the `owner=` label) and the lock's TTL; an extension re-arms
/// it, `inspect` reports what it says, and a release removes it with the lock.
pub async fn the_owner_record_lives_beside_the_lock_as_long_as_it(
    url: String,
) -> anyhow::Result<()> {
    let with_label = format!("{url}?owner=billing%20jobs");
    let client = Arc::new(RedisLockBuilder::from_url(&with_label)?.connect().await?);
    ensure!(
        client.owner().label() == Some("billing jobs"),
        "the owner= label: {:?}",
        client.owner()
    );
    let mut raw = support::raw(&url).await?;
    let name = unique("owner");
    let keys = client.keys(&LockKey::new(&name)?);
    ensure!(
        keys.owner == format!("dlock:owner:{{{name}}}"),
        "owner record key {:?}",
        keys.owner
    );
    let ttl = Duration::from_secs(20);
    let mut lease = client
        .try_acquire(&name, &LockOptions::new(ttl))
        .await?
        .context("a free key was busy")?;

    let (token, fencing, json) = owner_record(&mut raw, &keys.owner).await?;
    ensure!(
        token.as_deref() == Some(lease.owner().to_hex().as_str()),
        "the record's owner token is {token:?}"
    );
    ensure!(
        fencing == Some(lease.fencing_token().get()),
        "the record's fencing token is {fencing:?}, the lease has {}",
        lease.fencing_token()
    );
    let json = json.context("no record")?;
    let record = OwnerRecord::parse(json.as_bytes()).context(json.clone())?;
    ensure!(record.pid == std::process::id(), "{json}");
    ensure!(record.label.as_deref() == Some("billing jobs"), "{json}");
    ensure!(
        record
            .age()
            .is_some_and(|age| age < Duration::from_secs(30)),
        "{json}"
    );
    let left = pttl(&mut raw, &keys.owner).await?;
    ensure!(
        left > 15_000 && left <= 20_000,
        "the record's PTTL is {left}"
    );

    match client.holding(&name).await? {
        Holding::Held(holder) => {
            ensure!(
                holder.fencing == Some(lease.fencing_token()),
                "inspect: {holder}"
            );
            ensure!(holder.owner.as_ref() == Some(&record), "inspect: {holder}");
            ensure!(holder.expires_in.is_some(), "inspect: {holder}");
            ensure!(holder.waiting == Some(0), "inspect: {holder}");
        }
        other => bail!("our held lock looks {other}"),
    }

    lease.extend(Duration::from_secs(60)).await?;
    let left = pttl(&mut raw, &keys.owner).await?;
    ensure!(
        left > 55_000,
        "the extension left the record's PTTL at {left}"
    );

    ensure!(lease.release().await? == Released::Released, "release");
    let exists: u64 = redis::cmd("EXISTS")
        .arg(&keys.owner)
        .query_async(&mut raw)
        .await?;
    ensure!(exists == 0, "the record outlived the release");
    Ok(())
}

/// `list` shows the held locks under a prefix with their holders, and nothing else: not another
/// prefix's locks, not plain keys that look like locks, not released ones.
pub async fn list_finds_the_held_locks_by_prefix_and_nothing_else(
    url: String,
) -> anyhow::Result<()> {
    let prefix = format!("{}:", unique("list"));
    let client: Arc<dyn DistributedLock> = Arc::new(
        RedisLock::builder(&url)
            .with_prefix(&prefix)
            .with_owner("lister")
            .connect()
            .await?,
    );
    let other: Arc<dyn DistributedLock> = Arc::new(
        RedisLock::builder(&url)
            .with_prefix(format!("{}:", unique("list-other")))
            .connect()
            .await?,
    );
    let mut raw = support::raw(&url).await?;
    let opts = LockOptions::new(Duration::from_secs(30));
    let mut leases = Vec::new();
    for name in ["jobs/a", "jobs/b", "reports/{tenant}/daily", "jobs/}odd"] {
        leases.push(client.acquire(name, &opts).await?);
    }
    let elsewhere = other.acquire("jobs/c", &opts).await?;
    // Data that is not a lock, though named like one.
    redis::cmd("SET")
        .arg(format!("{prefix}jobs/plain"))
        .arg("x")
        .query_async::<()>(&mut raw)
        .await?;

    let admin = Admin::new(&client);
    let listed = admin.list("jobs/").await?;
    let names: Vec<&str> = listed.iter().map(|l| l.key.as_str()).collect();
    ensure!(
        names == ["jobs/a", "jobs/b", "jobs/}odd"],
        "list(jobs/): {names:?}"
    );
    for (held, lease) in listed.iter().zip([&leases[0], &leases[1], &leases[3]]) {
        ensure!(
            held.holder.fencing == Some(lease.fencing_token()),
            "{}: {}",
            held.key,
            held.holder
        );
        let label = held.holder.owner.as_ref().and_then(|o| o.label.as_deref());
        ensure!(label == Some("lister"), "{}: {}", held.key, held.holder);
    }
    let all = admin.list("").await?;
    ensure!(all.len() == 4, "list(\"\"): {all:?}");
    let theirs = Admin::new(&other).list("").await?;
    ensure!(
        theirs.len() == 1 && theirs[0].key == "jobs/c",
        "the other prefix lists {theirs:?}"
    );

    let released = leases.remove(0);
    released.release().await?;
    let after = admin.list("jobs/").await?;
    let names: Vec<&str> = after.iter().map(|l| l.key.as_str()).collect();
    ensure!(
        names == ["jobs/b", "jobs/}odd"],
        "after a release: {names:?}"
    );
    for lease in leases {
        lease.release().await?;
    }
    elsewhere.release().await?;
    ensure!(
        admin.list("").await?.is_empty(),
        "listed after every release"
    );
    Ok(())
}

/// A holder that stalls (it renews, but does not write) is evicted by the token `list` showed:
/// a waiter is woken as by a release and gets a greater token, writes through the fence, and
/// the stalled holder's late write is refused; its lease turns lost at its next renewal.
pub async fn eviction_fences_out_a_paused_holder_and_wakes_a_waiter(
    url: String,
) -> anyhow::Result<()> {
    let [holder, waiter, operator] = support::clients(&url).await?;
    let name = unique("evict");
    let renewal = Duration::from_millis(300);
    let stuck = holder
        .acquire(
            &name,
            &LockOptions::new(Duration::from_secs(30)).with_renewal(AutoRenew {
                interval: Some(renewal),
                max_hold: None,
            }),
        )
        .await?;
    let resource = Fenced::new(Vec::<&str>::new());
    resource.write(stuck.fencing_token(), |log| log.push("stuck"))?;

    let waiting = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move {
            let opts =
                support::waiting_without_polling(Duration::from_secs(30), Duration::from_secs(25));
            let lease = waiter.acquire(&name, &opts).await;
            (lease, tokio::time::Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(!waiting.is_finished(), "the waiter took a held lock");

    let admin = Admin::new(&operator);
    let shown = admin
        .list(&name)
        .await?
        .into_iter()
        .find(|held| held.key == name)
        .context("the held lock is not listed")?;
    let evicted_at = tokio::time::Instant::now();
    match admin.force_unlock(&name, shown.holder.fencing).await? {
        Eviction::Evicted(holder) => ensure!(
            holder.fencing == Some(stuck.fencing_token()),
            "evicted {holder}"
        ),
        other => bail!("the eviction answered {other:?}"),
    }

    let (successor, acquired_at) = waiting.await?;
    let successor = successor.context("the waiter after the eviction")?;
    let gap = acquired_at - evicted_at;
    ensure!(gap <= PROMPT, "the waiter took {gap:?} after the eviction");
    ensure!(
        successor.fencing_token() > stuck.fencing_token(),
        "the successor's token {} is not above the evicted {}",
        successor.fencing_token(),
        stuck.fencing_token()
    );
    resource.write(successor.fencing_token(), |log| log.push("successor"))?;
    ensure!(
        resource
            .write(stuck.fencing_token(), |log| log.push("late"))
            .is_err(),
        "the fence took the evicted holder's late write"
    );
    ensure!(
        resource.read(|log| log.clone()) == ["stuck", "successor"],
        "the resource holds {:?}",
        resource.read(|log| log.clone())
    );

    let lost = tokio::time::timeout(renewal * 3 + SLACK, stuck.lost()).await;
    ensure!(
        lost.is_ok(),
        "the evicted lease still counts: {:?}",
        stuck.state()
    );
    ensure!(!stuck.is_held(), "the evicted lease is {:?}", stuck.state());
    ensure!(successor.release().await? == Released::Released, "release");
    Ok(())
}

/// An eviction that expects another token changes nothing; a free key answers free; an
/// expected token on a holder that shows none (a peer's) is "changed" too.
pub async fn an_unexpected_token_evicts_nothing(url: String) -> anyhow::Result<()> {
    let [client] = support::clients(&url).await?;
    let admin = Admin::new(&client);
    let name = unique("unexpected");
    let mut lease = client
        .try_acquire(&name, &LockOptions::new(Duration::from_secs(30)))
        .await?
        .context("a free key was busy")?;
    let wrong = FencingToken(lease.fencing_token().get() - 1);
    match admin.force_unlock(&name, Some(wrong)).await? {
        Eviction::Changed(holder) => ensure!(
            holder.fencing == Some(lease.fencing_token()),
            "changed: {holder}"
        ),
        other => bail!("a wrong token answered {other:?}"),
    }
    lease
        .extend(Duration::from_secs(30))
        .await
        .context("the lease after an eviction that should have changed nothing")?;
    ensure!(lease.release().await? == Released::Released, "release");
    ensure!(
        admin.force_unlock(&name, None).await? == Eviction::Free,
        "a free key was evicted"
    );
    match admin.force_unlock("", None).await {
        Err(Error::InvalidInput { .. }) => {}
        other => bail!("an empty key answered {other:?}"),
    }
    Ok(())
}
