//! etcd over TLS: the shared compliance suite through TLS with a client certificate and
//! user/password auth, plus what is particular to it: a wrong authority or a missing client
//! certificate is a clear error, a lease outlives many expiries of the client's auth token,
//! a plaintext client against the TLS port fails clearly, and no error or `Debug` output shows
//! the password or the key.
//!
//! One member ([`EtcdTlsServer`], auth tokens living 2 s) serves every case; the outage case
//! gets a second one. The freezable and proxied clients reach the shared member through TCP
//! proxies on 127.0.0.1, which the server certificate names.
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-etcd --test tls
//! ```

#![allow(clippy::unwrap_used)]

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use async_trait::async_trait;
use dlock_compliance::{suite, Inspect, Outage, Subject, Timing};
use dlock_core::backend::tls::TlsFiles;
use dlock_core::{DistributedLock, DistributedLockExt, Error, LeaseState, LockOptions, Released};
use dlock_etcd::{EtcdLock, EtcdLockBuilder};
use dlock_testkit::certs::TestCerts;
use dlock_testkit::fixtures::etcd_tls::EtcdTlsOptions;
use dlock_testkit::fixtures::{docker_opt_out, EtcdTlsServer};
use dlock_testkit::trials::{self, Case};
use dlock_testkit::{case, url_target, Freeze, FreezeProxy};
use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use libtest_mimic::Trial;
use tokio::time::Instant;

use support::{count, NAMESPACE, TRIAL_BUDGET};

/// As in the plain suite: the shortest session etcd grants with its default election timeout.
const SESSION_TTL: Duration = Duration::from_secs(2);
/// How long the server's auth tokens live after their last use.
const TOKEN_TTL: Duration = Duration::from_secs(2);

/// What a client needs to reach the member: its endpoints and the certificate files.
#[derive(Debug, Clone)]
struct Env {
    endpoints: Vec<String>,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl Env {
    fn of(server: &EtcdTlsServer) -> Env {
        let certs = server.certs();
        Env {
            endpoints: server.endpoints(),
            ca: certs.ca.clone(),
            cert: certs.client_cert.clone(),
            key: certs.client_key.clone(),
        }
    }

    /// TLS with the test authority and the client certificate.
    fn tls(&self) -> TlsFiles {
        TlsFiles::new(&self.ca).with_client_cert(&self.cert, &self.key)
    }

    /// The builder of a client as `app`, over TLS with the client certificate.
    fn builder(&self, endpoints: &[String]) -> EtcdLockBuilder {
        EtcdLock::builder()
            .with_endpoints(endpoints.iter().cloned())
            .with_prefix(NAMESPACE)
            .with_session_timeout(SESSION_TTL)
            .with_request_timeout(Duration::from_secs(2))
            .with_connect_timeout(Duration::from_secs(10))
            .with_tls(self.tls())
            .with_credentials(EtcdTlsServer::APP_USER, EtcdTlsServer::APP_PASSWORD)
    }

    async fn client(&self) -> anyhow::Result<Arc<EtcdLock>> {
        Ok(Arc::new(self.builder(&self.endpoints).connect().await?))
    }

    /// A raw client as `root`, to look at the server's side.
    async fn root(&self) -> anyhow::Result<etcd_client::Client> {
        let tls = TlsOptions::new()
            .ca_certificate(Certificate::from_pem(std::fs::read(&self.ca)?))
            .identity(Identity::from_pem(
                std::fs::read(&self.cert)?,
                std::fs::read(&self.key)?,
            ));
        let options = ConnectOptions::new()
            .with_tls(tls)
            .with_user(EtcdTlsServer::ROOT_USER, EtcdTlsServer::ROOT_PASSWORD)
            .with_auto_token_refresh(true)
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(5));
        Ok(etcd_client::Client::connect(&self.endpoints, Some(options)).await?)
    }

    /// How many contender keys the server stores for lock `key` of `locks`.
    async fn stored(&self, locks: &EtcdLock, key: &str) -> anyhow::Result<u64> {
        let prefix = format!("{}/", locks.lock_name(key)?);
        count(&mut self.root().await?, &prefix).await
    }
}

struct Stored(Env);

#[async_trait]
impl Inspect for Stored {
    async fn stored(&self, namespace: &str) -> anyhow::Result<u64> {
        let layout = dlock_etcd::KeyLayout::new(NAMESPACE)?;
        count(&mut self.0.root().await?, &layout.name_prefix(namespace)).await
    }
}

fn declared() -> dlock_core::backend::Capabilities {
    dlock_etcd::EtcdLock::CAPABILITIES
}

fn subject(shared: &Env, dedicated: &EtcdTlsServer) -> anyhow::Result<Subject> {
    let connect = {
        let env = shared.clone();
        move || {
            let env = env.clone();
            async move {
                let locks: Arc<dyn DistributedLock> = env.client().await?;
                Ok(locks)
            }
        }
    };
    let outage_env = Env::of(dedicated);
    let outage = Outage::new(dedicated.control()?, move || {
        let env = outage_env.clone();
        async move {
            let locks: Arc<dyn DistributedLock> = env.client().await?;
            Ok(locks)
        }
    });
    let targets = shared
        .endpoints
        .iter()
        .map(|endpoint| url_target(endpoint, 2379))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let frozen_target = *targets.first().context("the member has no endpoint")?;
    let (frozen_env, proxied_env) = (shared.clone(), shared.clone());
    Ok(Subject::new("etcd-tls", declared(), connect)
        .with_timing(Timing {
            ttl: Duration::from_secs(1),
            slack: Duration::from_secs(3),
        })
        .with_outage(outage)
        .with_inspect(Arc::new(Stored(shared.clone())))
        .with_freezable(move || {
            let env = frozen_env.clone();
            async move {
                let proxy = FreezeProxy::start(frozen_target).await?;
                let locks = env
                    .builder(&[format!("https://{}", proxy.addr())])
                    .connect()
                    .await?;
                let pair: (Arc<dyn DistributedLock>, Arc<dyn Freeze>) =
                    (Arc::new(locks), Arc::new(proxy));
                Ok(pair)
            }
        })
        .with_proxied(targets, move |addrs| {
            let env = proxied_env.clone();
            async move {
                let endpoints: Vec<String> = addrs.iter().map(|a| format!("https://{a}")).collect();
                let locks: Arc<dyn DistributedLock> =
                    Arc::new(env.builder(&endpoints).connect().await?);
                Ok(locks)
            }
        }))
}

fn cases() -> Vec<(&'static str, Case<Env>)> {
    vec![
        case!(the_url_form_connects_locks_and_fences),
        case!(a_lease_outlives_many_token_expiries),
        case!(watches_survive_token_expiries),
        case!(a_wrong_authority_is_a_clear_error),
        case!(a_missing_client_certificate_is_a_clear_error),
        case!(a_plaintext_client_fails_clearly),
        case!(the_server_name_override_is_what_is_verified),
        case!(the_certificate_names_the_user_without_a_password),
        case!(no_error_or_debug_shows_a_secret),
    ]
}

fn key(name: &str) -> String {
    format!(
        "etcd-tls/{:x}/{name}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    )
}

/// `etcd+https://user:password@host:port/prefix?ca=…&cert=…&key=…` connects like the builder:
/// two clients exclude each other and their fencing tokens grow.
async fn the_url_form_connects_locks_and_fences(env: Env) -> anyhow::Result<()> {
    let hosts: Vec<&str> = env
        .endpoints
        .iter()
        .map(|e| e.trim_start_matches("https://"))
        .collect();
    let url = format!(
        "etcd+https://{}:{}@{}/{NAMESPACE}?ca={}&cert={}&key={}&tls_server_name=localhost&session_timeout=2s",
        EtcdTlsServer::APP_USER,
        EtcdTlsServer::APP_PASSWORD,
        hosts.join(","),
        env.ca.display(),
        env.cert.display(),
        env.key.display()
    );
    let (a, b) = (
        Arc::new(EtcdLock::connect(&url).await?),
        Arc::new(EtcdLock::connect(&url).await?),
    );
    ensure!(a.endpoint_in_use().starts_with("https://"));
    let key = key("url");
    let opts = LockOptions::new(Duration::from_secs(10));
    let first = a.acquire(&key, &opts).await?;
    ensure!(
        b.try_acquire(&key, &opts).await?.is_none(),
        "the second client took a held lock"
    );
    let token = first.fencing_token();
    ensure!(first.release().await? == Released::Released);
    let second = b.acquire(&key, &opts).await?;
    ensure!(
        second.fencing_token() > token,
        "the fencing token did not grow"
    );
    ensure!(second.release().await? == Released::Released);
    Ok(())
}

/// A lock held with auto-renew for several token lifetimes stays held, and its key stays on the
/// server: the renewals find the token expired, authenticate again, and go on. (Keep-alives do
/// not use the token, so nothing else keeps it fresh; the lock's TTL is long enough that
/// renewals come further apart than the token lives.)
async fn a_lease_outlives_many_token_expiries(env: Env) -> anyhow::Result<()> {
    let locks = env.client().await?;
    let key = key("renewed");
    let opts = LockOptions::new(Duration::from_secs(9)).with_auto_renew();
    let lease = locks.acquire(&key, &opts).await?;
    let held_for = TOKEN_TTL * 6;
    let until = Instant::now() + held_for;
    while Instant::now() < until {
        ensure!(
            matches!(lease.state(), LeaseState::Held { .. }),
            "the lease became {:?} while the token expired",
            lease.state()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(
        env.stored(&locks, &key).await? == 1,
        "the key is no longer stored after {held_for:?}"
    );
    // Past the lock's own TTL, so only renewals kept it.
    ensure!(lease.release().await? == Released::Released);
    ensure!(env.stored(&locks, &key).await? == 0);
    Ok(())
}

/// Watches made after the token expired work: a waiter that waited across expiries gets the
/// lock on release, and a lock taken by a client whose shared key watch was opened with a token
/// that has since expired still learns at once that its key was deleted.
async fn watches_survive_token_expiries(env: Env) -> anyhow::Result<()> {
    let (holder, waiter) = (env.client().await?, env.client().await?);
    let first = key("first");
    let opts = LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(30));
    let lease = holder.acquire(&first, &opts).await?;
    let waiting = {
        let (waiter, first, opts) = (waiter.clone(), first.clone(), opts.clone());
        tokio::spawn(async move { waiter.acquire(&first, &opts).await })
    };
    // The holder's key watch opens with the token of now; both tokens expire meanwhile.
    tokio::time::sleep(TOKEN_TTL * 2 + Duration::from_millis(500)).await;
    ensure!(!waiting.is_finished(), "the waiter did not wait");
    ensure!(lease.release().await? == Released::Released);
    let successor = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .context("the waiter was not woken by the release")???;

    // A second lock of the holder: its key watch joins the stream opened with the old token.
    let second = key("second");
    let held = holder.acquire(&second, &opts).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let prefix = format!("{}/", holder.lock_name(&second)?);
    let mut root = env.root().await?;
    let signal = held.lost();
    root.delete(
        prefix,
        Some(etcd_client::DeleteOptions::new().with_prefix()),
    )
    .await?;
    tokio::time::timeout(Duration::from_secs(2), signal)
        .await
        .context("the holder did not learn that its key was deleted")?;
    ensure!(successor.release().await? == Released::Released);
    Ok(())
}

/// Connecting with an authority that did not sign the server's certificate fails at once with
/// a permanent error naming TLS and the certificate, and takes no lock.
async fn a_wrong_authority_is_a_clear_error(env: Env) -> anyhow::Result<()> {
    let other = TestCerts::generate(&["localhost", "127.0.0.1"], "app")?;
    let started = Instant::now();
    let outcome = env
        .builder(&env.endpoints)
        .with_tls(TlsFiles::new(&other.ca).with_client_cert(&env.cert, &env.key))
        .connect()
        .await;
    let error = match outcome {
        Ok(_) => bail!("connected although the server's certificate is not from the CA"),
        Err(error) => error,
    };
    eprintln!("wrong CA: {error} after {:?}", started.elapsed());
    let text = error.to_string();
    ensure!(refused_for_good(&error), "{error:?}");
    ensure!(
        text.contains("TLS") && text.contains("certificate"),
        "unclear: {text}"
    );
    ensure!(
        started.elapsed() < Duration::from_secs(5),
        "took the whole connect timeout"
    );
    Ok(())
}

/// Without a client certificate the server refuses the handshake: a clear, permanent error.
async fn a_missing_client_certificate_is_a_clear_error(env: Env) -> anyhow::Result<()> {
    let outcome = EtcdLock::builder()
        .with_endpoints(env.endpoints.iter().cloned())
        .with_tls(TlsFiles::new(&env.ca))
        .with_credentials(EtcdTlsServer::APP_USER, EtcdTlsServer::APP_PASSWORD)
        .with_connect_timeout(Duration::from_secs(10))
        .connect()
        .await;
    let error = match outcome {
        Ok(_) => bail!("connected without the client certificate the server requires"),
        Err(error) => error,
    };
    eprintln!("no client certificate: {error}");
    // The server's refusal comes as a certificate alert or, with TLS 1.3, as a connection closed
    // after the handshake; either way the error says what is missing.
    let text = error.to_string();
    let alert = refused_for_good(&error) && text.contains("TLS handshake failed");
    ensure!(
        alert || text.contains("with_client_cert"),
        "unclear: {error:?}"
    );
    Ok(())
}

/// A client without TLS against the TLS port gets an error within its connect timeout.
async fn a_plaintext_client_fails_clearly(env: Env) -> anyhow::Result<()> {
    let started = Instant::now();
    let plain: Vec<String> = env
        .endpoints
        .iter()
        .map(|e| e.replace("https://", "http://"))
        .collect();
    let outcome = EtcdLock::builder()
        .with_endpoints(plain)
        .with_credentials(EtcdTlsServer::APP_USER, EtcdTlsServer::APP_PASSWORD)
        .with_connect_timeout(Duration::from_secs(3))
        .with_request_timeout(Duration::from_secs(1))
        .connect()
        .await;
    let error = match outcome {
        Ok(_) => bail!("a plaintext client connected to the TLS port"),
        Err(error) => error,
    };
    eprintln!("plaintext: {error} after {:?}", started.elapsed());
    ensure!(
        started.elapsed() < Duration::from_secs(10),
        "no answer in time"
    );
    ensure!(
        error.to_string().contains("TLS"),
        "the error does not suggest TLS: {error}"
    );
    Ok(())
}

/// `tls_server_name` replaces the endpoint's host in the check of the server's certificate:
/// a name the certificate carries connects, another one fails as a TLS error.
async fn the_server_name_override_is_what_is_verified(env: Env) -> anyhow::Result<()> {
    let locks = env
        .builder(&env.endpoints)
        .with_tls(env.tls().with_server_name("localhost"))
        .connect()
        .await?;
    locks.close().await?;
    let outcome = env
        .builder(&env.endpoints)
        .with_tls(env.tls().with_server_name("etcd.elsewhere.example"))
        .connect()
        .await;
    let error = match outcome {
        Ok(_) => bail!("connected although the certificate does not name the server name"),
        Err(error) => error,
    };
    eprintln!("other server name: {error}");
    ensure!(refused_for_good(&error), "{error:?}");
    ensure!(error.to_string().contains("TLS"), "unclear: {error}");
    Ok(())
}

/// etcd 3.4 with `--client-cert-auth` takes a request without a token as the certificate's
/// user: a client with the certificate and no password locks, lists and evicts as `app`, within
/// `app`'s role.
async fn the_certificate_names_the_user_without_a_password(env: Env) -> anyhow::Result<()> {
    let builder = EtcdLock::builder()
        .with_endpoints(env.endpoints.iter().cloned())
        .with_prefix(NAMESPACE)
        .with_tls(env.tls());
    let locks = Arc::new(builder.clone().connect().await?);
    let name = key("cert-user");
    let lease = locks
        .acquire(&name, &LockOptions::new(Duration::from_secs(5)))
        .await?;
    // The role's read access to its prefixes is enough to list and evict there.
    let listed = locks.list(&name).await?;
    ensure!(
        listed.len() == 1 && listed[0].holder.fencing == Some(lease.fencing_token()),
        "{listed:?}"
    );
    ensure!(listed[0].holder.owner.as_ref().map(|o| o.pid) == Some(std::process::id()));
    let evicted = locks
        .evict(
            &dlock_core::backend::LockKey::new(&name)?,
            Some(lease.fencing_token()),
        )
        .await?;
    ensure!(
        matches!(evicted, dlock_core::inspect::Eviction::Evicted(_)),
        "{evicted:?}"
    );
    ensure!(lease.release().await? != Released::Released);
    // Outside the role's prefixes the server refuses.
    let outside = Arc::new(builder.with_prefix("elsewhere/").connect().await?);
    match outside
        .acquire(&key("refused"), &LockOptions::new(Duration::from_secs(5)))
        .await
    {
        Ok(_) => bail!("a lock outside the role's prefixes was granted"),
        Err(error) => ensure!(error.to_string().contains("permission denied"), "{error}"),
    }
    Ok(())
}

/// A wrong password, a garbled key file and the `Debug` of builders and clients never show the
/// password or the key's contents.
async fn no_error_or_debug_shows_a_secret(env: Env) -> anyhow::Result<()> {
    let key_text = std::fs::read_to_string(&env.key)?;
    let key_body: Vec<&str> = key_text
        .lines()
        .filter(|line| !line.starts_with("-----") && line.len() > 8)
        .collect();
    ensure!(!key_body.is_empty());
    let secrets = |text: &str| {
        text.contains(EtcdTlsServer::APP_PASSWORD)
            || text.contains("wrong-pw-123")
            || key_body.iter().any(|line| text.contains(line))
    };
    let builder = env.builder(&env.endpoints);
    let locks = builder.clone().connect().await?;
    for shown in [format!("{builder:?}"), format!("{locks:?}")] {
        ensure!(!secrets(&shown), "a secret in {shown}");
        ensure!(shown.contains("client-key.pem"), "no key path in {shown}");
    }
    let wrong = builder
        .clone()
        .with_credentials(EtcdTlsServer::APP_USER, "wrong-pw-123")
        .connect()
        .await;
    match wrong {
        Ok(_) => bail!("a wrong password was accepted"),
        Err(error) => {
            let shown = format!("{error} {error:?}");
            eprintln!("wrong password: {error}");
            ensure!(!secrets(&shown), "a secret in {shown}");
            ensure!(shown.contains("authentication failed"), "unclear: {shown}");
        }
    }
    // The key file given as the certificate, and the other way round.
    for swapped in [
        builder
            .clone()
            .with_tls(TlsFiles::new(&env.ca).with_client_cert(&env.key, &env.key)),
        builder
            .clone()
            .with_tls(TlsFiles::new(&env.ca).with_client_cert(&env.cert, &env.ca)),
    ] {
        match swapped.connect().await {
            Ok(_) => bail!("swapped files were accepted"),
            Err(error) => {
                let shown = format!("{error} {error:?}");
                ensure!(matches!(error, Error::InvalidInput { .. }), "{shown}");
                ensure!(!secrets(&shown), "a secret in {shown}");
            }
        }
    }
    locks.close().await?;
    Ok(())
}

fn names() -> Vec<String> {
    trials::names("etcd-tls", &cases())
}

fn main() {
    let args = trials::arguments();
    if docker_opt_out() {
        let mut trials = suite::placeholder_trials("etcd-tls", declared());
        trials.extend(trials::placeholders(names()));
        trials::run_ignored(&args, trials);
    }
    let runtime = trials::fixture_runtime();
    let options = EtcdTlsOptions::default().with_auth_token_ttl(TOKEN_TTL);
    let (shared, dedicated) =
        trials::start(&runtime, "two etcd members with TLS and auth", async {
            tokio::try_join!(
                EtcdTlsServer::start(options.clone()),
                EtcdTlsServer::start(options.clone())
            )
        });
    let env = Env::of(&shared);
    let trials: Vec<Trial> = match subject(&env, &dedicated) {
        Ok(subject) => {
            let mut trials = suite::trials(&subject);
            trials.extend(trials::cases("etcd-tls", &cases(), &env, TRIAL_BUDGET));
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

/// Whether `error` is the backend's, and not worth retrying (a TLS setting that does not fit).
fn refused_for_good(error: &Error) -> bool {
    matches!(
        error,
        Error::Backend {
            temporary: false,
            ..
        }
    )
}
