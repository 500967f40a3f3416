//! Connecting: the URL's credentials and database are used (and the password never shows), and one
//! client keeps one connection however many tasks use it. (Unreachable and silent servers are
//! fault cases, in the faults binary.)

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use dlock_core::{DistributedLockExt, LockOptions};
use dlock_redis::RedisLock;
use dlock_testkit::case;
use dlock_testkit::fixtures::RedisServer;
use dlock_testkit::trials::Case;

use crate::support::{self, unique};

/// The cases of this module, each given the shared server's URL.
pub fn cases() -> Vec<(&'static str, Case<String>)> {
    vec![
        case!(credentials_and_database_come_from_the_url),
        case!(one_connection_serves_many_concurrent_acquires),
    ]
}

/// The database number of the URL is where the locks live; a user name and password are used
/// (also by a user without permission for the release channels), a wrong password is a permanent
/// error, and the password shows nowhere.
pub async fn credentials_and_database_come_from_the_url(url: String) -> anyhow::Result<()> {
    let client = Arc::new(RedisLock::connect(&format!("{url}/3")).await?);
    let name = unique("db3");
    let lease = client
        .try_acquire(&name, &LockOptions::new(Duration::from_secs(30)))
        .await?
        .context("a free key was busy")?;
    let mut raw = support::raw(&url).await?;
    let in_db0: bool = redis::cmd("EXISTS")
        .arg(&name)
        .query_async(&mut raw)
        .await?;
    let mut raw3 = support::raw(&format!("{url}/3")).await?;
    let in_db3: bool = redis::cmd("EXISTS")
        .arg(&name)
        .query_async(&mut raw3)
        .await?;
    ensure!(
        in_db3 && !in_db0,
        "lock in db 3: {in_db3}, in db 0: {in_db0}"
    );
    lease.release().await?;

    // A user with a password (an ACL user, created for this trial), then the wrong password.
    let user = format!("dlock-test-{:08x}", rand::random::<u32>());
    let secret = "hunter2-do-not-print";
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("on")
        .arg(format!(">{secret}"))
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query_async::<()>(&mut raw)
        .await?;
    let outcome = async {
        let as_user = url.replacen("redis://", &format!("redis://{user}:{secret}@"), 1);
        let client = Arc::new(RedisLock::connect(&as_user).await?);
        ensure!(
            !format!("{client:?}").contains(secret),
            "Debug shows the password: {client:?}"
        );
        client
            .try_acquire(&unique("acl"), &LockOptions::new(Duration::from_secs(5)))
            .await?
            .context("a free key was busy for the ACL user")?
            .release()
            .await?;
        // Without permission for the release channels the user still locks and releases; a
        // waiter learns of the release by polling.
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg(&user)
            .arg("resetchannels")
            .query_async::<()>(&mut raw.clone())
            .await?;
        let other = Arc::new(RedisLock::connect(&as_user).await?);
        let key = unique("acl-no-channels");
        let opts = LockOptions::new(Duration::from_secs(30));
        let held = client.acquire(&key, &opts).await?;
        let waiting = {
            let (other, key, opts) = (other.clone(), key.clone(), opts.clone());
            tokio::spawn(async move {
                other
                    .acquire(&key, &opts.with_wait(Duration::from_secs(10)))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        ensure!(
            held.release().await? == dlock_core::Released::Released,
            "release without channel permission"
        );
        tokio::time::timeout(Duration::from_secs(3), waiting)
            .await
            .context("the waiter did not get the lock after the release")???
            .release()
            .await?;
        let wrong = url.replacen("redis://", &format!("redis://{user}:not-{secret}@"), 1);
        match RedisLock::connect(&wrong).await {
            Err(e) => {
                ensure!(!e.is_temporary(), "a refused password is temporary: {e}");
                let shown = format!("{e} {e:?}");
                ensure!(
                    !shown.contains(secret),
                    "the error shows the password: {shown}"
                );
            }
            Ok(client) => bail!("the server accepted a wrong password: {client:?}"),
        }
        anyhow::Ok(())
    }
    .await;
    redis::cmd("ACL")
        .arg("DELUSER")
        .arg(&user)
        .query_async::<()>(&mut raw)
        .await?;
    outcome?;
    let with_password = url.replacen("redis://", &format!("redis://:{secret}@"), 1);
    let builder = RedisLock::builder(&with_password);
    ensure!(
        !format!("{builder:?}").contains(secret),
        "the builder shows the password"
    );
    Ok(())
}

/// 64 tasks acquiring and releasing at once, and a task waiting, use this client's two
/// connections (commands, notifications) and no more.
pub async fn one_connection_serves_many_concurrent_acquires(_: String) -> anyhow::Result<()> {
    let server = RedisServer::start().await?;
    let mut raw = support::raw(&server.url()).await?;
    let clients = |info: String| -> anyhow::Result<u64> {
        info.lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .context("no connected_clients in INFO")?
            .trim()
            .parse()
            .context("connected_clients")
    };
    let info = || redis::cmd("INFO").arg("clients").clone();
    let before = clients(info().query_async(&mut raw).await?)?;

    let [client, blocker] = support::clients(&server.url()).await?;
    let busy = unique("busy");
    let held = blocker
        .acquire(&busy, &LockOptions::new(Duration::from_secs(30)))
        .await?;
    let waiting = {
        let (client, busy) = (client.clone(), busy.clone());
        tokio::spawn(async move {
            client
                .acquire(
                    &busy,
                    &LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(20)),
                )
                .await
        })
    };
    let mut tasks = Vec::new();
    for i in 0..64 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let opts = LockOptions::new(Duration::from_secs(30));
            for round in 0..10 {
                let lease = client
                    .try_acquire(&format!("many/{i}/{round}"), &opts)
                    .await?
                    .context("a free key was busy")?;
                lease.release().await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let during = clients(info().query_async(&mut raw).await?)?;
    // This client: commands + notifications; the blocker: commands.
    ensure!(
        during == before + 3,
        "{} connections for two clients (expected 3: commands + notifications, and the blocker's)",
        during - before
    );
    held.release().await?;
    waiting.await??.release().await?;
    server.shutdown().await?;
    Ok(())
}
