//! The Redis backend against real Redis servers in containers: the whole compliance suite, then
//! the interoperability, storage, waiting, renewal and connection behaviour specific to Redis.
//! (Servers and links that break are in the faults binary, `tests/faults.rs`.)
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-redis --test compliance
//! ```
//!
//! The suite shares one server (every case works in its own key namespace); its outage case gets a
//! dedicated one. Trials that count a server's connections or scripts start their own. With
//! `DLOCK_TEST_NO_DOCKER=1` every trial is reported as ignored; without Docker and without that
//! opt-out the binary fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "compliance/connecting.rs"]
mod connecting;
#[path = "compliance/interop.rs"]
mod interop;
#[path = "compliance/operations.rs"]
mod operations;
#[path = "compliance/primitives.rs"]
mod primitives;
#[path = "compliance/renewing.rs"]
mod renewing;
#[path = "compliance/storage.rs"]
mod storage;
mod support;
#[path = "compliance/waiting.rs"]
mod waiting;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use dlock_compliance::{suite, Outage, Subject, Timing};
use dlock_core::DistributedLock;
use dlock_redis::RedisLock;
use dlock_testkit::fixtures::{docker_opt_out, RedisServer};
use dlock_testkit::{trials, url_target, url_via, Members};
use libtest_mimic::Trial;
use tokio::runtime::Handle;

fn main() {
    let args = trials::arguments();
    if RedisServer::needs_docker() && docker_opt_out() {
        let mut trials = suite::trials(&placeholder_subject());
        trials.extend(own_trials(String::new()));
        trials::run_ignored(&args, trials);
    }

    let runtime = trials::fixture_runtime();
    let (shared, outage) = trials::start(&runtime, "two Redis servers", async {
        tokio::try_join!(RedisServer::start(), RedisServer::start())
    });

    let subject = subject(&shared, &outage, runtime.handle().clone());
    let mut trials: Vec<Trial> = suite::trials(&subject);
    trials.extend(own_trials(shared.url()));
    trials::run_then(&args, trials, &runtime, || async {
        let (a, b) = tokio::join!(shared.shutdown(), outage.shutdown());
        a.and(b)
    })
}

/// The Redis-specific trials, each given the shared server's URL.
fn own_trials(url: String) -> Vec<Trial> {
    [
        ("redis::interop", interop::cases()),
        ("redis::operations", operations::cases()),
        ("redis::storage", storage::cases()),
        ("redis::waiting", waiting::cases()),
        ("redis::renewing", renewing::cases()),
        ("redis::connecting", connecting::cases()),
    ]
    .iter()
    .flat_map(|(prefix, cases)| trials::cases(prefix, cases, &url, support::TRIAL_BUDGET))
    .chain(trials::cases(
        "redis::primitives",
        &primitives::cases(),
        &connector(url.clone()),
        support::TRIAL_BUDGET,
    ))
    .collect()
}

/// Makes clients of the server at `url` for the primitives' cases.
fn connector(url: String) -> primitives::Connect {
    Arc::new(connect_to(url))
}

fn connect_to(url: String) -> impl Fn() -> support::ClientFuture + Send + Sync + 'static {
    move || {
        let url = url.clone();
        Box::pin(async move {
            let client: Arc<dyn DistributedLock> = Arc::new(RedisLock::connect(&url).await?);
            Ok(client)
        })
    }
}

fn subject(shared: &RedisServer, outage: &RedisServer, main: Handle) -> Subject {
    let capabilities = declared();
    let member = outage
        .member()
        .expect("a container-backed outage server")
        .clone();
    let control = Arc::new(Members::new(main, vec![member]));
    Subject::new("redis", capabilities, connect_to(shared.url()))
        .with_timing(Timing {
            ttl: Duration::from_millis(1_000),
            slack: Duration::from_secs(3),
        })
        .with_inspect(Arc::new(support::KeyCount { url: shared.url() }))
        .with_outage(Outage::new(control, connect_to(outage.url())))
        .with_proxied(
            vec![url_target(&shared.url(), 6379).expect("the server's address")],
            via(shared.url()),
        )
}

/// Makes clients of the server at `url` that connect to the address they are given instead.
fn via(url: String) -> impl Fn(Vec<SocketAddr>) -> support::ClientFuture + Send + Sync + 'static {
    move |addrs| {
        let url = url.clone();
        Box::pin(async move {
            let addr = addrs.first().context("no address to connect to")?;
            let url = url_via(&url, *addr)?;
            let client: Arc<dyn DistributedLock> = Arc::new(RedisLock::connect(&url).await?);
            Ok(client)
        })
    }
}

/// What the backend declares for Redis; the suite checks it against behaviour.
fn declared() -> dlock_core::backend::Capabilities {
    dlock_redis::RedisLock::CAPABILITIES
}

/// The same trial names, for a run that opted out of Docker.
fn placeholder_subject() -> Subject {
    let capabilities = declared();
    let outage = Outage::new(Arc::new(Members::none()), connect_to(String::new()));
    Subject::new("redis", capabilities, connect_to(String::new()))
        .with_outage(outage)
        .with_proxied(Vec::new(), via(String::new()))
}
