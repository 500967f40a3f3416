//! Shared by the ZooKeeper test binaries: clients, timings, raw server access and fault proxies.
#![allow(dead_code)]

pub mod lossy_proxy;
pub mod proxied;
pub mod raw;

use std::sync::Arc;
use std::time::Duration;

use dlock_core::DistributedLock;
use dlock_zk::{ZkLock, ZkLockBuilder};

/// The tick time of the test ensembles: sessions from 1 s to 10 s are allowed.
pub const TICK: Duration = Duration::from_millis(500);

/// The session timeout of ordinary test clients.
pub const SESSION: Duration = Duration::from_secs(4);

/// The session timeout of clients whose link a test freezes: short, so that the server expires
/// them quickly.
pub const SHORT_SESSION: Duration = Duration::from_secs(2);

/// The longest one trial may take before it counts as hung.
pub const TRIAL_BUDGET: Duration = Duration::from_secs(180);

/// A client of `url` with session timeout `session`.
pub async fn client(url: &str, session: Duration) -> anyhow::Result<Arc<ZkLock>> {
    client_with(url, session, |b| b).await
}

/// Like [`client`], with whatever `settings` change (an identifier, a naming scheme, a
/// connect timeout).
pub async fn client_with(
    url: &str,
    session: Duration,
    settings: impl FnOnce(ZkLockBuilder) -> ZkLockBuilder,
) -> anyhow::Result<Arc<ZkLock>> {
    let builder = ZkLock::builder(url).with_session_timeout(session);
    Ok(Arc::new(settings(builder).connect().await?))
}

/// Like [`client`], as the trait object the suite uses.
pub async fn shared(url: &str, session: Duration) -> anyhow::Result<Arc<dyn DistributedLock>> {
    Ok(client(url, session).await?)
}

/// `zk://` plus a fixture's connect string.
pub fn url(connect_string: &str) -> String {
    format!("zk://{connect_string}")
}
