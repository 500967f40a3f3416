//! Mutual exclusion with the peer recipes on one lock path, in both directions, under each of
//! dlock's namings.
//!
//! Curator's `InterProcessMutex` is followed step by step as its source does it (`LockInternals`
//! with `StandardLockInternalsDriver`): a protected-mode ephemeral sequential child
//! `_c_<uuid>-lock-`, every child of the path sorted by the text after its last `lock-`, the
//! lock held by the first. No Java is needed to see what Curator would decide. kazoo runs for
//! real (Debian's python3-kazoo in the server's container).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use dlock_core::{DistributedLockExt, LockOptions};
use dlock_testkit::fixtures::connect_docker;
use dlock_zk::{Naming, ZkLock};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::kazoo::python;
use crate::support::{client_with, raw, url, SESSION};
use crate::Env;
use dlock_testkit::fixtures::exec::Exec;

/// One try of kazoo's `Lock` at argv[1], without waiting.
const KAZOO_TRY: &str = r#"
import sys
from kazoo.client import KazooClient
zk = KazooClient(hosts="127.0.0.1:2181")
zk.start(timeout=30)
lock = zk.Lock(sys.argv[1], "kazoo-try")
got = lock.acquire(blocking=False)
print("try " + ("acquired" if got else "busy"), flush=True)
if got:
    lock.release()
zk.stop()
"#;

async fn dlock(env: &Env, naming: Naming) -> anyhow::Result<Arc<ZkLock>> {
    client_with(&url(&env.hosts), SESSION, |b| b.with_naming(naming)).await
}

fn key(name: &str) -> String {
    format!("peers/{:016x}/{name}", rand::random::<u64>())
}

fn opts() -> LockOptions {
    LockOptions::new(Duration::from_secs(60))
}

/// Creates every missing node of `path` (persistent; dlock accepts parents of either kind).
async fn ensure_path(client: &zk::Client, path: &str) -> anyhow::Result<()> {
    let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let mut at = String::new();
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        at.push('/');
        at.push_str(segment);
        match client.create(&at, b"", &options).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// `StandardLockInternalsDriver.fixForSorting(name, "lock-")`.
fn curator_sort_key(name: &str) -> &str {
    name.rfind("lock-")
        .map_or(name, |i| &name[i + "lock-".len()..])
}

/// A Curator `InterProcessMutex` contender: its node, and what Curator decides about it.
pub struct Curator {
    client: zk::Client,
    parent: String,
    name: String,
}

impl Curator {
    /// Creates the contender's node as Curator does (protected mode, ephemeral sequential).
    pub async fn enqueue(env: &Env, parent: &str) -> anyhow::Result<Curator> {
        let client = raw::connect(&env.hosts).await?;
        ensure_path(&client, parent).await?;
        let uuid = format!("{:032x}", rand::random::<u128>());
        let prefix = format!(
            "{parent}/_c_{}-{}-{}-{}-{}-lock-",
            &uuid[0..8],
            &uuid[8..12],
            &uuid[12..16],
            &uuid[16..20],
            &uuid[20..32]
        );
        let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let (_, sequence) = client.create(&prefix, b"curator", &options).await?;
        let name = format!("{}{sequence}", &prefix[parent.len() + 1..]);
        Ok(Curator {
            client,
            parent: parent.to_owned(),
            name,
        })
    }

    /// Whether Curator would consider itself the holder (`getsTheLock` with one lease).
    async fn holds(&self) -> anyhow::Result<bool> {
        let mut children = raw::children(&self.client, &self.parent).await?;
        children.sort_by(|a, b| curator_sort_key(a).cmp(curator_sort_key(b)));
        let index = children
            .iter()
            .position(|c| *c == self.name)
            .context("Curator's node vanished")?;
        Ok(index == 0)
    }

    pub async fn release(self) -> anyhow::Result<()> {
        self.client
            .delete(&format!("{}/{}", self.parent, self.name), None)
            .await?;
        Ok(())
    }
}

/// A Curator holder makes dlock wait under either naming, and dlock takes the lock once
/// Curator's node is gone.
pub async fn dlock_waits_behind_a_curator_holder(env: Env) -> anyhow::Result<()> {
    for naming in [Naming::Kazoo, Naming::Curator] {
        let lock = dlock(&env, naming).await?;
        let key = key("curator-holds");
        let curator = Curator::enqueue(&env, &lock.lock_path(&key)?).await?;
        ensure!(curator.holds().await?, "Curator does not hold a free lock");
        ensure!(
            lock.try_acquire(&key, &opts()).await?.is_none(),
            "{naming}: dlock took a lock Curator holds"
        );
        let waiting = {
            let lock = lock.clone();
            let key = key.clone();
            tokio::spawn(async move {
                let lease = lock
                    .acquire(&key, &opts().with_wait(Duration::from_secs(20)))
                    .await?;
                Ok::<_, dlock_core::Error>((Instant::now(), lease))
            })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        ensure!(
            !waiting.is_finished(),
            "{naming}: a waiting dlock acquire ended while Curator held the lock"
        );
        let released = Instant::now();
        curator.release().await?;
        let (acquired, lease) = waiting.await??;
        ensure!(
            acquired >= released,
            "{naming}: dlock held before Curator released"
        );
        ensure!(
            acquired - released <= Duration::from_secs(3),
            "{naming}: dlock took {:?} to follow Curator",
            acquired - released
        );
        lease.release().await?;
    }
    Ok(())
}

/// Under the Curator naming, a Curator contender sees dlock's holder first and waits; under the
/// kazoo naming it misorders dlock's node and would take the lock alongside it, which is why the
/// naming is a setting (see `Naming`).
pub async fn curator_waits_behind_dlock_only_under_curator_naming(env: Env) -> anyhow::Result<()> {
    for (naming, curator_waits) in [(Naming::Curator, true), (Naming::Kazoo, false)] {
        let lock = dlock(&env, naming).await?;
        let key = key("dlock-holds");
        let lease = lock.acquire(&key, &opts()).await?;
        let curator = Curator::enqueue(&env, &lock.lock_path(&key)?).await?;
        let holds = curator.holds().await?;
        ensure!(
            holds != curator_waits,
            "{naming}: Curator {} while dlock holds",
            if holds { "holds too" } else { "waits" }
        );
        lease.release().await?;
        ensure!(
            curator.holds().await?,
            "{naming}: Curator does not hold after dlock's release"
        );
        curator.release().await?;
    }
    Ok(())
}

/// Under the Curator naming, dlock still waits behind a kazoo holder, but kazoo ignores a dlock
/// holder (kazoo waits only behind `__lock__` and `__rlock__` nodes). The kazoo naming, where
/// kazoo and dlock exclude each other both ways, is checked by the kazoo case.
pub async fn kazoo_under_curator_naming(env: Env) -> anyhow::Result<()> {
    let docker = connect_docker().await?;
    let lock = dlock(&env, Naming::Curator).await?;
    let key = key("kazoo");
    let path = lock.lock_path(&key)?;
    let mut kazoo = Exec::start(
        &docker,
        &env.container,
        python(crate::kazoo::HOLD, &[&path, "2"]),
    )
    .await?;
    kazoo.expect("held", Duration::from_secs(30)).await?;
    ensure!(
        lock.try_acquire(&key, &opts()).await?.is_none(),
        "dlock (curator naming) took a lock kazoo holds"
    );
    kazoo.expect("released", Duration::from_secs(10)).await?;
    kazoo.finish(Duration::from_secs(10)).await?;

    let lease = lock.acquire(&key, &opts()).await?;
    let mut kazoo = Exec::start(&docker, &env.container, python(KAZOO_TRY, &[&path])).await?;
    let answer = kazoo.expect("try ", Duration::from_secs(30)).await?;
    kazoo.finish(Duration::from_secs(10)).await?;
    ensure!(
        answer == "try acquired",
        "kazoo answered {answer:?} beside a dlock holder with the curator naming; dlock-zk's README says it does not see it"
    );
    lease.release().await?;
    Ok(())
}
