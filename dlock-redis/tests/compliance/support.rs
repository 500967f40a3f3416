//! What the Redis-specific trials share: running a trial, raw connections, waiting for a state.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use libtest_mimic::{Failed, Trial};
use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;

pub type ClientFuture = dlock_compliance::subject::ClientFuture;

type TrialFuture = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// A trial body: gets the shared server's URL (trials that break a server start their own).
pub type Body = fn(String) -> TrialFuture;

/// The longest one of these trials may take before it counts as hung.
const TRIAL_BUDGET: Duration = Duration::from_secs(120);

/// Every Redis-specific trial.
pub fn own_trials(url: String) -> Vec<Trial> {
    let bodies: Vec<(&str, Body)> = vec![
        (
            "faults::paused_server_ends_a_waiting_acquire_by_its_deadline",
            |u| Box::pin(crate::faults::paused_server_ends_a_waiting_acquire_by_its_deadline(u)),
        ),
        (
            "faults::restart_without_persistence_errors_then_recovers_and_loses_leases",
            |u| {
                Box::pin(crate::faults::restart_without_persistence_errors_then_recovers_and_loses_leases(u))
            },
        ),
        ("faults::flushed_script_cache_is_reloaded", |u| {
            Box::pin(crate::faults::flushed_script_cache_is_reloaded(u))
        }),
        (
            "interop::a_convention_lock_and_ours_exclude_each_other",
            |u| Box::pin(crate::interop::a_convention_lock_and_ours_exclude_each_other(u)),
        ),
        ("interop::the_key_layout_is_as_documented", |u| {
            Box::pin(crate::interop::the_key_layout_is_as_documented(u))
        }),
        ("storage::fence_ttl_is_rearmed_by_each_grant", |u| {
            Box::pin(crate::storage::fence_ttl_is_rearmed_by_each_grant(u))
        }),
        ("interop::holding_tells_held_or_free_and_the_ttl", |u| {
            Box::pin(crate::interop::holding_tells_held_or_free_and_the_ttl(u))
        }),
        ("waiting::a_release_wakes_a_waiter_without_polling", |u| {
            Box::pin(crate::waiting::a_release_wakes_a_waiter_without_polling(u))
        }),
        (
            "waiting::waiters_of_one_client_are_woken_one_per_release",
            |u| Box::pin(crate::waiting::waiters_of_one_client_are_woken_one_per_release(u)),
        ),
        ("waiting::an_expiring_holder_is_followed_at_its_ttl", |u| {
            Box::pin(crate::waiting::an_expiring_holder_is_followed_at_its_ttl(u))
        }),
        (
            "waiting::a_lost_subscriber_connection_costs_only_latency",
            |u| Box::pin(crate::waiting::a_lost_subscriber_connection_costs_only_latency(u)),
        ),
        ("waiting::a_silent_subscriber_connection_is_replaced", |u| {
            Box::pin(crate::waiting::a_silent_subscriber_connection_is_replaced(
                u,
            ))
        }),
        (
            "renewing::extend_many_answers_each_lease_in_one_script",
            |u| Box::pin(crate::renewing::extend_many_answers_each_lease_in_one_script(u)),
        ),
        (
            "renewing::many_renewing_leases_cost_a_few_scripts_per_tick",
            |u| Box::pin(crate::renewing::many_renewing_leases_cost_a_few_scripts_per_tick(u)),
        ),
        (
            "connecting::unreachable_servers_fail_in_bounded_time",
            |u| {
                Box::pin(crate::connecting::unreachable_servers_fail_in_bounded_time(
                    u,
                ))
            },
        ),
        (
            "connecting::credentials_and_database_come_from_the_url",
            |u| Box::pin(crate::connecting::credentials_and_database_come_from_the_url(u)),
        ),
        (
            "connecting::one_connection_serves_many_concurrent_acquires",
            |u| Box::pin(crate::connecting::one_connection_serves_many_concurrent_acquires(u)),
        ),
    ];
    bodies
        .into_iter()
        .map(|(name, body)| {
            let url = url.clone();
            Trial::test(format!("redis::{name}"), move || run(name, body, url))
        })
        .collect()
}

fn run(name: &str, body: Body, url: String) -> Result<(), Failed> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let started = Instant::now();
    let result = runtime.block_on(async {
        match tokio::time::timeout(TRIAL_BUDGET, body(url)).await {
            Ok(result) => result,
            Err(_) => Err(anyhow::anyhow!(
                "hung: did not finish within {TRIAL_BUDGET:?}"
            )),
        }
    });
    eprintln!("[timing] {name}: {:.2?}", started.elapsed());
    result.map_err(|e| Failed::from(format!("{e:#}")))
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
