//! Interoperability with the common single-instance convention, written with the raw client
//! exactly as redis-py's `Lock` and redsync do it: `SET name <random> NX PX ttl` to take, a
//! compare-and-delete script to release. And the key layout the crate documents.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use dlock_core::backend::LockKey;
use dlock_core::inspect::{Eviction, Holder, Holding};
use dlock_core::{Admin, DistributedLockExt, FencingToken, LockOptions, Released};
use dlock_redis::RedisLock;
use dlock_testkit::case;
use dlock_testkit::trials::Case;
use redis::aio::MultiplexedConnection;

use crate::support::{self, unique};

/// The cases of this module, each given the shared server's URL.
pub fn cases() -> Vec<(&'static str, Case<String>)> {
    vec![
        case!(a_convention_lock_and_ours_exclude_each_other),
        case!(holding_tells_held_or_free_and_the_ttl),
        case!(the_key_layout_is_as_documented),
    ]
}

/// redis-py's release script (`LUA_RELEASE_SCRIPT`), verbatim.
const CONVENTION_RELEASE: &str = r#"
local token = redis.call('get', KEYS[1])
if not token or token ~= ARGV[1] then
    return 0
end
redis.call('del', KEYS[1])
return 1
"#;

/// The other client: takes and releases `name` by the convention.
struct ConventionClient {
    con: MultiplexedConnection,
    token: String,
}

impl ConventionClient {
    async fn new(url: &str) -> anyhow::Result<Self> {
        Ok(ConventionClient {
            con: support::raw(url).await?,
            token: format!("{:032x}", rand::random::<u128>()),
        })
    }

    async fn try_take(&mut self, name: &str, ttl: Duration) -> anyhow::Result<bool> {
        let answer: Option<String> = redis::cmd("SET")
            .arg(name)
            .arg(&self.token)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .query_async(&mut self.con)
            .await?;
        Ok(answer.is_some())
    }

    async fn release(&mut self, name: &str) -> anyhow::Result<bool> {
        let deleted: i64 = redis::Script::new(CONVENTION_RELEASE)
            .key(name)
            .arg(&self.token)
            .invoke_async(&mut self.con)
            .await?;
        Ok(deleted == 1)
    }
}

/// A lock the other client holds blocks ours (try and wait), and a waiter of ours gets it soon
/// after the other client's release, although that release is not announced. A lock we hold
/// blocks the other client, whose release cannot delete it.
pub async fn a_convention_lock_and_ours_exclude_each_other(url: String) -> anyhow::Result<()> {
    let ours = Arc::new(RedisLock::connect(&url).await?);
    let mut theirs = ConventionClient::new(&url).await?;
    let name = unique("interop");
    let opts = LockOptions::new(Duration::from_secs(30));

    ensure!(
        theirs.try_take(&name, Duration::from_secs(30)).await?,
        "their take"
    );
    ensure!(
        ours.try_acquire(&name, &opts).await?.is_none(),
        "our try_acquire took a lock the other client holds"
    );
    let waiting = {
        let (ours, name, opts) = (ours.clone(), name.clone(), opts.clone());
        tokio::spawn(async move {
            let lease = ours
                .acquire(&name, &opts.with_wait(Duration::from_secs(20)))
                .await;
            (lease, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    ensure!(
        !waiting.is_finished(),
        "our waiter took a lock the other client holds"
    );
    let released_at = Instant::now();
    ensure!(theirs.release(&name).await?, "their release");
    let (lease, acquired_at) = waiting.await?;
    let lease = lease.context("our waiter after their release")?;
    // Not announced: found by polling, within one step of the default backoff (500 ms at most).
    let gap = acquired_at - released_at;
    ensure!(
        gap <= Duration::from_millis(1500),
        "our waiter took {gap:?} after their release"
    );

    ensure!(
        !theirs.try_take(&name, Duration::from_secs(30)).await?,
        "the other client took a lock we hold"
    );
    ensure!(
        !theirs.release(&name).await?,
        "the other client's release deleted our lock"
    );
    ensure!(lease.is_held(), "our lease: {:?}", lease.state());
    ensure!(lease.release().await? == Released::Released, "our release");
    ensure!(
        theirs.try_take(&name, Duration::from_secs(30)).await?,
        "the other client cannot take the lock after our release"
    );
    ensure!(theirs.release(&name).await?, "their second release");
    Ok(())
}

/// `holding` reads the lock without taking it: our holder with its remaining TTL, its token and
/// its owner record, then free; another client's holder with its TTL but no token and no owner
/// (its take did not count and left no record), never listed, and evicted only without an
/// expected token.
pub async fn holding_tells_held_or_free_and_the_ttl(url: String) -> anyhow::Result<()> {
    let ours = Arc::new(RedisLock::connect(&url).await?);
    let mut theirs = ConventionClient::new(&url).await?;
    let name = unique("holding");
    let ttl = Duration::from_secs(30);
    ensure!(
        ours.holding(&name).await? == Holding::Free,
        "a new key is not free"
    );

    let lease = ours
        .try_acquire(&name, &LockOptions::new(ttl))
        .await?
        .context("a free key was busy")?;
    match ours.holding(&name).await? {
        Holding::Held(Holder {
            fencing,
            expires_in,
            owner,
            ..
        }) => {
            ensure!(
                fencing == Some(lease.fencing_token()),
                "the token shown is {fencing:?}, not {}",
                lease.fencing_token()
            );
            ensure!(
                owner.is_some_and(|o| o.pid == std::process::id()),
                "no owner record shown"
            );
            ensure!(
                expires_in.is_some_and(|left| left <= ttl && left > ttl / 2),
                "remaining {expires_in:?} of {ttl:?}"
            );
        }
        other => anyhow::bail!("our held lock looks {other:?}"),
    }
    ensure!(lease.release().await? == Released::Released, "our release");
    ensure!(
        ours.holding(&name).await? == Holding::Free,
        "a released key is not free"
    );

    ensure!(theirs.try_take(&name, ttl).await?, "their take");
    let seen = ours.holding(&name).await?;
    ensure!(
        matches!(
            seen,
            Holding::Held(Holder {
                fencing: None,
                expires_in: Some(_),
                owner: None,
                ..
            })
        ),
        "their lock looks {seen:?}"
    );
    let admin = Admin::new(&ours);
    ensure!(
        admin.list(&name).await?.is_empty(),
        "their lock is listed as ours"
    );
    ensure!(
        matches!(
            admin.force_unlock(&name, Some(FencingToken(1))).await?,
            Eviction::Changed(_)
        ),
        "their lock was evicted by an expected token it does not show"
    );
    ensure!(
        matches!(
            admin.force_unlock(&name, None).await?,
            Eviction::Evicted(Holder { owner: None, .. })
        ),
        "their lock was not evicted"
    );
    ensure!(
        !theirs.release(&name).await?,
        "their lock survived its eviction"
    );
    Ok(())
}

/// While held: the lock key is prefix + name with the owner token as value and the lease's TTL;
/// the owner record is a hash beside it with the same TTL; the counter holds the lease's fencing
/// token and never expires; after release only the counter is left.
pub async fn the_key_layout_is_as_documented(url: String) -> anyhow::Result<()> {
    let prefix = format!("{}:", unique("prefix"));
    let client = Arc::new(
        RedisLock::builder(&url)
            .with_prefix(&prefix)
            .connect()
            .await?,
    );
    let mut raw = support::raw(&url).await?;
    let name = "jobs/nightly";
    let ttl = Duration::from_secs(30);
    let lease = client
        .try_acquire(name, &LockOptions::new(ttl))
        .await?
        .context("a free key was busy")?;

    let lock_key = format!("{prefix}{name}");
    let keys = client.keys(&LockKey::new(name)?);
    ensure!(keys.lock == lock_key, "lock key {:?}", keys.lock);
    ensure!(
        keys.fence == format!("{{{lock_key}}}:dlock:fence"),
        "counter key {:?}",
        keys.fence
    );
    let value: Option<String> = redis::cmd("GET")
        .arg(&lock_key)
        .query_async(&mut raw)
        .await?;
    ensure!(
        value.as_deref() == Some(lease.owner().to_hex().as_str()),
        "the lock's value is {value:?}, not the owner token"
    );
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&lock_key)
        .query_async(&mut raw)
        .await?;
    ensure!(
        pttl > 25_000 && pttl <= 30_000,
        "the lock's PTTL is {pttl} ms for a {ttl:?} lease"
    );
    ensure!(
        keys.owner == format!("dlock:owner:{{{lock_key}}}"),
        "owner record key {:?}",
        keys.owner
    );
    let record_type: String = redis::cmd("TYPE")
        .arg(&keys.owner)
        .query_async(&mut raw)
        .await?;
    let record_pttl: i64 = redis::cmd("PTTL")
        .arg(&keys.owner)
        .query_async(&mut raw)
        .await?;
    ensure!(
        record_type == "hash" && record_pttl > 25_000 && record_pttl <= 30_000,
        "the owner record is a {record_type} with PTTL {record_pttl}"
    );
    let counter: Option<u64> = redis::cmd("GET")
        .arg(&keys.fence)
        .query_async(&mut raw)
        .await?;
    ensure!(
        counter == Some(lease.fencing_token().get()),
        "the counter holds {counter:?}, the lease has token {}",
        lease.fencing_token()
    );
    let counter_ttl: i64 = redis::cmd("PTTL")
        .arg(&keys.fence)
        .query_async(&mut raw)
        .await?;
    ensure!(counter_ttl == -1, "the counter expires: PTTL {counter_ttl}");

    lease.release().await?;
    let left = support::scan(&mut raw, &format!("*{}*", support::glob_escape(&prefix))).await?;
    ensure!(
        left == vec![keys.fence.clone()],
        "left after release: {left:?}"
    );
    Ok(())
}
