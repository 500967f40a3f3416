//! Interoperability with Python's kazoo `Lock` recipe (Debian's python3-kazoo, installed in the
//! ZooKeeper image), run with `docker exec` inside the server's container.

use std::time::Duration;

use anyhow::ensure;
use dlock_core::{DistributedLockExt, LockOptions, OwnerRecord, Released};
use dlock_testkit::fixtures::connect_docker;
use tokio::time::Instant;

use crate::support::{client_with, url, SESSION};
use crate::Env;
use dlock_testkit::fixtures::exec::Exec;

/// Takes the lock at argv[1], prints `held`, holds it for argv[2] seconds, releases it.
pub const HOLD: &str = r#"
import sys, time
from kazoo.client import KazooClient
zk = KazooClient(hosts="127.0.0.1:2181")
zk.start(timeout=30)
lock = zk.Lock(sys.argv[1], "kazoo-holder")
if not lock.acquire(timeout=30):
    print("not-acquired", flush=True)
    sys.exit(2)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
lock.release()
print("released", flush=True)
zk.stop()
"#;

/// Tries the lock at argv[1] for one second, lists the contenders, then waits for it.
const WAIT: &str = r#"
import sys
from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout
zk = KazooClient(hosts="127.0.0.1:2181")
zk.start(timeout=30)
lock = zk.Lock(sys.argv[1], "kazoo-waiter")
try:
    print("first " + ("acquired" if lock.acquire(timeout=1.0) else "timeout"), flush=True)
except LockTimeout:
    print("first timeout", flush=True)
print("contenders " + ",".join(lock.contenders()), flush=True)
if not lock.acquire(timeout=30):
    print("not-acquired", flush=True)
    sys.exit(2)
print("acquired", flush=True)
lock.release()
zk.stop()
"#;

pub fn python(script: &str, args: &[&str]) -> Vec<String> {
    let mut cmd = vec!["python3".to_owned(), "-c".to_owned(), script.to_owned()];
    cmd.extend(args.iter().map(|a| a.to_string()));
    cmd
}

/// A kazoo holder makes dlock wait, and a dlock holder makes kazoo wait, on one lock path.
pub async fn kazoo_and_dlock_exclude_each_other_on_one_path(env: Env) -> anyhow::Result<()> {
    let docker = connect_docker().await?;
    let lock = client_with(&url(&env.hosts), SESSION, |b| {
        b.with_identifier("dlock-interop")
    })
    .await?;
    // Characters that need encoding, so the path kazoo uses is the encoded one.
    let key = format!("kazoo/{:016x}/invoices 42", rand::random::<u64>());
    let path = lock.lock_path(&key)?;
    let opts = LockOptions::new(Duration::from_secs(60));

    // kazoo holds; dlock is busy, then waits for kazoo's release.
    let hold_for = Duration::from_secs(2);
    let mut kazoo = Exec::start(
        &docker,
        &env.container,
        python(HOLD, &[&path, &hold_for.as_secs_f64().to_string()]),
    )
    .await?;
    kazoo.expect("held", Duration::from_secs(30)).await?;
    let seen_held = Instant::now();
    ensure!(
        lock.try_acquire(&key, &opts).await?.is_none(),
        "dlock took a lock kazoo holds"
    );
    let lease = lock
        .acquire(&key, &opts.clone().with_wait(Duration::from_secs(30)))
        .await?;
    let waited = seen_held.elapsed();
    kazoo.expect("released", Duration::from_secs(5)).await?;
    kazoo.finish(Duration::from_secs(10)).await?;
    ensure!(
        waited >= hold_for / 2,
        "dlock acquired {waited:?} after kazoo took the lock for {hold_for:?}"
    );

    // dlock holds; kazoo times out, sees dlock as the contender, then gets the lock after
    // dlock's release.
    let mut kazoo = Exec::start(&docker, &env.container, python(WAIT, &[&path])).await?;
    let first = kazoo.expect("first ", Duration::from_secs(30)).await?;
    ensure!(
        first == "first timeout",
        "kazoo's one-second attempt on a lock dlock holds: {first}"
    );
    let contenders = kazoo.expect("contenders", Duration::from_secs(10)).await?;
    // kazoo's contenders are the nodes' data: dlock's owner record, with the identifier as label.
    let record = contenders
        .strip_prefix("contenders ")
        .and_then(|json| OwnerRecord::parse(json.as_bytes()));
    ensure!(
        record.is_some_and(|r| r.label.as_deref() == Some("dlock-interop")),
        "kazoo sees {contenders:?}"
    );
    ensure!(lease.is_held(), "the lease is {:?}", lease.state());
    ensure!(lease.release().await? == Released::Released);
    kazoo.expect("acquired", Duration::from_secs(30)).await?;
    kazoo.finish(Duration::from_secs(10)).await?;
    // And dlock gets it back once kazoo is done.
    let again = lock
        .try_acquire(&key, &opts)
        .await?
        .ok_or_else(|| anyhow::anyhow!("kazoo left the lock held"))?;
    again.release().await?;
    Ok(())
}
