//! ZooKeeper over TLS with digest credentials: the whole compliance suite through the secure
//! client port, and the cases of TLS and ACLs (certificates the other side refuses, plaintext
//! and TLS on the wrong ports, bad files, what another identity may see and do, kazoo).
//!
//! Two standalone servers with a secure client port (2281, client certificates required) run
//! for the whole binary: one shared by the cases, one dedicated to the outage case. The
//! certificates are made for the run ([`TestCerts`]). Every suite client authenticates as
//! [`USER`], so every node the suite creates carries dlock's credentialed ACL.
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-zk --test tls
//! ```

mod support;

#[path = "tls/cases.rs"]
mod cases;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_compliance::{suite, Inspect, Outage, Subject, Timing};
use dlock_core::backend::tls::TlsFiles;
use dlock_core::backend::Capabilities;
use dlock_core::DistributedLock;
use dlock_testkit::certs::TestCerts;
use dlock_testkit::fixtures::{docker_opt_out, ZkEnsemble, ZkOptions, ZkTlsFiles};
use dlock_testkit::{trials, Freeze, FreezeProxy};
use dlock_zk::{decode_key, ZkLock, ZkLockBuilder, DEFAULT_ROOT};
use libtest_mimic::Trial;

use support::proxied::Proxied;
use support::{raw, SESSION, SHORT_SESSION, TICK};

/// The digest identity of the suite's clients.
pub const USER: &str = "dlock-app";
/// Its password: no error or `Debug` output may show it.
pub const PASSWORD: &str = "tls-pw-6b1d0c";
/// Another digest identity, which may look but not touch.
pub const OTHER_USER: &str = "dlock-other";
/// Its password.
pub const OTHER_PASSWORD: &str = "tls-other-pw-93ae";

/// The connect timeout of the outage case's client.
const OUTAGE_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// What the TLS cases need to know about the shared server.
#[derive(Clone)]
pub struct Env {
    /// `127.0.0.1:PORT` of its secure client port.
    pub secure: String,
    /// `127.0.0.1:PORT` of its plain client port.
    pub plain: String,
    /// Its container, for `docker exec`.
    pub container: String,
    /// The run's certificates.
    pub certs: Arc<TestCerts>,
}

/// TLS with the run's authority and client certificate.
pub fn tls(certs: &TestCerts) -> TlsFiles {
    TlsFiles::new(&certs.ca).with_client_cert(&certs.client_cert, &certs.client_key)
}

/// `zk://user:password@hosts`.
pub fn url_as(user: &str, password: &str, hosts: &str) -> String {
    format!("zk://{user}:{password}@{hosts}")
}

/// A client of `hosts` over TLS as [`USER`], with whatever `settings` change.
pub async fn tls_client(
    hosts: &str,
    certs: &TestCerts,
    session: Duration,
    settings: impl FnOnce(ZkLockBuilder) -> ZkLockBuilder,
) -> anyhow::Result<Arc<ZkLock>> {
    let builder = ZkLock::builder(&url_as(USER, PASSWORD, hosts))
        .with_tls(tls(certs))
        .with_session_timeout(session);
    Ok(Arc::new(settings(builder).connect().await?))
}

/// Counts the lock nodes (parents and contenders) stored for keys in a namespace, read through
/// the plain port by a client without credentials: world READ lets it.
struct Stored {
    hosts: String,
}

#[async_trait]
impl Inspect for Stored {
    async fn stored(&self, namespace: &str) -> anyhow::Result<u64> {
        let client = raw::connect(&self.hosts).await?;
        let mut count = 0;
        for parent in raw::children(&client, DEFAULT_ROOT).await? {
            if decode_key(&parent).is_some_and(|k| k.starts_with(namespace)) {
                let path = format!("{DEFAULT_ROOT}/{parent}");
                count += 1 + raw::children(&client, &path).await?.len() as u64;
            }
        }
        Ok(count)
    }
}

/// What the backend declares for ZooKeeper (TLS changes nothing of it).
fn declared() -> Capabilities {
    dlock_zk::ZkLock::CAPABILITIES
}

fn subject(env: &Env, capabilities: Capabilities, outage: Outage) -> anyhow::Result<Subject> {
    let target: SocketAddr = env.secure.parse()?;
    let (hosts, certs) = (env.secure.clone(), env.certs.clone());
    let (freeze_certs, proxied_certs) = (env.certs.clone(), env.certs.clone());
    Ok(Subject::new("zookeeper-tls", capabilities, move || {
        let (hosts, certs) = (hosts.clone(), certs.clone());
        async move {
            let client: Arc<dyn DistributedLock> =
                tls_client(&hosts, &certs, SESSION, |b| b).await?;
            Ok(client)
        }
    })
    .with_timing(Timing {
        ttl: Duration::from_secs(1),
        slack: Duration::from_secs(3),
    })
    .with_inspect(Arc::new(Stored {
        hosts: env.plain.clone(),
    }))
    .with_freezable(move || {
        let certs = freeze_certs.clone();
        async move {
            // Freezing the connection stops the session's pings: the server expires it after the
            // (short) session timeout. The proxy passes the TLS bytes through unchanged.
            let proxy = FreezeProxy::start(target).await?;
            let lock = tls_client(&proxy.addr().to_string(), &certs, SHORT_SESSION, |b| b).await?;
            let switch: Arc<dyn Freeze> = proxy.switch();
            let client: Arc<dyn DistributedLock> = Arc::new(Proxied::new(lock, proxy));
            Ok((client, switch))
        }
    })
    .with_proxied(vec![target], move |addrs| {
        let certs = proxied_certs.clone();
        async move {
            let hosts: Vec<String> = addrs.iter().map(SocketAddr::to_string).collect();
            let client: Arc<dyn DistributedLock> =
                tls_client(&hosts.join(","), &certs, SESSION, |b| b).await?;
            Ok(client)
        }
    })
    .with_outage(outage))
}

fn main() {
    let args = trials::arguments();
    if docker_opt_out() {
        let mut trials = suite::placeholder_trials("zookeeper-tls", declared());
        trials.extend(trials::placeholders(cases::names()));
        trials::run_ignored(&args, trials);
    }
    let runtime = trials::fixture_runtime();
    let certs = match TestCerts::generate(&["localhost", "127.0.0.1"], "dlock-client") {
        Ok(certs) => Arc::new(certs),
        Err(e) => {
            eprintln!("cannot make the test certificates: {e:#}");
            std::process::exit(1);
        }
    };
    let options = || {
        ZkOptions::default()
            .with_tick_time(TICK)
            .with_tls(ZkTlsFiles {
                ca: certs.ca.clone(),
                server_cert: certs.server_cert.clone(),
                server_key: certs.server_key.clone(),
                require_client_cert: true,
            })
    };
    let (main_zk, outage_zk) = trials::start(
        &runtime,
        "two standalone ZooKeepers with a secure client port",
        async {
            tokio::try_join!(
                ZkEnsemble::start_with(1, options()),
                ZkEnsemble::start_with(1, options())
            )
        },
    );
    let trials = match build_trials(&main_zk, &outage_zk, &certs, &runtime) {
        Ok(trials) => trials,
        Err(e) => {
            eprintln!("cannot set up the trials: {e:#}");
            std::process::exit(1);
        }
    };
    trials::run_then(&args, trials, &runtime, || async move {
        let removed = tokio::try_join!(main_zk.shutdown(), outage_zk.shutdown()).map(|_| ());
        // The process ends right after: drop the certificates' directory now.
        drop(certs);
        removed
    })
}

fn build_trials(
    main_zk: &ZkEnsemble,
    outage_zk: &ZkEnsemble,
    certs: &Arc<TestCerts>,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<Vec<Trial>> {
    let env = Env {
        secure: main_zk.secure_connect_string(),
        plain: main_zk.connect_string(),
        container: main_zk.member(0)?.name().to_owned(),
        certs: certs.clone(),
    };
    anyhow::ensure!(!env.secure.is_empty(), "the fixture has no secure port");
    // The suite checks the backend's own declaration against its behaviour.
    let client = runtime.block_on(tls_client(&env.secure, certs, SESSION, |b| b))?;
    anyhow::ensure!(
        client.capabilities() == declared(),
        "the client declares {:?}, its type's constant {:?}",
        client.capabilities(),
        declared()
    );
    let outage_hosts = outage_zk.secure_connect_string();
    // The first TLS handshake of a JVM is slow (class loading, key set-up): have it before the
    // outage case's client, whose connect timeout is short.
    drop(runtime.block_on(tls_client(&outage_hosts, certs, SESSION, |b| b))?);
    let outage_certs = certs.clone();
    let outage = Outage::new(Arc::new(outage_zk.member(0)?.clone()), move || {
        let (hosts, certs) = (outage_hosts.clone(), outage_certs.clone());
        async move {
            // A connect timeout below the case's wait (1 s), as in tests/compliance.rs. A TLS
            // handshake with a JVM under load can take longer than that: the client is made
            // (with the server up) in up to three attempts.
            let settings = |b: ZkLockBuilder| b.with_connect_timeout(OUTAGE_CONNECT_TIMEOUT);
            let mut attempts = 0;
            loop {
                attempts += 1;
                match tls_client(&hosts, &certs, SESSION, settings).await {
                    Ok(client) => break Ok(client as Arc<dyn DistributedLock>),
                    Err(e) if attempts >= 3 => break Err(e),
                    Err(_) => {}
                }
            }
        }
    });
    eprintln!(
        "[zookeeper-tls] shared server {} (plain {}); the outage case stops {}",
        env.secure,
        env.plain,
        outage_zk.secure_connect_string()
    );
    let subject = subject(&env, declared(), outage)?;
    let mut trials = suite::trials(&subject);
    trials.extend(cases::trials(&env));
    Ok(trials)
}
