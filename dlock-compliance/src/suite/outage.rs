//! Outage: with the server gone, calls fail within their deadlines instead of hanging, and the
//! same client works again once the server is back.

use std::time::Duration;

use anyhow::{bail, ensure};
use dlock_core::{DistributedLockExt, Error};
use tokio::time::Instant;

use super::Ctx;

/// Stops the subject's dedicated server, checks that operations fail in bounded time with
/// [`Error::Unavailable`] (the same error for the same situation on every backend), restarts it,
/// and checks that service resumes — for the lock and for every primitive the subject declares.
pub(crate) async fn server_outage_gives_errors_not_hangs_then_recovers(
    cx: Ctx,
) -> anyhow::Result<()> {
    let Some(outage) = cx.subject().outage.clone() else {
        bail!("the subject has no dedicated server to stop");
    };
    let client = outage.client().await?;
    let key = cx.key("outage");
    let ttl = cx.ttl();
    cx.take_and_release(&client, &key).await?;
    let views = cx.declared_views(&client, "outage")?;
    for (_, view) in &views {
        cx.take_and_release(view, &key).await?;
    }
    outage.control.stop().await?;
    let result = async {
        let start = Instant::now();
        let attempt = client.try_acquire(&key, &cx.opts(ttl)).await;
        unavailable("try_acquire", attempt.map(|lease| lease.is_some()))?;
        ensure!(
            start.elapsed() <= ttl + cx.slack(),
            "try_acquire took {:?} to fail",
            start.elapsed()
        );
        let wait = ttl;
        let start = Instant::now();
        let attempt = client.acquire(&key, &cx.opts(ttl).with_wait(wait)).await;
        unavailable("acquire", attempt.map(|_| true))?;
        ensure!(
            start.elapsed() <= wait + cx.slack(),
            "acquire with a {wait:?} deadline took {:?} to fail",
            start.elapsed()
        );
        for (name, view) in &views {
            let start = Instant::now();
            let attempt = view.try_acquire(&key, &cx.opts(ttl)).await;
            unavailable(name, attempt.map(|lease| lease.is_some()))?;
            ensure!(
                start.elapsed() <= ttl + cx.slack(),
                "the {name} took {:?} to fail",
                start.elapsed()
            );
        }
        anyhow::Ok(())
    }
    .await;
    outage.control.start().await?;
    result?;
    let recovery = Duration::from_secs(30) + cx.slack();
    let start = Instant::now();
    loop {
        match client.try_acquire(&key, &cx.opts(ttl)).await {
            Ok(Some(lease)) => {
                lease.release().await?;
                break;
            }
            Ok(None) => bail!("the key is busy after the restart"),
            Err(e) if start.elapsed() > recovery => {
                bail!("no recovery {recovery:?} after the restart: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    for (name, view) in &views {
        let lease = view
            .try_acquire(&key, &cx.opts(ttl))
            .await?
            .ok_or_else(|| anyhow::anyhow!("the {name} is busy after the restart"))?;
        lease.release().await?;
    }
    Ok(())
}

/// Checks that `op` failed as unavailable; `Ok(true)` means it took the lock.
fn unavailable(op: &str, answer: Result<bool, Error>) -> anyhow::Result<()> {
    match answer {
        Err(Error::Unavailable { .. }) => Ok(()),
        Err(other) => bail!("{op} with the server stopped: expected Unavailable, got {other:?}"),
        Ok(true) => bail!("{op} took the lock with the server stopped"),
        Ok(false) => bail!("{op} answered busy with the server stopped"),
    }
}
