//! PostgreSQL over TLS as libpq users configure it (`sslmode`, `sslrootcert`, `sslcert`,
//! `sslkey`): each mode against a server with TLS that requires client certificates of its TLS
//! clients (`hostssl … cert`), checking that the lock session is encrypted, that a server the
//! client must not trust is refused, and that no error shows key material.
//!
//! The server's certificate names `localhost` only, so `127.0.0.1` tells `verify-ca` (chain
//! only) from `verify-full` (chain and name).
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-postgres --test tls
//! ```

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use dlock_core::{DistributedLockExt, Error, LockOptions};
use dlock_testkit::case;
use dlock_testkit::certs::TestCerts;
use dlock_testkit::fixtures::{docker_opt_out, PostgresOptions, PostgresServer, PostgresTlsFiles};
use dlock_testkit::trials::{self, Case};
use libtest_mimic::Arguments;

use support::{builder, client};

const TRIAL_BUDGET: Duration = Duration::from_secs(60);

#[derive(Clone)]
struct Env {
    server: Arc<PostgresServer>,
    certs: Arc<TestCerts>,
    /// An authority the server's certificate does not chain to.
    stranger: Arc<TestCerts>,
}

impl Env {
    /// `postgres://postgres@HOST:PORT/postgres?` with the parameters `params`, no password:
    /// TLS clients log in with their certificate.
    fn url(&self, host: &str, params: &str) -> String {
        let url = self.server.url();
        let port = url
            .rsplit_once(':')
            .and_then(|(_, p)| p.split('/').next())
            .unwrap_or("5432");
        format!("postgres://postgres@{host}:{port}/postgres?{params}")
    }

    fn files(&self, certs: &TestCerts, root: bool) -> String {
        let mut params = format!(
            "sslcert={}&sslkey={}",
            certs.client_cert.display(),
            certs.client_key.display()
        );
        if root {
            params.push_str(&format!("&sslrootcert={}", certs.ca.display()));
        }
        params
    }
}

fn cases() -> Vec<(&'static str, Case<Env>)> {
    vec![
        case!(verify_full_with_a_client_certificate_locks_over_tls),
        case!(verify_full_refuses_another_name_and_verify_ca_takes_it),
        case!(an_untrusted_authority_is_refused_without_retrying),
        case!(require_and_prefer_encrypt_without_checking),
        case!(disable_logs_in_with_the_password_in_plaintext),
        case!(bad_files_name_the_setting_and_never_their_contents),
    ]
}

/// Whether the server sees the client's lock session encrypted (`pg_stat_ssl`).
async fn encrypted(env: &Env, locks: &dlock_postgres::PgLock) -> anyhow::Result<bool> {
    let pid = locks.session_pid().await.context("no lock session")?;
    let shown = env
        .server
        .psql(&format!("SELECT ssl FROM pg_stat_ssl WHERE pid = {pid}"))
        .await?;
    Ok(shown == "t")
}

async fn lock_once(locks: &Arc<dlock_postgres::PgLock>, name: &str) -> anyhow::Result<()> {
    let lease = locks
        .acquire(name, &LockOptions::new(Duration::from_secs(5)))
        .await?;
    ensure!(lease.fencing_token().0 > 0, "no token");
    lease.release().await?;
    Ok(())
}

async fn verify_full_with_a_client_certificate_locks_over_tls(env: Env) -> anyhow::Result<()> {
    let url = env.url(
        "localhost",
        &format!("sslmode=verify-full&{}", env.files(&env.certs, true)),
    );
    let locks = client(&url).await?;
    lock_once(&locks, "tls/verify-full").await?;
    ensure!(
        encrypted(&env, &locks).await?,
        "the lock session is not encrypted"
    );
    Ok(())
}

async fn verify_full_refuses_another_name_and_verify_ca_takes_it(env: Env) -> anyhow::Result<()> {
    let files = env.files(&env.certs, true);
    let full = client(&env.url("127.0.0.1", &format!("sslmode=verify-full&{files}"))).await;
    let error = full
        .err()
        .context("verify-full accepted a certificate for another name")?;
    ensure!(
        format!("{error:#}").contains("certificate"),
        "the refusal does not say why: {error:#}"
    );
    let locks = client(&env.url("127.0.0.1", &format!("sslmode=verify-ca&{files}"))).await?;
    lock_once(&locks, "tls/verify-ca").await?;
    ensure!(
        encrypted(&env, &locks).await?,
        "the lock session is not encrypted"
    );
    Ok(())
}

async fn an_untrusted_authority_is_refused_without_retrying(env: Env) -> anyhow::Result<()> {
    let files = format!(
        "sslrootcert={}&sslcert={}&sslkey={}",
        env.stranger.ca.display(),
        env.certs.client_cert.display(),
        env.certs.client_key.display()
    );
    for mode in ["verify-ca", "verify-full", "require"] {
        let url = env.url("localhost", &format!("sslmode={mode}&{files}"));
        let error = client(&url)
            .await
            .err()
            .with_context(|| format!("sslmode={mode} trusted a server of another authority"))?;
        let dlock = error.downcast_ref::<Error>().context("not a dlock error")?;
        ensure!(
            !dlock.is_temporary(),
            "sslmode={mode}: a refused certificate is temporary: {dlock}"
        );
    }
    Ok(())
}

async fn require_and_prefer_encrypt_without_checking(env: Env) -> anyhow::Result<()> {
    // No root certificate: the server's certificate is not checked, as in libpq.
    let files = env.files(&env.certs, false);
    for mode in ["require", "prefer"] {
        let locks = client(&env.url("127.0.0.1", &format!("sslmode={mode}&{files}"))).await?;
        lock_once(&locks, &format!("tls/{mode}")).await?;
        ensure!(
            encrypted(&env, &locks).await?,
            "sslmode={mode}: not encrypted"
        );
    }
    Ok(())
}

async fn disable_logs_in_with_the_password_in_plaintext(env: Env) -> anyhow::Result<()> {
    let url = format!("{}?sslmode=disable", env.server.url());
    let locks = client(&url).await?;
    lock_once(&locks, "tls/disable").await?;
    ensure!(
        !encrypted(&env, &locks).await?,
        "sslmode=disable encrypted the session"
    );
    Ok(())
}

async fn bad_files_name_the_setting_and_never_their_contents(env: Env) -> anyhow::Result<()> {
    let key = std::fs::read_to_string(&env.certs.client_key)?;
    let secret_line = key.lines().nth(1).context("a key line")?.to_string();
    // The key given as the certificate, and the certificate as the key.
    let url = env.url(
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
            env.certs.ca.display(),
            env.certs.client_key.display(),
            env.certs.client_cert.display()
        ),
    );
    let error = builder(&url)?
        .connect()
        .await
        .err()
        .context("swapped files connected")?;
    let shown = format!("{error} {error:?}");
    ensure!(
        !shown.contains(&secret_line),
        "the error shows the key: {shown}"
    );
    ensure!(
        matches!(
            error,
            Error::InvalidInput {
                field: "sslcert" | "sslkey",
                ..
            }
        ),
        "swapped files: {error:?}"
    );
    let missing = env.url(
        "localhost",
        "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
    );
    let error = builder(&missing)?
        .connect()
        .await
        .err()
        .context("a missing root connected")?;
    ensure!(
        format!("{error}").contains("/nonexistent/ca.pem"),
        "the error does not name the file: {error}"
    );
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    if PostgresServer::needs_docker() && docker_opt_out() {
        trials::run_ignored(
            &args,
            trials::placeholders(trials::names("postgres-tls", &cases())),
        );
    }
    let certs = Arc::new(TestCerts::generate(&["localhost"], "postgres").expect("certificates"));
    let stranger = Arc::new(TestCerts::generate(&["localhost"], "postgres").expect("certificates"));
    let runtime = trials::fixture_runtime();
    let options = PostgresOptions::default().with_tls(PostgresTlsFiles {
        ca: certs.ca.clone(),
        server_cert: certs.server_cert.clone(),
        server_key: certs.server_key.clone(),
        require_client_cert: true,
    });
    let server = trials::start(&runtime, "a PostgreSQL server with TLS", async {
        PostgresServer::start_with(options).await
    });
    let env = Env {
        server: Arc::new(server),
        certs,
        stranger,
    };
    let server = env.server.clone();
    let trials = trials::cases("postgres-tls", &cases(), &env, TRIAL_BUDGET);
    drop(env);
    trials::run_then(&args, trials, &runtime, || async move {
        match Arc::try_unwrap(server) {
            Ok(server) => server.shutdown().await,
            Err(_) => Ok(()),
        }
    })
}
