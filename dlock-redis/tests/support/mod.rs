//! What the Redis test binaries share: timings, raw connections, waiting for a state.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use dlock_core::{Backoff, DistributedLockExt, LockOptions};
use dlock_redis::RedisLock;
use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;

pub type ClientFuture = dlock_compliance::subject::ClientFuture;

/// The longest one Redis-specific trial may take before it counts as hung.
pub const TRIAL_BUDGET: Duration = Duration::from_secs(120);

/// How late past a promised bound an answer may come on this noisy machine.
pub const SLACK: Duration = Duration::from_secs(1);

/// What a notified hand-over may take at most on this noisy machine (it takes about a millisecond).
pub const PROMPT: Duration = Duration::from_millis(750);

/// A backoff that never polls within a trial: only a notification or a TTL can explain a prompt
/// hand-over.
pub fn no_polling() -> Backoff {
    Backoff {
        initial: Duration::from_secs(30),
        max: Duration::from_secs(30),
        multiplier: 1.0,
        jitter: 0.0,
    }
}

/// Options for a waiter that waits up to `wait` for a lease of `ttl` and never polls within a
/// trial (see [`no_polling`]).
pub fn waiting_without_polling(ttl: Duration, wait: Duration) -> LockOptions {
    LockOptions::new(ttl)
        .with_retry(no_polling())
        .with_wait(wait)
}

/// `N` independent clients of the server at `url`, each with connections of its own.
pub async fn clients<const N: usize>(url: &str) -> anyhow::Result<[Arc<RedisLock>; N]> {
    let mut clients = Vec::with_capacity(N);
    for _ in 0..N {
        clients.push(Arc::new(RedisLock::connect(url).await?));
    }
    clients
        .try_into()
        .map_err(|_| anyhow::anyhow!("not {N} clients"))
}

/// A plain connection with no client-side timeout: the trials decide what "no answer" is.
pub async fn raw(url: &str) -> anyhow::Result<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(Some(Duration::from_secs(10)));
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection_with_config(&config)
        .await?)
}

/// Escapes the glob characters of `MATCH` patterns.
pub fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// Every key matching `pattern`.
pub async fn scan(
    con: &mut MultiplexedConnection,
    pattern: &str,
) -> redis::RedisResult<Vec<String>> {
    let mut cursor: u64 = 0;
    let mut keys = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(con)
            .await?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// A key no other trial uses.
pub fn unique(name: &str) -> String {
    format!("dlock-redis-test/{:016x}/{name}", rand::random::<u64>())
}

/// Polls `check` every 20 ms until it holds or `within` passes; returns how long it took.
pub async fn eventually<F>(within: Duration, mut check: F) -> Option<Duration>
where
    F: FnMut() -> bool,
{
    let start = Instant::now();
    loop {
        if check() {
            return Some(start.elapsed());
        }
        if start.elapsed() > within {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Acquires `key`, retrying temporary failures (a failover under way) until `within` passed.
pub async fn acquire_through_failover(
    client: &Arc<RedisLock>,
    key: &str,
    opts: &LockOptions,
    within: Duration,
) -> anyhow::Result<dlock_core::Lease> {
    let deadline = Instant::now() + within;
    loop {
        match client.acquire(key, opts).await {
            Ok(lease) => return Ok(lease),
            Err(e) if e.is_temporary() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e).context(format!("acquire {key}")),
        }
    }
}

/// Counts the keys of a namespace on the server at `url` (a Sentinel setup's primary): lock keys
/// start with it, counters contain it.
pub struct KeyCount {
    pub url: String,
}

#[async_trait::async_trait]
impl dlock_compliance::Inspect for KeyCount {
    async fn stored(&self, namespace: &str) -> anyhow::Result<u64> {
        let mut con = raw(&self.url).await?;
        let pattern = format!("*{}*", glob_escape(namespace));
        Ok(scan(&mut con, &pattern).await?.len() as u64)
    }
}
