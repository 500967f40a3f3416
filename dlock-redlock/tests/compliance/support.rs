//! What the Redlock trials share: client settings, running a trial, raw access to one master.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use dlock_redlock::RedlockBuilder;
use libtest_mimic::{Failed, Trial};
use redis::aio::MultiplexedConnection;

pub type ClientFuture = dlock_compliance::subject::ClientFuture;

type TrialFuture = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// A trial body: starts whatever masters it needs.
type Body = fn() -> TrialFuture;

/// The per-node timeout the trials use: far above a healthy round trip through Docker's port
/// mapping, even on a loaded machine, and far below the suite's one-second TTLs.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(200);

/// The longest one of these trials may take before it counts as hung.
const TRIAL_BUDGET: Duration = Duration::from_secs(180);

/// A client of `urls` with the trials' per-node timeout.
pub fn builder(urls: &[String]) -> RedlockBuilder {
    RedlockBuilder::from_urls(urls.iter().cloned()).with_node_timeout(NODE_TIMEOUT)
}

/// Every Redlock-specific trial: (name, body).
pub fn own_trials() -> Vec<Trial> {
    let bodies: Vec<(&str, Body)> = vec![
        ("faults::one_or_two_of_five_masters_down_still_lock", || {
            Box::pin(crate::faults::one_or_two_of_five_masters_down_still_lock())
        }),
        (
            "faults::three_of_five_masters_down_fail_fast_naming_reached_and_needed",
            || {
                Box::pin(
                    crate::faults::three_of_five_masters_down_fail_fast_naming_reached_and_needed(),
                )
            },
        ),
        (
            "faults::a_frozen_master_costs_at_most_the_node_timeout",
            || Box::pin(crate::faults::a_frozen_master_costs_at_most_the_node_timeout()),
        ),
        (
            "faults::restart_without_persistence_with_delayed_restart_has_one_holder",
            || {
                Box::pin(
                    crate::faults::restart_without_persistence_with_delayed_restart_has_one_holder(
                    ),
                )
            },
        ),
        (
            "faults::restart_without_persistence_without_delayed_restart_has_two_holders",
            || {
                Box::pin(crate::faults::restart_without_persistence_without_delayed_restart_has_two_holders())
            },
        ),
        (
            "fencing::tokens_increase_while_masters_fail_one_at_a_time",
            || Box::pin(crate::fencing::tokens_increase_while_masters_fail_one_at_a_time()),
        ),
        ("fencing::the_maximum_is_written_back_to_a_quorum", || {
            Box::pin(crate::fencing::the_maximum_is_written_back_to_a_quorum())
        }),
        ("fencing::fencing_off_declares_no_guarantee", || {
            Box::pin(crate::fencing::fencing_off_declares_no_guarantee())
        }),
        (
            "fencing::fence_ttl_is_armed_on_every_master_and_rearmed_by_each_grant",
            || {
                Box::pin(
                    crate::fencing::fence_ttl_is_armed_on_every_master_and_rearmed_by_each_grant(),
                )
            },
        ),
        ("inspect::a_quorum_decides_held_or_free", || {
            Box::pin(crate::inspect::a_quorum_decides_held_or_free())
        }),
        (
            "inspect::a_minority_down_still_answers_and_no_quorum_is_an_error",
            || Box::pin(crate::inspect::a_minority_down_still_answers_and_no_quorum_is_an_error()),
        ),
        (
            "batch::a_mixed_batch_with_one_master_down_answers_like_extend",
            || Box::pin(crate::batch::a_mixed_batch_with_one_master_down_answers_like_extend()),
        ),
        (
            "batch::three_of_five_masters_down_answer_unavailable_per_lease",
            || Box::pin(crate::batch::three_of_five_masters_down_answer_unavailable_per_lease()),
        ),
    ];
    bodies
        .into_iter()
        .map(|(name, body)| Trial::test(format!("redlock::{name}"), move || run(name, body)))
        .collect()
}

fn run(name: &str, body: Body) -> Result<(), Failed> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let started = Instant::now();
    let result = runtime.block_on(async {
        tokio::time::timeout(TRIAL_BUDGET, body())
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("hung: not done within {TRIAL_BUDGET:?}")))
    });
    eprintln!("[timing] {name}: {:.2?}", started.elapsed());
    result.map_err(|e| Failed::from(format!("{e:#}")))
}

/// A plain connection to one master, for looking at and planting keys.
pub async fn raw(url: &str) -> anyhow::Result<MultiplexedConnection> {
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?)
}

/// The keys on the master at `url` whose name contains `text` (glob characters escaped).
pub async fn keys_containing(url: &str, text: &str) -> anyhow::Result<Vec<String>> {
    let escaped: String = text
        .chars()
        .flat_map(|c| {
            let escape = matches!(c, '*' | '?' | '[' | ']' | '\\').then_some('\\');
            escape.into_iter().chain([c])
        })
        .collect();
    // KEYS is fine on a test server; it answers in one call.
    let mut con = raw(url).await?;
    Ok(redis::cmd("KEYS")
        .arg(format!("*{escaped}*"))
        .query_async(&mut con)
        .await?)
}

/// A key no other trial uses.
pub fn unique(name: &str) -> String {
    format!("dlock-redlock-test/{:016x}/{name}", rand::random::<u64>())
}

/// The `q`-quantile of `samples` (sorted in place).
pub fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort_unstable();
    let at = ((samples.len().max(1) - 1) as f64 * q).round() as usize;
    samples.get(at).copied().unwrap_or_default()
}
