//! etcd-specific cases, beyond the shared suite: the Go recipe's key layout, exclusion with
//! `etcdctl lock` in both directions, a waiter whose session ends, closing, local turns, a key
//! deleted behind the holder's back, unanswered keep-alives, configuration errors, and the
//! operator's view: owner records read with `etcdctl get`, the queue in serving order beside
//! `etcdctl lock`, listing by prefix, and fenced eviction of a dlock or a peer holder.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use dlock_core::inspect::{Eviction, Holder, Holding};
use dlock_core::{
    Admin, DistributedLock, DistributedLockExt, Error, FencingToken, LeaseState, LockOptions,
    LostReason, OwnerRecord, Released,
};
use dlock_etcd::EtcdLock;
use dlock_testkit::case;
use dlock_testkit::fixtures::EtcdCluster;
use dlock_testkit::trials::{self, Case};
use libtest_mimic::Trial;
use tokio::time::Instant;

use crate::support::{
    self, client, clients, contenders, contenders_until, eventually, labelled_client, raw, Exec,
    NAMESPACE, TRIAL_BUDGET,
};
use crate::SESSION_TTL;

#[path = "primitive_cases.rs"]
mod primitives;

/// What the cases need to know about the shared cluster.
#[derive(Debug, Clone)]
pub struct Env {
    /// The shared member's client endpoints.
    endpoints: Vec<String>,
    /// Its container, for `docker exec`.
    container: String,
}

fn cases() -> Vec<(&'static str, Case<Env>)> {
    vec![
        case!(holding_reads_the_holder_without_taking_it),
        case!(contender_keys_follow_the_go_layout),
        case!(a_late_delete_of_an_earlier_holding_spares_the_next),
        case!(a_key_an_abandoned_acquire_left_is_cleared_by_the_next),
        case!(etcdctl_holds_and_dlock_waits),
        case!(dlock_holds_and_etcdctl_waits),
        case!(waiter_whose_session_ends_fails_its_acquire),
        case!(close_loses_leases_and_frees_locks_at_once),
        case!(tasks_of_one_client_queue_locally),
        case!(bad_configuration_fails_fast),
        case!(a_holder_learns_at_once_that_its_key_was_deleted),
        case!(hot_key_hand_offs_never_stall),
        case!(unanswered_keep_alives_make_the_lease_uncertain_then_lost),
        case!(etcdctl_get_reads_the_owner_record),
        case!(inspect_shows_the_queue_in_serving_order),
        case!(list_finds_the_dlock_locks_under_a_prefix),
        case!(evicting_a_paused_holder_fences_it_out),
        case!(a_peer_holder_has_no_record_and_can_be_evicted),
        case!(primitives::election_keys_follow_the_go_layout),
        case!(primitives::etcdctl_leads_and_dlock_waits),
        case!(primitives::dlock_leads_and_etcdctl_waits),
        case!(primitives::semaphore_permits_and_mismatch),
        case!(primitives::rw_lock_queues_writers_fairly),
        case!(primitives::cancelled_acquires_leave_no_key),
        case!(primitives::permits_return_at_the_ttl_and_when_a_client_is_cut_off),
        case!(primitives::close_ends_the_grants_at_once),
        case!(primitives::losing_the_session_loses_the_grants),
    ]
}

/// The etcd-specific trial names, for a run that opted out of Docker.
pub fn names() -> Vec<String> {
    trials::names("etcd", &cases())
}

/// The etcd-specific trials against the shared cluster.
pub fn etcd_trials(cluster: &EtcdCluster) -> Vec<Trial> {
    let env = Env {
        endpoints: cluster.endpoints(),
        container: cluster
            .member(0)
            .map(|m| m.name().to_owned())
            .unwrap_or_default(),
    };
    trials::cases("etcd", &cases(), &env, TRIAL_BUDGET)
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
async fn holding_reads_the_holder_without_taking_it(
    Env { endpoints, .. }: Env,
) -> anyhow::Result<()> {
    let [locks, observer] = clients(&endpoints, SESSION_TTL).await?;
    let raw = raw(&endpoints).await?;
    let key = key("holding");
    let opts = LockOptions::new(Duration::from_secs(30));
    let lease = trials::ensure_holding_sees(&locks, &observer, &key, &opts).await?;
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

/// Our contender key is `<name>/<session lease in hex>_<owner token in hex>` (Go's key, named
/// after the acquire too), attached to the session lease, holding this process's owner record
/// with the same owner token, and its create revision is the fencing token.
async fn contender_keys_follow_the_go_layout(Env { endpoints, .. }: Env) -> anyhow::Result<()> {
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
    let token = k
        .strip_prefix(&format!("{name}/{session:x}_"))
        .with_context(|| format!("key {k:?}, session {session:x}"))?;
    ensure!(
        token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "key {k:?} does not end in an owner token"
    );
    ensure!(
        value.contains(&format!("\"token\":\"{token}\"")),
        "key {k:?} names another acquire than its value {value}"
    );
    ensure!(*key_lease == session, "attached to lease {key_lease:x}");
    let record = OwnerRecord::parse(value.as_bytes()).context("value is not an owner record")?;
    ensure!(record.pid == std::process::id(), "record {value}");
    ensure!(
        lease.fencing_token().get() == u64::try_from(*create_revision)?,
        "token {} but create revision {create_revision}",
        lease.fencing_token()
    );
    ensure!(lease.release().await? == Released::Released);
    ensure!(contenders(&raw, &locks, &key).await?.is_empty());
    Ok(())
}

/// A release is a plain delete of the holding's key, and a delete can reach the server late (its
/// answer lost, or held up at a member cut off from its leader). The late delete of an earlier
/// holding's key must not end a later holding of the same client on the same lock: no two
/// acquires write the same key.
async fn a_late_delete_of_an_earlier_holding_spares_the_next(
    Env { endpoints, .. }: Env,
) -> anyhow::Result<()> {
    let locks = Arc::new(client(&endpoints, SESSION_TTL).await?);
    let raw = raw(&endpoints).await?;
    let key = key("late-delete");
    let opts = LockOptions::new(Duration::from_secs(30));
    let earlier = locks.acquire(&key, &opts).await?;
    let stored = contenders(&raw, &locks, &key).await?;
    ensure!(stored.len() == 1, "contenders: {stored:?}");
    let earlier_key = stored[0].0.clone();
    ensure!(earlier.release().await? == Released::Released);
    let later = locks.acquire(&key, &opts).await?;
    // What the earlier release would do if it reached the server now.
    raw.clone().delete(earlier_key.as_str(), None).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(
        later.state().is_held(),
        "the later holding is {} after a late delete of the earlier key",
        later.state()
    );
    let stored = contenders(&raw, &locks, &key).await?;
    ensure!(
        stored.len() == 1 && stored[0].0 != earlier_key,
        "contenders: {stored:?}"
    );
    ensure!(later.release().await? == Released::Released);
    ensure!(contenders(&raw, &locks, &key).await?.is_empty());
    Ok(())
}

/// A key of this client's session that no acquire claims (an abandoned acquire's, whose
/// withdrawal never reached the server) stands in the lock's queue; the client's next acquire —
/// waiting or not — deletes it rather than wait behind it until the session ends.
async fn a_key_an_abandoned_acquire_left_is_cleared_by_the_next(
    Env { endpoints, .. }: Env,
) -> anyhow::Result<()> {
    let locks = Arc::new(client(&endpoints, SESSION_TTL).await?);
    let mut raw = raw(&endpoints).await?;
    let session = locks.session_lease().context("no session")?;
    let leave = |raw: &mut etcd_client::Client, key: &str, token: u128| {
        let name = locks.lock_name(key);
        let mut raw = raw.clone();
        async move {
            let left = format!("{}/{session:x}_{token:032x}", name?);
            let put = etcd_client::PutOptions::new().with_lease(session);
            raw.put(left.as_str(), "{}", Some(put)).await?;
            anyhow::Ok(left)
        }
    };
    for (key, wait) in [("left-behind-wait", true), ("left-behind-try", false)] {
        let key = self::key(key);
        let left = leave(&mut raw, &key, 0x1eff_0000 + u128::from(wait)).await?;
        let opts = LockOptions::new(Duration::from_secs(30));
        let lease = if wait {
            locks
                .acquire(&key, &opts.with_wait(Duration::from_secs(5)))
                .await
                .with_context(|| format!("acquire behind {left}"))?
        } else {
            locks
                .try_acquire(&key, &opts)
                .await?
                .with_context(|| format!("try_acquire found the lock busy with {left}"))?
        };
        let stored = contenders(&raw, &locks, &key).await?;
        ensure!(
            stored.len() == 1 && stored[0].0 != left,
            "contenders: {stored:?}"
        );
        ensure!(lease.release().await? == Released::Released);
    }
    Ok(())
}

/// What a case against `etcdctl lock` works with: a dlock client, a raw client, the case's key,
/// the etcd lock name etcdctl is given for it, and a marker key named after that lock, which
/// etcdctl's command writes.
type Interop = (Arc<EtcdLock>, etcd_client::Client, String, String, String);

async fn interop(endpoints: &[String], key_name: &str) -> anyhow::Result<Interop> {
    let locks = Arc::new(client(endpoints, SESSION_TTL).await?);
    let raw = raw(endpoints).await?;
    let key = key(key_name);
    let name = locks.lock_name(&key)?;
    let marker = format!("{name}-marker");
    Ok((locks, raw, key, name, marker))
}

/// Starts `etcdctl lock <name> -- sh -c <script>` in the server's `container`.
async fn etcdctl_lock(container: &str, name: &str, script: &str) -> anyhow::Result<Exec> {
    Exec::start(
        container,
        support::etcdctl(&["lock", name, "--", "sh", "-c", script]),
    )
    .await
}

/// `etcdctl lock` holds: dlock reports busy, waits, and gets the lock only after etcdctl's
/// critical section (which ends by writing a marker) is over.
async fn etcdctl_holds_and_dlock_waits(env: Env) -> anyhow::Result<()> {
    let (locks, mut raw, key, name, marker) = interop(&env.endpoints, "etcdctl-first").await?;
    let script = format!("sleep 2; etcdctl --endpoints=http://127.0.0.1:2379 put {marker} done");
    let etcdctl = etcdctl_lock(&env.container, &name, &script).await?;
    contenders_until(
        "etcdctl holds the lock",
        Duration::from_secs(10),
        &raw,
        &locks,
        &key,
        |n| n > 0,
    )
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
        matches!(&seen, Holding::Held(h) if h.fencing == Some(FencingToken(etcdctl_revision.unsigned_abs()))),
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
async fn dlock_holds_and_etcdctl_waits(env: Env) -> anyhow::Result<()> {
    let (locks, mut raw, key, name, marker) = interop(&env.endpoints, "dlock-first").await?;
    let lease = locks
        .acquire(&key, &LockOptions::new(Duration::from_secs(30)))
        .await?;
    let script =
        format!("etcdctl --endpoints=http://127.0.0.1:2379 put {marker} \"$ETCD_LOCK_KEY\"");
    let etcdctl = etcdctl_lock(&env.container, &name, &script).await?;
    contenders_until(
        "etcdctl queues behind us",
        Duration::from_secs(10),
        &raw,
        &locks,
        &key,
        |n| n == 2,
    )
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
async fn waiter_whose_session_ends_fails_its_acquire(
    Env { endpoints, .. }: Env,
) -> anyhow::Result<()> {
    let [holder, waiter, third] = clients(&endpoints, SESSION_TTL).await?;
    let mut raw = raw(&endpoints).await?;
    let key = key("doomed-waiter");
    let opts = LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(30));
    let lease = holder.acquire(&key, &opts).await?;
    let waiting = {
        let (waiter, key, opts) = (waiter.clone(), key.clone(), opts.clone());
        tokio::spawn(async move { waiter.acquire(&key, &opts).await })
    };
    contenders_until(
        "the waiter queues",
        Duration::from_secs(5),
        &raw,
        &holder,
        &key,
        |n| n == 2,
    )
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
async fn close_loses_leases_and_frees_locks_at_once(
    Env { endpoints, .. }: Env,
) -> anyhow::Result<()> {
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
async fn tasks_of_one_client_queue_locally(Env { endpoints, .. }: Env) -> anyhow::Result<()> {
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
async fn bad_configuration_fails_fast(_: Env) -> anyhow::Result<()> {
    for (url, field) in [
        ("http://127.0.0.1:2379", "url"),
        ("etcd://", "url"),
        ("etcd://user:hunter2@127.0.0.1:notaport", "endpoints"),
        (
            "etcd://127.0.0.1:2379?session_timeout=0s",
            "session_timeout",
        ),
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
    Env { endpoints, .. }: Env,
) -> anyhow::Result<()> {
    let [holder, next] = clients(&endpoints, SESSION_TTL).await?;
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
async fn hot_key_hand_offs_never_stall(Env { endpoints, .. }: Env) -> anyhow::Result<()> {
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
    Env { endpoints, .. }: Env,
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
    trials::ensure_stays_lost(lease, SESSION_TTL / 2).await?;
    ensure!(next.release().await? == Released::Released);
    let again = holder.acquire(&key, &opts).await?;
    again.release().await?;
    Ok(())
}

/// The owner record of this process, from a stored value; fails unless it has `label`.
fn record_of(value: &[u8], label: &str) -> anyhow::Result<OwnerRecord> {
    let record = OwnerRecord::parse(value)
        .with_context(|| format!("not an owner record: {:?}", String::from_utf8_lossy(value)))?;
    ensure!(record.pid == std::process::id(), "pid in {record:?}");
    ensure!(
        record.label.as_deref() == Some(label),
        "label in {record:?}"
    );
    Ok(record)
}

/// The labels of a holder's queue, in serving order (`None` for a waiter without a record).
fn queue_labels(holder: &Holder) -> Vec<Option<String>> {
    holder
        .queue
        .iter()
        .map(|w| w.owner.as_ref().and_then(|o| o.label.clone()))
        .collect()
}

/// `etcdctl get` of the contender key prints the owner record: one line of JSON with this
/// process's pid and the client's label, which `inspect` reads back.
async fn etcdctl_get_reads_the_owner_record(env: Env) -> anyhow::Result<()> {
    let locks = labelled_client(&env.endpoints, SESSION_TTL, "etcd-billing").await?;
    let raw = raw(&env.endpoints).await?;
    let key = key("owner-record");
    let lease = locks
        .acquire(&key, &LockOptions::new(Duration::from_secs(30)))
        .await?;
    let stored = contenders(&raw, &locks, &key).await?;
    let (contender, ..) = stored.first().context("no contender key")?;
    let get = Exec::start(
        &env.container,
        support::etcdctl(&["get", contender, "--print-value-only"]),
    )
    .await?;
    let printed = get.finish(Duration::from_secs(10)).await?;
    let line = printed.trim();
    ensure!(!line.contains('\n'), "more than one line: {printed:?}");
    let record = record_of(line.as_bytes(), "etcd-billing")?;
    let seen = locks.holding(&key).await?;
    let holder = seen.holder().context("not held")?;
    ensure!(
        holder.owner.as_ref() == Some(&record),
        "inspect saw {seen:?}"
    );
    ensure!(
        holder.fencing == Some(lease.fencing_token()) && holder.expires_in.is_none(),
        "{seen:?}"
    );
    lease.release().await?;
    ensure!(contenders(&raw, &locks, &key).await?.is_empty());
    // A bad label is refused before anything is sent.
    match EtcdLock::builder()
        .with_endpoints(env.endpoints.iter().cloned())
        .with_owner("two\nlines")
        .connect()
        .await
    {
        Err(Error::InvalidInput { field: "owner", .. }) => Ok(()),
        other => bail!("a label with a newline gave {other:?}"),
    }
}

/// Two waiting dlock clients and an `etcdctl lock` between them: `inspect` shows the holder and
/// the three waiters in the order they are served, etcdctl's without a record, and that is the
/// order in which they get the lock.
async fn inspect_shows_the_queue_in_serving_order(env: Env) -> anyhow::Result<()> {
    let holder = labelled_client(&env.endpoints, SESSION_TTL, "holder").await?;
    let first = labelled_client(&env.endpoints, SESSION_TTL, "first").await?;
    let second = labelled_client(&env.endpoints, SESSION_TTL, "second").await?;
    let raw = raw(&env.endpoints).await?;
    let key = key("queue");
    let name = holder.lock_name(&key)?;
    let marker = format!("{name}-marker");
    let opts = LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(30));
    let lease = holder.acquire(&key, &opts).await?;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    // Each dlock waiter notes, once it holds the lock, whether etcdctl has run its command.
    let wait = |locks: Arc<EtcdLock>, label: &'static str| {
        let (key, opts, order) = (key.clone(), opts.clone(), order.clone());
        let (mut raw, marker) = (raw.clone(), marker.clone());
        tokio::spawn(async move {
            let lease = locks.acquire(&key, &opts).await?;
            let etcdctl_ran = !raw.get(marker, None).await?.kvs().is_empty();
            order.lock().unwrap().push((label, etcdctl_ran));
            anyhow::Ok(lease.release().await?)
        })
    };
    let queued = |n: usize, what: &'static str| {
        contenders_until(
            what,
            Duration::from_secs(10),
            &raw,
            &holder,
            &key,
            move |c| c == n,
        )
    };
    let first_waits = wait(first, "first");
    queued(2, "the first dlock waiter queues").await?;
    let script = format!("etcdctl --endpoints=http://127.0.0.1:2379 put {marker} done");
    let etcdctl = Exec::start(
        &env.container,
        support::etcdctl(&["lock", &name, "--", "sh", "-c", &script]),
    )
    .await?;
    queued(3, "etcdctl queues").await?;
    let second_waits = wait(second, "second");
    queued(4, "the second dlock waiter queues").await?;

    let seen = holder.holding(&key).await?;
    let shown = seen.holder().context("not held")?;
    ensure!(shown.fencing == Some(lease.fencing_token()), "{seen:?}");
    let owner = shown.owner.as_ref().context("the holder has no record")?;
    ensure!(owner.label.as_deref() == Some("holder"), "{seen:?}");
    ensure!(shown.waiting == Some(3), "{seen:?}");
    let labels = queue_labels(shown);
    ensure!(
        labels == [Some("first".to_owned()), None, Some("second".to_owned())],
        "queue {labels:?}"
    );

    lease.release().await?;
    first_waits.await??;
    let output = etcdctl.finish(Duration::from_secs(15)).await?;
    ensure!(!output.contains("Error"), "etcdctl: {output}");
    second_waits.await??;
    let order = order.lock().unwrap().clone();
    ensure!(
        order == [("first", false), ("second", true)],
        "served (waiter, after etcdctl) {order:?}"
    );
    raw.clone().delete(marker, None).await?;
    Ok(())
}

/// `list` finds the locks dlock clients hold under a prefix, each with its holder and queue, over
/// more keys than one page reads, and leaves out locks outside the prefix, a holder without an
/// owner record (a peer's), and other data in the namespace.
async fn list_finds_the_dlock_locks_under_a_prefix(env: Env) -> anyhow::Result<()> {
    const MANY: usize = 300;
    let locks = labelled_client(&env.endpoints, SESSION_TTL, "lister").await?;
    let waiter = labelled_client(&env.endpoints, SESSION_TTL, "waiter").await?;
    let mut raw = raw(&env.endpoints).await?;
    let group = key("list");
    let opts = LockOptions::new(Duration::from_secs(60)).with_wait(Duration::from_secs(30));
    let mut leases = Vec::new();
    for i in 0..MANY {
        leases.push(locks.acquire(&format!("{group}/a/{i:03}"), &opts).await?);
    }
    let outside = locks.acquire(&format!("{group}-outside"), &opts).await?;
    let contended = format!("{group}/a/000");
    let waiting = {
        let (waiter, key, opts) = (waiter.clone(), contended.clone(), opts.clone());
        tokio::spawn(async move { waiter.acquire(&key, &opts).await })
    };
    contenders_until(
        "the waiter queues",
        Duration::from_secs(10),
        &raw,
        &locks,
        &contended,
        |n| n == 2,
    )
    .await?;
    // A peer's holder (an empty value, as etcdctl writes) and data that is no lock.
    let peer = format!("{}/694d", locks.lock_name(&format!("{group}/peer"))?);
    let junk = format!("{}/not-a-lease", locks.lock_name(&format!("{group}/junk"))?);
    raw.put(peer.as_str(), "", None).await?;
    raw.put(junk.as_str(), "{}", None).await?;

    let listed = Admin::new(&locks).list(&format!("{group}/")).await?;
    let names: Vec<&str> = listed.iter().map(|l| l.key.as_str()).collect();
    let expected: Vec<String> = (0..MANY).map(|i| format!("{group}/a/{i:03}")).collect();
    ensure!(
        names == expected.iter().map(String::as_str).collect::<Vec<_>>(),
        "listed {} locks: first {:?}, last {:?}",
        names.len(),
        names.first(),
        names.last()
    );
    for (held, lease) in listed.iter().zip(&leases) {
        ensure!(
            held.holder.fencing == Some(lease.fencing_token()),
            "{held:?}"
        );
        record_of(
            held.holder
                .owner
                .as_ref()
                .context("no record")?
                .to_json()
                .as_bytes(),
            "lister",
        )?;
    }
    let labels = queue_labels(&listed[0].holder);
    ensure!(labels == [Some("waiter".to_owned())], "queue {labels:?}");
    ensure!(listed[1].holder.waiting == Some(0), "{:?}", listed[1]);
    // A narrower prefix, and one that matches nothing.
    let few = locks.list(&format!("{group}/a/29")).await?;
    ensure!(few.len() == 10, "{} locks under a/29", few.len());
    ensure!(locks.list(&format!("{group}/b")).await?.is_empty());

    raw.delete(peer, None).await?;
    raw.delete(junk, None).await?;
    for lease in leases {
        lease.release().await?;
    }
    waiting.await??.release().await?;
    outside.release().await?;
    ensure!(locks.list(&format!("{group}/")).await?.is_empty());
    Ok(())
}

/// A holder that stops renewing (paused) is evicted by an operator: a wrong `expected` token
/// changes nothing; the right one removes it, the waiter gets the lock with a greater token,
/// the evicted lease turns lost at once (its key is watched), and its late write through a
/// fence is rejected after the successor wrote.
async fn evicting_a_paused_holder_fences_it_out(env: Env) -> anyhow::Result<()> {
    let holder = labelled_client(&env.endpoints, SESSION_TTL, "paused").await?;
    let next = labelled_client(&env.endpoints, SESSION_TTL, "next").await?;
    let operator: Arc<dyn DistributedLock> = Arc::new(client(&env.endpoints, SESSION_TTL).await?);
    let admin = Admin::new(&operator);
    let raw = raw(&env.endpoints).await?;
    let key = key("evict");
    let opts = LockOptions::new(Duration::from_secs(60)).with_wait(Duration::from_secs(10));
    ensure!(admin.force_unlock(&key, None).await? == Eviction::Free);
    let lease = holder.acquire(&key, &opts).await?;
    let token = lease.fencing_token();
    let resource = dlock_core::Fenced::new(Vec::new());
    resource.write(token, |log| log.push("paused"))?;
    let waiting = {
        let (next, key, opts) = (next.clone(), key.clone(), opts.clone());
        tokio::spawn(async move { next.acquire(&key, &opts).await })
    };
    contenders_until(
        "the waiter queues",
        Duration::from_secs(10),
        &raw,
        &holder,
        &key,
        |n| n == 2,
    )
    .await?;
    // Past the moment the holder starts watching its key.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let wrong = FencingToken(token.get() + 1000);
    match admin.force_unlock(&key, Some(wrong)).await? {
        Eviction::Changed(shown) if shown.fencing == Some(token) => {}
        other => bail!("evicting token {wrong} gave {other:?}"),
    }
    ensure!(
        lease.is_held(),
        "a mismatched eviction took the lock: {:?}",
        lease.state()
    );
    ensure!(contenders(&raw, &holder, &key).await?.len() == 2);

    let lost = lease.lost();
    let evicted_at = Instant::now();
    match admin.force_unlock(&key, Some(token)).await? {
        Eviction::Evicted(shown) => {
            ensure!(shown.fencing == Some(token), "{shown:?}");
            let owner = shown.owner.as_ref().context("no record")?;
            record_of(owner.to_json().as_bytes(), "paused")?;
            ensure!(
                queue_labels(&shown) == [Some("next".to_owned())],
                "{shown:?}"
            );
        }
        other => bail!("evicting the holder gave {other:?}"),
    }
    let reason = tokio::time::timeout(Duration::from_secs(1), lost)
        .await
        .context("the evicted lease did not turn lost")?;
    ensure!(reason == LostReason::TakenOver, "lost because {reason}");
    eprintln!(
        "evicted lease lost {:?} after the eviction ({reason})",
        evicted_at.elapsed()
    );
    let successor = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .context("the waiter was not woken by the eviction")???;
    ensure!(
        successor.fencing_token() > token,
        "{} after {token}",
        successor.fencing_token()
    );
    resource.write(successor.fencing_token(), |log| log.push("next"))?;
    ensure!(
        resource.write(token, |log| log.push("late")).is_err(),
        "the evicted holder's late write was admitted"
    );
    ensure!(lease.release().await? != Released::Released);
    ensure!(successor.is_held(), "{:?}", successor.state());
    let seen = operator.holding(&key).await?;
    ensure!(
        seen.holder().and_then(|h| h.fencing) == Some(successor.fencing_token()),
        "{seen:?}"
    );
    ensure!(successor.release().await? == Released::Released);
    Ok(())
}

/// `etcdctl lock` holds: `inspect` shows a holder without an owner record (not an error), and an
/// eviction without `expected` removes it, so a dlock client takes the lock at once with a
/// greater token.
async fn a_peer_holder_has_no_record_and_can_be_evicted(env: Env) -> anyhow::Result<()> {
    let (locks, raw, key, name, _) = interop(&env.endpoints, "peer-evicted").await?;
    let etcdctl = etcdctl_lock(&env.container, &name, "sleep 3").await?;
    contenders_until(
        "etcdctl holds the lock",
        Duration::from_secs(10),
        &raw,
        &locks,
        &key,
        |n| n == 1,
    )
    .await?;
    let peer_revision = contenders(&raw, &locks, &key).await?[0].2;
    let seen = locks.holding(&key).await?;
    let shown = seen.holder().context("not held")?;
    ensure!(
        shown.owner.is_none() && shown.fencing == Some(FencingToken(peer_revision.unsigned_abs())),
        "{seen:?}"
    );
    ensure!(
        locks.list(&key).await?.is_empty(),
        "a peer's lock was listed"
    );
    let opts = LockOptions::new(Duration::from_secs(30));
    ensure!(locks.try_acquire(&key, &opts).await?.is_none());
    match locks
        .evict(&dlock_core::backend::LockKey::new(&key)?, None)
        .await?
    {
        Eviction::Evicted(shown) if shown.owner.is_none() => {}
        other => bail!("evicting etcdctl's holder gave {other:?}"),
    }
    let lease = locks
        .try_acquire(&key, &opts)
        .await?
        .context("the lock is still held after the eviction")?;
    ensure!(lease.fencing_token().get() > peer_revision.unsigned_abs());
    lease.release().await?;
    etcdctl.finish(Duration::from_secs(15)).await?;
    Ok(())
}
