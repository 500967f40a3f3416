//! ZooKeeper-specific cases, beyond the shared suite.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use dlock_core::inspect::Holding;
use dlock_core::{DistributedLockExt, Error, LockOptions, Released};
use dlock_testkit::trials::{self, Case};
use dlock_testkit::{case, FreezeProxy};
use dlock_zk::ZkLock;
use libtest_mimic::Trial;
use tokio::time::Instant;

use crate::support::lossy_proxy::LossyProxy;
use crate::support::{client, client_with, raw, url, SESSION, SHORT_SESSION, TRIAL_BUDGET};
use crate::{kazoo, operator, peers, primitives, Env};

fn cases() -> Vec<(&'static str, Case<Env>)> {
    vec![
        case!(kazoo::kazoo_and_dlock_exclude_each_other_on_one_path),
        case!(peers::dlock_waits_behind_a_curator_holder),
        case!(peers::curator_waits_behind_dlock_only_under_curator_naming),
        case!(peers::kazoo_under_curator_naming),
        case!(lost_create_reply_is_recovered_by_owner_prefix),
        case!(fencing_token_grows_across_parent_recreation),
        case!(lock_nodes_are_session_ephemerals_named_like_kazoos),
        case!(bad_settings_fail_before_connecting_and_unreachable_servers_fail_in_time),
        case!(credentials_work_and_never_show),
        case!(a_chroot_prefixes_every_node),
        case!(waiter_whose_session_expires_fails_instead_of_waiting),
        case!(holding_reads_the_holder_without_taking_it),
        case!(operator::the_owner_record_is_the_node_data_kazoo_reads),
        case!(operator::inspect_shows_the_queue_in_order),
        case!(operator::list_finds_the_held_locks_under_a_prefix),
        case!(operator::evicting_a_paused_holder_fences_it_out),
        case!(operator::an_auto_renewing_holder_learns_of_its_eviction),
        case!(operator::a_force_unlocked_holder_learns_it_at_once),
        case!(operator::a_holder_whose_node_another_client_deletes_learns_it_at_once),
        case!(operator::a_kazoo_holder_has_no_record_and_can_be_evicted),
        case!(primitives::primitives_use_kazoos_layout),
        case!(primitives::kazoo_writer_and_dlock_readers),
        case!(primitives::dlock_writer_and_kazoo_readers),
        case!(primitives::kazoo_semaphore_and_dlock_share_permits),
        case!(primitives::kazoo_leader_is_seen_by_dlock),
        case!(primitives::dlock_leader_is_seen_by_kazoo),
        case!(primitives::cancelled_acquires_leave_no_node),
        case!(primitives::tokens_grow_in_grant_order),
        case!(primitives::a_kazoo_28_reader_waits_for_a_later_writer),
        case!(primitives::semaphore_waiters_are_served_in_order),
    ]
}

const PREFIX: &str = "zookeeper::zk";

/// The trial names, for a run that opted out of Docker.
pub fn names() -> Vec<String> {
    trials::names(PREFIX, &cases())
}

pub fn trials(env: &Env) -> Vec<Trial> {
    trials::cases(PREFIX, &cases(), env, TRIAL_BUDGET)
}

fn key(name: &str) -> String {
    format!("zk-cases/{:016x}/{name}", rand::random::<u64>())
}

fn opts() -> LockOptions {
    LockOptions::new(Duration::from_secs(60))
}

/// `holding` reads who holds a key — free, then the holder's token — and changes nothing: the
/// holder keeps the lock, and no node is added to the queue.
async fn holding_reads_the_holder_without_taking_it(env: Env) -> anyhow::Result<()> {
    let holder = client(&url(&env.hosts), SESSION).await?;
    let observer = client(&url(&env.hosts), SESSION).await?;
    let key = key("holding");
    let lease = trials::ensure_holding_sees(&holder, &observer, &key, &opts()).await?;
    let observer_raw = raw::connect(&env.hosts).await?;
    let parent = holder.lock_path(&key)?;
    let queue = raw::children(&observer_raw, &parent).await?;
    ensure!(queue.len() == 1, "looking added a node: {queue:?}");
    let node = raw::stat(&observer_raw, &format!("{parent}/{}", queue[0]))
        .await?
        .context("the holder's node is gone")?;
    ensure!(
        u64::try_from(node.czxid)? == lease.fencing_token().0,
        "the token is not the holder node's creation zxid {}",
        node.czxid
    );
    ensure!(
        lease.release().await? == Released::Released,
        "the holder lost its lock"
    );
    ensure!(
        observer.holding(&key).await? == Holding::Free,
        "a released key is not free"
    );
    Ok(())
}

/// The server applies a create whose reply never arrives; after reconnecting, the contender
/// finds its node by owner prefix instead of creating a second one, takes the lock, and leaves
/// nothing behind on release.
async fn lost_create_reply_is_recovered_by_owner_prefix(env: Env) -> anyhow::Result<()> {
    let target: SocketAddr = env.hosts.parse()?;
    let proxy = LossyProxy::start(target).await?;
    let lossy = client(&url(&proxy.addr().to_string()), SESSION).await?;
    let other = client(&url(&env.hosts), SESSION).await?;
    let observer = raw::connect(&env.hosts).await?;
    let key = key("lost-reply");
    let parent = lossy.lock_path(&key)?;
    // The parent exists already, so the first request of the acquire is the create itself.
    other
        .try_acquire(&key, &opts())
        .await?
        .context("a fresh key was busy")?
        .release()
        .await?;
    let session = lossy.session_id();
    proxy.lose_replies();
    let started = Instant::now();
    let lease = lossy
        .acquire(&key, &opts().with_wait(Duration::from_secs(30)))
        .await
        .context("acquire across a lost create reply")?;
    eprintln!(
        "acquired across a lost reply after {:.2?}",
        started.elapsed()
    );
    ensure!(
        lossy.stats().recovered_creates == 1,
        "the own node was not found by its owner prefix: {:?}",
        lossy.stats()
    );
    ensure!(
        lossy.session_id() == session,
        "the session did not survive the lost reply"
    );
    let children = raw::children(&observer, &parent).await?;
    ensure!(
        children.len() == 1,
        "one acquire left {} nodes: {children:?}",
        children.len()
    );
    ensure!(
        other.try_acquire(&key, &opts()).await?.is_none(),
        "another client took the recovered lock"
    );
    ensure!(
        lease.release().await? == Released::Released,
        "release failed"
    );
    let left = raw::children(&observer, &parent).await?;
    ensure!(left.is_empty(), "nodes left after release: {left:?}");
    Ok(())
}

/// Sequence numbers start again when a parent is recreated; creation zxids do not, so a later
/// holder's token is still larger.
async fn fencing_token_grows_across_parent_recreation(env: Env) -> anyhow::Result<()> {
    let lock = client(&url(&env.hosts), SESSION).await?;
    let observer = raw::connect(&env.hosts).await?;
    let key = key("recreated");
    let parent = lock.lock_path(&key)?;
    let first = lock.acquire(&key, &opts()).await?;
    let before = first.fencing_token();
    first.release().await?;
    // What the server's container cleanup does to an empty parent.
    observer
        .delete(&parent, None)
        .await
        .context("delete the empty parent")?;
    let second = lock.acquire(&key, &opts()).await?;
    let names = raw::children(&observer, &parent).await?;
    ensure!(
        names.len() == 1 && names[0].ends_with("__lock__0000000000"),
        "the recreated parent's first node should restart the sequence: {names:?}"
    );
    trials::ensure_token_above(&second, before, "parent recreation")?;
    second.release().await?;
    Ok(())
}

/// Lock nodes are ephemeral nodes of the holder's session, named `<owner hex>__lock__<sequence>`
/// (kazoo's scheme), carrying the owner record with the identifier as its label, with their czxid as the fencing token. (That the
/// parents are container nodes the server removes is checked in the `faults` binary, which runs
/// long enough for the server's container sweep.)
async fn lock_nodes_are_session_ephemerals_named_like_kazoos(env: Env) -> anyhow::Result<()> {
    let lock = client_with(&url(&env.hosts), SESSION, |b| b.with_identifier("worker-7")).await?;
    let observer = raw::connect(&env.hosts).await?;
    let key = key("shape");
    let parent = lock.lock_path(&key)?;
    let lease = lock.acquire(&key, &opts()).await?;
    let names = raw::children(&observer, &parent).await?;
    ensure!(names.len() == 1, "expected one lock node: {names:?}");
    ensure!(
        names[0].starts_with(&format!("{}__lock__", lease.owner().to_hex())),
        "the node name does not start with the owner token"
    );
    let path = format!("{parent}/{}", names[0]);
    let (data, stat) = observer.get_data(&path).await?;
    let record = dlock_core::OwnerRecord::parse(&data).context("the node data is no record")?;
    ensure!(
        record.label.as_deref() == Some("worker-7") && record.pid == std::process::id(),
        "node data {record:?}"
    );
    ensure!(
        Some(stat.ephemeral_owner) == lock.session_id(),
        "the node is not an ephemeral of the holder's session"
    );
    ensure!(
        lease.fencing_token().get() == stat.czxid as u64,
        "the fencing token {} is not the node's czxid {}",
        lease.fencing_token(),
        stat.czxid
    );
    lease.release().await?;
    ensure!(
        raw::children(&observer, &parent).await?.is_empty(),
        "the node outlived the release"
    );
    Ok(())
}

/// Malformed settings are rejected by field before any connection; a server that does not
/// answer makes `build` fail within the connect timeout, not hang.
async fn bad_settings_fail_before_connecting_and_unreachable_servers_fail_in_time(
    env: Env,
) -> anyhow::Result<()> {
    for (bad, field) in [
        ("http://zk1:2181", "url"),
        ("zk://", "url"),
        ("zk://zk1:0", "url"),
        ("zk://zk1:2181/a//b", "url"),
        ("zk://zk1:2181?x=1", "url"),
    ] {
        let started = Instant::now();
        match ZkLock::connect(bad).await {
            Err(Error::InvalidInput { field: f, .. }) => ensure!(f == field, "{bad}: field {f}"),
            other => bail!("{bad}: expected InvalidInput, got {other:?}"),
        }
        ensure!(
            started.elapsed() < Duration::from_millis(100),
            "{bad} took {:?}",
            started.elapsed()
        );
    }
    match ZkLock::builder(&url(&env.hosts))
        .with_session_timeout(Duration::ZERO)
        .connect()
        .await
    {
        Err(Error::InvalidInput {
            field: "session_timeout",
            ..
        }) => {}
        other => bail!("zero session timeout: {other:?}"),
    }
    // A port nobody listens on.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.local_addr()?.port()
    };
    let connect_timeout = Duration::from_secs(2);
    let started = Instant::now();
    let result = ZkLock::builder(&format!("zk://127.0.0.1:{port}"))
        .with_connect_timeout(connect_timeout)
        .connect()
        .await;
    let took = started.elapsed();
    match result {
        Err(e @ Error::Unavailable { .. }) => ensure!(e.is_temporary(), "{e}"),
        other => bail!("unreachable server: expected Unavailable, got {other:?}"),
    }
    ensure!(
        took <= connect_timeout + Duration::from_secs(2),
        "an unreachable server took {took:?} to fail"
    );
    Ok(())
}

/// `user:password@` adds digest credentials; the password shows in no `Debug` output.
async fn credentials_work_and_never_show(env: Env) -> anyhow::Result<()> {
    let secret = "hunter2-zk";
    // A root of its own: nodes dlock creates with credentials belong to that identity (world
    // READ only), so a base it created would shut the other cases' clients out.
    let root = format!("/dlock-alice-{:016x}", rand::random::<u64>());
    let lock = client_with(
        &format!("zk://alice:{secret}@{}", env.hosts),
        SESSION,
        |b| b.with_prefix(root),
    )
    .await?;
    let shown = format!("{lock:?}");
    ensure!(!shown.contains(secret), "Debug shows the password: {shown}");
    ensure!(shown.contains("alice"), "Debug hides the user: {shown}");
    let lease = lock
        .try_acquire(&key("auth"), &opts())
        .await?
        .context("a fresh key was busy")?;
    ensure!(!format!("{lease:?}").contains(secret));
    lease.release().await?;
    Ok(())
}

/// The chroot of `zk://hosts/chroot` is created on first use and holds every node; clients
/// with different chroots do not share locks.
async fn a_chroot_prefixes_every_node(env: Env) -> anyhow::Result<()> {
    let chroot = format!("/zk-chroot-{:016x}/app", rand::random::<u64>());
    let rooted = client(&format!("zk://{}{chroot}", env.hosts), SESSION).await?;
    let plain = client(&url(&env.hosts), SESSION).await?;
    let observer = raw::connect(&env.hosts).await?;
    ensure!(
        rooted.base_path() == format!("{chroot}/dlock"),
        "base path {}",
        rooted.base_path()
    );
    let key = key("rooted");
    let lease = rooted.acquire(&key, &opts()).await?;
    let parent = rooted.lock_path(&key)?;
    ensure!(parent.starts_with(&chroot), "lock path {parent}");
    ensure!(
        raw::children(&observer, &parent).await?.len() == 1,
        "no lock node under the chroot"
    );
    let elsewhere = plain
        .try_acquire(&key, &opts())
        .await?
        .context("the same key outside the chroot was busy")?;
    elsewhere.release().await?;
    lease.release().await?;
    Ok(())
}

/// A waiter whose session expires (its link is frozen past the session timeout) fails its
/// acquire instead of waiting forever, its queue node disappears with the session, and the
/// client works again with a new session.
async fn waiter_whose_session_expires_fails_instead_of_waiting(env: Env) -> anyhow::Result<()> {
    let holder = client(&url(&env.hosts), SESSION).await?;
    let proxy = FreezeProxy::start(env.hosts.parse()?).await?;
    let waiter = client(&url(&proxy.addr().to_string()), SHORT_SESSION).await?;
    let observer = raw::connect(&env.hosts).await?;
    let key = key("expiring-waiter");
    let parent = holder.lock_path(&key)?;
    let lease = holder.acquire(&key, &opts()).await?;
    let waiting = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move {
            let result = waiter.acquire(&key, &opts()).await;
            (result, Instant::now())
        })
    };
    // Queued: two contenders in the parent.
    let deadline = Instant::now() + Duration::from_secs(10);
    while raw::children(&observer, &parent).await?.len() < 2 {
        ensure!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let frozen_at = Instant::now();
    proxy.switch().freeze();
    let (result, failed_at) = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .context("the waiter is still waiting 30 s after its session was cut off")??;
    match result {
        Err(Error::Timeout { .. }) => bail!("the waiter timed out instead of failing"),
        Err(e) => {
            eprintln!("the cut-off waiter failed with: {e}");
            ensure!(e.is_temporary(), "expected a temporary error, got {e}")
        }
        Ok(_) => bail!("the waiter acquired a held lock"),
    }
    eprintln!(
        "waiter failed {:.2?} after its link froze",
        failed_at - frozen_at
    );
    proxy.switch().thaw();
    // The server expired the waiter's session: only the holder's node is left.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let children = raw::children(&observer, &parent).await?;
        if children.len() == 1 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the expired waiter's node stayed: {children:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(lease.release().await? == Released::Released);
    let again = waiter
        .try_acquire(&key, &opts())
        .await
        .context("the waiter's client after its session expired")?
        .context("a free key was busy")?;
    ensure!(
        waiter.stats().sessions_opened == 2,
        "expected a second session: {:?}",
        waiter.stats()
    );
    again.release().await?;
    Ok(())
}
