//! The shared compliance suite against a real ZooKeeper, plus the ZooKeeper-specific cases
//! (kazoo interoperability, lost create replies, container parents, fencing across parent
//! recreation, connection strings, waiters whose session expires).
//!
//! Two standalone servers run for the whole binary: one shared by the cases, one dedicated to
//! the outage case, which stops and starts it. Both use a 500 ms tick so that sessions of 1–10 s
//! are allowed.
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-zk --test compliance
//! ```

mod support;

#[path = "compliance/kazoo.rs"]
mod kazoo;
#[path = "compliance/operator.rs"]
mod operator;
#[path = "compliance/peers.rs"]
mod peers;
#[path = "compliance/primitives.rs"]
mod primitives;
#[path = "compliance/zk_cases.rs"]
mod zk_cases;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_compliance::{suite, Inspect, Outage, Subject, Timing};
use dlock_core::backend::Capabilities;
use dlock_core::DistributedLock;
use dlock_testkit::fixtures::{docker_opt_out, ZkEnsemble, ZkOptions};
use dlock_testkit::{trials, Freeze, FreezeProxy};
use dlock_zk::{decode_key, ZkLockBuilder, DEFAULT_ROOT};
use libtest_mimic::Trial;

use support::proxied::Proxied;
use support::{client_with, raw, shared, url, SESSION, SHORT_SESSION, TICK};

/// The connect timeout of the outage case's client.
const OUTAGE_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// What the ZooKeeper-specific cases need to know about the shared server.
#[derive(Debug, Clone)]
pub struct Env {
    /// `host:port` of the shared server.
    pub hosts: String,
    /// Its container, for `docker exec`.
    pub container: String,
}

/// Counts the nodes (lock and primitive parents, contenders, leases) stored for keys in a
/// namespace.
struct Stored {
    hosts: String,
}

#[async_trait]
impl Inspect for Stored {
    async fn stored(&self, namespace: &str) -> anyhow::Result<u64> {
        let client = raw::connect(&self.hosts).await?;
        let mut count = 0;
        for parent in raw::children(&client, DEFAULT_ROOT).await? {
            // Locks, and the primitives' nodes beside them (`…%rw`, `…%semaphore`, …).
            let stem = primitives::strip_primitive_suffix(&parent);
            if decode_key(stem).is_some_and(|k| k.starts_with(namespace)) {
                let path = format!("{DEFAULT_ROOT}/{parent}");
                count += 1 + raw::children(&client, &path).await?.len() as u64;
            }
        }
        Ok(count)
    }
}

/// What the backend declares for ZooKeeper: the client's own declaration must
/// match it, and a run without servers (where no client can ask) uses it.
fn declared() -> Capabilities {
    dlock_zk::ZkLock::CAPABILITIES
}

fn subject(
    shared_hosts: &str,
    capabilities: Capabilities,
    outage: Outage,
) -> anyhow::Result<Subject> {
    let main_url = url(shared_hosts);
    let target: SocketAddr = shared_hosts.parse()?;
    let connect_url = main_url.clone();
    Ok(Subject::new("zookeeper", capabilities, move || {
        let url = connect_url.clone();
        async move { shared(&url, SESSION).await }
    })
    .with_timing(Timing {
        ttl: Duration::from_secs(1),
        slack: Duration::from_secs(3),
    })
    .with_inspect(Arc::new(Stored {
        hosts: shared_hosts.to_owned(),
    }))
    .with_freezable(move || async move {
        // Freezing the connection stops the session's pings: the server expires it after
        // the (short) session timeout, as with a long pause or a partition.
        let proxy = FreezeProxy::start(target).await?;
        let lock = support::client(&url(&proxy.addr().to_string()), SHORT_SESSION).await?;
        let switch: Arc<dyn Freeze> = proxy.switch();
        let client: Arc<dyn DistributedLock> = Arc::new(Proxied::new(lock, proxy));
        Ok((client, switch))
    })
    .with_proxied(vec![target], |addrs| async move {
        let hosts: Vec<String> = addrs.iter().map(SocketAddr::to_string).collect();
        shared(&url(&hosts.join(",")), SESSION).await
    })
    .with_outage(outage))
}

fn main() {
    let args = trials::arguments();
    if docker_opt_out() {
        let mut trials = suite::placeholder_trials("zookeeper", declared());
        trials.extend(trials::placeholders(zk_cases::names()));
        trials::run_ignored(&args, trials);
    }
    let runtime = trials::fixture_runtime();
    let options = || ZkOptions::default().with_tick_time(TICK);
    let (main_zk, outage_zk) = trials::start(&runtime, "two standalone ZooKeepers", async {
        tokio::try_join!(
            ZkEnsemble::start_with(1, options()),
            ZkEnsemble::start_with(1, options())
        )
    });
    // The suite checks the backend's own declaration against its behaviour.
    let capabilities = match runtime.block_on(shared(&url(&main_zk.connect_string()), SESSION)) {
        Ok(client) if client.capabilities() == declared() => declared(),
        Ok(client) => {
            let own = client.capabilities();
            eprintln!(
                "the client declares {own:?}, its type's constant {:?}",
                declared()
            );
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("cannot connect to the shared server: {e:#}");
            std::process::exit(1);
        }
    };
    let trials = match build_trials(&main_zk, &outage_zk, capabilities) {
        Ok(trials) => trials,
        Err(e) => {
            eprintln!("cannot set up the trials: {e:#}");
            std::process::exit(1);
        }
    };
    trials::run_then(&args, trials, &runtime, || async {
        tokio::try_join!(main_zk.shutdown(), outage_zk.shutdown()).map(|_| ())
    })
}

fn build_trials(
    main_zk: &ZkEnsemble,
    outage_zk: &ZkEnsemble,
    capabilities: Capabilities,
) -> anyhow::Result<Vec<Trial>> {
    let outage_hosts = outage_zk.connect_string();
    let outage_url = url(&outage_hosts);
    let outage = Outage::new(Arc::new(outage_zk.member(0)?.clone()), move || {
        let url = outage_url.clone();
        async move {
            // A connect timeout below the case's wait (1 s): with the server down, calls fail as
            // unavailable after the connect timeout, before the wait runs out.
            let settings = |b: ZkLockBuilder| b.with_connect_timeout(OUTAGE_CONNECT_TIMEOUT);
            let client: Arc<dyn DistributedLock> = client_with(&url, SESSION, settings).await?;
            Ok(client)
        }
    });
    let hosts = main_zk.connect_string();
    eprintln!("[zookeeper] shared server {hosts}; the outage case stops {outage_hosts}");
    let subject = subject(&hosts, capabilities, outage)?;
    let env = Env {
        hosts,
        container: main_zk.member(0)?.name().to_owned(),
    };
    let mut trials = suite::trials(&subject);
    trials.extend(zk_cases::trials(&env));
    Ok(trials)
}
