//! Redlock over masters that each speak TLS and each require their own password and a client
//! certificate, and one Redis over TLS from a URL with its TLS files — against real servers:
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-redlock --test tls
//! ```
//!
//! Three masters share one fresh authority (generated at start); master `i` requires password
//! `pw-i`. The trials lock, fence, lose and regain a master, and check that a wrong password or
//! authority is refused without the password showing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use dlock_core::{DistributedLock, DistributedLockExt, LockOptions};
use dlock_redlock::RedlockBuilder;
use dlock_testkit::certs::TestCerts;
use dlock_testkit::fixtures::{docker_opt_out, RedisMasters, RedisOptions, RedisTlsFiles};
use dlock_testkit::{case, trials};
use libtest_mimic::{Arguments, Trial};

const MASTERS: usize = 3;
const BUDGET: Duration = Duration::from_secs(120);

/// What every trial gets: the masters' TLS addresses and the files a client presents.
#[derive(Clone)]
struct Tls {
    urls: Vec<String>,
    masters: Option<Arc<RedisMasters>>,
    certs: Arc<TestCerts>,
}

impl Tls {
    fn password(i: usize) -> String {
        format!("pw-{}", i + 1)
    }

    /// Master `i`'s URL with its own password and the client's TLS files.
    fn url(&self, i: usize, password: &str, ca: &std::path::Path) -> String {
        let address = self.urls[i].trim_start_matches("rediss://");
        format!(
            "rediss://:{password}@{address}?ca={}&cert={}&key={}",
            ca.display(),
            self.certs.client_cert.display(),
            self.certs.client_key.display()
        )
    }

    fn urls_with_own_passwords(&self) -> Vec<String> {
        (0..self.urls.len())
            .map(|i| self.url(i, &Self::password(i), &self.certs.ca))
            .collect()
    }

    async fn redlock(&self, urls: Vec<String>) -> dlock_core::Result<Arc<dyn DistributedLock>> {
        let lock = RedlockBuilder::from_urls(urls)
            .with_request_timeout(Duration::from_millis(500))
            .connect()
            .await?;
        Ok(Arc::new(lock))
    }
}

fn options() -> LockOptions {
    LockOptions::default().with_ttl(Duration::from_secs(5))
}

fn main() {
    let args = Arguments::from_args();
    let certs = Arc::new(
        TestCerts::generate(&["localhost", "127.0.0.1"], "app").expect("test certificates"),
    );
    let placeholder = Tls {
        urls: Vec::new(),
        masters: None,
        certs: certs.clone(),
    };
    if RedisMasters::needs_docker() && docker_opt_out() {
        trials::run_ignored(&args, own_trials(&placeholder));
    }
    let runtime = trials::fixture_runtime();
    let options = RedisOptions::default()
        .with_tls(RedisTlsFiles {
            ca: certs.ca.clone(),
            server_cert: certs.server_cert.clone(),
            server_key: certs.server_key.clone(),
            require_client_cert: true,
        })
        .with_passwords((0..MASTERS).map(Tls::password).collect());
    let masters = trials::start(
        &runtime,
        "3 Redis masters with TLS and passwords",
        RedisMasters::start_with(MASTERS, options),
    );
    let masters = Arc::new(masters);
    let cx = Tls {
        urls: masters.tls_urls(),
        masters: Some(masters.clone()),
        certs,
    };
    assert_eq!(
        cx.urls.len(),
        MASTERS,
        "every master publishes its TLS port"
    );
    let trials = own_trials(&cx);
    drop(cx);
    trials::run_then(&args, trials, &runtime, || async move {
        match Arc::try_unwrap(masters) {
            Ok(masters) => masters.shutdown().await,
            Err(_) => Ok(()),
        }
    })
}

fn own_trials(cx: &Tls) -> Vec<Trial> {
    let cases = [
        case!(locks_fences_and_recovers_over_tls_with_each_masters_credentials),
        case!(a_wrong_password_or_authority_is_refused_without_showing_the_password),
        case!(one_redis_over_tls_from_a_url),
    ];
    trials::cases("redlock::tls", &cases, cx, BUDGET)
}

async fn locks_fences_and_recovers_over_tls_with_each_masters_credentials(
    cx: Tls,
) -> anyhow::Result<()> {
    let a = cx.redlock(cx.urls_with_own_passwords()).await?;
    let b = cx.redlock(cx.urls_with_own_passwords()).await?;
    let first = a.acquire("tls/job", &options()).await?;
    anyhow::ensure!(
        b.try_acquire("tls/job", &options()).await?.is_none(),
        "a second client got a held lock"
    );
    let token = first.fencing_token();
    first.release().await?;
    let second = b.acquire("tls/job", &options()).await?;
    anyhow::ensure!(second.fencing_token() > token, "tokens must grow");
    second.release().await?;

    // One master down: the other two still make a quorum; back up, it serves again.
    let masters = cx.masters.as_ref().context("container-backed masters")?;
    let member = masters.member(0)?;
    member.stop().await?;
    let during = a.acquire("tls/job", &options()).await;
    member.start().await?;
    let during = during.context("a lock with one master of three down")?;
    anyhow::ensure!(during.fencing_token() > token, "tokens must grow");
    during.release().await?;
    let after = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Ok(lease) = b.acquire("tls/after-restart", &options()).await {
                break lease;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .context("locking again after the master came back")?;
    after.release().await?;
    Ok(())
}

async fn a_wrong_password_or_authority_is_refused_without_showing_the_password(
    cx: Tls,
) -> anyhow::Result<()> {
    let wrong_password: Vec<String> = (0..cx.urls.len())
        .map(|i| cx.url(i, "hunter2-wrong", &cx.certs.ca))
        .collect();
    let other = TestCerts::generate(&["localhost", "127.0.0.1"], "app")?;
    let wrong_authority: Vec<String> = (0..cx.urls.len())
        .map(|i| cx.url(i, &Tls::password(i), &other.ca))
        .collect();
    for (what, urls) in [
        ("a wrong password", wrong_password),
        ("another authority", wrong_authority),
    ] {
        let outcome = match cx.redlock(urls).await {
            Err(e) => Err(e),
            Ok(lock) => lock
                .try_acquire("tls/refused", &options())
                .await
                .map(|_| ()),
        };
        let error = match outcome {
            Err(e) => e,
            Ok(()) => anyhow::bail!("{what}: a lock was granted"),
        };
        let shown = format!("{error} {error:?}");
        anyhow::ensure!(!shown.contains("hunter2"), "{what}: {shown}");
    }
    Ok(())
}

async fn one_redis_over_tls_from_a_url(cx: Tls) -> anyhow::Result<()> {
    // The last master: the recovery trial, running beside this one, stops the first.
    let last = cx.urls.len() - 1;
    let url = format!(
        "{}&prefix=tls-one:",
        cx.url(last, &Tls::password(last), &cx.certs.ca)
    );
    let lock: Arc<dyn DistributedLock> = Arc::new(
        dlock_redis::RedisLockBuilder::from_url(&url)?
            .connect()
            .await?,
    );
    let lease = lock.acquire("k", &options()).await?;
    anyhow::ensure!(
        lock.try_acquire("k", &options()).await?.is_none(),
        "a held lock was granted again"
    );
    let token = lease.fencing_token();
    lease.release().await?;
    let again = lock.acquire("k", &options()).await?;
    anyhow::ensure!(again.fencing_token() > token, "tokens must grow");
    again.release().await?;
    Ok(())
}
