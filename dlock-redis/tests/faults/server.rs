//! Faults of the server: a pause (GC, VM stall, silent partition), a restart that loses every key,
//! and a flushed script cache. Each case breaks the binary's one server and leaves it serving.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use anyhow::{bail, ensure, Context};
use dlock_core::inspect::{Eviction, Holding};
use dlock_core::{Admin, AutoRenew, DistributedLockExt, Error, LockOptions, Released};
use dlock_redis::protocol::scripts;
use dlock_redis::RedisLock;
use dlock_testkit::case;
use dlock_testkit::fixtures::RedisServer;
use dlock_testkit::trials::Case;

use crate::support::{self, unique, SLACK};

/// The cases of this module, in the order they run.
pub fn cases() -> Vec<(&'static str, Case<Arc<RedisServer>>)> {
    vec![
        case!(paused_server_ends_a_waiting_acquire_by_its_deadline),
        case!(restart_without_persistence_errors_then_recovers_and_loses_leases),
        case!(flushed_script_cache_is_reloaded),
        case!(list_and_evict_on_a_paused_server_fail_in_bounded_time),
    ]
}

/// The server freezes while a client waits for a held lock: the acquire ends by its deadline (with
/// a timeout or an unavailability error), a request in the meantime fails within the request
/// timeout, a renewed lease stops counting as held, and everything works again after the thaw.
pub async fn paused_server_ends_a_waiting_acquire_by_its_deadline(
    server: Arc<RedisServer>,
) -> anyhow::Result<()> {
    let member = server.member()?;
    let [holder, waiter, prober] = support::clients(&server.url()).await?;
    let key = unique("paused");
    let held = holder
        .acquire(&key, &LockOptions::new(Duration::from_secs(30)))
        .await?;
    let renewed = holder
        .acquire(
            &unique("paused-renewed"),
            &LockOptions::new(Duration::from_secs(3)).with_renewal(AutoRenew {
                interval: Some(Duration::from_millis(300)),
                max_hold: None,
            }),
        )
        .await?;

    let wait = Duration::from_secs(2);
    let waiting = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move {
            let start = Instant::now();
            let result = waiter
                .acquire(
                    &key,
                    &LockOptions::new(Duration::from_secs(30)).with_wait(wait),
                )
                .await;
            (result.map(|_| ()), start.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    member.pause().await?;
    let outcome = async {
        let start = Instant::now();
        let probe = prober
            .try_acquire(&unique("probe"), &LockOptions::new(Duration::from_secs(5)))
            .await;
        let took = start.elapsed();
        match probe {
            Err(Error::Unavailable { .. }) => {}
            Err(other) => bail!("a request to a paused server failed oddly: {other}"),
            Ok(_) => bail!("a request to a paused server succeeded"),
        }
        ensure!(
            took <= prober.request_timeout() + SLACK,
            "a request to a paused server took {took:?} to fail"
        );
        let (result, took) = waiting.await?;
        match result {
            Err(Error::Timeout { .. } | Error::Unavailable { .. }) => {}
            Err(other) => bail!("the waiting acquire failed oddly: {other}"),
            Ok(()) => bail!("the waiting acquire took a held lock"),
        }
        // A waiter that gives up withdraws its queue entry first, which a paused server answers
        // no sooner than dlock-core's withdrawal bound.
        ensure!(
            took <= wait + dlock_core::backend::WITHDRAW_BOUND + SLACK,
            "the waiting acquire with a {wait:?} deadline ended after {took:?}"
        );
        // A renewal in flight when the server froze fails after the request timeout; from then
        // on the lease is uncertain.
        let noticed =
            support::eventually(prober.request_timeout() * 2 + SLACK, || !renewed.is_held()).await;
        ensure!(
            noticed.is_some(),
            "a lease whose renewals get no answer still counts as held: {:?}",
            renewed.state()
        );
        anyhow::Ok(())
    }
    .await;
    member.unpause().await?;
    outcome?;

    // Back to normal: the holder still holds (its TTL is far from over) and can release.
    ensure!(
        waiter
            .try_acquire(&key, &LockOptions::new(Duration::from_secs(5)))
            .await?
            .is_none(),
        "the held lock was lost during the pause"
    );
    ensure!(
        held.release().await? == Released::Released,
        "release after the pause"
    );
    let lease = waiter
        .acquire(
            &key,
            &LockOptions::new(Duration::from_secs(5)).with_wait(Duration::from_secs(5)),
        )
        .await
        .context("acquire after the pause")?;
    lease.release().await?;
    drop(renewed);
    Ok(())
}

/// The server restarts and comes back empty: requests fail meanwhile, then work again through the
/// same client; a renewed lease is reported lost by its next renewal (not silently held until its
/// TTL), and a new holder gets a larger fencing token than the lost one.
pub async fn restart_without_persistence_errors_then_recovers_and_loses_leases(
    server: Arc<RedisServer>,
) -> anyhow::Result<()> {
    let member = server.member()?;
    let client = Arc::new(RedisLock::connect(&server.url()).await?);
    let key = unique("wiped");
    // A long TTL: if the lease ends soon, it is the renewal that found the key gone, not expiry.
    let renewed_opts = LockOptions::new(Duration::from_secs(20)).with_renewal(AutoRenew {
        interval: Some(Duration::from_millis(250)),
        max_hold: None,
    });
    let lease = client.acquire(&key, &renewed_opts).await?;
    let lost_token = lease.fencing_token();
    let valid_until = lease.valid_until();

    let stop = Arc::new(AtomicBool::new(false));
    let (errors, successes_after_error) =
        (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let prober = {
        let (client, stop) = (client.clone(), stop.clone());
        let (errors, after) = (errors.clone(), successes_after_error.clone());
        tokio::spawn(async move {
            let opts = LockOptions::new(Duration::from_secs(5));
            while !stop.load(Ordering::SeqCst) {
                match client.try_acquire(&unique("probe"), &opts).await {
                    Ok(Some(lease)) => {
                        if errors.load(Ordering::SeqCst) > 0 {
                            after.fetch_add(1, Ordering::SeqCst);
                        }
                        let _ = lease.release().await;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        ensure!(e.is_temporary(), "a restart gave a permanent error: {e}");
                        errors.fetch_add(1, Ordering::SeqCst);
                    }
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            anyhow::Ok(())
        })
    };

    let restarted = Instant::now();
    member.restart_wipe_data().await?;
    let back = Instant::now();
    eprintln!("[timing] restart_wipe_data: {:.2?}", back - restarted);

    let lost_within = Duration::from_secs(5);
    let watch = lease.watch();
    let reason = tokio::time::timeout(lost_within, watch.lost())
        .await
        .with_context(|| format!("a lease whose key the server lost still counts as {:?} {lost_within:?} after the restart", lease.state()))?;
    ensure!(
        Instant::now() < valid_until,
        "the lease only ended with its validity ({reason}), the renewal did not notice the loss"
    );

    let recovered = support::eventually(Duration::from_secs(10), || {
        successes_after_error.load(Ordering::SeqCst) > 0
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    prober.await??;
    ensure!(
        errors.load(Ordering::SeqCst) > 0,
        "no request failed while the server was restarting"
    );
    ensure!(
        recovered.is_some(),
        "the client did not work again after the restart"
    );

    let successor = client
        .acquire(
            &key,
            &LockOptions::new(Duration::from_secs(10)).with_wait(Duration::from_secs(5)),
        )
        .await?;
    ensure!(
        successor.fencing_token() > lost_token,
        "tokens went back after the data loss: {lost_token} then {}",
        successor.fencing_token()
    );
    let stale = lease.release().await?;
    ensure!(
        stale != Released::Released,
        "the lost lease released the successor's lock"
    );
    ensure!(successor.is_held(), "successor: {:?}", successor.state());
    ensure!(
        successor.release().await? == Released::Released,
        "successor release"
    );
    Ok(())
}

/// `SCRIPT FLUSH` between operations: acquire, extend and release still work, and put their
/// scripts back in the cache.
pub async fn flushed_script_cache_is_reloaded(server: Arc<RedisServer>) -> anyhow::Result<()> {
    let client = Arc::new(RedisLock::connect(&server.url()).await?);
    let mut raw = support::raw(&server.url()).await?;
    let flush = |raw: &mut redis::aio::MultiplexedConnection| {
        let mut raw = raw.clone();
        async move {
            redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async::<()>(&mut raw)
                .await
        }
    };
    let key = unique("flushed");
    let opts = LockOptions::new(Duration::from_secs(10));
    client
        .try_acquire(&key, &opts)
        .await?
        .context("warm-up")?
        .release()
        .await?;

    flush(&mut raw).await?;
    let mut lease = client
        .try_acquire(&key, &opts)
        .await?
        .context("acquire after SCRIPT FLUSH: busy")?;
    flush(&mut raw).await?;
    lease
        .extend(Duration::from_secs(20))
        .await
        .context("extend after SCRIPT FLUSH")?;
    flush(&mut raw).await?;
    ensure!(
        lease.release().await? == Released::Released,
        "release after SCRIPT FLUSH"
    );
    let hashes = [
        scripts::ACQUIRE.hash(),
        scripts::EXTEND.hash(),
        scripts::RELEASE.hash(),
    ];
    let cached: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(&hashes[..])
        .query_async(&mut raw)
        .await?;
    // Acquire and extend ran before the last flush; release ran after it and must be back.
    ensure!(
        cached[2],
        "the release script was not put back in the cache: {cached:?}"
    );
    let again = client
        .try_acquire(&key, &opts)
        .await?
        .context("acquire again")?;
    let cached: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(scripts::ACQUIRE.hash())
        .query_async(&mut raw)
        .await?;
    ensure!(
        cached == [true],
        "the acquire script was not put back in the cache"
    );
    flush(&mut raw).await?;
    let evicted = Admin::new(&client)
        .force_unlock(&key, Some(again.fencing_token()))
        .await
        .context("evict after SCRIPT FLUSH")?;
    ensure!(
        matches!(evicted, Eviction::Evicted(_)),
        "evict after SCRIPT FLUSH: {evicted:?}"
    );
    ensure!(
        again.release().await? != Released::Released,
        "the evicted lease released"
    );
    Ok(())
}

/// The server freezes while an operator lists and evicts: both fail as unavailable within the
/// request timeout. After the thaw the eviction may or may not have run (it may have reached the
/// server), so the lock is the holder's or free — never someone else's — and the next grant's
/// token is greater than the holder's either way.
pub async fn list_and_evict_on_a_paused_server_fail_in_bounded_time(
    server: Arc<RedisServer>,
) -> anyhow::Result<()> {
    let member = server.member()?;
    let [holder, operator] = support::clients(&server.url()).await?;
    let key = unique("paused-evict");
    let lease = holder
        .acquire(&key, &LockOptions::new(Duration::from_secs(30)))
        .await?;
    let admin = Admin::new(&operator);
    member.pause().await?;
    let outcome = async {
        let bound = operator.request_timeout() + SLACK;
        let start = Instant::now();
        let listed = admin.list("").await;
        ensure!(
            matches!(listed, Err(Error::Unavailable { .. })),
            "list on a paused server: {listed:?}"
        );
        ensure!(start.elapsed() <= bound, "list took {:?}", start.elapsed());
        let start = Instant::now();
        let evicted = admin.force_unlock(&key, Some(lease.fencing_token())).await;
        ensure!(
            matches!(evicted, Err(Error::Unavailable { .. })),
            "evict on a paused server: {evicted:?}"
        );
        ensure!(start.elapsed() <= bound, "evict took {:?}", start.elapsed());
        anyhow::Ok(())
    }
    .await;
    member.unpause().await?;
    outcome?;

    // The operator's client replaces its timed-out connection on the next request.
    let thawed = Instant::now();
    let seen = loop {
        match operator.holding(&key).await {
            Ok(seen) => break seen,
            Err(e) if thawed.elapsed() < Duration::from_secs(5) => eprintln!("after the thaw: {e}"),
            Err(e) => return Err(e.into()),
        }
    };
    match &seen {
        Holding::Free => {}
        Holding::Held(h) if h.fencing == Some(lease.fencing_token()) => {}
        other => bail!("after the thaw the lock is {other}"),
    }
    let evicted = admin
        .force_unlock(&key, Some(lease.fencing_token()))
        .await?;
    ensure!(
        matches!(evicted, Eviction::Evicted(_) | Eviction::Free),
        "evicting again: {evicted:?}"
    );
    let successor = operator
        .acquire(&key, &LockOptions::new(Duration::from_secs(5)))
        .await?;
    ensure!(
        successor.fencing_token() > lease.fencing_token(),
        "token {} after the evicted {}",
        successor.fencing_token(),
        lease.fencing_token()
    );
    successor.release().await?;
    Ok(())
}
