//! What the Redlock test binaries share: client settings, timings, raw access to one master.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use dlock_redlock::{RedlockBuilder, RedlockLock};
use dlock_testkit::fixtures::RedisMasters;
use redis::aio::MultiplexedConnection;

pub type ClientFuture = dlock_compliance::subject::ClientFuture;

/// The per-node timeout the trials use: far above a healthy round trip through Docker's port
/// mapping, even on a loaded machine, and far below the suite's one-second TTLs.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(200);

/// The longest one Redlock-specific trial may take before it counts as hung.
pub const TRIAL_BUDGET: Duration = Duration::from_secs(180);

/// How late past a promised bound an answer may come on this noisy machine.
pub const SLACK: Duration = Duration::from_secs(1);

/// A per-node timeout for looking at a lock: each verdict needs every master's answer (a master
/// that did not answer in time can turn "free" into "unknown"), so it is one no loaded machine
/// reaches.
pub const PATIENT: Duration = Duration::from_secs(2);

/// A client of `urls` with the trials' per-node timeout.
pub fn builder(urls: &[String]) -> RedlockBuilder {
    RedlockBuilder::from_urls(urls.iter().cloned()).with_request_timeout(NODE_TIMEOUT)
}

/// A client of `urls` with the trials' per-node timeout and whatever `settings` change.
pub async fn client_with(
    urls: &[String],
    settings: impl FnOnce(RedlockBuilder) -> RedlockBuilder,
) -> anyhow::Result<Arc<RedlockLock>> {
    Ok(Arc::new(settings(builder(urls)).connect().await?))
}

/// Starts every master that is down (a case before may have left some stopped), lifts any CPU
/// limit one left, and waits until each answers: every fault case begins from five serving
/// masters at full speed.
pub async fn all_serving(masters: &RedisMasters) -> anyhow::Result<()> {
    for member in masters.members()? {
        member.start().await?;
        member.unthrottle().await?;
    }
    Ok(())
}

/// A client of every master once [`all_serving`] brought them all back: how most fault cases
/// begin.
pub async fn serving_client(masters: &RedisMasters) -> anyhow::Result<Arc<RedlockLock>> {
    all_serving(masters).await?;
    client_with(&masters.urls(), |b| b).await
}

/// A plain connection to one master, for looking at and planting keys.
pub async fn raw(url: &str) -> anyhow::Result<MultiplexedConnection> {
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?)
}

/// The keys on the master at `url` whose name contains `text` (glob characters escaped).
pub async fn keys_containing(url: &str, text: &str) -> anyhow::Result<Vec<String>> {
    let escaped: String = text
        .chars()
        .flat_map(|c| {
            let escape = matches!(c, '*' | '?' | '[' | ']' | '\\').then_some('\\');
            escape.into_iter().chain([c])
        })
        .collect();
    // KEYS is fine on a test server; it answers in one call.
    let mut con = raw(url).await?;
    Ok(redis::cmd("KEYS")
        .arg(format!("*{escaped}*"))
        .query_async(&mut con)
        .await?)
}

/// A key no other trial uses.
pub fn unique(name: &str) -> String {
    format!("dlock-redlock-test/{:016x}/{name}", rand::random::<u64>())
}

/// The `q`-quantile of `samples` (sorted in place).
pub fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort_unstable();
    let at = ((samples.len().max(1) - 1) as f64 * q).round() as usize;
    samples.get(at).copied().unwrap_or_default()
}
