//! The semaphore, read-write lock and election on ZooKeeper, in kazoo's layouts: interoperability
//! with kazoo's `ReadLock`/`WriteLock`, `Semaphore` and `Election` in both directions (kazoo runs
//! for real, Debian's python3-kazoo inside the server's container), the nodes dlock leaves, and
//! withdrawals of cancelled acquires.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use dlock_core::backend::Primitive;
use dlock_core::inspect::Holding;
use dlock_core::{
    DistributedLock, DistributedLockExt, Error, FencingToken, LockOptions, OwnerRecord, Released,
};
use dlock_testkit::fixtures::connect_docker;
use dlock_zk::{Naming, ZkLock};
use futures::StreamExt;
use tokio::time::Instant;

use crate::kazoo::python;
use crate::support::{client_with, raw, url, SESSION};
use crate::Env;
use dlock_testkit::fixtures::exec::Exec;

/// kazoo's recipes, driven from the command line:
/// `KIND PATH ACTION [N] [IDENT]`, KIND one of `read`, `write`, `semaphore` (N = max_leases),
/// `election` (IDENT = the identifier); ACTION one of
/// * `try`: one attempt without waiting (`try acquired` / `try busy` / `try error …`), released;
/// * `hold SECONDS` (in N's place for locks, after N for the semaphore): takes it (waiting up to
///   30 s), prints `held`, holds, releases, prints `released`;
/// * `wait SECONDS`: waits up to SECONDS (`wait acquired` / `wait timeout`), released;
/// * `contenders`: prints `contenders ` and the JSON list of `contenders()` (locks, elections)
///   or `lease_holders()` (semaphores).
const KAZOO: &str = r#"
import sys, time, json
from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout
kind, path, action = sys.argv[1], sys.argv[2], sys.argv[3]
rest = sys.argv[4:]
zk = KazooClient(hosts="127.0.0.1:2181")
zk.start(timeout=30)
if kind == "read":
    r = zk.ReadLock(path, "kazoo-reader")
elif kind == "write":
    r = zk.WriteLock(path, "kazoo-writer")
elif kind == "semaphore":
    r = zk.Semaphore(path, "kazoo-permit", max_leases=int(rest.pop(0)))
elif kind == "election":
    r = zk.Election(path, rest.pop(0))
if action == "try":
    try:
        got = r.acquire(blocking=False)
        print("try " + ("acquired" if got else "busy"), flush=True)
        if got:
            r.release()
    except ValueError as e:
        print("try error ValueError " + str(e), flush=True)
elif action == "hold":
    seconds = float(rest.pop(0))
    if kind == "election":
        def lead():
            print("held", flush=True)
            time.sleep(seconds)
        r.run(lead)
    else:
        if not r.acquire(timeout=30):
            print("not-acquired", flush=True)
            sys.exit(2)
        print("held", flush=True)
        time.sleep(seconds)
        r.release()
    print("released", flush=True)
elif action == "wait":
    try:
        got = r.acquire(timeout=float(rest.pop(0)))
    except LockTimeout:
        got = False
    print("wait " + ("acquired" if got else "timeout"), flush=True)
    if got:
        r.release()
elif action == "contenders":
    names = r.lease_holders() if kind == "semaphore" else r.contenders()
    print("contenders " + json.dumps(names), flush=True)
zk.stop()
"#;

/// Runs kazoo with `args` in the server's container.
async fn kazoo(env: &Env, args: &[&str]) -> anyhow::Result<Exec> {
    let docker = connect_docker().await?;
    Exec::start(&docker, &env.container, python(KAZOO, args)).await
}

/// Runs a kazoo action that prints one answer line starting with `prefix`, and returns it.
async fn kazoo_answer(env: &Env, args: &[&str], prefix: &str) -> anyhow::Result<String> {
    let mut run = kazoo(env, args).await?;
    let line = run.expect(prefix, Duration::from_secs(30)).await?;
    run.finish(Duration::from_secs(10)).await?;
    Ok(line)
}

/// kazoo's `contenders()` (or `lease_holders()`), parsed.
async fn kazoo_contenders(env: &Env, args: &[&str]) -> anyhow::Result<Vec<String>> {
    let line = kazoo_answer(env, args, "contenders ").await?;
    let json = line.strip_prefix("contenders ").unwrap_or_default();
    parse_strings(json).with_context(|| format!("kazoo printed {line:?}"))
}

/// A JSON list of strings, as Python's `json.dumps` writes it.
fn parse_strings(json: &str) -> Option<Vec<String>> {
    let value: serde_json::Value = serde_json::from_str(json).ok()?;
    value
        .as_array()?
        .iter()
        .map(|v| v.as_str().map(str::to_owned))
        .collect()
}

async fn dlock(env: &Env, label: &str) -> anyhow::Result<Arc<ZkLock>> {
    client_with(&url(&env.hosts), SESSION, |b| b.with_owner(label)).await
}

fn key(name: &str) -> String {
    format!("primitives/{:016x}/{name}", rand::random::<u64>())
}

fn opts() -> LockOptions {
    LockOptions::new(Duration::from_secs(60))
}

fn view(lock: &Arc<ZkLock>, primitive: Primitive) -> anyhow::Result<Arc<dyn DistributedLock>> {
    Ok(lock.primitive(&primitive)?)
}

/// The children of `path`, sorted.
async fn children(env: &Env, path: &str) -> anyhow::Result<Vec<String>> {
    let client = raw::connect(&env.hosts).await?;
    let mut children = raw::children(&client, path).await?;
    children.sort();
    Ok(children)
}

/// The creation zxid of the first kazoo contender at `path` whose name contains `marker`.
async fn czxid_of(env: &Env, path: &str, marker: &str) -> anyhow::Result<u64> {
    let client = raw::connect(&env.hosts).await?;
    let mut nodes = Vec::new();
    for name in raw::children(&client, path).await? {
        if name.contains(marker) {
            let stat = raw::stat(&client, &format!("{path}/{name}"))
                .await?
                .context("a contender vanished")?;
            nodes.push(stat.czxid);
        }
    }
    nodes.sort_unstable();
    Ok(u64::try_from(*nodes.first().context("no such contender")?)?)
}

/// The layout on the server is kazoo's: a reader's node is `<owner hex>__rlock__<seq>`, a
/// writer's `<owner hex>__lock__<seq>` under the read-write path; a permit is an ephemeral
/// `<owner hex>` under the semaphore node, whose data is the number of permits, and the
/// semaphore's lock queue at `<path>-__lock__` is empty again after the grant; a candidate's
/// node is `<owner hex>__lock__<seq>` holding its value. Each grant's token is its node's
/// creation zxid, and the primitive paths end in `%rw`, `%semaphore` and `%election`.
pub async fn primitives_use_kazoos_layout(env: Env) -> anyhow::Result<()> {
    let lock = dlock(&env, "layout").await?;
    let client = raw::connect(&env.hosts).await?;
    let key = key("layout");
    let base = lock.lock_path(&key)?;
    let rw = lock.primitive_path(&key, &Primitive::Read)?;
    let sem = lock.primitive_path(&key, &Primitive::semaphore(2))?;
    let election = lock.primitive_path(&key, &Primitive::observer())?;
    ensure!(rw == format!("{base}%rw"), "{rw}");
    ensure!(sem == format!("{base}%semaphore"), "{sem}");
    ensure!(election == format!("{base}%election"), "{election}");

    let hex = |lease: &dlock_core::Lease| lease.owner().to_hex();
    let is_node = |name: &str, owner: &str, marker: &str| {
        name.strip_prefix(owner)
            .and_then(|rest| rest.strip_prefix(marker))
            .is_some_and(|seq| seq.len() == 10 && seq.bytes().all(|b| b.is_ascii_digit()))
    };
    let read = view(&lock, Primitive::Read)?.acquire(&key, &opts()).await?;
    let nodes = children(&env, &rw).await?;
    ensure!(
        nodes.len() == 1 && is_node(&nodes[0], &hex(&read), "__rlock__"),
        "{nodes:?}"
    );
    let stat = raw::stat(&client, &format!("{rw}/{}", nodes[0]))
        .await?
        .context("the reader's node")?;
    ensure!(read.fencing_token() == FencingToken(u64::try_from(stat.czxid)?));
    ensure!(stat.ephemeral_owner == lock.session_id().unwrap_or_default());
    read.release().await?;
    let write = view(&lock, Primitive::Write)?
        .acquire(&key, &opts())
        .await?;
    let nodes = children(&env, &rw).await?;
    ensure!(
        nodes.len() == 1 && is_node(&nodes[0], &hex(&write), "__lock__"),
        "{nodes:?}"
    );
    write.release().await?;

    let permit = view(&lock, Primitive::semaphore(2))?
        .acquire(&key, &opts())
        .await?;
    let leases = children(&env, &sem).await?;
    ensure!(leases == [hex(&permit)], "{leases:?}");
    let (data, stat) = client.get_data(&sem).await?;
    ensure!(data == b"2", "the semaphore's data is {data:?}");
    ensure!(
        stat.ephemeral_owner == 0,
        "the semaphore node is not persistent"
    );
    let lease = raw::stat(&client, &format!("{sem}/{}", hex(&permit)))
        .await?
        .context("the lease")?;
    ensure!(permit.fencing_token() == FencingToken(u64::try_from(lease.czxid)?));
    ensure!(lease.ephemeral_owner != 0, "the lease is not ephemeral");
    let queue = children(&env, &format!("{sem}-__lock__")).await?;
    ensure!(
        queue.is_empty(),
        "the semaphore's lock is still queued: {queue:?}"
    );
    permit.release().await?;
    ensure!(children(&env, &sem).await?.is_empty());
    // The node stays, as kazoo's does; with no lease held, the next holder sets the number.
    ensure!(
        raw::stat(&client, &sem).await?.is_some(),
        "the semaphore node went with its last lease"
    );
    let permit = view(&lock, Primitive::semaphore(3))?
        .acquire(&key, &opts())
        .await?;
    let (data, _) = client.get_data(&sem).await?;
    ensure!(
        data == b"3",
        "the semaphore's data is {data:?} after a holder of 3"
    );
    permit.release().await?;

    let leader = view(&lock, Primitive::candidate("10.0.0.7:8080"))?
        .acquire(&key, &opts())
        .await?;
    let nodes = children(&env, &election).await?;
    ensure!(
        nodes.len() == 1 && is_node(&nodes[0], &hex(&leader), "__lock__"),
        "{nodes:?}"
    );
    let (data, _) = client.get_data(&format!("{election}/{}", nodes[0])).await?;
    ensure!(data == b"10.0.0.7:8080", "the candidate's data is {data:?}");
    leader.release().await?;
    ensure!(children(&env, &election).await?.is_empty());
    // The lock of the same name is another thing: untouched by all of the above.
    ensure!(children(&env, &base).await?.is_empty());

    // The lock's `naming` setting does not apply: the primitives always name nodes as kazoo.
    let curator = client_with(&url(&env.hosts), SESSION, |b| {
        b.with_naming(Naming::Curator)
    })
    .await?;
    let read = view(&curator, Primitive::Read)?
        .acquire(&key, &opts())
        .await?;
    let nodes = children(&env, &rw).await?;
    ensure!(
        nodes.len() == 1 && is_node(&nodes[0], &hex(&read), "__rlock__"),
        "{nodes:?}"
    );
    read.release().await?;
    Ok(())
}

/// A kazoo `WriteLock` holder keeps dlock's readers and writers out; a dlock reader waiting for
/// it is served after kazoo's release; kazoo's `ReadLock` then shares with the dlock reader
/// while kazoo's `WriteLock` is refused.
pub async fn kazoo_writer_and_dlock_readers(env: Env) -> anyhow::Result<()> {
    let lock = dlock(&env, "rw-reader").await?;
    let key = key("kazoo-writer");
    let path = lock.primitive_path(&key, &Primitive::Read)?;
    let rw = lock.rw(&key)?;

    let mut writer = kazoo(&env, &["write", &path, "hold", "2"]).await?;
    writer.expect("held", Duration::from_secs(30)).await?;
    let seen = Instant::now();
    ensure!(
        rw.try_read(&opts()).await?.is_none(),
        "read beside kazoo's writer"
    );
    ensure!(
        rw.try_write(&opts()).await?.is_none(),
        "wrote beside kazoo's writer"
    );
    let read = rw.read(&opts().with_wait(Duration::from_secs(30))).await?;
    let waited = seen.elapsed();
    writer.expect("released", Duration::from_secs(5)).await?;
    writer.finish(Duration::from_secs(10)).await?;
    ensure!(
        waited >= Duration::from_secs(1),
        "the dlock reader was served {waited:?} after kazoo's writer took the lock for 2 s"
    );

    let answer = kazoo_answer(&env, &["read", &path, "try"], "try ").await?;
    ensure!(
        answer == "try acquired",
        "kazoo's reader beside a dlock reader: {answer}"
    );
    let answer = kazoo_answer(&env, &["write", &path, "try"], "try ").await?;
    ensure!(
        answer == "try busy",
        "kazoo's writer beside a dlock reader: {answer}"
    );
    // kazoo's contenders() shows the dlock reader's owner record.
    let contenders = kazoo_contenders(&env, &["read", &path, "contenders"]).await?;
    let records: Vec<_> = contenders
        .iter()
        .filter_map(|c| OwnerRecord::parse(c.as_bytes()))
        .collect();
    ensure!(
        records.len() == 1 && records[0].label.as_deref() == Some("rw-reader"),
        "kazoo sees {contenders:?}"
    );
    ensure!(read.release().await? == Released::Released);
    let answer = kazoo_answer(&env, &["write", &path, "try"], "try ").await?;
    ensure!(
        answer == "try acquired",
        "kazoo's writer after the release: {answer}"
    );
    Ok(())
}

/// A dlock writer keeps kazoo's readers and writers out and is listed first by kazoo's
/// `contenders()`; a kazoo `ReadLock` holder shares with dlock's readers, keeps dlock's writer
/// out, and the dlock writer that waited for it gets a token above the kazoo reader's node's
/// creation zxid.
pub async fn dlock_writer_and_kazoo_readers(env: Env) -> anyhow::Result<()> {
    let lock = dlock(&env, "rw-writer").await?;
    let key = key("dlock-writer");
    let path = lock.primitive_path(&key, &Primitive::Write)?;
    let rw = lock.rw(&key)?;

    let write = rw.write(&opts()).await?;
    for kind in ["read", "write"] {
        let answer = kazoo_answer(&env, &[kind, &path, "try"], "try ").await?;
        ensure!(
            answer == "try busy",
            "kazoo's {kind} lock beside a dlock writer: {answer}"
        );
    }
    let contenders = kazoo_contenders(&env, &["write", &path, "contenders"]).await?;
    let first = contenders
        .first()
        .and_then(|c| OwnerRecord::parse(c.as_bytes()));
    ensure!(
        contenders.len() == 1 && first.is_some_and(|r| r.label.as_deref() == Some("rw-writer")),
        "kazoo sees {contenders:?}"
    );
    ensure!(write.release().await? == Released::Released);

    let mut reader = kazoo(&env, &["read", &path, "hold", "2"]).await?;
    reader.expect("held", Duration::from_secs(30)).await?;
    let kazoo_token = czxid_of(&env, &path, "__rlock__").await?;
    let shared = rw
        .try_read(&opts())
        .await?
        .context("a dlock reader was refused beside kazoo's reader")?;
    shared.release().await?;
    ensure!(
        rw.try_write(&opts()).await?.is_none(),
        "wrote beside kazoo's reader"
    );
    let write = rw.write(&opts().with_wait(Duration::from_secs(30))).await?;
    reader.expect("released", Duration::from_secs(5)).await?;
    reader.finish(Duration::from_secs(10)).await?;
    ensure!(
        write.fencing_token().0 > kazoo_token,
        "the writer's token {} is not above the earlier kazoo reader's {kazoo_token}",
        write.fencing_token()
    );
    write.release().await?;
    Ok(())
}

/// A kazoo `Semaphore` and dlock share the permits of one semaphore: kazoo's lease counts
/// against dlock's, a dlock permit against kazoo's; another number of permits is refused on
/// both sides (dlock: `Error::Mismatch`, with nothing changed), and `lease_holders()` shows
/// dlock's owner record.
pub async fn kazoo_semaphore_and_dlock_share_permits(env: Env) -> anyhow::Result<()> {
    let lock = dlock(&env, "permit").await?;
    let key = key("semaphore");
    let path = lock.primitive_path(&key, &Primitive::semaphore(2))?;
    let sem = lock.semaphore(&key, 2)?;
    let client = raw::connect(&env.hosts).await?;

    // kazoo holds one of two permits: dlock gets the other, and then finds none.
    let mut holder = kazoo(&env, &["semaphore", &path, "hold", "2", "3"]).await?;
    holder.expect("held", Duration::from_secs(30)).await?;
    let second = sem
        .try_acquire(&opts())
        .await?
        .context("dlock did not get the second permit")?;
    ensure!(
        sem.try_acquire(&opts()).await?.is_none(),
        "a third permit of two"
    );

    // Another number: refused, nothing changed.
    let before = children(&env, &path).await?;
    match lock.semaphore(&key, 3)?.try_acquire(&opts()).await {
        Err(Error::Mismatch { message, .. }) => {
            ensure!(message.contains('2') && message.contains('3'), "{message}")
        }
        other => bail!("a semaphore of 3 beside one of 2: {other:?}"),
    }
    ensure!(
        children(&env, &path).await? == before,
        "the mismatch changed the leases"
    );
    ensure!(
        client.get_data(&path).await?.0 == b"2",
        "the mismatch changed the permits"
    );
    let queue = children(&env, &format!("{path}-__lock__")).await?;
    ensure!(
        queue.is_empty(),
        "the mismatch left {queue:?} in the semaphore's lock"
    );
    let answer = kazoo_answer(&env, &["semaphore", &path, "try", "3"], "try ").await?;
    ensure!(
        answer.starts_with("try error ValueError"),
        "kazoo with 3 leases: {answer}"
    );
    let holders = kazoo_contenders(&env, &["semaphore", &path, "contenders", "2"]).await?;
    let dlock_holders = holders
        .iter()
        .filter_map(|h| OwnerRecord::parse(h.as_bytes()))
        .filter(|r| r.label.as_deref() == Some("permit"))
        .count();
    ensure!(
        holders.len() == 2 && holders.contains(&"kazoo-permit".to_owned()) && dlock_holders == 1,
        "kazoo's lease_holders: {holders:?}"
    );

    // A dlock waiter is served when kazoo's lease goes.
    let third = sem
        .acquire(&opts().with_wait(Duration::from_secs(30)))
        .await?;
    holder.expect("released", Duration::from_secs(5)).await?;
    holder.finish(Duration::from_secs(10)).await?;
    ensure!(third.fencing_token() > second.fencing_token());

    // dlock holds both permits: kazoo finds none, then gets the one dlock gives back.
    let answer = kazoo_answer(&env, &["semaphore", &path, "try", "2"], "try ").await?;
    ensure!(
        answer == "try busy",
        "kazoo beside two dlock permits: {answer}"
    );
    second.release().await?;
    let answer = kazoo_answer(&env, &["semaphore", &path, "try", "2"], "try ").await?;
    ensure!(
        answer == "try acquired",
        "kazoo after a dlock release: {answer}"
    );
    third.release().await?;
    ensure!(children(&env, &path).await?.is_empty());
    Ok(())
}

/// A kazoo `Election` leader is what dlock's observer sees (its identifier as the value, its
/// node's creation zxid as the term); a dlock candidate campaigning meanwhile leads after kazoo
/// steps down, with a greater term.
pub async fn kazoo_leader_is_seen_by_dlock(env: Env) -> anyhow::Result<()> {
    let lock = dlock(&env, "observer").await?;
    let key = key("kazoo-leads");
    let path = lock.primitive_path(&key, &Primitive::observer())?;
    let election = lock.election(&key)?;

    let mut leader = kazoo(&env, &["election", &path, "hold", "kazoo-leader", "2"]).await?;
    leader.expect("held", Duration::from_secs(30)).await?;
    let term = czxid_of(&env, &path, "__lock__").await?;
    let seen = election.leader().await?.context("no leader seen")?;
    ensure!(
        seen.value.as_deref() == Some("kazoo-leader") && seen.term == Some(FencingToken(term)),
        "dlock sees {seen:?}, kazoo's term is {term}"
    );
    let mut observed = Box::pin(election.observe());
    let first = tokio::time::timeout(Duration::from_secs(10), observed.next())
        .await?
        .context("the observation ended")??;
    ensure!(
        first.value.as_deref() == Some("kazoo-leader") && first.term == Some(FencingToken(term)),
        "observe() shows {first:?}"
    );
    drop(observed);
    ensure!(
        election
            .try_campaign("dlock-candidate", &opts())
            .await?
            .is_none(),
        "dlock led beside kazoo's leader"
    );
    let leadership = election
        .campaign(
            "dlock-candidate",
            &opts().with_wait(Duration::from_secs(30)),
        )
        .await?;
    leader.expect("released", Duration::from_secs(5)).await?;
    leader.finish(Duration::from_secs(10)).await?;
    ensure!(
        leadership.term().0 > term,
        "the next term {} is not above kazoo's {term}",
        leadership.term()
    );
    let seen = election.leader().await?.context("no leader seen")?;
    ensure!(
        seen.value.as_deref() == Some("dlock-candidate") && seen.term == Some(leadership.term())
    );
    // The node data is the value (what kazoo shows): there is no owner record beside it.
    ensure!(seen.owner.is_none(), "{seen:?}");
    leadership.resign().await?;
    ensure!(
        election.leader().await?.is_none(),
        "a leader after the resignation"
    );
    Ok(())
}

/// A dlock leader is the first of kazoo's `Election.contenders()` (its value), a kazoo
/// candidate cannot lead beside it, and leads once dlock resigns.
pub async fn dlock_leader_is_seen_by_kazoo(env: Env) -> anyhow::Result<()> {
    let lock = dlock(&env, "candidate").await?;
    let key = key("dlock-leads");
    let path = lock.primitive_path(&key, &Primitive::observer())?;
    let election = lock.election(&key)?;
    let leadership = election.campaign("10.0.0.7:8080", &opts()).await?;
    let contenders =
        kazoo_contenders(&env, &["election", &path, "contenders", "kazoo-candidate"]).await?;
    ensure!(
        contenders == ["10.0.0.7:8080"],
        "kazoo's contenders: {contenders:?}"
    );
    let mut candidate = kazoo(&env, &["election", &path, "hold", "kazoo-candidate", "0"]).await?;
    // The kazoo process starts, connects and stands as a candidate (slowly on a loaded machine).
    let standing_by = Instant::now() + Duration::from_secs(30);
    while children(&env, &path).await?.len() < 2 {
        ensure!(
            Instant::now() < standing_by,
            "the kazoo candidate never stood"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let contenders =
        kazoo_contenders(&env, &["election", &path, "contenders", "kazoo-observer"]).await?;
    ensure!(
        contenders == ["10.0.0.7:8080", "kazoo-candidate"],
        "kazoo's contenders with a kazoo candidate waiting: {contenders:?}"
    );
    let seen = election.leader().await?.context("no leader")?;
    ensure!(seen.value.as_deref() == Some("10.0.0.7:8080"), "{seen:?}");
    leadership.resign().await?;
    candidate.expect("held", Duration::from_secs(10)).await?;
    candidate.finish(Duration::from_secs(10)).await?;
    Ok(())
}

/// A waiting acquire that times out, or is dropped, leaves no node behind: no queue entry of a
/// read-write lock's side or a candidate, and neither a lease nor an entry in the semaphore's
/// lock queue (where a waiting permit waits).
pub async fn cancelled_acquires_leave_no_node(env: Env) -> anyhow::Result<()> {
    let lock = dlock(&env, "cancel").await?;
    let key = key("cancel");
    let cases = [
        (Primitive::Write, Primitive::Read),
        (Primitive::Read, Primitive::Write),
        (Primitive::candidate("a"), Primitive::candidate("b")),
        (Primitive::semaphore(1), Primitive::semaphore(1)),
    ];
    for (held, waits) in cases {
        let path = lock.primitive_path(&key, &held)?;
        let holder = view(&lock, held.clone())?.acquire(&key, &opts()).await?;
        let queued = || async {
            let mut nodes = children(&env, &path).await?;
            if matches!(held, Primitive::Semaphore { .. }) {
                nodes.extend(children(&env, &format!("{path}-__lock__")).await?);
            }
            anyhow::Ok(nodes)
        };
        let alone = queued().await?;
        let waiter = view(&lock, waits.clone())?;
        let wait = opts().with_wait(Duration::from_millis(500));
        match waiter.acquire(&key, &wait).await {
            Err(Error::Timeout { .. }) => {}
            other => bail!(
                "{}: a wait behind a holder ended with {other:?}",
                waits.name()
            ),
        }
        // The withdrawal is done before the timeout returns.
        ensure!(
            queued().await? == alone,
            "{}: a timed-out wait left {:?}",
            waits.name(),
            queued().await?
        );
        let dropped = {
            let waiter = waiter.clone();
            let key = key.clone();
            tokio::spawn(async move {
                waiter
                    .acquire(&key, &opts().with_wait(Duration::from_secs(30)))
                    .await
            })
        };
        let queued_by = Instant::now() + Duration::from_secs(10);
        while queued().await?.len() != alone.len() + 1 {
            ensure!(
                Instant::now() < queued_by,
                "{}: the waiter is not queued",
                waits.name()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if matches!(held, Primitive::Semaphore { .. }) {
            // A waiting permit waits holding the semaphore's lock, as kazoo's does.
            let queue = children(&env, &format!("{path}-__lock__")).await?;
            ensure!(queue.len() == 1, "the semaphore's lock queue: {queue:?}");
        }
        dropped.abort();
        let _ = dropped.await;
        let by = Instant::now() + Duration::from_secs(5);
        while queued().await? != alone {
            ensure!(
                Instant::now() < by,
                "{}: a dropped wait left {:?}",
                waits.name(),
                queued().await?
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        holder.release().await?;
        ensure!(
            queued().await?.is_empty(),
            "{}: nodes after the release",
            held.name()
        );
    }
    Ok(())
}

/// Tokens follow grant order on one name: a writer's is above every earlier reader's, each
/// permit's above the permits granted before it, each term above the one before.
pub async fn tokens_grow_in_grant_order(env: Env) -> anyhow::Result<()> {
    let lock = dlock(&env, "tokens").await?;
    let key = key("tokens");
    let rw = lock.rw(&key)?;
    let r1 = rw.read(&opts()).await?;
    let r2 = rw.read(&opts()).await?;
    let writer = {
        let rw = rw.clone();
        tokio::spawn(async move { rw.write(&opts().with_wait(Duration::from_secs(30))).await })
    };
    // Writer preference: once the writer is in line, a reader arriving after it is held back.
    let path = lock.primitive_path(&key, &Primitive::Write)?;
    let queued_by = Instant::now() + Duration::from_secs(10);
    while children(&env, &path).await?.len() < 3 {
        ensure!(Instant::now() < queued_by, "the writer is not in line");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(
        rw.try_read(&opts()).await?.is_none(),
        "a reader passed a waiting writer"
    );
    let readers = [r1.fencing_token(), r2.fencing_token()];
    r1.release().await?;
    r2.release().await?;
    let w = writer.await??;
    ensure!(
        readers.iter().all(|r| w.fencing_token() > *r),
        "writer {} after readers {readers:?}",
        w.fencing_token()
    );
    let w_token = w.fencing_token();
    w.release().await?;
    let r3 = rw.read(&opts()).await?;
    ensure!(r3.fencing_token() > w_token);
    r3.release().await?;

    let sem = lock.semaphore(&key, 2)?;
    let mut last = FencingToken(0);
    for _ in 0..3 {
        let p = sem.acquire(&opts()).await?;
        ensure!(
            p.fencing_token() > last,
            "permit {} after {last}",
            p.fencing_token()
        );
        last = p.fencing_token();
        p.release().await?;
    }

    let election = lock.election(&key)?;
    let mut last = FencingToken(0);
    for value in ["a", "b", "c"] {
        let l = election.campaign(value, &opts()).await?;
        ensure!(l.term() > last, "term {} after {last}", l.term());
        last = l.term();
        match election.leader().await? {
            Some(leader) => ensure!(
                leader.value.as_deref() == Some(value) && leader.term == Some(l.term()),
                "{leader:?}"
            ),
            None => bail!("no leader while {value} leads"),
        }
        l.resign().await?;
    }
    // The observer cannot campaign.
    match lock
        .primitive(&Primitive::observer())?
        .try_acquire(&key, &opts())
        .await
    {
        Err(Error::InvalidInput { .. }) => {}
        other => bail!("an observer campaigned: {other:?}"),
    }
    let holding = lock
        .primitive(&Primitive::observer())?
        .holding(&key)
        .await?;
    ensure!(matches!(holding, Holding::Free), "{holding:?}");
    Ok(())
}

/// The lock path a primitive's node name belongs to: `name` without the suffix of a
/// read-write lock, an election, a semaphore or a semaphore's lock (for counting stored nodes).
pub fn strip_primitive_suffix(name: &str) -> &str {
    for suffix in ["%semaphore-__lock__", "%semaphore", "%election", "%rw"] {
        if let Some(stem) = name.strip_suffix(suffix) {
            return stem;
        }
    }
    name
}

/// kazoo 2.8's `ReadLock` (Debian's) also waits for writers queued *after* it (kazoo issue
/// #649, fixed in 2.9): a kazoo reader queued between two dlock writers waits for the later
/// writer once the first leaves, while that writer waits for the reader. Neither proceeds
/// until one gives up; here the later writer times out, and only then is kazoo's reader served.
pub async fn a_kazoo_28_reader_waits_for_a_later_writer(env: Env) -> anyhow::Result<()> {
    let lock = dlock(&env, "later-writer").await?;
    let key = key("kazoo-649");
    let path = lock.primitive_path(&key, &Primitive::Read)?;
    let rw = lock.rw(&key)?;
    let first = rw.write(&opts()).await?;
    let mut reader = kazoo(&env, &["read", &path, "wait", "8"]).await?;
    let queued = |n: usize| {
        let env = env.clone();
        let path = path.clone();
        async move {
            let by = Instant::now() + Duration::from_secs(20);
            while children(&env, &path).await?.len() < n {
                ensure!(Instant::now() < by, "{n} contenders did not queue");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(())
        }
    };
    queued(2).await?;
    let later = {
        let rw = rw.clone();
        tokio::spawn(async move { rw.write(&opts().with_wait(Duration::from_secs(3))).await })
    };
    queued(3).await?;
    first.release().await?;
    match later.await? {
        Err(Error::Timeout { .. }) => {}
        other => bail!("the later writer, queued behind kazoo's reader: {other:?}"),
    }
    let gave_up = Instant::now();
    let answer = reader.expect("wait ", Duration::from_secs(10)).await?;
    reader.finish(Duration::from_secs(10)).await?;
    ensure!(
        answer == "wait acquired",
        "kazoo's reader after the later writer gave up: {answer}"
    );
    ensure!(
        gave_up.elapsed() < Duration::from_secs(3),
        "kazoo's reader was served {:?} after the writer gave up",
        gave_up.elapsed()
    );
    Ok(())
}

/// Waiting permits are served in the order they came: each waits in the semaphore's lock queue,
/// and the first of them keeps the lock until a lease goes.
pub async fn semaphore_waiters_are_served_in_order(env: Env) -> anyhow::Result<()> {
    let lock = dlock(&env, "order").await?;
    let key = key("order");
    let sem = lock.semaphore(&key, 1)?;
    let lock_queue = format!(
        "{}-__lock__",
        lock.primitive_path(&key, &Primitive::semaphore(1))?
    );
    let held = sem.acquire(&opts()).await?;
    let (tx, mut served) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for name in ["first", "second", "third"] {
        let sem = sem.clone();
        let tx = tx.clone();
        waiters.push(tokio::spawn(async move {
            let lease = sem
                .acquire(&opts().with_wait(Duration::from_secs(30)))
                .await?;
            let _ = tx.send(name);
            tokio::time::sleep(Duration::from_millis(100)).await;
            lease.release().await?;
            anyhow::Ok(())
        }));
        // Queued one after the other: each waiter's node in the semaphore's lock queue (the
        // waiting permit holds it, as kazoo's does) before the next asks.
        let queued_by = Instant::now() + Duration::from_secs(10);
        while children(&env, &lock_queue).await?.len() < waiters.len() {
            ensure!(
                Instant::now() < queued_by,
                "the {name} waiter is not in line"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    held.release().await?;
    let mut order = Vec::new();
    for _ in 0..3 {
        let name = tokio::time::timeout(Duration::from_secs(20), served.recv())
            .await?
            .context("a waiter ended without a permit")?;
        order.push(name);
    }
    for waiter in waiters {
        waiter.await??;
    }
    ensure!(
        order == ["first", "second", "third"],
        "served in the order {order:?}"
    );
    Ok(())
}
