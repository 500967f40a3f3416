//! A silent link: the connection stays open but nothing comes back (a dropped route, a peer that
//! forgot the connection, a proxy that lost its state). Calls fail in bounded time meanwhile,
//! and once the link carries bytes again the same client works within [`RECOVERY`].

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use dlock_core::{DistributedLock, DistributedLockExt};
use dlock_testkit::Freeze;
use tokio::time::Instant;

use super::Ctx;

/// How long the link stays silent: longer than any request timeout of the backends' defaults,
/// so the silence is noticed before it ends.
const SILENCE: Duration = Duration::from_secs(3);

/// The longest a client may take to work again once its link is healed: a request timeout plus
/// a reconnection's backoff with the backends' defaults. Not stretched by the subject's slack:
/// a client that needs longer keeps its callers failing for that long after every such fault.
pub const RECOVERY: Duration = Duration::from_secs(5);

/// Silences every link of a proxied client for [`SILENCE`] (bytes discarded both ways,
/// connections left open), checks that attempts meanwhile (on the lock and on every primitive the
/// subject declares, each on a key of its own) fail in bounded time, heals the links, and checks
/// that an acquire succeeds within [`RECOVERY`] and that none of the failed attempts left its key
/// busy: not on the server and not in the client, whose clean-up of the abandoned attempts may
/// still be under way.
pub(crate) async fn silent_link_fails_in_bounded_time_then_recovers(cx: Ctx) -> anyhow::Result<()> {
    let Some((client, link)) = cx.subject().proxied_client().await? else {
        bail!("the subject makes no clients through a proxy");
    };
    let key = cx.key("silent");
    let ttl = cx.ttl();
    cx.take_and_release(&client, &key).await?;
    let mut views = Vec::new();
    for (n, (name, view)) in cx
        .declared_views(&client, "silent")?
        .into_iter()
        .enumerate()
    {
        let key = cx.key(&format!("silent-{n}"));
        cx.take_and_release(&view, &key).await?;
        views.push((name, view, key));
    }

    link.freeze();
    let silenced = Instant::now();
    let attempt = client.try_acquire(&key, &cx.opts(ttl)).await;
    let took = silenced.elapsed();
    let mut failed_views = Vec::new();
    for (name, view, key) in &views {
        let start = Instant::now();
        let attempt = view.try_acquire(key, &cx.opts(ttl)).await;
        failed_views.push((*name, attempt.map(|lease| lease.is_some()), start.elapsed()));
    }
    tokio::time::sleep_until(silenced + SILENCE).await;
    link.thaw();
    let healed = Instant::now();
    ensure!(
        attempt.is_err(),
        "try_acquire succeeded while the link was silent"
    );
    ensure!(
        took <= ttl + cx.slack(),
        "try_acquire took {took:?} to fail on a silent link"
    );
    for (name, answer, took) in failed_views {
        ensure!(
            answer.is_err(),
            "the {name} answered {answer:?} while the link was silent (expected an error)"
        );
        ensure!(
            took <= ttl + cx.slack(),
            "the {name} took {took:?} to fail on a silent link"
        );
    }

    // Short attempts, each bounded by the client's own timeouts, until one gets through; keep
    // going a little past the bound only to report how long recovery really took.
    let give_up = RECOVERY + cx.slack();
    let mut last_error = None;
    loop {
        match client.try_acquire(&key, &cx.opts(ttl)).await {
            Ok(Some(lease)) => {
                let recovered = healed.elapsed();
                eprintln!(
                    "[timing] {}: acquired {recovered:.2?} after the link healed",
                    cx.subject().name()
                );
                ensure!(
                    recovered <= RECOVERY,
                    "the client worked again only {recovered:?} after the link healed \
                     (bound {RECOVERY:?}); until then: {}",
                    last_error.map_or_else(
                        || "no error".to_owned(),
                        |e: dlock_core::Error| e.to_string()
                    )
                );
                lease
                    .release()
                    .await
                    .context("release after the recovery")?;
                break;
            }
            Ok(None) => bail!("the key is busy after the silence: the failed attempt left it held"),
            Err(e) if healed.elapsed() > give_up => {
                bail!("the client did not work again within {give_up:?} after the link healed: {e}")
            }
            Err(e) => {
                last_error = Some(e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    for (name, view, key) in &views {
        granted_after_the_silence(name, view, key, &cx, healed + give_up).await?;
    }
    Ok(())
}

/// How long the next acquire may wait once a client's connection went silent for good: the
/// client must notice and open another within it. Not stretched by the subject's slack.
pub const REPLACED: Duration = Duration::from_secs(5);

/// A connection that goes silent for good while new connections still work (half-open, a route
/// gone for that one flow): the client replaces it. An attempt made as the silence begins fails
/// in bounded time (or succeeds, on a client that noticed at once); the next acquire, waiting
/// [`REPLACED`], is granted within that wait.
pub(crate) async fn a_dead_connection_is_replaced(cx: Ctx) -> anyhow::Result<()> {
    let Some((client, links)) = cx.subject().proxied_client().await? else {
        bail!("the subject makes no clients through a proxy");
    };
    let key = cx.key("dead-connection");
    let ttl = cx.ttl();
    cx.take_and_release(&client, &key).await?;

    links.silence_links();
    let started = Instant::now();
    let first = client.try_acquire(&key, &cx.opts(ttl)).await;
    let took = started.elapsed();
    ensure!(
        took <= ttl + cx.slack(),
        "try_acquire took {took:?} to answer on a connection gone silent"
    );
    let first = match first {
        Ok(Some(lease)) => {
            lease
                .release()
                .await
                .context("release of the first attempt")?;
            "granted".to_owned()
        }
        Ok(None) => "busy".to_owned(),
        Err(e) => format!("failed after {took:.2?}: {e}"),
    };

    let started = Instant::now();
    let next = client
        .acquire(&key, &cx.opts(ttl).with_wait(REPLACED))
        .await;
    let took = started.elapsed();
    eprintln!(
        "[timing] {}: the next acquire after a connection went silent for good answered in \
         {took:.2?} (the attempt as the silence began: {first})",
        cx.subject().name()
    );
    let lease = next.with_context(|| {
        format!(
            "the next acquire, waiting {REPLACED:?} after a connection went silent for good \
             (new connections work), failed after {took:?}"
        )
    })?;
    ensure!(
        took <= REPLACED + cx.slack(),
        "the next acquire was granted only after {took:?} (its wait: {REPLACED:?})"
    );
    lease
        .release()
        .await
        .context("release after the replacement")?;
    Ok(())
}

/// `view` grants the free `key` before `give_up`: errors are retried (the link is back, but one
/// connection may still be reconnecting), a busy answer fails at once.
async fn granted_after_the_silence(
    name: &str,
    view: &Arc<dyn DistributedLock>,
    key: &str,
    cx: &Ctx,
    give_up: Instant,
) -> anyhow::Result<()> {
    loop {
        match view.try_acquire(key, &cx.opts(cx.ttl())).await {
            Ok(Some(lease)) => {
                lease
                    .release()
                    .await
                    .context("release after the recovery")?;
                return Ok(());
            }
            Ok(None) => bail!(
                "the {name} is busy after the silence: an attempt that failed while the link \
                 was silent left it held"
            ),
            Err(e) if Instant::now() > give_up => {
                bail!("the {name} did not work again after the link healed: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}
