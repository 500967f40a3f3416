//! The primitives on etcd: the election beside `etcdctl elect` in both directions, the
//! semaphore's and the read-write lock's layout and rules, and acquires that time out or are
//! dropped leaving no key behind.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use dlock_core::inspect::Holding;
use dlock_core::{DistributedLock, DistributedLockExt, Error, LockOptions};
use dlock_etcd::EtcdLock;
use tokio::time::Instant;

use super::{key, Env};
use crate::support::{self, clients, count, eventually, keys_under, raw, Exec};
use crate::SESSION_TTL;

fn opts() -> LockOptions {
    LockOptions::new(Duration::from_secs(30))
}

fn shared(locks: &Arc<EtcdLock>) -> Arc<dyn DistributedLock> {
    locks.clone()
}

/// The name of `key` in `family` (`semaphore`, `rw`, `election`).
fn family_name(locks: &EtcdLock, family: &str, key: &str) -> anyhow::Result<String> {
    Ok(locks
        .layout()
        .family_name(family, &dlock_core::backend::LockKey::new(key)?))
}

/// `etcdctl` inside the member's container, ended with SIGTERM after `seconds` (on which
/// `etcdctl elect` resigns).
async fn etcdctl_for(container: &str, seconds: u32, args: &[&str]) -> anyhow::Result<Exec> {
    let mut cmd = vec!["timeout".to_owned(), seconds.to_string()];
    cmd.extend(support::etcdctl(args));
    Exec::start(container, cmd).await
}

/// A dlock candidate's key is `<election>/<lease hex>` holding the value, on that lease, and
/// its create revision is the term; the observer reports value and term; resigning frees it.
pub async fn election_keys_follow_the_go_layout(Env { endpoints, .. }: Env) -> anyhow::Result<()> {
    let [candidate, observer] = clients(&endpoints, SESSION_TTL).await?;
    let raw = raw(&endpoints).await?;
    let key = key("election-layout");
    let name = candidate.election_name(&key)?;
    let election = shared(&candidate).election(&key)?;
    let leadership = election.campaign("10.0.0.7:8080", &opts()).await?;
    let stored = keys_under(&raw, &format!("{name}/")).await?;
    ensure!(stored.len() == 1, "keys: {stored:?}");
    let (k, value, create_revision, lease) = &stored[0];
    ensure!(
        *k == format!("{name}/{lease:x}"),
        "key {k:?} on lease {lease:x}"
    );
    ensure!(
        Some(*lease) == candidate.session_lease(),
        "the candidate's key is not on the client's session lease"
    );
    ensure!(value == "10.0.0.7:8080", "value {value:?}");
    ensure!(leadership.term().get() == u64::try_from(*create_revision)?);
    let leader = shared(&observer)
        .election(&key)?
        .leader()
        .await?
        .context("no leader seen")?;
    ensure!(
        leader.value.as_deref() == Some("10.0.0.7:8080"),
        "{leader:?}"
    );
    ensure!(leader.term == Some(leadership.term()), "{leader:?}");
    // The value is the candidate's own, as Go writes it: no owner record beside it.
    ensure!(leader.owner.is_none(), "{leader:?}");
    leadership.resign().await?;
    ensure!(keys_under(&raw, &format!("{name}/")).await?.is_empty());
    ensure!(shared(&observer).election(&key)?.leader().await?.is_none());
    Ok(())
}

/// `etcdctl elect` leads: dlock's observer reports its value and term, a dlock candidate is
/// refused while it leads and wins once etcdctl resigns, with a greater term.
pub async fn etcdctl_leads_and_dlock_waits(env: Env) -> anyhow::Result<()> {
    let [candidate, observer] = clients(&env.endpoints, SESSION_TTL).await?;
    let raw = raw(&env.endpoints).await?;
    let key = key("etcdctl-leads");
    let name = candidate.election_name(&key)?;
    let etcdctl = etcdctl_for(&env.container, 4, &["elect", &name, "etcdctl-value"]).await?;
    eventually("etcdctl leads", Duration::from_secs(10), || async {
        Ok(!keys_under(&raw, &format!("{name}/")).await?.is_empty())
    })
    .await?;
    let etcdctl_key = keys_under(&raw, &format!("{name}/")).await?[0].clone();
    let started = Instant::now();
    let election = shared(&observer).election(&key)?;
    let leader = election.leader().await?.context("no leader seen")?;
    ensure!(
        leader.value.as_deref() == Some("etcdctl-value"),
        "{leader:?}"
    );
    ensure!(
        leader.term.map(|t| t.get()) == Some(u64::try_from(etcdctl_key.2)?),
        "{leader:?}; etcdctl's key {etcdctl_key:?}"
    );
    let candidates = shared(&candidate).election(&key)?;
    ensure!(
        candidates
            .try_campaign("dlock-value", &opts())
            .await?
            .is_none(),
        "dlock led beside etcdctl"
    );
    let leadership = candidates
        .campaign("dlock-value", &opts().with_wait(Duration::from_secs(15)))
        .await?;
    ensure!(
        started.elapsed() >= Duration::from_secs(2),
        "dlock led after {:?}, before etcdctl resigned",
        started.elapsed()
    );
    ensure!(leadership.term().get() > u64::try_from(etcdctl_key.2)?);
    let output = etcdctl.finish(Duration::from_secs(10)).await?;
    ensure!(output.contains("etcdctl-value"), "etcdctl: {output}");
    let leader = election.leader().await?.context("no leader seen")?;
    ensure!(leader.value.as_deref() == Some("dlock-value"), "{leader:?}");
    ensure!(leader.term == Some(leadership.term()), "{leader:?}");
    leadership.resign().await?;
    Ok(())
}

/// dlock leads: `etcdctl elect -l` prints dlock's value, `etcdctl elect` waits behind it and
/// leads once dlock resigns, which dlock's observer reports with etcdctl's value and term.
pub async fn dlock_leads_and_etcdctl_waits(env: Env) -> anyhow::Result<()> {
    let [candidate, observer] = clients(&env.endpoints, SESSION_TTL).await?;
    let raw = raw(&env.endpoints).await?;
    let key = key("dlock-leads");
    let name = candidate.election_name(&key)?;
    let leadership = shared(&candidate)
        .election(&key)?
        .campaign("dlock-value", &opts())
        .await?;
    let listen = etcdctl_for(&env.container, 2, &["elect", "-l", &name]).await?;
    let listened = listen.finish(Duration::from_secs(10)).await?;
    ensure!(
        listened.contains("dlock-value"),
        "etcdctl elect -l: {listened}"
    );
    let etcdctl = etcdctl_for(&env.container, 6, &["elect", &name, "etcdctl-value"]).await?;
    eventually("etcdctl campaigns", Duration::from_secs(10), || async {
        Ok(keys_under(&raw, &format!("{name}/")).await?.len() == 2)
    })
    .await?;
    let election = shared(&observer).election(&key)?;
    let leader = election.leader().await?.context("no leader seen")?;
    ensure!(leader.value.as_deref() == Some("dlock-value"), "{leader:?}");
    let dlock_term = leadership.term();
    leadership.resign().await?;
    eventually("etcdctl leads", Duration::from_secs(5), || async {
        let leader = election.leader().await?;
        Ok(leader.is_some_and(|l| l.value.as_deref() == Some("etcdctl-value")))
    })
    .await?;
    let leader = election.leader().await?.context("no leader seen")?;
    let etcdctl_key = keys_under(&raw, &format!("{name}/")).await?[0].clone();
    ensure!(
        leader.term.map(|t| t.get()) == Some(u64::try_from(etcdctl_key.2)?),
        "{leader:?}; etcdctl's key {etcdctl_key:?}"
    );
    ensure!(
        leader.term > Some(dlock_term),
        "{leader:?} after {dlock_term}"
    );
    let output = etcdctl.finish(Duration::from_secs(15)).await?;
    ensure!(output.contains("etcdctl-value"), "etcdctl: {output}");
    Ok(())
}

/// Two permits, both of one client: two holders on keys `<semaphore>/<session lease hex>_<owner
/// token hex>` with the owner record, tokens increasing; a third is refused; a client asking with another number is refused with a
/// mismatch and writes nothing; once the name is free, another number is agreed.
pub async fn semaphore_permits_and_mismatch(Env { endpoints, .. }: Env) -> anyhow::Result<()> {
    let [a, b, c] = clients(&endpoints, SESSION_TTL).await?;
    let mut raw = raw(&endpoints).await?;
    let key = key("semaphore");
    let name = family_name(&a, "semaphore", &key)?;
    let first = shared(&a).semaphore(&key, 2)?.acquire(&opts()).await?;
    let second = shared(&a).semaphore(&key, 2)?.acquire(&opts()).await?;
    ensure!(second.fencing_token() > first.fencing_token());
    ensure!(
        shared(&b)
            .semaphore(&key, 2)?
            .try_acquire(&opts())
            .await?
            .is_none(),
        "a third permit of two"
    );
    let stored = keys_under(&raw, &format!("{name}/")).await?;
    ensure!(stored.len() == 2, "keys: {stored:?}");
    let session = a.session_lease().context("A has no session")?;
    for (k, value, _, lease) in &stored {
        ensure!(
            *lease == session,
            "key {k:?} on lease {lease:x}, not the session's"
        );
        let token = k
            .strip_prefix(&format!("{name}/{lease:x}_"))
            .with_context(|| format!("key {k:?}"))?;
        ensure!(
            token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit()),
            "key {k:?}"
        );
        ensure!(
            dlock_core::OwnerRecord::parse(value.as_bytes()).is_some(),
            "value {value:?}"
        );
    }
    ensure!(stored[0].0 != stored[1].0, "{stored:?}");
    ensure!(
        stored[0].2 == i64::try_from(first.fencing_token().get())?,
        "{stored:?}"
    );
    let held = shared(&c).semaphore(&key, 2)?.holding().await?;
    ensure!(
        matches!(&held, Holding::Held(h) if h.holders == Some(2) && h.fencing == Some(first.fencing_token())),
        "{held:?}"
    );
    let before = count(&mut raw, &name).await?;
    let other = shared(&c).semaphore(&key, 3)?.try_acquire(&opts()).await;
    ensure!(matches!(other, Err(Error::Mismatch { .. })), "{other:?}");
    let waited = shared(&c)
        .semaphore(&key, 3)?
        .acquire(&opts().with_wait(Duration::from_secs(1)))
        .await;
    ensure!(matches!(waited, Err(Error::Mismatch { .. })), "{waited:?}");
    ensure!(count(&mut raw, &name).await? == before, "a refusal wrote");
    first.release().await?;
    let third = shared(&b).semaphore(&key, 2)?.acquire(&opts()).await?;
    ensure!(third.fencing_token() > second.fencing_token());
    second.release().await?;
    third.release().await?;
    let agreed = shared(&c).semaphore(&key, 3)?.try_acquire(&opts()).await?;
    ensure!(agreed.is_some(), "a free name refused another number");
    if let Some(lease) = agreed {
        lease.release().await?;
    }
    ensure!(keys_under(&raw, &format!("{name}/")).await?.is_empty());
    Ok(())
}

/// Readers share; a waiting writer's key holds back readers that come after it (writers are
/// not starved); the writer's token is above every earlier reader's; readers go again after it.
pub async fn rw_lock_queues_writers_fairly(Env { endpoints, .. }: Env) -> anyhow::Result<()> {
    let [a, b, c] = clients(&endpoints, SESSION_TTL).await?;
    let raw = raw(&endpoints).await?;
    let key = key("rw");
    let name = family_name(&a, "rw", &key)?;
    let r1 = shared(&a).rw(&key)?.read(&opts()).await?;
    let r2 = shared(&b).rw(&key)?.read(&opts()).await?;
    ensure!(
        shared(&c).rw(&key)?.try_write(&opts()).await?.is_none(),
        "a writer beside readers"
    );
    let stored = keys_under(&raw, &format!("{name}/")).await?;
    ensure!(stored.len() == 2, "a busy try_write left a key: {stored:?}");
    ensure!(
        stored
            .iter()
            .all(|(k, _, _, lease)| k.starts_with(&format!("{name}/read/{lease:x}_"))),
        "{stored:?}"
    );
    ensure!(
        stored[0].2 == i64::try_from(r1.fencing_token().get())?,
        "{stored:?}"
    );
    let writers = shared(&c).rw(&key)?;
    let writer = tokio::spawn(async move {
        writers
            .write(&opts().with_wait(Duration::from_secs(20)))
            .await
    });
    eventually("the writer queues", Duration::from_secs(5), || async {
        Ok(keys_under(&raw, &format!("{name}/write/")).await?.len() == 1)
    })
    .await?;
    let queued = keys_under(&raw, &format!("{name}/write/")).await?;
    ensure!(
        queued[0]
            .0
            .starts_with(&format!("{name}/write/{:x}_", queued[0].3)),
        "{queued:?}"
    );
    ensure!(
        shared(&a).rw(&key)?.try_read(&opts()).await?.is_none(),
        "a reader overtook a waiting writer"
    );
    let held = shared(&a).rw(&key)?.holding().await?;
    ensure!(
        matches!(&held, Holding::Held(h) if h.holders == Some(2)),
        "{held:?}"
    );
    let top_reader = r1.fencing_token().max(r2.fencing_token());
    r1.release().await?;
    ensure!(!writer.is_finished(), "the writer went beside a reader");
    r2.release().await?;
    let w = tokio::time::timeout(Duration::from_secs(5), writer).await???;
    ensure!(w.fencing_token() > top_reader);
    ensure!(w.fencing_token().get() == u64::try_from(queued[0].2)?);
    ensure!(shared(&a).rw(&key)?.try_read(&opts()).await?.is_none());
    let writer_token = w.fencing_token();
    w.release().await?;
    let r3 = shared(&a).rw(&key)?.try_read(&opts()).await?;
    ensure!(r3.is_some(), "no reader after the writer");
    if let Some(r3) = r3 {
        ensure!(r3.fencing_token() > writer_token);
        r3.release().await?;
    }
    Ok(())
}

/// A semaphore acquire and a writer that time out have withdrawn their keys when the timeout
/// returns; a dropped waiting acquire's key goes right after; the name is usable again.
pub async fn cancelled_acquires_leave_no_key(Env { endpoints, .. }: Env) -> anyhow::Result<()> {
    let [a, b] = clients(&endpoints, SESSION_TTL).await?;
    let raw = raw(&endpoints).await?;
    let key = key("cancel");
    let sem = family_name(&a, "semaphore", &key)?;
    let rw = family_name(&a, "rw", &key)?;
    let holder = shared(&a).semaphore(&key, 1)?.acquire(&opts()).await?;
    let short = opts().with_wait(Duration::from_millis(300));
    let timed_out = shared(&b).semaphore(&key, 1)?.acquire(&short).await;
    ensure!(
        matches!(timed_out, Err(Error::Timeout { .. })),
        "{timed_out:?}"
    );
    let left = keys_under(&raw, &format!("{sem}/")).await?;
    ensure!(left.len() == 1, "a timed-out acquire left a key: {left:?}");
    let semaphore = shared(&b).semaphore(&key, 1)?;
    let waiting = tokio::spawn(async move { semaphore.acquire(&opts()).await });
    eventually("the acquire queues", Duration::from_secs(5), || async {
        Ok(keys_under(&raw, &format!("{sem}/")).await?.len() == 2)
    })
    .await?;
    waiting.abort();
    eventually(
        "the dropped acquire's key goes",
        Duration::from_secs(2),
        || async { Ok(keys_under(&raw, &format!("{sem}/")).await?.len() == 1) },
    )
    .await?;
    holder.release().await?;
    ensure!(keys_under(&raw, &format!("{sem}/")).await?.is_empty());

    let reader = shared(&a).rw(&key)?.read(&opts()).await?;
    let writer = shared(&b).rw(&key)?.write(&short).await;
    ensure!(matches!(writer, Err(Error::Timeout { .. })), "{writer:?}");
    let left = keys_under(&raw, &format!("{rw}/")).await?;
    ensure!(left.len() == 1, "a timed-out writer left a key: {left:?}");
    let another = shared(&b).rw(&key)?.try_read(&opts()).await?;
    ensure!(
        another.is_some(),
        "readers still held back by a gone writer"
    );
    if let Some(another) = another {
        another.release().await?;
    }
    reader.release().await?;
    ensure!(keys_under(&raw, &format!("{rw}/")).await?.is_empty());
    Ok(())
}

/// A permit that is not renewed goes at its TTL (the client deletes its key), and the permit
/// of a client cut off from the server returns when its lease runs out there (session TTL).
pub async fn permits_return_at_the_ttl_and_when_a_client_is_cut_off(
    Env { endpoints, .. }: Env,
) -> anyhow::Result<()> {
    let [a, b] = clients(&endpoints, SESSION_TTL).await?;
    let raw = raw(&endpoints).await?;
    let key = key("permit-ttl");
    let sem = family_name(&a, "semaphore", &key)?;
    let short = shared(&a)
        .semaphore(&key, 1)?
        .acquire(&LockOptions::new(Duration::from_millis(800)))
        .await?;
    ensure!(keys_under(&raw, &format!("{sem}/")).await?.len() == 1);
    eventually(
        "the permit's key goes at its TTL",
        Duration::from_secs(3),
        || async { Ok(keys_under(&raw, &format!("{sem}/")).await?.is_empty()) },
    )
    .await?;
    ensure!(!short.is_held(), "a permit past its TTL is held");
    let next = shared(&b).semaphore(&key, 1)?.try_acquire(&opts()).await?;
    let next = next.context("the permit did not return at its TTL")?;
    let endpoint = endpoints.first().context("no endpoint")?;
    let (frozen, freeze) = support::freezable_client(endpoint, SESSION_TTL).await?;
    next.release().await?;
    let cut_off = frozen.semaphore(&key, 1)?.acquire(&opts()).await?;
    freeze.freeze();
    let started = Instant::now();
    let after = shared(&b)
        .semaphore(&key, 1)?
        .acquire(&opts().with_wait(Duration::from_secs(15)))
        .await?;
    ensure!(
        started.elapsed() >= Duration::from_secs(1),
        "the permit of a cut-off client returned after {:?}",
        started.elapsed()
    );
    ensure!(after.fencing_token() > cut_off.fencing_token());
    freeze.thaw();
    after.release().await?;
    Ok(())
}

/// Closing a client revokes its session lease, which its grants' keys are attached to: their
/// keys are gone when `close` returns, and the leadership and the permit are lost.
pub async fn close_ends_the_grants_at_once(Env { endpoints, .. }: Env) -> anyhow::Result<()> {
    let [a, b] = clients(&endpoints, SESSION_TTL).await?;
    let raw = raw(&endpoints).await?;
    let key = key("close");
    let sem = family_name(&a, "semaphore", &key)?;
    let election = a.election_name(&key)?;
    let permit = shared(&a).semaphore(&key, 1)?.acquire(&opts()).await?;
    let leadership = shared(&a).election(&key)?.campaign("a", &opts()).await?;
    a.close().await?;
    ensure!(keys_under(&raw, &format!("{sem}/")).await?.is_empty());
    ensure!(keys_under(&raw, &format!("{election}/")).await?.is_empty());
    ensure!(!permit.is_held() && !leadership.is_leader());
    let next = shared(&b)
        .election(&key)?
        .try_campaign("b", &opts())
        .await?;
    ensure!(next.is_some(), "the closed client's leadership stood");
    Ok(())
}

/// Every grant lives on the client's session lease: when the server ends that lease behind the
/// client's back, the permit, the read hold and the leadership are lost and their keys gone; a
/// second campaign of the same client on one election waits for the first to resign.
pub async fn losing_the_session_loses_the_grants(Env { endpoints, .. }: Env) -> anyhow::Result<()> {
    let [a, b] = clients(&endpoints, SESSION_TTL).await?;
    let mut raw = raw(&endpoints).await?;
    let key = key("session-grants");
    let permit = shared(&a).semaphore(&key, 2)?.acquire(&opts()).await?;
    let read = shared(&a).rw(&key)?.read(&opts()).await?;
    let leadership = shared(&a).election(&key)?.campaign("a", &opts()).await?;
    let second = shared(&a)
        .election(&key)?
        .try_campaign("a-again", &opts())
        .await?;
    ensure!(second.is_none(), "one client campaigned twice at once");
    let session = a.session_lease().context("A has no session")?;
    raw.lease_revoke(session).await?;
    eventually("the grants are lost", Duration::from_secs(5), || async {
        Ok(!permit.is_held() && !read.is_held() && !leadership.is_leader())
    })
    .await?;
    for family in ["semaphore", "rw", "election"] {
        let name = family_name(&a, family, &key)?;
        let left = keys_under(&raw, &format!("{name}/")).await?;
        ensure!(left.is_empty(), "{family} keys left: {left:?}");
    }
    let next = shared(&b)
        .election(&key)?
        .try_campaign("b", &opts())
        .await?;
    ensure!(next.is_some(), "the lost leadership stood");
    if let Some(next) = next {
        next.resign().await?;
    }
    // A new session is granted for A's next campaign; its two campaigns take turns.
    let first = shared(&a).election(&key)?.campaign("a1", &opts()).await?;
    let again = shared(&a).election(&key)?;
    let waiting = tokio::spawn(async move {
        again
            .campaign("a2", &opts().with_wait(Duration::from_secs(10)))
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        !waiting.is_finished(),
        "a second campaign of A led beside the first"
    );
    let first_term = first.term();
    first.resign().await?;
    let led = tokio::time::timeout(Duration::from_secs(5), waiting).await???;
    ensure!(led.term() > first_term);
    led.resign().await?;
    Ok(())
}
