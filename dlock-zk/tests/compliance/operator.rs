//! What operators see and do on ZooKeeper: the owner record is each contender node's data (read
//! back with kazoo), `inspect` shows the holder and the queue in order, `list` finds the locks
//! dlock clients hold under a prefix, and a fenced eviction removes a paused holder, whose late
//! writes a fenced resource then rejects.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use dlock_core::inspect::{Eviction, Holder, Holding};
use dlock_core::{
    Admin, DistributedLockExt, Expiring, Fenced, FencingToken, Lease, LeaseState, LockOptions,
    LostReason, Owner, OwnerRecord, Released,
};
use dlock_testkit::fixtures::connect_docker;
use dlock_zk::ZkLock;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::kazoo::{python, HOLD};
use crate::peers::Curator;
use crate::support::{client, client_with, raw, url, SESSION};
use crate::Env;
use dlock_testkit::fixtures::exec::Exec;

/// Reads the node at argv[1] as kazoo's `get` does and prints its creation zxid and data.
const GET: &str = r#"
import sys
from kazoo.client import KazooClient
zk = KazooClient(hosts="127.0.0.1:2181")
zk.start(timeout=30)
data, stat = zk.get(sys.argv[1])
print("czxid %d" % stat.czxid, flush=True)
print("data " + data.decode("utf-8"), flush=True)
zk.stop()
"#;

fn key(name: &str) -> String {
    format!("zk-operator/{:016x}/{name}", rand::random::<u64>())
}

fn opts() -> LockOptions {
    LockOptions::new(Duration::from_secs(60))
}

async fn labelled(env: &Env, label: &str) -> anyhow::Result<Arc<ZkLock>> {
    client_with(&url(&env.hosts), SESSION, |b| b.with_owner(label)).await
}

/// Checks that `record` is this process's, with `label`.
fn ensure_ours(record: Option<&OwnerRecord>, label: &str) -> anyhow::Result<()> {
    let record = record.context("no owner record")?;
    ensure!(
        record.pid == std::process::id()
            && record.host == Owner::this_process().record().host
            && record.label.as_deref() == Some(label),
        "the record {record:?} is not this process's with label {label:?}"
    );
    Ok(())
}

/// Waits until `key`'s queue has `n` contender nodes.
async fn queue_reaches(env: &Env, parent: &str, n: usize) -> anyhow::Result<()> {
    let observer = raw::connect(&env.hosts).await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let children = raw::children(&observer, parent).await?;
        if children.len() >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the queue has {children:?}, expected {n} nodes");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A contender that waits for `key` in the background.
fn waiter(lock: &Arc<ZkLock>, key: &str) -> JoinHandle<dlock_core::Result<Lease>> {
    let (lock, key) = (lock.clone(), key.to_owned());
    tokio::spawn(async move {
        lock.acquire(&key, &opts().with_wait(Duration::from_secs(60)))
            .await
    })
}

async fn granted(task: JoinHandle<dlock_core::Result<Lease>>) -> anyhow::Result<Lease> {
    Ok(tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .context("the waiter was not granted the lock")???)
}

/// Every grant writes the owner record as its node's data: kazoo's `get` reads it, it parses as
/// this process's record with the label, and it goes with the node.
pub async fn the_owner_record_is_the_node_data_kazoo_reads(env: Env) -> anyhow::Result<()> {
    let docker = connect_docker().await?;
    let lock = labelled(&env, "billing-zk").await?;
    let key = key("record");
    let parent = lock.lock_path(&key)?;
    let lease = lock.acquire(&key, &opts()).await?;
    let observer = raw::connect(&env.hosts).await?;
    let names = raw::children(&observer, &parent).await?;
    ensure!(names.len() == 1, "expected one node: {names:?}");
    let node = format!("{parent}/{}", names[0]);
    let mut kazoo = Exec::start(&docker, &env.container, python(GET, &[&node])).await?;
    let czxid = kazoo.expect("czxid ", Duration::from_secs(30)).await?;
    let data = kazoo.expect("data ", Duration::from_secs(10)).await?;
    kazoo.finish(Duration::from_secs(10)).await?;
    ensure!(
        czxid == format!("czxid {}", lease.fencing_token()),
        "kazoo read {czxid}, the token is {}",
        lease.fencing_token()
    );
    let json = data.strip_prefix("data ").unwrap_or_default();
    ensure_ours(OwnerRecord::parse(json.as_bytes()).as_ref(), "billing-zk")
        .with_context(|| format!("kazoo read {json:?}"))?;
    ensure!(!json.contains('\n'), "the record is not one line: {json:?}");

    let seen = lock.holding(&key).await?;
    let holder = seen.holder().context("inspect saw no holder")?;
    ensure_ours(holder.owner.as_ref(), "billing-zk")?;
    ensure!(holder.fencing == Some(lease.fencing_token()) && holder.expires_in.is_none());
    ensure!(
        holder.waiting == Some(0) && holder.queue.is_empty(),
        "{holder:?}"
    );

    lease.release().await?;
    ensure!(
        raw::children(&observer, &parent).await?.is_empty(),
        "the record outlived the release"
    );
    Ok(())
}

/// `inspect` names the holder and the waiters in serving order, each with its record; a peer's
/// waiter (Curator's node, its own data) is in the queue without one.
pub async fn inspect_shows_the_queue_in_order(env: Env) -> anyhow::Result<()> {
    let first = labelled(&env, "first").await?;
    let second = labelled(&env, "second").await?;
    let observer = client(&url(&env.hosts), SESSION).await?;
    let key = key("queue");
    let parent = first.lock_path(&key)?;
    let lease = first.acquire(&key, &opts()).await?;
    let waiting = waiter(&second, &key);
    queue_reaches(&env, &parent, 2).await?;
    let peer = Curator::enqueue(&env, &parent).await?;

    let Holding::Held(holder) = observer.holding(&key).await? else {
        bail!("inspect saw no holder");
    };
    ensure!(holder.fencing == Some(lease.fencing_token()), "{holder:?}");
    ensure_ours(holder.owner.as_ref(), "first")?;
    ensure!(holder.waiting == Some(2), "{holder:?}");
    ensure_ours(holder.queue[0].owner.as_ref(), "second")?;
    ensure!(holder.queue[1].owner.is_none(), "the peer: {holder:?}");
    // Looking changed nothing.
    ensure!(
        raw::children(&raw::connect(&env.hosts).await?, &parent)
            .await?
            .len()
            == 3
    );

    lease.release().await?;
    let next = granted(waiting).await?;
    let Holding::Held(holder) = observer.holding(&key).await? else {
        bail!("inspect saw no holder after the release");
    };
    ensure_ours(holder.owner.as_ref(), "second")?;
    ensure!(
        holder.fencing == Some(next.fencing_token()) && holder.waiting == Some(1),
        "{holder:?}"
    );
    ensure!(holder.queue[0].owner.is_none());
    next.release().await?;
    peer.release().await?;
    Ok(())
}

/// `list(prefix)` finds exactly the locks dlock clients hold under the prefix, by name, each as
/// `inspect` shows it; a peer's holder (no record) and a key outside the prefix are not listed.
pub async fn list_finds_the_held_locks_under_a_prefix(env: Env) -> anyhow::Result<()> {
    let lock = labelled(&env, "lister").await?;
    let admin = Admin::new(&lock);
    let prefix = key("list/");
    let a = lock.acquire(&format!("{prefix}a"), &opts()).await?;
    let b = lock.acquire(&format!("{prefix}b/c d"), &opts()).await?;
    let outside = lock.acquire(&key("elsewhere"), &opts()).await?;
    let peer = Curator::enqueue(&env, &lock.lock_path(&format!("{prefix}peer"))?).await?;
    // A prefix of an encoded name, not of the lock name, must not match.
    let listed = admin.list(&prefix).await?;
    let keys: Vec<&str> = listed.iter().map(|l| l.key.as_str()).collect();
    ensure!(
        keys == [format!("{prefix}a"), format!("{prefix}b/c d")],
        "listed {keys:?}"
    );
    for (held, lease) in listed.iter().zip([&a, &b]) {
        ensure!(
            held.holder.fencing == Some(lease.fencing_token()),
            "{held:?}"
        );
        ensure_ours(held.holder.owner.as_ref(), "lister")?;
        ensure!(held.holder.waiting == Some(0), "{held:?}");
    }
    let everything = admin.list("").await?;
    ensure!(
        everything.iter().any(|l| l.key == format!("{prefix}a"))
            && everything.iter().any(|l| l.key.ends_with("/elsewhere")),
        "listing everything missed some: {everything:?}"
    );
    a.release().await?;
    b.release().await?;
    outside.release().await?;
    peer.release().await?;
    ensure!(
        admin.list(&prefix).await?.is_empty(),
        "released locks are listed"
    );
    Ok(())
}

/// The stuck-holder story: a holder that stopped renewing is evicted with the token the
/// operator was shown (a wrong token changes nothing); the waiting successor is granted a
/// greater token and writes through the fence, which rejects the evicted holder's late write;
/// the evicted lease is lost (its extend fails too).
pub async fn evicting_a_paused_holder_fences_it_out(env: Env) -> anyhow::Result<()> {
    let paused = labelled(&env, "paused").await?;
    let successor = labelled(&env, "successor").await?;
    let operator = client(&url(&env.hosts), SESSION).await?;
    let admin = Admin::new(&operator);
    let key = key("evict");
    let parent = paused.lock_path(&key)?;
    let resource = Fenced::new(Vec::<&str>::new());

    ensure!(
        matches!(admin.force_unlock(&key, None).await?, Eviction::Free),
        "evicting a free key"
    );
    let mut stuck = paused.acquire(&key, &opts()).await?;
    let stuck_token = stuck.fencing_token();
    resource.write(stuck_token, |log| log.push("stuck: before the pause"))?;
    let waiting = waiter(&successor, &key);
    queue_reaches(&env, &parent, 2).await?;

    let wrong = FencingToken(stuck_token.get() + 1);
    match admin.force_unlock(&key, Some(wrong)).await? {
        Eviction::Changed(holder) => ensure!(
            holder.fencing == Some(stuck_token),
            "Changed shows {holder:?}"
        ),
        other => bail!("evicting with a wrong token: {other:?}"),
    }
    ensure!(stuck.is_held(), "a mismatched eviction changed the holder");
    ensure!(
        raw::children(&raw::connect(&env.hosts).await?, &parent)
            .await?
            .len()
            == 2
    );

    let shown = operator.holding(&key).await?;
    let shown_token = shown.holder().and_then(|h| h.fencing);
    ensure!(shown_token == Some(stuck_token), "shown {shown:?}");
    let evicted = match admin.force_unlock(&key, shown_token).await? {
        Eviction::Evicted(holder) => holder,
        other => bail!("evicting the paused holder: {other:?}"),
    };
    ensure_ours(evicted.owner.as_ref(), "paused")?;
    ensure!(evicted.fencing == Some(stuck_token) && evicted.waiting == Some(1));

    let next = granted(waiting).await?;
    ensure!(
        next.fencing_token() > stuck_token,
        "the successor's token {} is not above the evicted {stuck_token}",
        next.fencing_token()
    );
    resource.write(next.fencing_token(), |log| log.push("successor"))?;
    // The paused holder wakes up and writes late: the fence rejects it.
    ensure!(
        resource
            .write(stuck_token, |log| log.push("stuck: late"))
            .is_err(),
        "the evicted holder's late write was admitted"
    );
    ensure!(
        resource.read(|log| log.clone()) == ["stuck: before the pause", "successor"],
        "the resource holds {:?}",
        resource.read(|log| log.clone())
    );
    // The watch on its node told the lease: it is lost, and an extend fails.
    ensure!(
        stuck.extend(Duration::from_secs(60)).await.is_err(),
        "an evicted lease was extended"
    );
    ensure!(
        stuck.state().is_lost(),
        "the evicted lease is {}",
        stuck.state()
    );

    match admin.force_unlock(&key, Some(stuck_token)).await? {
        Eviction::Changed(holder) => ensure!(holder.fencing == Some(next.fencing_token())),
        other => bail!("evicting the gone holder again: {other:?}"),
    }
    ensure!(next.is_held(), "the successor lost the lock");
    next.release().await?;
    drop(stuck);
    Ok(())
}

/// A holder that renews learns of its eviction (from its node's watch, or at its next renewal at
/// the latest): its lease turns lost, and its release leaves the next holder alone.
pub async fn an_auto_renewing_holder_learns_of_its_eviction(env: Env) -> anyhow::Result<()> {
    let lock = labelled(&env, "renewing").await?;
    let operator = client(&url(&env.hosts), SESSION).await?;
    let key = key("renewing");
    // Renewed every second or so (a third of the TTL).
    let renewing = LockOptions::new(Duration::from_secs(3)).with_auto_renew();
    let lease = lock.acquire(&key, &renewing).await?;
    let lost = lease.lost();
    let evicted = Instant::now();
    match Admin::new(&operator).force_unlock(&key, None).await? {
        Eviction::Evicted(holder) => ensure_ours(holder.owner.as_ref(), "renewing")?,
        other => bail!("evicting the renewing holder: {other:?}"),
    }
    let reason = tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .context("the evicted lease was never told")?;
    ensure!(lease.state().is_lost(), "the lease is {}", lease.state());
    eprintln!(
        "the renewing holder lost its lease {:?} after the eviction: {reason:?}",
        evicted.elapsed()
    );
    let next = operator
        .try_acquire(&key, &opts())
        .await?
        .context("the evicted key is busy")?;
    ensure!(next.fencing_token() > lease.fencing_token());
    let released = lease.release().await;
    ensure!(
        !matches!(released, Ok(Released::Released)),
        "the evicted lease released: {released:?}"
    );
    ensure!(next.is_held(), "the evicted holder's release took the lock");
    next.release().await?;
    Ok(())
}

/// How long an evicted holder may take to learn of it from its node's watch (it takes a few
/// milliseconds; the rest is slack for a loaded machine).
const TOLD_WITHIN: Duration = Duration::from_secs(3);

/// Who deletes the holder's node.
#[derive(Debug, Clone, Copy)]
enum Deleter {
    /// An operator's fenced eviction, with the token they were shown.
    ForceUnlock,
    /// Another client deleting the node by path, as `zkCli delete` or kazoo would.
    RawDelete,
}

/// A holder that does not renew (no auto-renew, a TTL of a minute) learns at once that its node
/// was deleted by `deleter`: the watch on its own node turns the lease lost as taken over, and its
/// `lost()` and `expiring()` complete, without any extend. Before that, a release of another lease
/// of the same client reads as released and is not counted as a takeover.
async fn a_holder_learns_at_once_that_its_node_was_deleted(
    env: Env,
    deleter: Deleter,
) -> anyhow::Result<()> {
    let lock = labelled(&env, "watching").await?;
    let operator = client(&url(&env.hosts), SESSION).await?;

    // The client's own delete fires the node's watch too: it must not read as a takeover.
    let plain = lock.acquire(&key("watch/released"), &opts()).await?;
    let plain_watch = plain.watch();
    let plain_lost = plain.lost();
    ensure!(
        plain.release().await? == Released::Released,
        "the plain release"
    );
    let reason = tokio::time::timeout(TOLD_WITHIN, plain_lost)
        .await
        .context("a released lease is not lost")?;
    // Time for a wrong takeover to show, had the watch taken the release for one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(
        reason == LostReason::Released
            && plain_watch.state() == LeaseState::Lost(LostReason::Released),
        "a released lease reads {reason:?}, {}",
        plain_watch.state()
    );
    ensure!(
        lock.stats().taken_over == 0,
        "a release was counted as a takeover: {:?}",
        lock.stats()
    );

    let key = key("watch/evicted");
    let parent = lock.lock_path(&key)?;
    let lease = lock.acquire(&key, &opts()).await?;
    let lost = lease.lost();
    let expiring = lease.expiring(Duration::from_secs(1));
    ensure!(lease.is_held(), "the new lease is {}", lease.state());
    let deleted = match deleter {
        Deleter::ForceUnlock => {
            let token = Some(lease.fencing_token());
            let deleted = Instant::now();
            match Admin::new(&operator).force_unlock(&key, token).await? {
                Eviction::Evicted(holder) => ensure_ours(holder.owner.as_ref(), "watching")?,
                other => bail!("evicting the holder: {other:?}"),
            }
            deleted
        }
        Deleter::RawDelete => {
            let raw = raw::connect(&env.hosts).await?;
            let names = raw::children(&raw, &parent).await?;
            ensure!(names.len() == 1, "expected one node: {names:?}");
            let deleted = Instant::now();
            raw.delete(&format!("{parent}/{}", names[0]), None).await?;
            deleted
        }
    };
    let reason = tokio::time::timeout(TOLD_WITHIN, lost)
        .await
        .with_context(|| format!("the holder was not told within {TOLD_WITHIN:?}"))?;
    let told = deleted.elapsed();
    ensure!(
        reason == LostReason::TakenOver,
        "lost() says {reason:?}, not taken over"
    );
    ensure!(
        lease.state() == LeaseState::Lost(LostReason::TakenOver),
        "the lease is {}",
        lease.state()
    );
    let expiring = tokio::time::timeout(TOLD_WITHIN, expiring)
        .await
        .context("expiring() did not complete")?;
    ensure!(
        expiring == Expiring::Lost(LostReason::TakenOver),
        "expiring() says {expiring:?}"
    );
    ensure!(
        lock.stats().taken_over == 1,
        "takeovers counted: {:?}",
        lock.stats()
    );
    eprintln!("the holder learned of the {deleter:?} after {told:?}");

    // The key is free, and the lost lease's release leaves the next holder alone.
    let next = operator
        .try_acquire(&key, &opts())
        .await?
        .context("the key is busy after the deletion")?;
    let released = lease.release().await;
    ensure!(
        !matches!(released, Ok(Released::Released)),
        "the lost lease released: {released:?}"
    );
    ensure!(next.is_held(), "the lost lease's release took the lock");
    next.release().await?;
    Ok(())
}

/// [`a_holder_learns_at_once_that_its_node_was_deleted`] by an operator's fenced eviction.
pub async fn a_force_unlocked_holder_learns_it_at_once(env: Env) -> anyhow::Result<()> {
    a_holder_learns_at_once_that_its_node_was_deleted(env, Deleter::ForceUnlock).await
}

/// [`a_holder_learns_at_once_that_its_node_was_deleted`] by another client's plain delete.
pub async fn a_holder_whose_node_another_client_deletes_learns_it_at_once(
    env: Env,
) -> anyhow::Result<()> {
    a_holder_learns_at_once_that_its_node_was_deleted(env, Deleter::RawDelete).await
}

/// A kazoo holder has no owner record: `inspect` shows it with `owner: None` and its token,
/// `list` leaves it out, and an eviction without a token removes it, after which dlock takes
/// the lock with a greater token.
pub async fn a_kazoo_holder_has_no_record_and_can_be_evicted(env: Env) -> anyhow::Result<()> {
    let docker = connect_docker().await?;
    let lock = labelled(&env, "after-kazoo").await?;
    let admin = Admin::new(&lock);
    let key = key("kazoo/holder");
    let path = lock.lock_path(&key)?;
    let mut kazoo = Exec::start(&docker, &env.container, python(HOLD, &[&path, "5"])).await?;
    kazoo.expect("held", Duration::from_secs(30)).await?;

    let seen = lock.holding(&key).await?;
    let Some(Holder {
        fencing: Some(peer_token),
        owner: None,
        ..
    }) = seen.holder().cloned()
    else {
        bail!("a kazoo holder shows as {seen:?}");
    };
    let prefix = key.trim_end_matches("holder");
    ensure!(
        admin.list(prefix).await?.is_empty(),
        "a peer's lock is listed"
    );
    match admin.force_unlock(&key, None).await? {
        Eviction::Evicted(holder) => {
            ensure!(holder.owner.is_none() && holder.fencing == Some(peer_token))
        }
        other => bail!("evicting kazoo's holder: {other:?}"),
    }
    let lease = lock
        .try_acquire(&key, &opts())
        .await?
        .context("the lock is still busy after the eviction")?;
    ensure!(lease.fencing_token() > peer_token);
    // kazoo's release finds its node gone, which it accepts.
    kazoo.expect("released", Duration::from_secs(30)).await?;
    kazoo.finish(Duration::from_secs(10)).await?;
    ensure!(lease.is_held(), "kazoo's release took dlock's lock");
    lease.release().await?;
    Ok(())
}
