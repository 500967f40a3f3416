//! What operators see and do on Redlock: the owner record on every master (read with a plain
//! client), `inspect` with the holder's owner, `list` by prefix, and a fenced eviction whose
//! successor's token is greater and whose evicted lease turns lost. (Masters down are a fault
//! case, in the faults binary.)

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use dlock_core::backend::LockKey;
use dlock_core::inspect::{Eviction, Holding};
use dlock_core::{
    Admin, AutoRenew, DistributedLock, DistributedLockExt, Fenced, FencingToken, LockOptions,
    OwnerRecord, Released,
};
use dlock_redis::protocol::keys::owner_key;
use dlock_redlock::RedlockBuilder;
use dlock_testkit::case;
use dlock_testkit::trials::Case;

use crate::support::{self, unique, PATIENT, SLACK};

/// The cases of this module, each given the shared masters' URLs.
pub fn cases() -> Vec<(&'static str, Case<Vec<String>>)> {
    vec![
        case!(every_granting_master_keeps_the_owner_record),
        case!(list_by_prefix_and_a_fenced_eviction),
        case!(a_foreign_holder_has_no_owner_and_is_evicted_only_without_a_token),
        case!(a_semaphore_is_unsupported_and_declared_so),
    ]
}

/// Redlock declares the read-write lock and the election but no semaphore, and asking for one
/// is `Unsupported` before anything is sent.
async fn a_semaphore_is_unsupported_and_declared_so(urls: Vec<String>) -> anyhow::Result<()> {
    let client: Arc<dyn dlock_core::DistributedLock> =
        Arc::new(support::builder(&urls).connect().await?);
    let declared = client.capabilities().primitives;
    ensure!(
        declared == dlock_core::backend::Primitives::ALL.without_semaphore(),
        "declared {declared:?}"
    );
    match client.semaphore(&unique("sem"), 2) {
        Err(dlock_core::Error::Unsupported { .. }) => {}
        other => bail!("a semaphore by quorum: {other:?}"),
    }
    match client.primitive(&dlock_core::backend::Primitive::semaphore(1)) {
        Err(dlock_core::Error::Unsupported { .. }) => {}
        other => bail!("a semaphore view by quorum: {other:?}"),
    }
    ensure!(client.rw(&unique("rw")).is_ok() && client.election(&unique("e")).is_ok());
    Ok(())
}

/// The owner records of `name` on every master: `(owner token, fencing token, JSON)`.
async fn records(
    urls: &[String],
    name: &str,
) -> anyhow::Result<Vec<(Option<String>, Option<u64>, Option<String>)>> {
    let mut found = Vec::new();
    for url in urls {
        let mut con = support::raw(url).await?;
        found.push(
            redis::cmd("HMGET")
                .arg(owner_key(name))
                .arg(&["token", "fencing", "record"])
                .query_async(&mut con)
                .await?,
        );
    }
    Ok(found)
}

/// A grant leaves the same record, with the lease's owner token and fencing token, on (at
/// least) a quorum of masters; `inspect` names the owner; a release removes every record.
pub async fn every_granting_master_keeps_the_owner_record(urls: Vec<String>) -> anyhow::Result<()> {
    let url = format!(
        "redlock://{}?owner=nightly&request_timeout=2s",
        urls.iter()
            .map(|u| u.trim_start_matches("redis://").trim_end_matches('/'))
            .collect::<Vec<_>>()
            .join(",")
    );
    let client = Arc::new(RedlockBuilder::from_url(&url)?.connect().await?);
    let name = unique("owner");
    let lease = client
        .acquire(&name, &LockOptions::new(Duration::from_secs(30)))
        .await?;
    let owner = lease.owner().to_hex();
    let found = records(&urls, &name).await?;
    let mut agreeing = 0;
    for (token, fencing, json) in &found {
        if token.as_deref() != Some(owner.as_str()) {
            continue;
        }
        let json = json.as_deref().context("a record without its JSON")?;
        let record = OwnerRecord::parse(json.as_bytes()).context(json.to_owned())?;
        ensure!(record.pid == std::process::id(), "{json}");
        ensure!(record.label.as_deref() == Some("nightly"), "{json}");
        if *fencing == Some(lease.fencing_token().get()) {
            agreeing += 1;
        }
    }
    ensure!(
        agreeing >= client.quorum(),
        "{agreeing} masters record the lease's token: {found:?}"
    );
    match client.inspect(&LockKey::new(&name)?).await? {
        Holding::Held(holder) => {
            ensure!(holder.fencing == Some(lease.fencing_token()), "{holder}");
            let label = holder.owner.as_ref().and_then(|o| o.label.as_deref());
            ensure!(label == Some("nightly"), "{holder}");
        }
        other => bail!("a held lock shows as {other}"),
    }
    ensure!(lease.release().await? == Released::Released, "release");
    // The masters past the quorum hear of the release in the background.
    let gone = async {
        loop {
            if records(&urls, &name).await?.iter().all(|r| r.0.is_none()) {
                return anyhow::Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(PATIENT + SLACK, gone)
        .await
        .context("a record outlived the release")??;
    Ok(())
}

/// `list` shows the held locks under a prefix with their tokens; an eviction expecting another
/// token changes nothing; one expecting the shown token frees the lock, the successor's token is
/// greater and the fence refuses the evicted holder, whose renewal finds the lock gone.
pub async fn list_by_prefix_and_a_fenced_eviction(urls: Vec<String>) -> anyhow::Result<()> {
    let prefix = format!("{}:", unique("list"));
    let client: Arc<dyn DistributedLock> = support::client_with(&urls, |b| {
        b.with_prefix(&prefix).with_request_timeout(PATIENT)
    })
    .await?;
    let opts = LockOptions::new(Duration::from_secs(30));
    let a = client.acquire("jobs/a", &opts).await?;
    let renewal = Duration::from_millis(300);
    let stuck = client
        .acquire(
            "jobs/b",
            &opts.clone().with_renewal(AutoRenew {
                interval: Some(renewal),
                max_hold: None,
            }),
        )
        .await?;
    let other = client.acquire("reports/c", &opts).await?;

    let admin = Admin::new(&client);
    let listed = admin.list("jobs/").await?;
    let names: Vec<&str> = listed.iter().map(|l| l.key.as_str()).collect();
    ensure!(names == ["jobs/a", "jobs/b"], "list(jobs/): {names:?}");
    ensure!(
        listed[1].holder.fencing == Some(stuck.fencing_token()),
        "jobs/b: {}",
        listed[1].holder
    );
    ensure!(admin.list("").await?.len() == 3, "list of everything");

    let resource = Fenced::new(Vec::<&str>::new());
    resource.write(stuck.fencing_token(), |log| log.push("stuck"))?;
    let wrong = FencingToken(stuck.fencing_token().get() + 1);
    ensure!(
        matches!(
            admin.force_unlock("jobs/b", Some(wrong)).await?,
            Eviction::Changed(_)
        ),
        "a wrong token evicted"
    );
    ensure!(
        stuck.is_held(),
        "after a refused eviction: {:?}",
        stuck.state()
    );
    match admin
        .force_unlock("jobs/b", listed[1].holder.fencing)
        .await?
    {
        Eviction::Evicted(holder) => {
            ensure!(holder.fencing == Some(stuck.fencing_token()), "{holder}")
        }
        other => bail!("the eviction answered {other:?}"),
    }
    let successor = client
        .acquire("jobs/b", &opts.clone().with_wait(Duration::from_secs(10)))
        .await?;
    ensure!(
        successor.fencing_token() > stuck.fencing_token(),
        "token {} after the evicted {}",
        successor.fencing_token(),
        stuck.fencing_token()
    );
    resource.write(successor.fencing_token(), |log| log.push("successor"))?;
    ensure!(
        resource
            .write(stuck.fencing_token(), |log| log.push("late"))
            .is_err(),
        "the fence took the evicted holder's write"
    );
    let lost = tokio::time::timeout(renewal * 3 + PATIENT + SLACK, stuck.lost()).await;
    ensure!(lost.is_ok(), "the evicted lease: {:?}", stuck.state());

    for lease in [a, successor, other] {
        lease.release().await?;
    }
    ensure!(
        admin.force_unlock("jobs/a", None).await? == Eviction::Free,
        "a free key"
    );
    Ok(())
}

/// A key another client set on every master is held without an owner or token, is not listed,
/// refuses an eviction that expects a token, and goes with one that does not.
pub async fn a_foreign_holder_has_no_owner_and_is_evicted_only_without_a_token(
    urls: Vec<String>,
) -> anyhow::Result<()> {
    let client = support::client_with(&urls, |b| b.with_request_timeout(PATIENT)).await?;
    let name = unique("foreign");
    for url in &urls {
        let mut con = support::raw(url).await?;
        let _: () = redis::cmd("SET")
            .arg(&name)
            .arg("0123456789abcdef0123456789abcdef")
            .arg("PX")
            .arg(60_000)
            .query_async(&mut con)
            .await?;
    }
    match client.inspect(&LockKey::new(&name)?).await? {
        Holding::Held(holder) => ensure!(
            holder.owner.is_none() && holder.fencing.is_none(),
            "a foreign holder shows as {holder}"
        ),
        other => bail!("a foreign holder shows as {other}"),
    }
    let admin = Admin::new(&client);
    ensure!(admin.list(&name).await?.is_empty(), "a foreign lock listed");
    ensure!(
        matches!(
            admin.force_unlock(&name, Some(FencingToken(1))).await?,
            Eviction::Changed(_)
        ),
        "evicted by a token it does not show"
    );
    ensure!(
        matches!(admin.force_unlock(&name, None).await?, Eviction::Evicted(_)),
        "not evicted"
    );
    for url in &urls {
        let mut con = support::raw(url).await?;
        let left: u64 = redis::cmd("EXISTS")
            .arg(&name)
            .query_async(&mut con)
            .await?;
        ensure!(left == 0, "{name} is left on {url}");
    }
    Ok(())
}
