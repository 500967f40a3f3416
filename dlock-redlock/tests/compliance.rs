//! The Redlock backend against real Redis masters in containers: the whole compliance suite on
//! five masters, then fencing turned off, fence counters' expiry, and looking at a lock without
//! taking it. (The faults the algorithm is about — masters down, frozen, restarted without their
//! data — are in the faults binary, `tests/faults.rs`.)
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-redlock --test compliance
//! ```
//!
//! The suite shares five masters (every case works in its own key namespace); its outage case
//! gets three dedicated ones, all stopped at once. The Redlock-specific trials use the shared
//! masters too. `DLOCK_TEST_REDLOCK_URLS` (comma-separated) replaces the shared masters. With `DLOCK_TEST_NO_DOCKER=1` every trial is reported as ignored; without Docker
//! and without that opt-out the binary fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

#[path = "compliance/fencing.rs"]
mod fencing;
#[path = "compliance/inspect.rs"]
mod inspect;
#[path = "compliance/operations.rs"]
mod operations;
// The Redis crate's cases of the primitives; the read-write lock and the election run here.
#[allow(dead_code)]
#[path = "../../dlock-redis/tests/compliance/primitives.rs"]
mod primitives;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_compliance::{suite, Inspect, Outage, Subject, Timing};
use dlock_core::DistributedLock;
use dlock_testkit::fixtures::{docker_opt_out, RedisMasters};
use dlock_testkit::{trials, url_target, url_via, Members};
use libtest_mimic::Trial;
use tokio::runtime::Handle;

fn main() {
    let args = trials::arguments();
    if RedisMasters::needs_docker() && docker_opt_out() {
        let mut trials = suite::trials(&placeholder_subject());
        trials.extend(own_trials(Vec::new()));
        trials::run_ignored(&args, trials);
    }

    let runtime = trials::fixture_runtime();
    let (shared, outage) = trials::start(&runtime, "5 + 3 Redis masters", async {
        tokio::try_join!(RedisMasters::start(5), RedisMasters::start(3))
    });

    let subject = subject(&shared, &outage, runtime.handle().clone());
    let mut trials: Vec<Trial> = suite::trials(&subject);
    trials.extend(own_trials(shared.urls()));
    trials::run_then(&args, trials, &runtime, || async {
        let (a, b) = tokio::join!(shared.shutdown(), outage.shutdown());
        a.and(b)
    })
}

/// The Redlock-specific trials, each given the shared masters' URLs.
fn own_trials(urls: Vec<String>) -> Vec<Trial> {
    [
        ("redlock::fencing", fencing::cases()),
        ("redlock::inspect", inspect::cases()),
        ("redlock::operations", operations::cases()),
    ]
    .iter()
    .flat_map(|(prefix, cases)| trials::cases(prefix, cases, &urls, support::TRIAL_BUDGET))
    .chain(trials::cases(
        "redlock::primitives",
        &primitives::rw_and_election_cases(),
        &connector(urls.clone()),
        support::TRIAL_BUDGET,
    ))
    .collect()
}

/// Makes clients of the masters at `urls` for the primitives' cases.
fn connector(urls: Vec<String>) -> primitives::Connect {
    Arc::new(connect_to(urls))
}

fn connect_to(urls: Vec<String>) -> impl Fn() -> support::ClientFuture + Send + Sync + 'static {
    move || {
        let urls = urls.clone();
        Box::pin(async move {
            let client: Arc<dyn DistributedLock> =
                Arc::new(support::builder(&urls).connect().await?);
            Ok(client)
        })
    }
}

/// What the backend declares for Redlock; the suite checks it against behaviour.
fn capabilities() -> dlock_core::backend::Capabilities {
    dlock_redlock::RedlockLock::CAPABILITIES
}

fn subject(shared: &RedisMasters, outage: &RedisMasters, main: Handle) -> Subject {
    let members = outage
        .members()
        .expect("container-backed outage masters")
        .to_vec();
    let control = Arc::new(Members::new(main, members));
    Subject::new("redlock", capabilities(), connect_to(shared.urls()))
        .with_timing(Timing {
            ttl: Duration::from_millis(1_000),
            slack: Duration::from_secs(3),
        })
        .with_inspect(Arc::new(KeyCount {
            urls: shared.urls(),
        }))
        .with_outage(Outage::new(control, connect_to(outage.urls())))
        .with_proxied(
            shared
                .urls()
                .iter()
                .map(|url| url_target(url, 6379).expect("a master's address"))
                .collect(),
            via(shared.urls()),
        )
}

/// Makes clients of the masters at `urls` that connect to the addresses they are given instead,
/// one per master in the same order.
fn via(
    urls: Vec<String>,
) -> impl Fn(Vec<SocketAddr>) -> support::ClientFuture + Send + Sync + 'static {
    move |addrs| {
        let urls = urls.clone();
        Box::pin(async move {
            anyhow::ensure!(addrs.len() == urls.len(), "one address per master");
            let urls = urls
                .iter()
                .zip(addrs)
                .map(|(url, addr)| url_via(url, addr))
                .collect::<anyhow::Result<Vec<String>>>()?;
            let client: Arc<dyn DistributedLock> =
                Arc::new(support::builder(&urls).connect().await?);
            Ok(client)
        })
    }
}

/// The same trial names, for a run that opted out of Docker.
fn placeholder_subject() -> Subject {
    let outage = Outage::new(Arc::new(Members::none()), connect_to(Vec::new()));
    Subject::new("redlock", capabilities(), connect_to(Vec::new()))
        .with_outage(outage)
        .with_proxied(Vec::new(), via(Vec::new()))
}

/// Counts the keys of a namespace on every master: lock keys start with it, counters contain it.
struct KeyCount {
    urls: Vec<String>,
}

#[async_trait]
impl Inspect for KeyCount {
    async fn stored(&self, namespace: &str) -> anyhow::Result<u64> {
        let mut total = 0;
        for url in &self.urls {
            total += support::keys_containing(url, namespace).await?.len() as u64;
        }
        Ok(total)
    }
}
