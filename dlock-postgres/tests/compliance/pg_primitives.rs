//! The read-write lock and the semaphore beside plain `psql` sessions, on the documented keys:
//! `pg_advisory_lock_shared` on the name's key is a reader to dlock and `pg_advisory_lock` a
//! writer (DistributedLock's `PostgresDistributedReaderWriterLock` takes the same locks), both
//! ways; a waiting `psql` writer holds dlock's readers back, and a waiting dlock writer holds
//! the companion key; a `psql` session on a semaphore's slot key counts as a permit, and its
//! number of permits is enforced.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use dlock_core::{DistributedLockExt, Error, LockOptions};
use dlock_postgres::{advisory_key, rw_companion_key, semaphore_slot_key, AdvisoryKey};
use dlock_testkit::case;
use dlock_testkit::fixtures::{PostgresServer, PsqlSession};
use dlock_testkit::trials::{self, Case};
use libtest_mimic::Trial;
use tokio::time::Instant;

use crate::support::{client, NAMESPACE};

/// Upper bound for one whole case.
const TRIAL_BUDGET: Duration = Duration::from_secs(120);

fn cases() -> Vec<(&'static str, Case<Arc<PostgresServer>>)> {
    vec![
        case!(a_psql_reader_shares_with_dlock_readers_and_keeps_writers_out),
        case!(a_psql_writer_keeps_dlock_readers_and_writers_out),
        case!(psql_sees_dlock_readers_and_writers),
        case!(a_waiting_psql_writer_holds_dlock_readers_back),
        case!(a_waiting_dlock_writer_holds_the_companion_key_until_it_gives_up),
        case!(a_psql_session_on_a_slot_key_holds_a_permit),
    ]
}

/// The trial names, for a run that opted out of Docker.
pub fn names() -> Vec<String> {
    trials::names("postgres", &cases())
}

/// The trials against the shared server.
pub fn trials(server: &Arc<PostgresServer>) -> Vec<Trial> {
    trials::cases("postgres", &cases(), server, TRIAL_BUDGET)
}

/// A name that hashes into the `bigint` space (longer than 9 characters, not hexadecimal).
fn name(case: &str) -> String {
    let suffix = dlock_core::OwnerToken::random().as_u128() as u64;
    format!("{NAMESPACE}{case}/{suffix}")
}

fn args(key: AdvisoryKey) -> String {
    match key {
        AdvisoryKey::Single(k) => format!("{k}"),
        AdvisoryKey::Pair(h, l) => format!("{h}, {l}"),
    }
}

fn opts() -> LockOptions {
    LockOptions::new(Duration::from_secs(10))
}

/// Waits until `session` holds `count` granted advisory locks.
async fn wait_holding(
    server: &PostgresServer,
    session: &PsqlSession,
    count: usize,
) -> anyhow::Result<()> {
    let sql = format!(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
         WHERE a.application_name = '{}' AND l.locktype = 'advisory' AND l.granted",
        session.application_name()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if server.psql(&sql).await? == count.to_string() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{} never held {count} advisory locks",
            session.application_name()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// psql holds the name's key shared: a dlock reader joins it, a dlock writer is refused until
/// psql lets go; inspect counts both readers.
async fn a_psql_reader_shares_with_dlock_readers_and_keeps_writers_out(
    server: Arc<PostgresServer>,
) -> anyhow::Result<()> {
    let name = name("psql-reader");
    let key = advisory_key(&name);
    let mut psql = server.psql_session().await?;
    psql.send(&format!("SELECT pg_advisory_lock_shared({});", args(key)))
        .await?;
    wait_holding(&server, &psql, 1).await?;
    let (a, b) = (client(&server.url()).await?, client(&server.url()).await?);
    let (reader, writer) = (a.rw(&name)?, b.rw(&name)?);
    let read = reader
        .try_read(&opts())
        .await?
        .context("a dlock reader was refused beside a psql reader")?;
    ensure!(
        writer.try_write(&opts()).await?.is_none(),
        "a dlock writer got in beside a psql reader"
    );
    let holding = writer.holding().await?;
    let holder = holding.holder().context("inspect shows no reader")?;
    ensure!(
        holder.holders == Some(2),
        "inspect counts {:?} readers, not 2",
        holder.holders
    );
    ensure!(
        holder.fencing == Some(read.fencing_token()) && holder.owner.is_some(),
        "the earliest reader with a row is dlock's: {holder:?}"
    );
    read.release().await?;
    ensure!(
        writer.try_write(&opts()).await?.is_none(),
        "a dlock writer got in beside the psql reader alone"
    );
    psql.stop().await?;
    let write = writer
        .write(&opts().with_wait(Duration::from_secs(5)))
        .await
        .context("the dlock writer after psql's reader left")?;
    write.release().await?;
    Ok(())
}

/// psql holds the name's key exclusively: dlock's readers and writers are refused, and a
/// waiting dlock reader gets in once psql lets go.
async fn a_psql_writer_keeps_dlock_readers_and_writers_out(
    server: Arc<PostgresServer>,
) -> anyhow::Result<()> {
    let name = name("psql-writer");
    let AdvisoryKey::Single(key) = advisory_key(&name) else {
        bail!("{name} should hash into the bigint space");
    };
    let holder = server.hold_advisory_lock(key).await?;
    holder.wait_granted(Duration::from_secs(10)).await?;
    let rw = client(&server.url()).await?.rw(&name)?;
    ensure!(
        rw.try_read(&opts()).await?.is_none(),
        "a dlock reader got in beside a psql writer"
    );
    ensure!(
        rw.try_write(&opts()).await?.is_none(),
        "a dlock writer got in beside a psql writer"
    );
    let waiting = {
        let rw = rw.clone();
        tokio::spawn(async move { rw.read(&opts().with_wait(Duration::from_secs(20))).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(!waiting.is_finished(), "the dlock reader did not wait");
    holder.release().await?;
    let read = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .context("the dlock reader after psql's writer left")???;
    read.release().await?;
    Ok(())
}

/// A dlock reader lets psql read and not write; a dlock writer lets psql do neither: for a
/// hashed name (the `bigint` space) and a short one (the pair space).
async fn psql_sees_dlock_readers_and_writers(server: Arc<PostgresServer>) -> anyhow::Result<()> {
    let short = format!("r{:08x}", dlock_core::OwnerToken::random().as_u128() as u32);
    for name in [name("dlock-rw"), short] {
        psql_sees_dlock_readers_and_writers_of(&server, &name)
            .await
            .with_context(|| format!("the read-write lock {name:?}"))?;
    }
    Ok(())
}

async fn psql_sees_dlock_readers_and_writers_of(
    server: &PostgresServer,
    name: &str,
) -> anyhow::Result<()> {
    let key = args(advisory_key(name));
    let rw = client(&server.url()).await?.rw(name)?;
    // Each `psql` call is a session of its own, which ends (and frees what it took) at once.
    let try_read = format!("SELECT pg_try_advisory_lock_shared({key})");
    let try_write = format!("SELECT pg_try_advisory_lock({key})");
    let read = rw.read(&opts()).await?;
    ensure!(
        server.psql(&try_read).await? == "t",
        "psql could not read beside a dlock reader"
    );
    ensure!(
        server.psql(&try_write).await? == "f",
        "psql wrote beside a dlock reader"
    );
    read.release().await?;
    let write = rw.write(&opts()).await?;
    ensure!(
        server.psql(&try_read).await? == "f",
        "psql read beside a dlock writer"
    );
    ensure!(
        server.psql(&try_write).await? == "f",
        "psql wrote beside a dlock writer"
    );
    write.release().await?;
    ensure!(
        server.psql(&try_write).await? == "t",
        "psql could not write after the dlock writer left"
    );
    Ok(())
}

/// A psql writer blocked in `pg_advisory_lock` behind a dlock reader holds new dlock readers
/// back (PostgreSQL's own queue), and gets the key when the reader leaves.
async fn a_waiting_psql_writer_holds_dlock_readers_back(
    server: Arc<PostgresServer>,
) -> anyhow::Result<()> {
    let name = name("psql-waits");
    let AdvisoryKey::Single(key) = advisory_key(&name) else {
        bail!("{name} should hash into the bigint space");
    };
    let (a, b) = (client(&server.url()).await?, client(&server.url()).await?);
    let read = a.rw(&name)?.read(&opts()).await?;
    let writer = server.hold_advisory_lock(key).await?;
    // Wait until psql's request stands in the queue.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server
        .advisory_lock_holders(key)
        .await?
        .iter()
        .all(|e| e.application_name != writer.application_name())
    {
        ensure!(Instant::now() < deadline, "psql's request never queued");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(
        b.rw(&name)?.try_read(&opts()).await?.is_none(),
        "a dlock reader went ahead of a waiting psql writer"
    );
    read.release().await?;
    writer.wait_granted(Duration::from_secs(5)).await?;
    writer.release().await?;
    Ok(())
}

/// A waiting dlock writer holds the companion key, so psql readers that follow the protocol are
/// held back too; a writer that gives up (dropped) frees it at once.
async fn a_waiting_dlock_writer_holds_the_companion_key_until_it_gives_up(
    server: Arc<PostgresServer>,
) -> anyhow::Result<()> {
    let name = name("companion");
    let companion = format!(
        "SELECT pg_try_advisory_lock_shared({})",
        args(rw_companion_key(&name))
    );
    let (a, b) = (client(&server.url()).await?, client(&server.url()).await?);
    let read = a.rw(&name)?.read(&opts()).await?;
    ensure!(
        server.psql(&companion).await? == "t",
        "the companion key is held while no writer waits"
    );
    let waiting = {
        let rw = b.rw(&name)?;
        tokio::spawn(async move { rw.write(&opts().with_wait(Duration::from_secs(30))).await })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.psql(&companion).await? == "t" {
        ensure!(
            Instant::now() < deadline,
            "the waiting writer never took the companion key"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    waiting.abort();
    let _ = waiting.await;
    let given_up = Instant::now();
    while server.psql(&companion).await? == "f" {
        ensure!(
            given_up.elapsed() < Duration::from_secs(2),
            "the dropped writer kept the companion key"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    read.release().await?;
    Ok(())
}

/// psql holds slot 0 of a semaphore of 2: dlock with 3 permits is refused (mismatch), with 2 it
/// gets the other slot and then none; inspect counts both; psql's permit returns when it lets go.
async fn a_psql_session_on_a_slot_key_holds_a_permit(
    server: Arc<PostgresServer>,
) -> anyhow::Result<()> {
    let name = name("semaphore");
    let mut psql = server.psql_session().await?;
    psql.send(&format!(
        "SELECT pg_advisory_lock({});",
        args(semaphore_slot_key(&name, 2, 0))
    ))
    .await?;
    wait_holding(&server, &psql, 1).await?;
    let (a, b) = (client(&server.url()).await?, client(&server.url()).await?);
    match b.semaphore(&name, 3)?.try_acquire(&opts()).await {
        Err(Error::Mismatch { .. }) => {}
        Err(other) => bail!("3 permits beside a slot of 2: {other}"),
        Ok(_) => bail!("3 permits beside a slot of 2 was not refused"),
    }
    let two = a.semaphore(&name, 2)?;
    let permit = two
        .try_acquire(&opts())
        .await?
        .context("the second permit of 2 was refused")?;
    ensure!(
        two.try_acquire(&opts()).await?.is_none(),
        "a third permit of 2 was granted"
    );
    let holder = two.holding().await?;
    ensure!(
        holder.holder().and_then(|h| h.holders) == Some(2),
        "inspect shows {holder:?}, not 2 holders"
    );
    psql.stop().await?;
    let next = two
        .acquire(&opts().with_wait(Duration::from_secs(5)))
        .await
        .context("psql's permit did not return")?;
    next.release().await?;
    permit.release().await?;
    Ok(())
}
