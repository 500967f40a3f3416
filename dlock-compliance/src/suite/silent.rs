//! A silent link: the connection stays open but nothing comes back (a dropped route, a peer that
//! forgot the connection, a proxy that lost its state). Calls fail in bounded time meanwhile,
//! and once the link carries bytes again the same client works within [`RECOVERY`].

use std::time::Duration;

use anyhow::{bail, ensure, Context};
use dlock_core::DistributedLockExt;
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
/// connections left open), checks that an attempt meanwhile fails in bounded time, heals the
/// links, and checks that an acquire succeeds within [`RECOVERY`].
pub(crate) async fn silent_link_fails_in_bounded_time_then_recovers(cx: Ctx) -> anyhow::Result<()> {
    let Some((client, link)) = cx.subject().proxied_client().await? else {
        bail!("the subject makes no clients through a proxy");
    };
    let key = cx.key("silent");
    let ttl = cx.ttl();
    cx.take_and_release(&client, &key).await?;

    link.freeze();
    let silenced = Instant::now();
    let attempt = client.try_acquire(&key, &cx.opts(ttl)).await;
    let took = silenced.elapsed();
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
                return Ok(());
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
}
