//! Shared by the ZooKeeper test binaries: clients, trials, raw server access and fault proxies.
#![allow(dead_code)]

pub mod exec;
pub mod lossy_proxy;
pub mod proxied;
pub mod raw;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::DistributedLock;
use dlock_zk::ZkLock;
use libtest_mimic::{Failed, Trial};

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
    Ok(Arc::new(
        ZkLock::builder(url)
            .with_session_timeout(session)
            .connect()
            .await?,
    ))
}

/// Like [`client`], as the trait object the suite uses.
pub async fn shared(url: &str, session: Duration) -> anyhow::Result<Arc<dyn DistributedLock>> {
    Ok(client(url, session).await?)
}

/// `zk://` plus a fixture's connect string.
pub fn url(connect_string: &str) -> String {
    format!("zk://{connect_string}")
}

/// A named trial running `body` on a runtime of its own, bounded by [`TRIAL_BUDGET`].
pub fn trial<F, Fut>(name: impl Into<String>, body: F) -> Trial
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let name = name.into();
    let label = name.clone();
    Trial::test(name, move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let started = std::time::Instant::now();
        let result = runtime.block_on(async {
            match tokio::time::timeout(TRIAL_BUDGET, body()).await {
                Ok(result) => result,
                Err(_) => Err(anyhow::anyhow!(
                    "hung: did not finish within {TRIAL_BUDGET:?}"
                )),
            }
        });
        eprintln!("[timing] {label}: {:.2?}", started.elapsed());
        result.map_err(|e| Failed::from(format!("{e:#}")))
    })
}

/// A runtime for starting and stopping fixtures in `main`.
pub fn fixture_runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot build a tokio runtime: {e}");
            std::process::exit(1);
        }
    }
}
