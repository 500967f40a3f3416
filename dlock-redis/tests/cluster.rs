//! The Redis backend on a Redis Cluster of three primaries in containers: the whole compliance
//! suite, then what is specific to a cluster — locks spread over every shard with each counter on
//! its lock's node, slot migrations under load, and release notifications on the lock's shard.
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-redis --test cluster
//! ```
//!
//! One cluster serves every trial (each works in its own key namespace); the outage case gets a
//! dedicated one-node cluster, and replica acknowledgement (`min_replicas`) one of three primaries
//! with a replica each. With `DLOCK_TEST_NO_DOCKER=1` every trial is reported as ignored;
//! without Docker and without that opt-out the binary fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "compliance/primitives.rs"]
mod primitives;
mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use async_trait::async_trait;
use dlock_compliance::{suite, Inspect, Outage, Subject, Timing};
use dlock_core::inspect::Eviction;
use dlock_core::{Admin, DistributedLock, DistributedLockExt, LockOptions};
use dlock_redis::protocol::keys;
use dlock_redis::{RedisLock, RedisLockBuilder};
use dlock_testkit::case;
use dlock_testkit::certs::TestCerts;
use dlock_testkit::fixtures::{docker_opt_out, RedisCluster, CLUSTER_PASSWORD, CLUSTER_USER};
use dlock_testkit::trials::{self, Case};
use dlock_testkit::Members;
use libtest_mimic::Trial;
use tokio::runtime::Handle;

use crate::support::{unique, waiting_without_polling, PROMPT};

fn main() {
    let args = trials::arguments();
    if RedisCluster::needs_docker() && docker_opt_out() {
        let mut trials = suite::trials(&placeholder_subject());
        trials.extend(trials::placeholders(trials::names(
            "redis_cluster",
            &cases(),
        )));
        trials.extend(trials::placeholders(trials::names(
            "redis_cluster::primitives",
            &primitives::cases(),
        )));
        trials::run_ignored(&args, trials);
    }

    let runtime = trials::fixture_runtime();
    let certs = TestCerts::generate(&["127.0.0.1", "localhost"], "dlock-client")
        .expect("test certificates");
    let (shared, outage, tls, replicated) = trials::start(
        &runtime,
        "Redis Clusters: three primaries, one, three over TLS, and three with a replica each",
        async {
            tokio::try_join!(
                RedisCluster::start(3),
                RedisCluster::start(1),
                RedisCluster::start_tls(3, &certs),
                RedisCluster::start_with_replicas(3)
            )
        },
    );
    let shared = Arc::new(shared);
    let tls = Arc::new(tls);
    let replicated = Arc::new(replicated);

    let subject = subject(&shared, &outage, runtime.handle().clone());
    let mut trials: Vec<Trial> = suite::trials(&subject);
    trials.extend(trials::cases(
        "redis_cluster",
        &cases(),
        &Cx {
            cluster: shared.clone(),
            migrating: Arc::default(),
            tls: tls.clone(),
            certs: Arc::new(certs),
            replicated: replicated.clone(),
            replica_turn: Arc::default(),
        },
        support::TRIAL_BUDGET,
    ));
    let connect: primitives::Connect = Arc::new(connect_to(shared.seeds()));
    trials.extend(trials::cases(
        "redis_cluster::primitives",
        &primitives::cases(),
        &connect,
        support::TRIAL_BUDGET,
    ));
    trials::run_then(&args, trials, &runtime, || async {
        let mut result = outage.shutdown().await;
        for cluster in [shared, tls, replicated] {
            if let Ok(cluster) = Arc::try_unwrap(cluster) {
                result = result.and(cluster.shutdown().await);
            }
        }
        result
    })
}

/// What the cluster trials share: the cluster, for its addresses and its slot migrations, and a
/// lock that lets one trial at a time move slots, so each sees only its own migrations.
#[derive(Clone)]
struct Cx {
    cluster: Arc<RedisCluster>,
    migrating: Arc<tokio::sync::Mutex<()>>,
    /// A cluster that speaks TLS only, and its certificates.
    tls: Arc<RedisCluster>,
    certs: Arc<TestCerts>,
    /// A cluster whose primaries have a replica each, and a lock that lets one trial at a time
    /// use it, so a paused replica fails only the trial that paused it.
    replicated: Arc<RedisCluster>,
    replica_turn: Arc<tokio::sync::Mutex<()>>,
}

impl Cx {
    async fn client(&self) -> anyhow::Result<Arc<RedisLock>> {
        Ok(Arc::new(
            RedisLockBuilder::cluster(self.cluster.seeds())
                .connect()
                .await?,
        ))
    }
}

fn cases() -> Vec<(&'static str, Case<Cx>)> {
    vec![
        case!(locks_spread_over_every_shard_each_with_its_counter),
        case!(list_finds_locks_on_every_shard_and_evict_wakes_a_waiter_there),
        case!(a_slot_migration_loses_no_lock_and_grants_no_duplicate),
        case!(a_release_wakes_a_waiter_on_every_shard_and_after_a_migration),
        case!(a_cluster_url_connects_with_its_settings),
        case!(credentials_log_in_on_every_node_and_a_wrong_password_is_refused_unshown),
        case!(a_tls_cluster_url_locks_and_wakes_on_every_shard),
        case!(min_replicas_grants_extends_and_releases_on_every_shard),
        case!(min_replicas_acknowledges_the_primitives),
        case!(a_grant_its_paused_replica_does_not_acknowledge_is_unavailable_and_leaves_no_key),
    ]
}

fn connect_to(seeds: Vec<String>) -> impl Fn() -> support::ClientFuture + Send + Sync + 'static {
    move || {
        let seeds = seeds.clone();
        Box::pin(async move {
            let client: Arc<dyn DistributedLock> =
                Arc::new(RedisLockBuilder::cluster(seeds).connect().await?);
            Ok(client)
        })
    }
}

fn subject(shared: &RedisCluster, outage: &RedisCluster, main: Handle) -> Subject {
    let member = outage
        .member(0)
        .expect("a container-backed outage cluster")
        .clone();
    let control = Arc::new(Members::new(main, vec![member]));
    // No silent-link case: a cluster client follows the nodes' own addresses, which a proxy in
    // front of the seeds cannot intercept.
    Subject::new("redis_cluster", declared(), connect_to(shared.seeds()))
        .with_timing(Timing {
            ttl: Duration::from_millis(1_000),
            slack: Duration::from_secs(3),
        })
        .with_inspect(Arc::new(KeyCount {
            urls: shared.urls(),
        }))
        .with_outage(Outage::new(control, connect_to(outage.seeds())))
}

/// What the backend declares for Redis; a cluster promises the same.
fn declared() -> dlock_core::backend::Capabilities {
    dlock_redis::RedisLock::CAPABILITIES
}

/// The same trial names, for a run that opted out of Docker.
fn placeholder_subject() -> Subject {
    let outage = Outage::new(Arc::new(Members::none()), connect_to(Vec::new()));
    Subject::new("redis_cluster", declared(), connect_to(Vec::new())).with_outage(outage)
}

/// Counts the keys of a namespace on every node.
struct KeyCount {
    urls: Vec<String>,
}

#[async_trait]
impl Inspect for KeyCount {
    async fn stored(&self, namespace: &str) -> anyhow::Result<u64> {
        let pattern = format!("*{}*", support::glob_escape(namespace));
        let mut total = 0;
        for url in &self.urls {
            let mut con = support::raw(url).await?;
            total += support::scan(&mut con, &pattern).await?.len() as u64;
        }
        Ok(total)
    }
}

/// Sixty locks land on all three primaries, and every lock key's counter is on the node that
/// holds the lock key.
async fn locks_spread_over_every_shard_each_with_its_counter(cx: Cx) -> anyhow::Result<()> {
    let client = cx.client().await?;
    let namespace = unique("spread");
    let opts = LockOptions::new(Duration::from_secs(60));
    let mut leases = Vec::new();
    for i in 0..60 {
        let key = format!("{namespace}/{i}");
        leases.push(
            client
                .try_acquire(&key, &opts)
                .await?
                .context("a fresh key was busy")?,
        );
    }
    let mut per_node = Vec::new();
    for url in cx.cluster.urls() {
        let mut con = support::raw(&url).await?;
        let pattern = format!("{}/*", support::glob_escape(&namespace));
        let locks = support::scan(&mut con, &pattern).await?;
        for lock in &locks {
            let fence = keys::fence_key(lock);
            let here: bool = redis::cmd("EXISTS")
                .arg(&fence)
                .query_async(&mut con)
                .await?;
            ensure!(here, "{lock} is on {url} but its counter {fence} is not");
        }
        per_node.push(locks.len());
    }
    ensure!(
        per_node.iter().sum::<usize>() == 60 && per_node.iter().all(|&n| n > 0),
        "locks per node: {per_node:?}"
    );
    for lease in leases {
        lease.release().await?;
    }
    Ok(())
}

/// Thirty locks spread over the shards, each with its owner record on its node: `list` scans
/// every primary and finds them all under the prefix; on each shard an eviction with the shown
/// token frees the lock, wakes a waiter of another client (sharded release channel) and the
/// waiter's token is greater than the evicted one.
async fn list_finds_locks_on_every_shard_and_evict_wakes_a_waiter_there(
    cx: Cx,
) -> anyhow::Result<()> {
    let namespace = unique("listed");
    let client = cx.client().await?;
    let waiter = cx.client().await?;
    let opts = LockOptions::new(Duration::from_secs(60));
    let mut leases = Vec::new();
    for i in 0..30 {
        let name = format!("{namespace}/{i}");
        leases.push(client.acquire(&name, &opts).await?);
    }
    for url in cx.cluster.urls() {
        let mut con = support::raw(&url).await?;
        let pattern = format!("{}/*", support::glob_escape(&namespace));
        for lock in support::scan(&mut con, &pattern).await? {
            let record = keys::owner_key(&lock);
            let here: bool = redis::cmd("EXISTS")
                .arg(&record)
                .query_async(&mut con)
                .await?;
            ensure!(
                here,
                "{lock} is on {url} but its owner record {record} is not"
            );
        }
    }
    let admin = Admin::new(&client);
    let listed = admin.list(&format!("{namespace}/")).await?;
    ensure!(listed.len() == 30, "listed {} of 30 locks", listed.len());
    for held in &listed {
        let lease = leases
            .iter()
            .find(|l| l.key() == held.key)
            .with_context(|| format!("listed {} that nobody took", held.key))?;
        ensure!(
            held.holder.fencing == Some(lease.fencing_token()),
            "{}: {}",
            held.key,
            held.holder
        );
    }

    let mut evicted_per_node = [false; 3];
    for lease in &leases {
        let node = cx
            .cluster
            .owner_of(keys::hash_slot(lease.key().as_bytes()))
            .await?;
        if std::mem::replace(&mut evicted_per_node[node], true) {
            continue;
        }
        let waiting = {
            let (waiter, key) = (waiter.clone(), lease.key().to_owned());
            let opts = waiting_without_polling(Duration::from_secs(60), Duration::from_secs(20));
            tokio::spawn(async move {
                let lease = waiter.acquire(&key, &opts).await;
                (lease, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        let evicted_at = Instant::now();
        let eviction = admin
            .force_unlock(lease.key(), Some(lease.fencing_token()))
            .await?;
        ensure!(
            matches!(eviction, Eviction::Evicted(_)),
            "{} on node {node}: {eviction:?}",
            lease.key()
        );
        let (successor, acquired_at) = waiting.await?;
        let successor = successor?;
        let took = acquired_at.saturating_duration_since(evicted_at);
        ensure!(
            took <= PROMPT,
            "the waiter got {} {took:?} after the eviction",
            lease.key()
        );
        ensure!(
            successor.fencing_token() > lease.fencing_token(),
            "{}: token {} after the evicted {}",
            lease.key(),
            successor.fencing_token(),
            lease.fencing_token()
        );
        successor.release().await?;
    }
    ensure!(
        evicted_per_node == [true; 3],
        "evicted on {evicted_per_node:?}"
    );
    for lease in leases {
        let _ = lease.release().await;
    }
    ensure!(
        admin.list(&namespace).await?.is_empty(),
        "listed after every release"
    );
    Ok(())
}

/// Six clients take turns on one key while its slot moves from node to node four times, each
/// migration pausing in both halves (keys not yet moved: `ASK`/`TRYAGAIN`; keys moved, owner not
/// yet switched: `TRYAGAIN`). Nobody is ever granted the lock while another holds it, tokens grow
/// strictly in grant order (the counter moved with the lock), and the hand-overs go on.
async fn a_slot_migration_loses_no_lock_and_grants_no_duplicate(cx: Cx) -> anyhow::Result<()> {
    let key = unique("migrating");
    let slot = keys::hash_slot(key.as_bytes());
    let held = Arc::new(AtomicBool::new(false));
    let last_token = Arc::new(AtomicU64::new(0));
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let grants = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..6 {
        let client = Arc::new(
            RedisLockBuilder::cluster(cx.cluster.seeds())
                .with_request_timeout(Duration::from_secs(5))
                .connect()
                .await?,
        );
        let (key, held, last_token, violations, grants, errors, stop) = (
            key.clone(),
            held.clone(),
            last_token.clone(),
            violations.clone(),
            grants.clone(),
            errors.clone(),
            stop.clone(),
        );
        workers.push(tokio::spawn(async move {
            let opts = LockOptions::new(Duration::from_secs(10)).with_wait(Duration::from_secs(10));
            while !stop.load(Ordering::Acquire) {
                let lease = match client.acquire(&key, &opts).await {
                    Ok(lease) => lease,
                    Err(e) => {
                        errors.lock().unwrap().push(e.to_string());
                        continue;
                    }
                };
                let token = lease.fencing_token().0;
                if held.swap(true, Ordering::AcqRel) {
                    violations
                        .lock()
                        .unwrap()
                        .push(format!("token {token} granted while held"));
                }
                let before = last_token.swap(token, Ordering::AcqRel);
                if token <= before {
                    violations
                        .lock()
                        .unwrap()
                        .push(format!("token {token} after {before}"));
                }
                grants.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
                held.store(false, Ordering::Release);
                if let Err(e) = lease.release().await {
                    errors.lock().unwrap().push(format!("release: {e}"));
                }
            }
        }));
    }
    // Let the hand-overs start, then move the slot around every primary and back.
    let migrating = cx.migrating.lock().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let home = cx.cluster.owner_of(slot).await?;
    let mut migrations = Vec::new();
    for step in 1..=4 {
        let to = (home + step) % 3;
        let before = grants.load(Ordering::Relaxed);
        cx.cluster
            .migrate_slot_pausing(slot, to, Duration::from_millis(300))
            .await?;
        migrations.push((to, grants.load(Ordering::Relaxed) - before));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let owner = cx.cluster.owner_of(slot).await?;
    drop(migrating);
    stop.store(true, Ordering::Release);
    for worker in workers {
        worker.await?;
    }
    let violations = violations.lock().unwrap().clone();
    let errors = errors.lock().unwrap().clone();
    let grants = grants.load(Ordering::Relaxed);
    eprintln!(
        "[cluster] {grants} grants; per migration {migrations:?}; {} errors: {errors:?}",
        errors.len()
    );
    ensure!(violations.is_empty(), "{violations:?}");
    ensure!(owner == (home + 4) % 3, "the slot ended on {owner}");
    ensure!(grants >= 20, "only {grants} grants");
    // Every migration let hand-overs continue; a few bounded errors while a slot is split are
    // allowed, a stuck key is not.
    ensure!(
        errors.len() as u64 <= grants,
        "{} errors for {grants} grants: {errors:?}",
        errors.len()
    );
    Ok(())
}

/// On every shard, a release hands the lock to a waiter of another client at once, though the
/// waiter would not poll for 30 s and the lease runs 60 s; then again after the key's slot moved
/// to another primary (the listener subscribes the channel on the new owner).
async fn a_release_wakes_a_waiter_on_every_shard_and_after_a_migration(
    cx: Cx,
) -> anyhow::Result<()> {
    let (a, b) = (cx.client().await?, cx.client().await?);
    let opts = waiting_without_polling(Duration::from_secs(60), Duration::from_secs(20));
    // One key per primary.
    let namespace = unique("wake");
    let mut per_node: Vec<Option<String>> = vec![None; 3];
    for i in 0.. {
        let key = format!("{namespace}/{i}");
        let owner = cx.cluster.owner_of(keys::hash_slot(key.as_bytes())).await?;
        per_node[owner].get_or_insert(key);
        if per_node.iter().all(Option::is_some) {
            break;
        }
    }
    let keys: Vec<String> = per_node.into_iter().flatten().collect();
    for key in &keys {
        hand_over(&a, &b, key, &opts)
            .await
            .with_context(|| key.clone())?;
    }
    let moved = &keys[0];
    let slot = keys::hash_slot(moved.as_bytes());
    let migrating = cx.migrating.lock().await;
    let to = (cx.cluster.owner_of(slot).await? + 1) % 3;
    cx.cluster.migrate_slot(slot, to).await?;
    drop(migrating);
    // The first hand-over after the move may be found by the retried subscription; give the
    // listener its resubscription period, then every hand-over must be prompt.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for _ in 0..3 {
        hand_over(&a, &b, moved, &opts)
            .await
            .with_context(|| format!("{moved} after its slot moved"))?;
    }
    Ok(())
}

/// `holder` takes `key`, `waiter` waits for it; the release must reach the waiter within
/// [`PROMPT`].
async fn hand_over(
    holder: &Arc<RedisLock>,
    waiter: &Arc<RedisLock>,
    key: &str,
    opts: &LockOptions,
) -> anyhow::Result<()> {
    let lease = holder.acquire(key, opts).await?;
    let waiting = {
        let (waiter, key, opts) = (waiter.clone(), key.to_owned(), opts.clone());
        tokio::spawn(async move {
            let lease = waiter.acquire(&key, &opts).await;
            (lease, Instant::now())
        })
    };
    // Long enough for the waiter to be subscribed and waiting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    lease.release().await?;
    let (lease, acquired) = waiting.await?;
    let lease = lease?;
    let took = acquired.saturating_duration_since(released);
    ensure!(
        took <= PROMPT,
        "the waiter got the lock {took:?} after the release"
    );
    lease.release().await?;
    Ok(())
}

/// [`hand_over`] on a key of each of the cluster's three shards.
async fn hand_over_on_every_shard(
    cluster: &RedisCluster,
    holder: &Arc<RedisLock>,
    waiter: &Arc<RedisLock>,
    name: &str,
) -> anyhow::Result<()> {
    let opts = waiting_without_polling(Duration::from_secs(60), Duration::from_secs(20));
    let namespace = unique(name);
    let mut shards = [false; 3];
    for i in 0.. {
        let key = format!("{namespace}/{i}");
        let owner = cluster.owner_of(keys::hash_slot(key.as_bytes())).await?;
        if !shards[owner] {
            hand_over(holder, waiter, &key, &opts)
                .await
                .with_context(|| key.clone())?;
            shards[owner] = true;
        }
        if shards.iter().all(|&s| s) {
            return Ok(());
        }
    }
    unreachable!("the keys never end")
}

/// `redis+cluster://h1,h2,h3?prefix=…` connects like the builder, and the prefix is applied on
/// whichever node the key lands.
async fn a_cluster_url_connects_with_its_settings(cx: Cx) -> anyhow::Result<()> {
    let prefix = unique("url-prefix/");
    let url = format!(
        "redis+cluster://{}?prefix={prefix}&request_timeout=2s",
        cx.cluster.seeds().join(",")
    );
    let client = Arc::new(RedisLockBuilder::from_url(&url)?.connect().await?);
    ensure!(client.is_cluster() && client.endpoint().starts_with("redis+cluster://"));
    let lease = client
        .try_acquire("job", &LockOptions::new(Duration::from_secs(30)))
        .await?
        .context("a fresh key was busy")?;
    let mut found = 0;
    for node in cx.cluster.urls() {
        let mut con = support::raw(&node).await?;
        // A node that does not own the key answers MOVED.
        let exists: redis::RedisResult<bool> = redis::cmd("EXISTS")
            .arg(format!("{prefix}job"))
            .query_async(&mut con)
            .await;
        found += usize::from(exists.unwrap_or(false));
    }
    ensure!(found == 1, "the prefixed key is on {found} nodes");
    lease.release().await?;
    Ok(())
}

/// A client that logs in as an ACL user (through the URL's credentials) works on all three
/// shards, waking included; a wrong password is refused as a permanent error that does not show
/// it.
async fn credentials_log_in_on_every_node_and_a_wrong_password_is_refused_unshown(
    cx: Cx,
) -> anyhow::Result<()> {
    let seeds = cx.cluster.seeds().join(",");
    let url = format!("redis+cluster://{CLUSTER_USER}:{CLUSTER_PASSWORD}@{seeds}");
    let (a, b) = (
        Arc::new(RedisLockBuilder::from_url(&url)?.connect().await?),
        Arc::new(RedisLockBuilder::from_url(&url)?.connect().await?),
    );
    ensure!(!a.endpoint().contains(CLUSTER_PASSWORD), "{}", a.endpoint());
    ensure!(!format!("{a:?}").contains(CLUSTER_PASSWORD));
    hand_over_on_every_shard(&cx.cluster, &a, &b, "auth").await?;
    let wrong = "not-the-password-0451";
    let refused = RedisLockBuilder::cluster(cx.cluster.seeds())
        .with_cluster_username(CLUSTER_USER)
        .with_cluster_password(wrong)
        .connect()
        .await;
    match refused {
        Ok(_) => anyhow::bail!("a wrong password was accepted"),
        Err(e) => {
            let shown = format!("{e} {e:?}");
            ensure!(
                !e.is_temporary(),
                "a wrong password looks temporary: {shown}"
            );
            ensure!(
                !shown.contains(wrong),
                "the error shows the password: {shown}"
            );
        }
    }
    Ok(())
}

/// `rediss+cluster://…?ca=…&cert=…&key=…` reaches every node of a cluster that speaks TLS only
/// (redirects included: the client verifies each node it is sent to), locks and hands over by
/// notification on all three shards; without the authority (the system's roots) it cannot
/// connect.
async fn a_tls_cluster_url_locks_and_wakes_on_every_shard(cx: Cx) -> anyhow::Result<()> {
    let seeds = cx.tls.seeds().join(",");
    let url = format!(
        "rediss+cluster://{seeds}?ca={}&cert={}&key={}",
        cx.certs.ca.display(),
        cx.certs.client_cert.display(),
        cx.certs.client_key.display()
    );
    let (a, b) = (
        Arc::new(RedisLockBuilder::from_url(&url)?.connect().await?),
        Arc::new(RedisLockBuilder::from_url(&url)?.connect().await?),
    );
    ensure!(
        a.endpoint().starts_with("rediss+cluster://"),
        "{}",
        a.endpoint()
    );
    hand_over_on_every_shard(&cx.tls, &a, &b, "tls").await?;
    let untrusted = RedisLockBuilder::from_url(&format!("rediss+cluster://{seeds}"))?
        .with_connect_timeout(Duration::from_secs(2))
        .connect()
        .await;
    ensure!(untrusted.is_err(), "connected without the authority");
    Ok(())
}

/// A name whose lock key hashes to a slot of primary `primary` of `cluster` (an unprefixed
/// client's lock key is the name).
async fn name_on(
    cluster: &RedisCluster,
    primary: usize,
    namespace: &str,
) -> anyhow::Result<String> {
    for i in 0..1000 {
        let name = format!("{namespace}/{i}");
        if cluster.owner_of(keys::hash_slot(name.as_bytes())).await? == primary {
            return Ok(name);
        }
    }
    anyhow::bail!("no name of 1000 lands on primary {primary}")
}

/// Whether `key` exists on the replica at `url` (read there with `READONLY`, which a replica in
/// a cluster needs to answer for its primary's slots).
async fn on_replica(url: &str, key: &str) -> anyhow::Result<bool> {
    let mut con = support::raw(url).await?;
    redis::cmd("READONLY").query_async::<()>(&mut con).await?;
    Ok(redis::cmd("EXISTS").arg(key).query_async(&mut con).await?)
}

/// With `min_replicas=1` (set through the URL), a lock on each of the three shards is granted,
/// extended, released, taken again and evicted; each grant is on its primary's replica by the
/// time it is returned.
/// With `min_replicas`, a permit, a write hold and a leadership are granted, extended and
/// released with each write acknowledged by the primary's replica.
async fn min_replicas_acknowledges_the_primitives(cx: Cx) -> anyhow::Result<()> {
    let _turn = cx.replica_turn.lock().await;
    let url = format!(
        "redis+cluster://{}?min_replicas=1&replica_timeout=2s",
        cx.replicated.seeds().join(",")
    );
    let client: Arc<dyn DistributedLock> =
        Arc::new(RedisLockBuilder::from_url(&url)?.connect().await?);
    let opts = LockOptions::new(Duration::from_secs(30));
    for i in 0..6 {
        let name = unique(&format!("acknowledged-primitive-{i}"));
        let mut permit = client
            .semaphore(&name, 2)?
            .try_acquire(&opts)
            .await?
            .context("a permit")?;
        let mut write = client
            .rw(&name)?
            .try_write(&opts)
            .await?
            .context("a write")?;
        let leader = client
            .election(&name)?
            .try_campaign("here", &opts)
            .await?
            .context("a leadership")?;
        permit.extend(Duration::from_secs(20)).await?;
        write.extend(Duration::from_secs(20)).await?;
        permit.release().await?;
        write.release().await?;
        leader.resign().await?;
    }
    Ok(())
}

async fn min_replicas_grants_extends_and_releases_on_every_shard(cx: Cx) -> anyhow::Result<()> {
    let _turn = cx.replica_turn.lock().await;
    let url = format!(
        "redis+cluster://{}?min_replicas=1&replica_timeout=2s",
        cx.replicated.seeds().join(",")
    );
    let client = Arc::new(RedisLockBuilder::from_url(&url)?.connect().await?);
    let namespace = unique("acknowledged");
    let opts = LockOptions::new(Duration::from_secs(30));
    for (primary, primary_url) in cx.replicated.urls().iter().enumerate() {
        let name = name_on(&cx.replicated, primary, &namespace).await?;
        let mut lease = client
            .try_acquire(&name, &opts)
            .await?
            .context("a fresh key was busy")?;
        let replica = cx.replicated.replica_of(primary)?.endpoint();
        ensure!(
            on_replica(&format!("redis://{replica}"), &name).await?,
            "an acknowledged grant of {name} is not on the replica of primary {primary}"
        );
        lease.extend(Duration::from_secs(20)).await?;
        lease.release().await?;
        let mut con = support::raw(primary_url).await?;
        let exists: bool = redis::cmd("EXISTS")
            .arg(&name)
            .query_async(&mut con)
            .await?;
        ensure!(
            !exists,
            "{name} is still on primary {primary} after its release"
        );
        let again = client.try_acquire(&name, &opts).await?.context("retake")?;
        let evicted = Admin::new(&client)
            .force_unlock(&name, Some(again.fencing_token()))
            .await?;
        ensure!(
            matches!(evicted, Eviction::Evicted(_)),
            "an acknowledged eviction on primary {primary}: {evicted:?}"
        );
    }
    Ok(())
}

/// With the replica of the primary that owns a lock's slot frozen, a grant there is not
/// acknowledged: `Unavailable`, and its key is gone from the primary; a lock on another shard is
/// granted meanwhile. Once the replica is back, the first lock is granted too.
async fn a_grant_its_paused_replica_does_not_acknowledge_is_unavailable_and_leaves_no_key(
    cx: Cx,
) -> anyhow::Result<()> {
    let _turn = cx.replica_turn.lock().await;
    let client = Arc::new(
        RedisLockBuilder::cluster(cx.replicated.seeds())
            .with_min_replicas(1)
            .with_replica_timeout(Duration::from_millis(200))
            .connect()
            .await?,
    );
    let primary = 1;
    let namespace = unique("replica-paused");
    let name = name_on(&cx.replicated, primary, &namespace).await?;
    // A lock on another shard, whose replica is up: its `WAIT` goes to its own primary.
    let elsewhere = name_on(&cx.replicated, 0, &namespace).await?;
    let primary_url = cx.replicated.urls()[primary].clone();
    let replica = cx.replicated.replica_of(primary)?.clone();
    let opts = LockOptions::new(Duration::from_secs(30));
    replica.pause().await?;
    let outcome = client.try_acquire(&name, &opts).await;
    let other_shard = client.try_acquire(&elsewhere, &opts).await;
    let exists = async {
        let mut con = support::raw(&primary_url).await?;
        let exists: bool = redis::cmd("EXISTS")
            .arg(&name)
            .query_async(&mut con)
            .await?;
        anyhow::Ok(exists)
    }
    .await;
    replica.unpause().await?;
    match outcome {
        Err(dlock_core::Error::Unavailable { .. }) => {}
        Err(e) => anyhow::bail!("expected Unavailable, got {e}"),
        Ok(held) => anyhow::bail!("granted without the replica: {}", held.is_some()),
    }
    ensure!(!exists?, "the unacknowledged grant left its key behind");
    other_shard?
        .context("a fresh key on another shard was busy")?
        .release()
        .await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let lease = loop {
        match client.try_acquire(&name, &opts).await {
            Ok(Some(lease)) => break lease,
            Ok(None) => anyhow::bail!("{name} is held after an unacknowledged grant"),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(%e, "the replica is not acknowledging yet");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => anyhow::bail!("no grant after the replica came back: {e}"),
        }
    };
    lease.release().await?;
    Ok(())
}
