//! The shared compliance suite against a real etcd, plus what is particular to etcd: the Go
//! recipe's key layout, exclusion with `etcdctl lock` in both directions, a waiter whose session
//! ends, closing, local turns, and configuration errors.
//!
//! One single-member cluster serves every case; the outage case gets a dedicated one. The
//! freezable client of the lost-signal case reaches the shared member through a [`FreezeProxy`]:
//! freezing it stops the session's keep-alives, so the server expires the lease.
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-etcd --test compliance
//! ```
//!
//! [`FreezeProxy`]: dlock_testkit::FreezeProxy

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use async_trait::async_trait;
use dlock_compliance::{suite, Inspect, Outage, Subject, Timing};
use dlock_core::{
    DistributedLock, DistributedLockExt, Error, FencingToken, Holding, LeaseState, LockOptions,
    LostReason, Released,
};
use dlock_etcd::EtcdLock;
use dlock_testkit::fixtures::{docker_opt_out, EtcdCluster};
use dlock_testkit::url_target;
use libtest_mimic::{Arguments, Trial};
use tokio::time::Instant;

use support::{client, contenders, count, eventually, raw, trial, Exec, NAMESPACE};

/// The session TTL of the suite's clients: the shortest etcd grants with its default election
/// timeout, so a frozen client's locks are freed within a few seconds.
const SESSION_TTL: Duration = Duration::from_secs(2);

struct Stored {
    endpoints: Vec<String>,
}

#[async_trait]
impl Inspect for Stored {
    async fn stored(&self, namespace: &str) -> anyhow::Result<u64> {
        let layout = dlock_etcd::KeyLayout::new(NAMESPACE)?;
        let mut raw = raw(&self.endpoints).await?;
        count(&mut raw, &layout.name_prefix(namespace)).await
    }
}

/// What the registry of backends declares for etcd.
fn declared() -> dlock_core::Capabilities {
    dlock_testkit::registry::capabilities_of("etcd").expect("etcd in the registry")
}

fn subject(
    shared: &EtcdCluster,
    dedicated: &EtcdCluster,
    capabilities: dlock_core::Capabilities,
) -> anyhow::Result<Subject> {
    let endpoints = shared.endpoints();
    let connect = {
        let endpoints = endpoints.clone();
        move || {
            let endpoints = endpoints.clone();
            async move {
                let locks: Arc<dyn DistributedLock> =
                    Arc::new(client(&endpoints, SESSION_TTL).await?);
                Ok(locks)
            }
        }
    };
    let outage_endpoints = dedicated.endpoints();
    let outage = Outage::new(Arc::new(dedicated.member(0)?.clone()), move || {
        let endpoints = outage_endpoints.clone();
        async move {
            let locks: Arc<dyn DistributedLock> = Arc::new(client(&endpoints, SESSION_TTL).await?);
            Ok(locks)
        }
    });
    let frozen_endpoint = endpoints
        .first()
        .cloned()
        .context("the cluster has no endpoint")?;
    let targets = endpoints
        .iter()
        .map(|endpoint| url_target(endpoint, 2379))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Subject::new("etcd", capabilities, connect)
        .with_timing(Timing {
            ttl: Duration::from_secs(1),
            slack: Duration::from_secs(3),
        })
        .with_outage(outage)
        .with_inspect(Arc::new(Stored {
            endpoints: endpoints.clone(),
        }))
        .with_freezable(move || {
            let endpoint = frozen_endpoint.clone();
            async move { support::freezable_client(&endpoint, SESSION_TTL).await }
        })
        .with_proxied(targets, |addrs| async move {
            let endpoints: Vec<String> = addrs.iter().map(|a| format!("http://{a}")).collect();
            let locks: Arc<dyn DistributedLock> = Arc::new(client(&endpoints, SESSION_TTL).await?);
            Ok(locks)
        }))
}

fn main() {
    let args = Arguments::from_args();
    if EtcdCluster::needs_docker() && docker_opt_out() {
        let subject = Subject::new("etcd", declared(), || async {
            anyhow::bail!("DLOCK_TEST_NO_DOCKER=1")
        });
        let trials = suite::trials(&subject)
            .into_iter()
            .map(|t| t.with_ignored_flag(true))
            .collect();
        libtest_mimic::run(&args, trials).exit();
    }
    let runtime = support::fixture_runtime();
    let started = std::time::Instant::now();
    let clusters =
        runtime.block_on(async { tokio::try_join!(EtcdCluster::start(1), EtcdCluster::start(1)) });
    let (shared, dedicated) = match clusters {
        Ok(clusters) => clusters,
        Err(e) => {
            eprintln!("cannot start etcd: {e}");
            std::process::exit(101);
        }
    };
    eprintln!(
        "[timing] two single-member etcd clusters: {:.2?}",
        started.elapsed()
    );
    // The backend declares its own capabilities, which must be the registry's; the suite checks
    // them.
    let capabilities = runtime
        .block_on(client(&shared.endpoints(), SESSION_TTL))
        .and_then(|locks| {
            let own = locks.capabilities();
            ensure!(
                own == declared(),
                "the client declares {own:?}, the registry {:?}",
                declared()
            );
            Ok(own)
        });
    let conclusion = match capabilities.and_then(|c| subject(&shared, &dedicated, c)) {
        Ok(subject) => {
            let mut trials = suite::trials(&subject);
            trials.extend(etcd_trials(&shared));
            libtest_mimic::run(&args, trials)
        }
        Err(e) => {
            eprintln!("cannot build the subject: {e:#}");
            std::process::exit(101);
        }
    };
    runtime.block_on(async {
        let _ = tokio::join!(shared.shutdown(), dedicated.shutdown());
    });
    conclusion.exit();
}

fn etcd_trials(cluster: &EtcdCluster) -> Vec<Trial> {
    let endpoints = cluster.endpoints();
    let container = cluster
        .member(0)
        .map(|m| m.name().to_owned())
        .unwrap_or_default();
    let e = || endpoints.clone();
    let c = || container.clone();
    vec![
        {
            let endpoints = e();
            trial("etcd::contender_keys_follow_the_go_layout", move || {
                contender_keys_follow_the_go_layout(endpoints)
            })
        },
        {
            let (endpoints, container) = (e(), c());
            trial("etcd::etcdctl_holds_and_dlock_waits", move || {
                etcdctl_holds_and_dlock_waits(endpoints, container)
            })
        },
        {
            let (endpoints, container) = (e(), c());
            trial("etcd::dlock_holds_and_etcdctl_waits", move || {
                dlock_holds_and_etcdctl_waits(endpoints, container)
            })
        },
        {
            let endpoints = e();
            trial(
                "etcd::waiter_whose_session_ends_fails_its_acquire",
                move || waiter_whose_session_ends_fails_its_acquire(endpoints),
            )
        },
        {
            let endpoints = e();
            trial(
                "etcd::close_loses_leases_and_frees_locks_at_once",
                move || close_loses_leases_and_frees_locks_at_once(endpoints),
            )
        },
        {
            let endpoints = e();
            trial("etcd::tasks_of_one_client_queue_locally", move || {
                tasks_of_one_client_queue_locally(endpoints)
            })
        },
        {
            let endpoints = e();
            trial(
                "etcd::a_holder_learns_at_once_that_its_key_was_deleted",
                move || a_holder_learns_at_once_that_its_key_was_deleted(endpoints),
            )
        },
        {
            let endpoints = e();
            trial("etcd::hot_key_hand_offs_never_stall", move || {
                hot_key_hand_offs_never_stall(endpoints)
            })
        },
        {
            let endpoints = e();
            trial(
                "etcd::unanswered_keep_alives_make_the_lease_uncertain_then_lost",
                move || unanswered_keep_alives_make_the_lease_uncertain_then_lost(endpoints),
            )
        },
        {
            let endpoints = e();
            trial(
                "etcd::holding_reads_the_holder_without_taking_it",
                move || holding_reads_the_holder_without_taking_it(endpoints),
            )
        },
        trial(
            "etcd::bad_configuration_fails_fast",
            bad_configuration_fails_fast,
        ),
    ]
}

fn key(name: &str) -> String {
    format!("etcd-cases/{:016x}/{name}", rand_u64())
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// `holding` reads who holds a key — free, then the holder's token — and changes nothing: the
/// lock is still the holder's afterwards, and no contender key was added.
async fn holding_reads_the_holder_without_taking_it(endpoints: Vec<String>) -> anyhow::Result<()> {
    let locks = Arc::new(client(&endpoints, SESSION_TTL).await?);
    let observer = Arc::new(client(&endpoints, SESSION_TTL).await?);
    let raw = raw(&endpoints).await?;
    let key = key("holding");
    ensure!(
        observer.holding(&key).await? == Holding::Free,
        "a new key is not free"
    );
    let lease = locks
        .try_acquire(&key, &LockOptions::new(Duration::from_secs(30)))
        .await?
        .context("a free key was busy")?;
    let seen = observer.holding(&key).await?;
    ensure!(
        seen == Holding::Held {
            fencing: Some(lease.fencing_token()),
            expires_in: None
        },
        "holding() saw {seen:?}, the holder has token {}",
        lease.fencing_token()
    );
    ensure!(
        contenders(&raw, &locks, &key).await?.len() == 1,
        "looking added a contender"
    );
    lease.release().await?;
    ensure!(
        observer.holding(&key).await? == Holding::Free,
        "a released key is not free"
    );
    Ok(())
}

/// Our contender key is `<name>/<session lease in hex>`, attached to the session lease, holding
/// the owner token, and its create revision is the fencing token.
async fn contender_keys_follow_the_go_layout(endpoints: Vec<String>) -> anyhow::Result<()> {
    let locks = client(&endpoints, SESSION_TTL).await?;
    let raw = raw(&endpoints).await?;
    let key = key("layout/with/slashes");
    let lease = Arc::new(locks.clone())
        .acquire(&key, &LockOptions::new(Duration::from_secs(30)))
        .await?;
    let session = locks.session_lease().context("no session")?;
    let name = locks.lock_name(&key)?;
    ensure!(
        name.starts_with(NAMESPACE) && !name[NAMESPACE.len()..].contains('/'),
        "lock name {name:?}"
    );
    let stored = contenders(&raw, &locks, &key).await?;
    ensure!(stored.len() == 1, "contenders: {stored:?}");
    let (k, value, create_revision, key_lease) = &stored[0];
    ensure!(
        *k == format!("{name}/{session:x}"),
        "key {k:?}, session {session:x}"
    );
    ensure!(*key_lease == session, "attached to lease {key_lease:x}");
    ensure!(
        *value == lease.owner().to_hex(),
        "value is not the owner token"
    );
    ensure!(
        lease.fencing_token().get() == u64::try_from(*create_revision)?,
        "token {} but create revision {create_revision}",
        lease.fencing_token()
    );
    ensure!(lease.release().await? == Released::Released);
    ensure!(contenders(&raw, &locks, &key).await?.is_empty());
    Ok(())
}

/// `etcdctl lock` holds: dlock reports busy, waits, and gets the lock only after etcdctl's
/// critical section (which ends by writing a marker) is over.
async fn etcdctl_holds_and_dlock_waits(
    endpoints: Vec<String>,
    container: String,
) -> anyhow::Result<()> {
    let locks = Arc::new(client(&endpoints, SESSION_TTL).await?);
    let mut raw = raw(&endpoints).await?;
    let key = key("etcdctl-first");
    let name = locks.lock_name(&key)?;
    let marker = format!("{name}-marker");
    let script = format!("sleep 2; etcdctl --endpoints=http://127.0.0.1:2379 put {marker} done");
    let etcdctl = Exec::start(
        &container,
        support::etcdctl(&["lock", &name, "--", "sh", "-c", &script]),
    )
    .await?;
    eventually("etcdctl holds the lock", Duration::from_secs(10), || {
        let (locks, key) = (locks.clone(), key.clone());
        let raw = raw.clone();
        async move { Ok(!contenders(&raw, &locks, &key).await?.is_empty()) }
    })
    .await?;
    let opts = LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(15));
    ensure!(
        locks.try_acquire(&key, &opts).await?.is_none(),
        "try_acquire took a lock etcdctl holds"
    );
    // A read-only look names etcdctl's key's create revision as the holder's token.
    let etcdctl_revision = contenders(&raw, &locks, &key).await?[0].2;
    let seen = locks.holding(&key).await?;
    ensure!(
        matches!(seen, Holding::Held { fencing: Some(FencingToken(t)), .. } if t == etcdctl_revision.unsigned_abs()),
        "holding() saw {seen:?}; etcdctl's key was created at revision {etcdctl_revision}"
    );
    let lease = locks.acquire(&key, &opts).await?;
    let seen = raw.get(marker.as_str(), None).await?;
    ensure!(
        seen.kvs().first().map(|kv| kv.value()) == Some(b"done".as_slice()),
        "dlock got the lock before etcdctl's critical section ended"
    );
    let output = etcdctl.finish(Duration::from_secs(10)).await?;
    ensure!(!output.contains("Error"), "etcdctl: {output}");
    lease.release().await?;
    raw.delete(marker, None).await?;
    Ok(())
}

/// dlock holds: `etcdctl lock` waits until dlock releases, then runs its command.
async fn dlock_holds_and_etcdctl_waits(
    endpoints: Vec<String>,
    container: String,
) -> anyhow::Result<()> {
    let locks = Arc::new(client(&endpoints, SESSION_TTL).await?);
    let mut raw = raw(&endpoints).await?;
    let key = key("dlock-first");
    let name = locks.lock_name(&key)?;
    let marker = format!("{name}-marker");
    let lease = locks
        .acquire(&key, &LockOptions::new(Duration::from_secs(30)))
        .await?;
    let script =
        format!("etcdctl --endpoints=http://127.0.0.1:2379 put {marker} \"$ETCD_LOCK_KEY\"");
    let etcdctl = Exec::start(
        &container,
        support::etcdctl(&["lock", &name, "--", "sh", "-c", &script]),
    )
    .await?;
    eventually("etcdctl queues behind us", Duration::from_secs(10), || {
        let (locks, key) = (locks.clone(), key.clone());
        let raw = raw.clone();
        async move { Ok(contenders(&raw, &locks, &key).await?.len() == 2) }
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let early = raw.get(marker.as_str(), None).await?;
    ensure!(
        early.kvs().is_empty(),
        "etcdctl ran its command while dlock held the lock"
    );
    let token = lease.fencing_token().get();
    ensure!(lease.release().await? == Released::Released);
    let output = etcdctl.finish(Duration::from_secs(15)).await?;
    let after = raw.get(marker.as_str(), None).await?;
    let Some(kv) = after.kvs().first() else {
        bail!("etcdctl never ran its command: {output}");
    };
    let etcdctl_key = kv.value_str()?.to_owned();
    ensure!(
        etcdctl_key.starts_with(&format!("{name}/")),
        "etcdctl locked {etcdctl_key:?}"
    );
    ensure!(
        u64::try_from(kv.mod_revision())? > token,
        "etcdctl's critical section predates our token"
    );
    raw.delete(marker, None).await?;
    Ok(())
}

/// A waiter whose session lease is revoked behind its back fails its acquire at once; the
/// holder is unaffected, and the next contender does not wait for the dead waiter.
async fn waiter_whose_session_ends_fails_its_acquire(endpoints: Vec<String>) -> anyhow::Result<()> {
    let holder = Arc::new(client(&endpoints, SESSION_TTL).await?);
    let waiter = Arc::new(client(&endpoints, SESSION_TTL).await?);
    let third = Arc::new(client(&endpoints, SESSION_TTL).await?);
    let mut raw = raw(&endpoints).await?;
    let key = key("doomed-waiter");
    let opts = LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(30));
    let lease = holder.acquire(&key, &opts).await?;
    let waiting = {
        let (waiter, key, opts) = (waiter.clone(), key.clone(), opts.clone());
        tokio::spawn(async move { waiter.acquire(&key, &opts).await })
    };
    eventually("the waiter queues", Duration::from_secs(5), || {
        let (locks, key) = (holder.clone(), key.clone());
        let raw = raw.clone();
        async move { Ok(contenders(&raw, &locks, &key).await?.len() == 2) }
    })
    .await?;
    let doomed = waiter.session_lease().context("waiter has no session")?;
    let revoked_at = Instant::now();
    raw.lease_revoke(doomed).await?;
    let outcome = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .context("the waiter kept waiting after its session ended")??;
    match outcome {
        Err(Error::Lost {
            reason: LostReason::SessionEnded,
            ..
        }) => {}
        Err(other) => bail!("the waiter failed with {other}, not a lost session"),
        Ok(_) => bail!("the waiter was granted the lock with its session gone"),
    }
    eprintln!(
        "waiter failed {:?} after its lease was revoked",
        revoked_at.elapsed()
    );
    ensure!(lease.is_held(), "the holder's lease is {:?}", lease.state());
    ensure!(lease.release().await? == Released::Released);
    let start = Instant::now();
    let next = third
        .acquire(&key, &opts.clone().with_wait(Duration::from_secs(3)))
        .await?;
    ensure!(
        start.elapsed() < Duration::from_secs(1),
        "the dead waiter was in the way"
    );
    next.release().await?;
    // The waiter's client recovers with a new session.
    let again = waiter.acquire(&key, &opts).await?;
    ensure!(
        waiter.session_lease() != Some(doomed),
        "the dead session was reused"
    );
    again.release().await?;
    Ok(())
}

/// Closing a client loses its leases at once and revokes its session, so others get its locks
/// without waiting for any TTL.
async fn close_loses_leases_and_frees_locks_at_once(endpoints: Vec<String>) -> anyhow::Result<()> {
    let closing = Arc::new(client(&endpoints, Duration::from_secs(30)).await?);
    let other = Arc::new(client(&endpoints, SESSION_TTL).await?);
    let opts = LockOptions::new(Duration::from_secs(60));
    let keys = [key("closed/a"), key("closed/b")];
    let mut leases = Vec::new();
    for k in &keys {
        leases.push(closing.acquire(k, &opts).await?);
    }
    let signals: Vec<_> = leases.iter().map(|l| l.lost()).collect();
    closing.close().await?;
    for signal in signals {
        let reason = tokio::time::timeout(Duration::from_secs(1), signal)
            .await
            .context("a lease of a closed client did not report its loss")?;
        ensure!(reason == LostReason::SessionEnded, "lost because {reason}");
    }
    for k in &keys {
        let lease = other.try_acquire(k, &opts).await?;
        ensure!(lease.is_some(), "{k} is still held after close");
    }
    match closing.try_acquire(&keys[0], &opts).await {
        Err(Error::Backend {
            temporary: false, ..
        }) => {}
        other => bail!("acquire on a closed client gave {other:?}"),
    }
    Ok(())
}

/// Many tasks of one client on one key: one at a time, tokens growing, and only one contender
/// key of this client on the server at any moment (no local herd).
async fn tasks_of_one_client_queue_locally(endpoints: Vec<String>) -> anyhow::Result<()> {
    let locks = Arc::new(client(&endpoints, SESSION_TTL).await?);
    let key = key("local-queue");
    let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let opts = LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(60));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (locks, key, opts, inside, tokens) = (
            locks.clone(),
            key.clone(),
            opts.clone(),
            inside.clone(),
            tokens.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let lease = locks.acquire(&key, &opts).await?;
                ensure!(
                    inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0,
                    "overlap"
                );
                tokens.lock().unwrap().push(lease.fencing_token());
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                lease.release().await?;
            }
            anyhow::Ok(())
        }));
    }
    let raw = raw(&endpoints).await?;
    let mut most = 0;
    while tasks.iter().any(|t| !t.is_finished()) {
        most = most.max(contenders(&raw, &locks, &key).await?.len());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for task in tasks {
        task.await??;
    }
    ensure!(most <= 1, "{most} contender keys of one client at once");
    let tokens = tokens.lock().unwrap().clone();
    ensure!(tokens.len() == 40, "{} acquisitions", tokens.len());
    ensure!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens did not grow: {tokens:?}"
    );
    Ok(())
}

/// Bad settings are rejected by name before anything is sent; an unreachable endpoint fails
/// within the connect timeout; a password never shows.
async fn bad_configuration_fails_fast() -> anyhow::Result<()> {
    for (url, field) in [
        ("http://127.0.0.1:2379", "url"),
        ("etcd://", "url"),
        ("etcd://user:hunter2@127.0.0.1:notaport", "endpoints"),
        ("etcd://127.0.0.1:2379?session_ttl=0", "session_ttl"),
        ("etcd://127.0.0.1:2379?lease=5", "url"),
    ] {
        match EtcdLock::connect(url).await {
            Err(Error::InvalidInput { field: f, message }) => {
                ensure!(f == field, "{url}: field {f}, expected {field}");
                ensure!(!message.contains("hunter2"), "{message}");
            }
            other => bail!("{url}: expected InvalidInput, got {other:?}"),
        }
    }
    // A port nobody listens on: an error, within the connect timeout.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let start = Instant::now();
    let result = EtcdLock::builder()
        .with_endpoint(dead.to_string())
        .with_credentials("app", "hunter2")
        .with_connect_timeout(Duration::from_secs(2))
        .connect()
        .await;
    let took = start.elapsed();
    match result {
        Err(e) => {
            ensure!(e.is_temporary(), "unreachable endpoint: {e}");
            ensure!(!format!("{e} {e:?}").contains("hunter2"), "{e:?}");
        }
        Ok(locks) => bail!("connected to nothing: {locks:?}"),
    }
    ensure!(took < Duration::from_secs(4), "took {took:?} to fail");
    Ok(())
}

/// etcd's server-side `Unlock` deletes whatever key it is given. When someone uses it (or
/// `etcdctl del`) on our key, the holder's lost signal fires at once — not at the next
/// keep-alive, which would never tell, since the session lives on — and its late fenced write is
/// rejected after the next holder's.
async fn a_holder_learns_at_once_that_its_key_was_deleted(
    endpoints: Vec<String>,
) -> anyhow::Result<()> {
    let holder = Arc::new(client(&endpoints, SESSION_TTL).await?);
    let next = Arc::new(client(&endpoints, SESSION_TTL).await?);
    let raw = raw(&endpoints).await?;
    let key = key("deleted-behind-its-back");
    let opts = LockOptions::new(Duration::from_secs(60)).with_wait(Duration::from_secs(10));
    let lease = holder.acquire(&key, &opts).await?;
    let resource = dlock_core::Fenced::new(Vec::new());
    resource.write(lease.fencing_token(), |log| log.push("holder"))?;
    let waiting = {
        let (next, key, opts) = (next.clone(), key.clone(), opts.clone());
        tokio::spawn(async move { next.acquire(&key, &opts).await })
    };
    let stored = contenders(&raw, &holder, &key).await?;
    let (ours, ..) = stored.first().context("no contender key")?.clone();
    let signal = lease.lost();
    let deleted_at = Instant::now();
    raw.lock_client().unlock(ours).await?;
    let reason = tokio::time::timeout(Duration::from_secs(1), signal)
        .await
        .context("the holder did not learn that its key was deleted")?;
    eprintln!(
        "lost signal {:?} after the deletion ({reason})",
        deleted_at.elapsed()
    );
    let successor = waiting.await??;
    resource.write(successor.fencing_token(), |log| log.push("successor"))?;
    ensure!(
        resource
            .write(lease.fencing_token(), |log| log.push("late"))
            .is_err(),
        "the old holder's late write was admitted"
    );
    ensure!(lease.release().await? != Released::Released);
    ensure!(successor.release().await? == Released::Released);
    Ok(())
}

/// Four clients hand one hot key round and round, so that releases race with waiters arming
/// their watches. A lost wake-up would leave a waiter stuck until its (short) deadline.
async fn hot_key_hand_offs_never_stall(endpoints: Vec<String>) -> anyhow::Result<()> {
    const CLIENTS: usize = 4;
    const ROUNDS: usize = 60;
    let key = key("hot");
    let opts = LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(10));
    let mut tasks = Vec::new();
    for id in 0..CLIENTS {
        let locks = Arc::new(client(&endpoints, SESSION_TTL).await?);
        let (key, opts) = (key.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let lease = locks
                    .acquire(&key, &opts)
                    .await
                    .with_context(|| format!("client {id}, round {round}"))?;
                lease.release().await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// The holder's connection freezes (a partition between it and the cluster): its keep-alives go
/// unanswered, so the lease turns uncertain, then lost when the session's confirmed end passes —
/// before the server lets anyone else take the lock. Thawing does not revive it, and the client
/// carries on with a new session.
async fn unanswered_keep_alives_make_the_lease_uncertain_then_lost(
    endpoints: Vec<String>,
) -> anyhow::Result<()> {
    let endpoint = endpoints.first().context("no endpoint")?.clone();
    let (holder, freeze) = support::freezable_client(&endpoint, SESSION_TTL).await?;
    let other = Arc::new(client(&endpoints, SESSION_TTL).await?);
    let key = key("uncertain");
    let opts = LockOptions::new(Duration::from_secs(60)).with_wait(Duration::from_secs(15));
    let lease = holder.acquire(&key, &opts).await?;
    ensure!(lease.is_held(), "fresh lease is {:?}", lease.state());
    let lost = lease.lost();
    let lost_at = tokio::spawn(async move { (lost.await, Instant::now()) });
    freeze.freeze();
    let frozen_at = Instant::now();
    eventually("the lease turns uncertain", SESSION_TTL * 2, || {
        let uncertain = matches!(
            lease.state(),
            LeaseState::Uncertain { .. } | LeaseState::Lost(_)
        );
        async move { Ok(uncertain) }
    })
    .await?;
    ensure!(
        matches!(lease.state(), LeaseState::Uncertain { .. }),
        "went straight to {:?}",
        lease.state()
    );
    let uncertain_after = frozen_at.elapsed();
    let next = other.acquire(&key, &opts).await?;
    let taken_at = Instant::now();
    let (reason, lost_at) = tokio::time::timeout(Duration::from_secs(1), lost_at)
        .await
        .context("another client holds the lock but the lease is not lost")??;
    ensure!(
        lost_at <= taken_at,
        "lost ({reason}) {:?} after another client took the lock",
        lost_at - taken_at
    );
    eprintln!(
        "uncertain {uncertain_after:?} after the freeze, lost after {:?}, taken over after {:?}",
        lost_at - frozen_at,
        taken_at - frozen_at
    );
    freeze.thaw();
    tokio::time::sleep(SESSION_TTL / 2).await;
    ensure!(
        lease.state().is_lost(),
        "thawed lease is {:?}",
        lease.state()
    );
    ensure!(lease.release().await? != Released::Released);
    ensure!(next.release().await? == Released::Released);
    let again = holder.acquire(&key, &opts).await?;
    again.release().await?;
    Ok(())
}
