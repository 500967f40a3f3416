//! The Redis backend through Redis Sentinel over TLS: one primary, one replica and three
//! sentinels in containers, every one of them on a TLS port that requires a client certificate
//! (`tls-auth-clients yes`), replicating and monitoring over TLS, with a test authority.
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-redis --test sentinel_tls
//! ```
//!
//! One topology, one trial (the failover changes it). With `DLOCK_TEST_NO_DOCKER=1` the trial is
//! reported as ignored; without Docker and without that opt-out the binary fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use dlock_core::{DistributedLockExt, LockOptions};
use dlock_redis::{RedisLock, RedisLockBuilder};
use dlock_testkit::certs::TestCerts;
use dlock_testkit::fixtures::redis_sentinel::SERVICE;
use dlock_testkit::fixtures::{docker_opt_out, RedisSentinel, RedisTlsFiles};
use dlock_testkit::{case, trials};
use libtest_mimic::Arguments;

/// The longest the trial may take before it counts as hung.
const BUDGET: Duration = Duration::from_secs(90);

/// What the trial shares with `main`: the topology and the files it was started with.
#[derive(Clone)]
struct Cx {
    sentinel: Arc<RedisSentinel>,
    certs: Arc<TestCerts>,
}

impl Cx {
    /// `rediss+sentinel://…?ca=…&cert=…&key=…` naming the sentinels' TLS ports.
    fn url(&self) -> String {
        format!(
            "rediss+sentinel://{}/{SERVICE}?ca={}&cert={}&key={}",
            self.sentinel.tls_sentinel_addresses().join(","),
            self.certs.ca.display(),
            self.certs.client_cert.display(),
            self.certs.client_key.display()
        )
    }

    async fn client(&self) -> anyhow::Result<Arc<RedisLock>> {
        Ok(Arc::new(
            RedisLockBuilder::from_url(&self.url())?.connect().await?,
        ))
    }

    /// A plain connection (the fixture's own port) to the server the sentinels name now.
    async fn primary_connection(&self) -> anyhow::Result<redis::aio::MultiplexedConnection> {
        let primary = self.sentinel.primary().await?;
        support::raw(&format!("redis://{}", primary.endpoint())).await
    }
}

const TRIALS: &[(&str, trials::Case<Cx>)] =
    &[case!(a_tls_sentinel_url_locks_and_follows_a_failover)];

fn main() {
    let args = Arguments::from_args();
    if docker_opt_out() {
        trials::run_ignored(
            &args,
            trials::placeholders(trials::names("sentinel_tls", TRIALS)),
        );
    }
    let runtime = trials::fixture_runtime();
    let certs = TestCerts::generate(&["127.0.0.1", "localhost"], "dlock-client")
        .expect("test certificates");
    let files = RedisTlsFiles {
        ca: certs.ca.clone(),
        server_cert: certs.server_cert.clone(),
        server_key: certs.server_key.clone(),
        require_client_cert: true,
    };
    let sentinel = trials::start(
        &runtime,
        "Redis Sentinel over TLS (primary, replica, three sentinels)",
        RedisSentinel::start_tls(&files),
    );
    let cx = Cx {
        sentinel: Arc::new(sentinel),
        certs: Arc::new(certs),
    };
    let all = trials::cases("sentinel_tls", TRIALS, &cx, BUDGET);
    trials::run_then(&args, all, &runtime, || async move {
        match Arc::try_unwrap(cx.sentinel) {
            Ok(sentinel) => sentinel.shutdown().await,
            // A trial still holds it (it hung); dropping the last reference removes it.
            Err(_) => Ok(()),
        }
    })
}

/// Through the sentinels' TLS ports, with the test authority and a client certificate: a lock is
/// held against a second client, the next grant's token is higher, and after a forced failover
/// the client finds the new primary (over TLS) and locks there. Without the client certificate
/// the servers refuse the client.
async fn a_tls_sentinel_url_locks_and_follows_a_failover(cx: Cx) -> anyhow::Result<()> {
    let (a, b) = (cx.client().await?, cx.client().await?);
    ensure!(
        a.endpoint().starts_with("rediss+sentinel://"),
        "{}",
        a.endpoint()
    );
    let key = support::unique("tls-sentinel");
    let opts = LockOptions::new(Duration::from_secs(10));
    let lease = a.acquire(&key, &opts).await?;
    let first = lease.fencing_token();
    ensure!(
        b.try_acquire(&key, &opts).await?.is_none(),
        "a second client got a held lock"
    );
    lease.release().await?;
    let second = b
        .try_acquire(&key, &opts)
        .await?
        .context("the released lock is not free")?;
    trials::ensure_token_above(&second, first, "a release")?;
    second.release().await?;

    let without_cert = format!(
        "rediss+sentinel://{}/{SERVICE}?ca={}",
        cx.sentinel.tls_sentinel_addresses().join(","),
        cx.certs.ca.display()
    );
    let refused = RedisLockBuilder::from_url(&without_cert)?.connect().await;
    ensure!(
        refused.is_err(),
        "connected without a client certificate to servers that require one"
    );

    let old = cx.sentinel.announced_port(cx.sentinel.primary().await?);
    let promoted = cx.sentinel.failover().await?;
    ensure!(
        cx.sentinel.announced_port(promoted) != old,
        "the failover kept the primary"
    );
    // Until the client hears of the promotion (`+switch-master`, or a failed request), it may
    // still be granted on the old primary, which takes writes until the sentinels demote it:
    // wait for the first grant on the new one.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let after = support::unique("tls-after-failover");
        let lease =
            support::acquire_through_failover(&a, &after, &opts, Duration::from_secs(20)).await?;
        let mut con = cx.primary_connection().await?;
        let exists: bool = redis::cmd("EXISTS")
            .arg(&after)
            .query_async(&mut con)
            .await?;
        lease.release().await?;
        if exists {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "no lock was granted on the new primary within 20 s of the failover"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cx.sentinel.wait_healthy().await?;
    Ok(())
}
