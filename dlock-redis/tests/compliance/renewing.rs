//! Batched renewals: `extend_many` answers each lease like `extend`, in one script per batch, and
//! auto-renew of many leases costs a few scripts per tick. Each trial counts the scripts of a
//! server of its own.

use std::sync::Arc;
use std::time::Duration;

use anyhow::ensure;
use dlock_core::backend::{ExtendRequest, Extension, LeaseRef, LockKey};
use dlock_core::{DistributedLock, DistributedLockExt, LockOptions, OwnerToken};
use dlock_redis::{RedisLock, EXTEND_BATCH};
use dlock_testkit::case;
use dlock_testkit::fixtures::RedisServer;
use dlock_testkit::trials::Case;
use redis::aio::MultiplexedConnection;

use crate::support::{self, unique};

/// The cases of this module, each given the shared server's URL.
pub fn cases() -> Vec<(&'static str, Case<String>)> {
    vec![
        case!(extend_many_answers_each_lease_in_one_script),
        case!(many_renewing_leases_cost_a_few_scripts_per_tick),
    ]
}

/// Scripts run by hash on the server so far (`INFO commandstats`).
async fn scripts_run(con: &mut MultiplexedConnection) -> anyhow::Result<u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await?;
    let calls = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    Ok(calls)
}

/// A held lease is extended, a released one answers expired, and a lease whose key another owner
/// holds answers taken over and leaves that lock as it was, all in one script.
pub async fn extend_many_answers_each_lease_in_one_script(_: String) -> anyhow::Result<()> {
    let server = RedisServer::start().await?;
    let client = Arc::new(RedisLock::connect(&server.url()).await?);
    let mut con = support::raw(&server.url()).await?;
    let opts = LockOptions::new(Duration::from_secs(5));
    let (held_key, gone_key, other_key) = (unique("held"), unique("gone"), unique("other"));
    let held = client.acquire(&held_key, &opts).await?;
    client.acquire(&gone_key, &opts).await?.release().await?;
    let other = client.acquire(&other_key, &opts).await?;
    let names = [&held_key, &gone_key, &other_key].map(|k| LockKey::new(k.as_str()));
    let [held_name, gone_name, other_name] = names;
    let (held_name, gone_name, other_name) = (held_name?, gone_name?, other_name?);
    let ours = held.owner();
    let requests = [
        ExtendRequest {
            lease: LeaseRef {
                key: &held_name,
                owner: ours,
                fencing: Some(held.fencing_token()),
            },
            ttl: Duration::from_secs(60),
        },
        ExtendRequest {
            lease: LeaseRef {
                key: &gone_name,
                owner: OwnerToken::random(),
                fencing: None,
            },
            ttl: Duration::from_secs(60),
        },
        ExtendRequest {
            lease: LeaseRef {
                key: &other_name,
                owner: OwnerToken::random(),
                fencing: None,
            },
            ttl: Duration::from_secs(60),
        },
    ];
    let before = scripts_run(&mut con).await?;
    let answers = client.extend_many(&requests).await;
    let after = scripts_run(&mut con).await?;
    let answers: Vec<Extension> = answers.into_iter().collect::<Result<_, _>>()?;
    ensure!(
        answers
            == [
                Extension::Extended,
                Extension::Expired,
                Extension::TakenOver
            ],
        "answers {answers:?}"
    );
    ensure!(
        after - before == 1,
        "{} scripts for 3 leases",
        after - before
    );
    let pttl = |key: String| {
        let mut con = con.clone();
        async move {
            let ms: i64 = redis::cmd("PTTL").arg(key).query_async(&mut con).await?;
            anyhow::Ok(ms)
        }
    };
    let layout = client.layout().clone();
    let held_pttl = pttl(layout.lock_key(&held_name)).await?;
    let other_pttl = pttl(layout.lock_key(&other_name)).await?;
    ensure!(
        held_pttl > 10_000,
        "the held lease was re-armed: {held_pttl} ms"
    );
    ensure!(
        (0..=5_000).contains(&other_pttl),
        "the other owner's lock kept its TTL: {other_pttl} ms"
    );
    ensure!(
        pttl(layout.lock_key(&gone_name)).await? == -2,
        "nothing re-created"
    );
    other.release().await?;
    held.release().await?;
    drop(con);
    server.shutdown().await?;
    Ok(())
}

/// 1,200 auto-renewed leases on one client stay held over several renewals at the cost of a few
/// scripts per tick (per-lease renewal would run 1,200 per second).
pub async fn many_renewing_leases_cost_a_few_scripts_per_tick(_: String) -> anyhow::Result<()> {
    const LEASES: usize = 1_200;
    let server = RedisServer::start().await?;
    let client: Arc<dyn DistributedLock> = Arc::new(RedisLock::connect(&server.url()).await?);
    let mut con = support::raw(&server.url()).await?;
    let opts = LockOptions::new(Duration::from_secs(3)).with_auto_renew();
    let prefix = unique("many");
    let mut leases = Vec::with_capacity(LEASES);
    for i in 0..LEASES {
        leases.push(client.acquire(&format!("{prefix}/{i}"), &opts).await?);
    }
    let before = scripts_run(&mut con).await?;
    // Renewals every second: three or four rounds in 3.5 s.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let scripts = scripts_run(&mut con).await? - before;
    ensure!(
        leases.iter().all(|l| l.is_held()),
        "every lease is still held past its TTL"
    );
    // Leases taken over a second fall into at most about eight groups per interval (the
    // scheduler renews what is due within an eighth of an interval together), and each group
    // costs one script per 500 leases; renewing per lease would cost 1,200 scripts per second.
    let chunks = LEASES.div_ceil(EXTEND_BATCH) as u64;
    let bound = 5 * (9 + chunks);
    ensure!(
        (chunks..=bound).contains(&scripts),
        "{scripts} scripts for {LEASES} leases in 3.5 s (expected {chunks} to {bound}; per lease it would be about 4,200)"
    );
    for lease in leases {
        lease.release().await?;
    }
    drop(con);
    server.shutdown().await?;
    Ok(())
}
