//! Broken links to a working server: the subscriber connection killed or gone silent, and
//! servers that refuse or never answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use dlock_core::{Backoff, DistributedLockExt, Error, LockOptions};
use dlock_redis::RedisLock;
use dlock_testkit::case;
use dlock_testkit::fixtures::RedisServer;
use dlock_testkit::trials::Case;
use dlock_testkit::{url_target, url_via, FreezeProxy};
use tokio::net::TcpListener;

use crate::support::{self, no_polling, unique, PROMPT, SLACK};

/// The cases of this module, in the order they run.
pub fn cases() -> Vec<(&'static str, Case<Arc<RedisServer>>)> {
    vec![
        case!(unreachable_servers_fail_in_bounded_time),
        case!(a_lost_subscriber_connection_costs_only_latency),
        case!(a_silent_subscriber_connection_is_replaced),
    ]
}

/// A port nobody listens on is refused at once; a port that accepts but never answers (a hung
/// server, a black-holing proxy) fails by the connect or request timeout.
pub async fn unreachable_servers_fail_in_bounded_time(_: Arc<RedisServer>) -> anyhow::Result<()> {
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        listener.local_addr()?.port()
    };
    let start = Instant::now();
    match RedisLock::connect(&format!("redis://127.0.0.1:{closed}")).await {
        Err(Error::Unavailable { .. }) => {}
        Err(other) => bail!("a refused connection gave {other}"),
        Ok(_) => bail!("connected to a closed port"),
    }
    let took = start.elapsed();
    ensure!(
        took <= dlock_redis::DEFAULT_CONNECT_TIMEOUT + SLACK,
        "a refused connection took {took:?} to fail"
    );

    let silent = TcpListener::bind("127.0.0.1:0").await?;
    let port = silent.local_addr()?.port();
    let accepting = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket); // accept, then never answer
        }
    });
    let timeout = Duration::from_millis(500);
    let start = Instant::now();
    let connected = RedisLock::builder(format!("redis://127.0.0.1:{port}"))
        .with_connect_timeout(timeout)
        .with_request_timeout(timeout)
        .connect()
        .await;
    match connected {
        Err(e) => {
            ensure!(
                e.is_temporary(),
                "a silent server gave a permanent error: {e}"
            );
            ensure!(
                start.elapsed() <= timeout + SLACK,
                "connecting to a silent server took {:?} to fail",
                start.elapsed()
            );
        }
        Ok(client) => {
            // The handshake needed no answer: then the first request must time out.
            let client = Arc::new(client);
            let start = Instant::now();
            let attempt = client
                .try_acquire("silent", &LockOptions::new(Duration::from_secs(10)))
                .await;
            ensure!(attempt.is_err(), "a silent server granted a lock");
            ensure!(
                start.elapsed() <= timeout + SLACK,
                "a request to a silent server took {:?} to fail",
                start.elapsed()
            );
        }
    }
    accepting.abort();
    Ok(())
}

/// The server drops the subscriber connections (`CLIENT KILL TYPE pubsub`) while a task waits: the
/// waiter still gets the lock by polling, and the next waits are woken by notifications again.
pub async fn a_lost_subscriber_connection_costs_only_latency(
    server: Arc<RedisServer>,
) -> anyhow::Result<()> {
    let url = server.url();
    let [holder_client, waiter] = support::clients(&url).await?;
    let mut raw = support::raw(&url).await?;
    let key = unique("resubscribe");
    let long = LockOptions::new(Duration::from_secs(60));

    // Polling at 200 ms: the fallback this trial relies on.
    let polling = long
        .clone()
        .with_wait(Duration::from_secs(20))
        .with_retry(Backoff {
            initial: Duration::from_millis(200),
            max: Duration::from_millis(200),
            multiplier: 1.0,
            jitter: 0.0,
        });
    let held = holder_client.acquire(&key, &long).await?;
    let waiting = {
        let (waiter, key, polling) = (waiter.clone(), key.clone(), polling.clone());
        tokio::spawn(async move { waiter.acquire(&key, &polling).await })
    };
    pubsub_ids_when(&mut raw, Duration::from_secs(5), |_| true)
        .await?
        .context("the waiter never subscribed")?;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut raw)
        .await?;
    ensure!(killed >= 1, "no subscriber connection to kill");
    held.release().await?;
    let lease = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .context("the waiter did not get the lock by polling")???;
    lease.release().await?;

    // The subscription comes back: a non-polling waiter is woken promptly again.
    let opts = long
        .with_retry(no_polling())
        .with_wait(Duration::from_secs(20));
    let mut prompt = false;
    for _ in 0..10 {
        let held = holder_client.acquire(&key, &opts).await?;
        let waiting = {
            let (waiter, key, opts) = (waiter.clone(), key.clone(), opts.clone());
            tokio::spawn(async move { (waiter.acquire(&key, &opts).await, Instant::now()) })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released_at = Instant::now();
        held.release().await?;
        match tokio::time::timeout(Duration::from_secs(2), waiting).await {
            Ok(joined) => {
                let (lease, at) = joined?;
                lease?.release().await?;
                if at - released_at <= PROMPT {
                    prompt = true;
                    break;
                }
            }
            Err(_) => {
                // Still waiting without a notification; take it over below and try again.
                anyhow::bail!("a waiter was not woken 2 s after a release, after the reconnection");
            }
        }
    }
    ensure!(
        prompt,
        "notifications did not come back after the subscriber was killed"
    );
    Ok(())
}

/// The subscriber connection goes silent (a dropping proxy: bytes lost both ways, the connection
/// left open) while a task waits without polling: the client notices by its health check,
/// replaces the connection once the link carries bytes again, and the release then wakes the
/// waiter promptly.
pub async fn a_silent_subscriber_connection_is_replaced(
    server: Arc<RedisServer>,
) -> anyhow::Result<()> {
    let url = server.url();
    let proxy = FreezeProxy::start_dropping(url_target(&url, 6379)?).await?;
    let switch = proxy.switch();
    let holder_client = Arc::new(RedisLock::connect(&url).await?);
    let waiter = Arc::new(RedisLock::connect(&url_via(&url, proxy.addr())?).await?);
    let mut raw = support::raw(&url).await?;
    let key = unique("silent-subscriber");
    let opts = LockOptions::new(Duration::from_secs(60))
        .with_retry(no_polling())
        .with_wait(Duration::from_secs(40));
    let held = holder_client.acquire(&key, &opts).await?;
    let waiting = {
        let (waiter, key, opts) = (waiter.clone(), key.clone(), opts.clone());
        tokio::spawn(async move { waiter.acquire(&key, &opts).await })
    };
    let subscriber = pubsub_ids_when(&mut raw, Duration::from_secs(5), |_| true)
        .await?
        .context("the waiter never subscribed")?;

    // Longer than a health check and its timeout.
    switch.freeze();
    tokio::time::sleep(Duration::from_secs(7)).await;
    switch.thaw();
    pubsub_ids_when(&mut raw, Duration::from_secs(10), |ids| {
        ids != subscriber.as_slice()
    })
    .await?
    .with_context(|| format!("the silent subscriber connection {subscriber:?} was not replaced"))?;

    let released_at = Instant::now();
    held.release().await?;
    let lease = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .context("the waiter was not woken after the subscriber was replaced")???;
    let took = released_at.elapsed();
    ensure!(
        took <= PROMPT,
        "the waiter got the lock {took:?} after the release, not woken by a notification"
    );
    lease.release().await?;
    Ok(())
}

/// The ids of the server's subscriber connections once there are some for which `wanted` holds,
/// checked every 100 ms; `None` if that does not happen `within`.
async fn pubsub_ids_when(
    raw: &mut redis::aio::MultiplexedConnection,
    within: Duration,
    wanted: impl Fn(&[String]) -> bool,
) -> anyhow::Result<Option<Vec<String>>> {
    let start = Instant::now();
    loop {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .arg("TYPE")
            .arg("pubsub")
            .query_async(raw)
            .await?;
        let ids: Vec<String> = list
            .lines()
            .filter_map(|line| line.split(' ').find_map(|f| f.strip_prefix("id=")))
            .map(str::to_owned)
            .collect();
        if !ids.is_empty() && wanted(&ids) {
            return Ok(Some(ids));
        }
        if start.elapsed() > within {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
