//! The Redis backend through Redis Sentinel (one primary, one replica, three sentinels in
//! containers), and replica acknowledgement (`min_replicas`, `WAIT`).
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-redis --test sentinel
//! ```
//!
//! One topology serves every trial. First the whole compliance suite and the trials that do not
//! break anything run side by side; then the failover trials, one at a time, each leaving the
//! topology healthy (roles may have swapped) for the next. A single Redis without replicas serves
//! the trial of `min_replicas` on a server that cannot satisfy it. With `DLOCK_TEST_NO_DOCKER=1`
//! every trial is reported as ignored; without Docker and without that opt-out the binary fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use dlock_compliance::{suite, Subject, Timing};
use dlock_core::{DistributedLock, DistributedLockExt, Error, LeaseState, LockOptions};
use dlock_redis::{RedisLock, RedisLockBuilder, SentinelSettings};
use dlock_testkit::fixtures::redis_sentinel::{DOWN_AFTER, SERVICE};
use dlock_testkit::fixtures::{docker_opt_out, RedisSentinel, RedisServer};
use dlock_testkit::{case, trials};
use libtest_mimic::Arguments;

/// The longest one trial may take before it counts as hung.
const BUDGET: Duration = Duration::from_secs(90);

/// What the issue promises: after a promotion, new acquires work within this.
const AFTER_PROMOTION: Duration = Duration::from_secs(2);

/// What the trials share: the Sentinel topology and a plain server without replicas.
#[derive(Clone)]
struct Cx {
    sentinel: Arc<RedisSentinel>,
    single: Arc<RedisServer>,
}

impl Cx {
    fn settings(&self) -> SentinelSettings {
        SentinelSettings::new(self.sentinel.sentinel_addresses(), SERVICE)
    }

    async fn client(&self) -> anyhow::Result<Arc<RedisLock>> {
        Ok(Arc::new(
            RedisLockBuilder::sentinel(self.settings())
                .connect()
                .await?,
        ))
    }

    async fn acknowledged_client(&self) -> anyhow::Result<Arc<RedisLock>> {
        Ok(Arc::new(
            RedisLockBuilder::sentinel(self.settings())
                .with_min_replicas(1)
                .with_replica_timeout(Duration::from_millis(300))
                .connect()
                .await?,
        ))
    }

    /// A plain connection to the server the sentinels name as the primary now.
    async fn primary_connection(&self) -> anyhow::Result<redis::aio::MultiplexedConnection> {
        let primary = self.sentinel.primary().await?;
        support::raw(&format!("redis://{}", primary.endpoint())).await
    }
}

/// The trials that leave the topology as it is, run beside the suite.
const SIDE_BY_SIDE: &[(&str, trials::Case<Cx>)] = &[
    case!(wait_grant_extend_release_with_the_replica_up),
    case!(min_replicas_on_a_server_without_replicas_is_unavailable),
    case!(settings_never_show_passwords),
    case!(a_sentinel_url_connects_with_replica_acknowledgement),
];

/// The trials that break the topology, one at a time after the others.
const ONE_AT_A_TIME: &[(&str, trials::Case<Cx>)] = &[
    case!(wait_grant_with_the_replica_paused_is_unavailable_and_leaves_no_key),
    case!(forced_failover_while_held_and_waited),
    case!(primary_stopped_while_held_and_waited),
];

fn main() {
    let args = Arguments::from_args();
    let capabilities = dlock_redis::RedisLock::CAPABILITIES;
    if docker_opt_out() {
        let mut all = suite::placeholder_trials("redis-sentinel", capabilities);
        all.extend(trials::placeholders(trials::names(
            "sentinel",
            SIDE_BY_SIDE,
        )));
        all.extend(trials::placeholders(trials::names(
            "sentinel::failover",
            ONE_AT_A_TIME,
        )));
        trials::run_ignored(&args, all);
    }
    let runtime = trials::fixture_runtime();
    let (sentinel, single) = trials::start(
        &runtime,
        "Redis Sentinel (primary, replica, three sentinels) and a single Redis",
        async { tokio::try_join!(RedisSentinel::start(), RedisServer::start()) },
    );
    let cx = Cx {
        sentinel: Arc::new(sentinel),
        single: Arc::new(single),
    };
    let primary = runtime
        .block_on(cx.sentinel.primary())
        .map(|m| format!("redis://{}", m.endpoint()))
        .expect("a primary");
    let connect_cx = cx.clone();
    let subject = Subject::new("redis-sentinel", capabilities, move || {
        let cx = connect_cx.clone();
        async move {
            let client: Arc<dyn DistributedLock> = cx.client().await?;
            Ok(client)
        }
    })
    .with_timing(Timing {
        ttl: Duration::from_millis(1_000),
        slack: Duration::from_secs(3),
    })
    .with_inspect(Arc::new(support::KeyCount { url: primary }));

    let mut first = suite::trials(&subject);
    first.extend(trials::cases("sentinel", SIDE_BY_SIDE, &cx, BUDGET));
    let started = Instant::now();
    let side_by_side = libtest_mimic::run(&args, first);

    let mut one_at_a_time_args = args.clone();
    one_at_a_time_args.test_threads = Some(1);
    let breaking = trials::cases("sentinel::failover", ONE_AT_A_TIME, &cx, BUDGET);
    let one_at_a_time = libtest_mimic::run(&one_at_a_time_args, breaking);
    eprintln!("[timing] all sentinel trials: {:.2?}", started.elapsed());

    let failed = side_by_side.has_failed() || one_at_a_time.has_failed();
    drop(subject);
    if let Err(e) = runtime.block_on(async move {
        let Cx { sentinel, single } = cx;
        let sentinel = Arc::try_unwrap(sentinel)
            .ok()
            .context("a trial still holds the topology")?;
        let single = Arc::try_unwrap(single)
            .ok()
            .context("a trial still holds the server")?;
        let (a, b) = tokio::join!(sentinel.shutdown(), single.shutdown());
        a.and(b).map_err(anyhow::Error::from)
    }) {
        eprintln!("removing the fixtures failed: {e:#}");
    }
    std::process::exit(i32::from(failed) * 101);
}

fn is_unavailable(error: &Error) -> bool {
    matches!(error, Error::Unavailable { .. })
}

/// With the replica up, every grant, extension and release is acknowledged.
async fn wait_grant_extend_release_with_the_replica_up(cx: Cx) -> anyhow::Result<()> {
    let client = cx.acknowledged_client().await?;
    let key = support::unique("acknowledged");
    let opts = LockOptions::new(Duration::from_secs(5));
    let mut lease = client.acquire(&key, &opts).await?;
    lease.extend(Duration::from_secs(5)).await?;
    lease.release().await?;
    Ok(())
}

/// `min_replicas` on a server without replicas: the grant is taken back and reported as
/// `Unavailable`, and no lock key stays behind.
async fn min_replicas_on_a_server_without_replicas_is_unavailable(cx: Cx) -> anyhow::Result<()> {
    let client = Arc::new(
        RedisLock::builder(cx.single.url())
            .with_min_replicas(1)
            .with_replica_timeout(Duration::from_millis(200))
            .connect()
            .await?,
    );
    let key = support::unique("no-replicas");
    let opts = LockOptions::new(Duration::from_secs(30));
    match client.try_acquire(&key, &opts).await {
        Err(e) if is_unavailable(&e) => {}
        Err(e) => anyhow::bail!("expected Unavailable, got {e}"),
        Ok(held) => anyhow::bail!("granted without a replica: {}", held.is_some()),
    }
    let mut con = support::raw(&cx.single.url()).await?;
    let exists: bool = redis::cmd("EXISTS").arg(&key).query_async(&mut con).await?;
    ensure!(!exists, "the unacknowledged grant left its key behind");
    Ok(())
}

/// `redis+sentinel://…/SERVICE?min_replicas=1&replica_timeout=…` connects through the sentinels
/// and acknowledges each grant.
async fn a_sentinel_url_connects_with_replica_acknowledgement(cx: Cx) -> anyhow::Result<()> {
    let url = format!(
        "redis+sentinel://{}/{SERVICE}/0?min_replicas=1&replica_timeout=300ms&prefix=url:",
        cx.sentinel.sentinel_addresses().join(",")
    );
    let client = Arc::new(RedisLockBuilder::from_url(&url)?.connect().await?);
    let key = support::unique("url");
    let lease = client
        .acquire(&key, &LockOptions::new(Duration::from_secs(5)))
        .await?;
    let mut con = cx.primary_connection().await?;
    let exists: bool = redis::cmd("EXISTS")
        .arg(format!("url:{key}"))
        .query_async(&mut con)
        .await?;
    ensure!(exists, "the lock key is not on the primary");
    lease.release().await?;
    Ok(())
}

/// Neither password shows in `Debug` of the settings, the builder or the client.
async fn settings_never_show_passwords(cx: Cx) -> anyhow::Result<()> {
    let settings = cx
        .settings()
        .with_password("data-hunter2")
        .with_sentinel_password("sentinel-hunter2");
    let builder = RedisLockBuilder::sentinel(settings.clone());
    let shown = format!("{settings:?} {builder:?}");
    ensure!(!shown.contains("hunter2"), "{shown}");
    // Wrong passwords: the servers run without any, so a password is refused by the sentinels.
    match builder.connect().await {
        Err(e) => ensure!(!format!("{e} {e:?}").contains("hunter2"), "{e:?}"),
        Ok(client) => ensure!(!format!("{client:?}").contains("hunter2")),
    }
    Ok(())
}

/// With the replica frozen, a grant is not acknowledged: `Unavailable`, and the key is gone.
async fn wait_grant_with_the_replica_paused_is_unavailable_and_leaves_no_key(
    cx: Cx,
) -> anyhow::Result<()> {
    let client = cx.acknowledged_client().await?;
    let replica = cx.sentinel.replica().await?.clone();
    let key = support::unique("replica-paused");
    let opts = LockOptions::new(Duration::from_secs(30));
    replica.pause().await?;
    let outcome = client.try_acquire(&key, &opts).await;
    let mut con = cx.primary_connection().await?;
    let exists: bool = redis::cmd("EXISTS").arg(&key).query_async(&mut con).await?;
    replica.unpause().await?;
    match outcome {
        Err(e) if is_unavailable(&e) => {}
        Err(e) => anyhow::bail!("expected Unavailable, got {e}"),
        Ok(held) => anyhow::bail!("granted without the replica: {}", held.is_some()),
    }
    ensure!(!exists, "the unacknowledged grant left its key behind");
    cx.sentinel.wait_healthy().await?;
    Ok(())
}

/// How long after `promoted` a fresh key can be acquired through `client`; fails unless the
/// lock key is then on the server the sentinels name as the primary.
async fn first_acquire_after(
    cx: &Cx,
    client: &Arc<RedisLock>,
    promoted: Instant,
) -> anyhow::Result<Duration> {
    let key = support::unique("after-failover");
    let opts = LockOptions::new(Duration::from_secs(5));
    let lease =
        support::acquire_through_failover(client, &key, &opts, Duration::from_secs(20)).await?;
    let took = promoted.elapsed();
    let mut con = cx.primary_connection().await?;
    let exists: bool = redis::cmd("EXISTS").arg(&key).query_async(&mut con).await?;
    ensure!(
        exists,
        "the lock was granted elsewhere than on the new primary"
    );
    lease.release().await?;
    Ok(took)
}

/// Waits until the replica has the lock key `key`, so that a failover keeps it.
async fn replicated(cx: &Cx, key: &str) -> anyhow::Result<()> {
    let replica = cx.sentinel.replica().await?;
    let mut con = support::raw(&format!("redis://{}", replica.endpoint())).await?;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let exists: bool = redis::cmd("EXISTS").arg(key).query_async(&mut con).await?;
        if exists {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "the replica never got {key}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A forced failover (`SENTINEL FAILOVER`) while one client holds a lock (its key replicated)
/// and another waits: a new acquire works on the new primary within 2 s of the promotion, though
/// the old primary still answers as a primary until the sentinels reconfigure it; the holder's
/// lease stays held and extends on the new primary; the waiter gets the lock when the holder
/// releases it there, with a larger fencing token.
///
/// (An acknowledging client, `min_replicas = 1`, could not acquire right after this promotion:
/// the new primary has no replica until the sentinels turn the old primary into one, which takes
/// them up to about ten seconds — their `INFO` period.)
async fn forced_failover_while_held_and_waited(cx: Cx) -> anyhow::Result<()> {
    let holder_client = cx.client().await?;
    let waiter_client = cx.client().await?;
    let key = support::unique("forced");
    let ttl = Duration::from_secs(10);
    let mut lease = holder_client.acquire(&key, &LockOptions::new(ttl)).await?;
    let token = lease.fencing_token();
    replicated(&cx, &key).await?;
    // A second lease whose key the new primary will not have (deleted there after the
    // promotion): what a grant that had not replicated looks like to its holder.
    let missing_key = support::unique("not-replicated");
    let mut missing = holder_client
        .acquire(&missing_key, &LockOptions::new(ttl))
        .await?;

    let waiter = {
        let (client, key) = (waiter_client.clone(), key.clone());
        tokio::spawn(async move {
            let opts = LockOptions::new(ttl).with_wait(Duration::from_secs(30));
            support::acquire_through_failover(&client, &key, &opts, Duration::from_secs(30)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(!waiter.is_finished(), "the waiter got a held lock");

    let old = cx.sentinel.primary().await?.host_port();
    cx.sentinel.failover().await?;
    let promoted = Instant::now();
    let took = first_acquire_after(&cx, &holder_client, promoted).await?;
    ensure!(
        took <= AFTER_PROMOTION + support::SLACK,
        "a new acquire took {took:?} after the promotion"
    );
    ensure!(
        cx.sentinel.primary().await?.host_port() != old,
        "no new primary"
    );

    // A key the new primary does not have: the extension finds it gone, the lease is lost.
    let mut con = cx.primary_connection().await?;
    let _: i64 = redis::cmd("DEL")
        .arg(&missing_key)
        .query_async(&mut con)
        .await?;
    ensure!(
        missing.extend(ttl).await.is_err(),
        "a lease whose key is gone extended"
    );
    ensure!(
        matches!(missing.state(), LeaseState::Lost(_)),
        "lease {:?} after its key was found missing",
        missing.state()
    );

    // The key had replicated: the holder's lease extends on the new primary.
    lease
        .extend(ttl)
        .await
        .context("extend after the failover")?;
    ensure!(
        lease.is_held(),
        "lease {:?} after the failover",
        lease.state()
    );
    ensure!(
        !waiter.is_finished(),
        "the waiter got the lock while it was held"
    );
    lease.release().await?;
    let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .context("the waiter did not get the released lock")???;
    ensure!(
        waited.fencing_token() > token,
        "token {} after {token}",
        waited.fencing_token()
    );
    waited.release().await?;
    cx.sentinel.wait_healthy().await?;
    Ok(())
}

/// The primary stops while a client holds an auto-renewed lock (its key replicated) and another
/// waits: while the sentinels fail over, the lease is uncertain or still held (never lost); once
/// a replica is promoted, renewals reach it and the lease is held again; new acquires work within
/// 2 s of the promotion; the waiter gets the lock once the holder releases it. The old primary
/// is started again and rejoins as a replica.
async fn primary_stopped_while_held_and_waited(cx: Cx) -> anyhow::Result<()> {
    let holder_client = cx.client().await?;
    let waiter_client = cx.client().await?;
    let key = support::unique("stopped");
    let ttl = Duration::from_secs(8);
    let lease = holder_client
        .acquire(&key, &LockOptions::new(ttl).with_auto_renew())
        .await?;
    let token = lease.fencing_token();
    replicated(&cx, &key).await?;
    let waiter = {
        let (client, key) = (waiter_client.clone(), key.clone());
        tokio::spawn(async move {
            let opts = LockOptions::new(ttl).with_wait(Duration::from_secs(40));
            support::acquire_through_failover(&client, &key, &opts, Duration::from_secs(40)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    let old = cx.sentinel.primary().await?.clone();
    let stopped = Instant::now();
    old.stop().await?;
    cx.sentinel
        .wait_for_primary_other_than(old.host_port())
        .await?;
    let promoted = Instant::now();
    eprintln!(
        "[timing] primary stopped → promotion seen: {:.2?} (down-after {DOWN_AFTER:?})",
        promoted - stopped
    );
    let took = first_acquire_after(&cx, &holder_client, promoted).await?;
    ensure!(
        took <= AFTER_PROMOTION + support::SLACK,
        "a new acquire took {took:?} after the promotion"
    );
    ensure!(
        !matches!(lease.state(), LeaseState::Lost(_)),
        "the replicated lease was lost: {:?}",
        lease.state()
    );
    // Renewal reaches the new primary: held again within a renewal period or two.
    let held = support::eventually(ttl, || lease.is_held()).await;
    ensure!(
        held.is_some(),
        "lease {:?} after the failover",
        lease.state()
    );
    ensure!(
        !waiter.is_finished(),
        "the waiter got the lock while it was held"
    );
    lease.release().await?;
    let waited = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .context("the waiter did not get the released lock")???;
    ensure!(
        waited.fencing_token() > token,
        "token {} after {token}",
        waited.fencing_token()
    );
    waited.release().await?;

    old.start().await?;
    cx.sentinel.wait_healthy().await?;
    Ok(())
}
