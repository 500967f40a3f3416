//! The shared compliance suite against a real etcd, plus what is particular to etcd: the Go
//! recipe's key layout, exclusion with `etcdctl lock` in both directions, a waiter whose session
//! ends, closing, local turns, and configuration errors.
//!
//! One single-member cluster serves every case; the outage case gets a dedicated one. The
//! freezable client of the lost-signal case reaches the shared member through a [`FreezeProxy`]:
//! freezing it stops the session's keep-alives, so the server expires the lease.
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-etcd --test compliance
//! ```
//!
//! [`FreezeProxy`]: dlock_testkit::FreezeProxy

#![allow(clippy::unwrap_used)]

mod support;

#[path = "compliance/etcd_cases.rs"]
mod etcd_cases;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use async_trait::async_trait;
use dlock_compliance::{suite, Inspect, Outage, Subject, Timing};
use dlock_core::DistributedLock;
use dlock_testkit::fixtures::{docker_opt_out, EtcdCluster};
use dlock_testkit::{trials, url_target};

use etcd_cases::etcd_trials;
use support::{client, count, raw, NAMESPACE};

/// The session TTL of the suite's clients: the shortest etcd grants with its default election
/// timeout, so a frozen client's locks are freed within a few seconds.
const SESSION_TTL: Duration = Duration::from_secs(2);

struct Stored {
    endpoints: Vec<String>,
}

#[async_trait]
impl Inspect for Stored {
    async fn stored(&self, namespace: &str) -> anyhow::Result<u64> {
        let layout = dlock_etcd::KeyLayout::new(NAMESPACE)?;
        let mut raw = raw(&self.endpoints).await?;
        count(&mut raw, &layout.name_prefix(namespace)).await
    }
}

/// What the backend declares for etcd.
fn declared() -> dlock_core::backend::Capabilities {
    dlock_etcd::EtcdLock::CAPABILITIES
}

fn subject(
    shared: &EtcdCluster,
    dedicated: &EtcdCluster,
    capabilities: dlock_core::backend::Capabilities,
) -> anyhow::Result<Subject> {
    let endpoints = shared.endpoints();
    let connect = {
        let endpoints = endpoints.clone();
        move || {
            let endpoints = endpoints.clone();
            async move {
                let locks: Arc<dyn DistributedLock> =
                    Arc::new(client(&endpoints, SESSION_TTL).await?);
                Ok(locks)
            }
        }
    };
    let outage_endpoints = dedicated.endpoints();
    let outage = Outage::new(Arc::new(dedicated.member(0)?.clone()), move || {
        let endpoints = outage_endpoints.clone();
        async move {
            let locks: Arc<dyn DistributedLock> = Arc::new(client(&endpoints, SESSION_TTL).await?);
            Ok(locks)
        }
    });
    let frozen_endpoint = endpoints
        .first()
        .cloned()
        .context("the cluster has no endpoint")?;
    let targets = endpoints
        .iter()
        .map(|endpoint| url_target(endpoint, 2379))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Subject::new("etcd", capabilities, connect)
        .with_timing(Timing {
            ttl: Duration::from_secs(1),
            slack: Duration::from_secs(3),
        })
        .with_outage(outage)
        .with_inspect(Arc::new(Stored {
            endpoints: endpoints.clone(),
        }))
        .with_freezable(move || {
            let endpoint = frozen_endpoint.clone();
            async move { support::freezable_client(&endpoint, SESSION_TTL).await }
        })
        .with_proxied(targets, |addrs| async move {
            let endpoints: Vec<String> = addrs.iter().map(|a| format!("http://{a}")).collect();
            let locks: Arc<dyn DistributedLock> = Arc::new(client(&endpoints, SESSION_TTL).await?);
            Ok(locks)
        }))
}

fn main() {
    let args = trials::arguments();
    if EtcdCluster::needs_docker() && docker_opt_out() {
        let mut trials = suite::placeholder_trials("etcd", declared());
        trials.extend(trials::placeholders(etcd_cases::names()));
        trials::run_ignored(&args, trials);
    }
    let runtime = trials::fixture_runtime();
    let (shared, dedicated) = trials::start(&runtime, "two single-member etcd clusters", async {
        tokio::try_join!(EtcdCluster::start(1), EtcdCluster::start(1))
    });
    // The backend declares its own capabilities, which must be its type's constant; the suite checks
    // them.
    let capabilities = runtime
        .block_on(client(&shared.endpoints(), SESSION_TTL))
        .and_then(|locks| {
            let own = locks.capabilities();
            ensure!(
                own == declared(),
                "the client declares {own:?}, its type's constant {:?}",
                declared()
            );
            Ok(own)
        });
    let trials = match capabilities.and_then(|c| subject(&shared, &dedicated, c)) {
        Ok(subject) => {
            let mut trials = suite::trials(&subject);
            trials.extend(etcd_trials(&shared));
            trials
        }
        Err(e) => {
            eprintln!("cannot build the subject: {e:#}");
            std::process::exit(101);
        }
    };
    trials::run_then(&args, trials, &runtime, || async {
        let (a, b) = tokio::join!(shared.shutdown(), dedicated.shutdown());
        a.and(b)
    })
}
