//! What the fencing counters cost in storage: without a fence TTL they never expire; with one,
//! each grant re-arms the counter's expiry, and a counter that did expire restarts from the
//! server's clock, above the tokens before it.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use dlock_core::backend::LockKey;
use dlock_core::{DistributedLockExt, FencingToken, LockOptions};
use dlock_redis::protocol::keys::fence_key;
use dlock_redis::RedisLock;
use dlock_testkit::case;
use dlock_testkit::trials::Case;
use redis::aio::MultiplexedConnection;

use crate::support::{self, unique};

/// The cases of this module, each given the shared server's URL.
pub fn cases() -> Vec<(&'static str, Case<String>)> {
    vec![
        case!(fence_ttl_is_rearmed_by_each_grant),
        case!(a_primitives_keys_share_a_slot_carry_the_holder_and_vanish_but_the_counter),
        case!(a_waiting_writers_intent_expires_within_the_requests_ttl),
    ]
}

/// While a writer waits, its intent is stored with an expiry no longer than the request's TTL,
/// so a writer that crashes while waiting holds readers back for that long at most; once it is
/// served the intent is gone.
async fn a_waiting_writers_intent_expires_within_the_requests_ttl(
    url: String,
) -> anyhow::Result<()> {
    use dlock_core::DistributedLock;
    let locks: Arc<dyn DistributedLock> = Arc::new(RedisLock::connect(&url).await?);
    let name = unique("intent");
    let ttl = Duration::from_secs(2);
    let reader = locks
        .rw(&name)?
        .try_read(&LockOptions::new(Duration::from_secs(10)))
        .await?
        .context("a reader")?;
    let writer = {
        let rw = locks.rw(&name)?;
        let opts = LockOptions::new(ttl).with_wait(Duration::from_secs(20));
        tokio::spawn(async move { rw.write(&opts).await })
    };
    let mut con = support::raw(&url).await?;
    let intents = format!("dlock:rw:intents:{{{name}}}");
    // The writer's first attempt stores the intent (a loaded machine may take a while).
    let stored_by = tokio::time::Instant::now() + Duration::from_secs(5);
    let pttl = loop {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&intents)
            .query_async(&mut con)
            .await?;
        if pttl != -2 || tokio::time::Instant::now() > stored_by {
            break pttl;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    ensure!(!writer.is_finished(), "the writer beside a reader");
    ensure!(
        pttl > 0 && pttl <= ttl.as_millis() as i64,
        "the intent's expiry is {pttl} ms for a {ttl:?} request"
    );
    reader.release().await?;
    let lease = writer.await??;
    let count: i64 = redis::cmd("ZCARD")
        .arg(&intents)
        .query_async(&mut con)
        .await?;
    ensure!(count == 0, "{count} intents once the writer was served");
    lease.release().await?;
    Ok(())
}

/// A semaphore, a read-write lock and an election of one name live in the documented keys,
/// each family's keys in the name's slot; the holder's owner record is in the data hash and
/// shown by `inspect`; primitives are not listed as locks; once every holder is gone (released,
/// or a crashed one past its TTL) only the fencing counters remain.
async fn a_primitives_keys_share_a_slot_carry_the_holder_and_vanish_but_the_counter(
    url: String,
) -> anyhow::Result<()> {
    use dlock_core::backend::{LockRequest, Primitive};
    use dlock_core::inspect::Holding;
    use dlock_core::{DistributedLock, OwnerToken};
    use dlock_redis::protocol::keys::hash_slot;
    let locks: Arc<dyn DistributedLock> = Arc::new(
        RedisLock::builder(&url)
            .with_owner("prim-storage")
            .connect()
            .await?,
    );
    let name = unique("prim-keys");
    let opts = LockOptions::new(Duration::from_secs(10));
    let permit = locks
        .semaphore(&name, 2)?
        .try_acquire(&opts)
        .await?
        .context("a permit")?;
    let reading = locks.rw(&name)?.try_read(&opts).await?.context("a read")?;
    let leading = locks
        .election(&name)?
        .try_campaign("here", &opts)
        .await?
        .context("leadership")?;
    // A crashed writer-to-be: a second permit taken straight on the view, never released.
    let key = LockKey::new(&name)?;
    let crashed = locks
        .primitive(&Primitive::semaphore(2))?
        .try_lock(&LockRequest {
            key: &key,
            owner: OwnerToken::random(),
            ttl: Duration::from_millis(300),
        })
        .await?;
    ensure!(matches!(crashed, dlock_core::backend::Attempt::Acquired(_)));
    let mut con = support::raw(&url).await?;
    let pattern = format!("*{}*", support::glob_escape(&name));
    let mut stored = support::scan(&mut con, &pattern).await?;
    stored.sort();
    let mut expected: Vec<String> = ["elect", "rw", "sem"]
        .iter()
        .flat_map(|family| {
            let name = &name;
            ["data", "fence", "holders"]
                .iter()
                .map(move |role| format!("dlock:{family}:{role}:{{{name}}}"))
        })
        .collect();
    expected.sort();
    ensure!(stored == expected, "stored {stored:?}");
    for family in ["elect", "rw", "sem"] {
        let slot = hash_slot(format!("dlock:{family}:holders:{{{name}}}").as_bytes());
        for key in stored
            .iter()
            .filter(|k| k.starts_with(&format!("dlock:{family}:")))
        {
            ensure!(hash_slot(key.as_bytes()) == slot, "{key} in another slot");
        }
    }
    let Holding::Held(holder) = locks.semaphore(&name, 2)?.holding().await? else {
        anyhow::bail!("the semaphore is not held");
    };
    ensure!(
        holder.owner.as_ref().and_then(|o| o.label.as_deref()) == Some("prim-storage"),
        "{holder:?}"
    );
    ensure!(holder.holders == Some(2), "{holder:?}");
    ensure!(
        locks.list(&name).await?.is_empty(),
        "primitives listed as locks"
    );
    permit.release().await?;
    reading.release().await?;
    leading.resign().await?;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut left = support::scan(&mut con, &pattern).await?;
    left.sort();
    let counters: Vec<String> = ["elect", "rw", "sem"]
        .iter()
        .map(|family| format!("dlock:{family}:fence:{{{name}}}"))
        .collect();
    ensure!(left == counters, "left behind: {left:?}");
    Ok(())
}

/// One grant of `name` on `locks`, released at once; its token.
async fn grant(locks: &Arc<RedisLock>, name: &str) -> anyhow::Result<FencingToken> {
    let lease = locks
        .try_acquire(name, &LockOptions::new(Duration::from_secs(10)))
        .await?
        .context("a free key was busy")?;
    let token = lease.fencing_token();
    lease.release().await?;
    Ok(token)
}

/// Makes `key` expire in `ms` milliseconds, as if time had passed.
async fn pexpire(con: &mut MultiplexedConnection, key: &str, ms: u64) -> anyhow::Result<()> {
    let _: () = redis::cmd("PEXPIRE")
        .arg(key)
        .arg(ms)
        .query_async(con)
        .await?;
    Ok(())
}

async fn pttl(con: &mut MultiplexedConnection, key: &str) -> anyhow::Result<i64> {
    Ok(redis::cmd("PTTL").arg(key).query_async(con).await?)
}

/// Without the option the counter never expires; with it the counter's TTL is the fence TTL
/// after a grant, the next grant re-arms it, and tokens keep growing — also after the counter
/// expired, since it restarts at the server's clock in microseconds.
pub async fn fence_ttl_is_rearmed_by_each_grant(url: String) -> anyhow::Result<()> {
    let fence_ttl = Duration::from_secs(2 * 24 * 3600);
    // Generous: the grant happened moments before the check on a possibly loaded machine.
    let fresh = |pttl: i64| {
        u64::try_from(pttl).is_ok_and(|ms| {
            let left = Duration::from_millis(ms);
            left <= fence_ttl && left > fence_ttl - Duration::from_secs(60)
        })
    };
    let mut con = support::raw(&url).await?;

    let forever = Arc::new(RedisLock::connect(&url).await?);
    let name = unique("fence-forever");
    grant(&forever, &name).await?;
    let left = pttl(&mut con, &fence_key(&name)).await?;
    ensure!(left == -1, "a default counter has a TTL of {left} ms");

    let locks = Arc::new(
        RedisLock::builder(&url)
            .with_fence_ttl(fence_ttl)
            .connect()
            .await?,
    );
    ensure!(locks.fence_ttl() == Some(fence_ttl), "{locks:?}");
    let name = unique("fence-ttl");
    let fence = fence_key(&name);
    let first = grant(&locks, &name).await?;
    let left = pttl(&mut con, &fence).await?;
    ensure!(
        fresh(left),
        "after the first grant the counter's PTTL is {left} ms"
    );

    // As if most of the fence TTL had passed without a grant.
    pexpire(&mut con, &fence, 100_000).await?;
    let second = grant(&locks, &name).await?;
    ensure!(second > first, "token {second} after {first}");
    let left = pttl(&mut con, &fence).await?;
    ensure!(
        fresh(left),
        "after the next grant the counter's PTTL is {left} ms"
    );

    // The counter runs out: the next grant starts it again at the server's clock, above before.
    pexpire(&mut con, &fence, 1).await?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let exists: bool = redis::cmd("EXISTS")
        .arg(&fence)
        .query_async(&mut con)
        .await?;
    ensure!(!exists, "the counter did not expire");
    let third = grant(&locks, &name).await?;
    ensure!(
        third > second,
        "token {third} after {second}, across the restart"
    );
    let left = pttl(&mut con, &fence).await?;
    ensure!(
        fresh(left),
        "after the restart the counter's PTTL is {left} ms"
    );
    Ok(())
}
