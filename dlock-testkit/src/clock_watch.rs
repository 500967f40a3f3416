//! The clock-watch check of the Redis and Redlock tests: a server's wall clock really jumps
//! (the test images' shim, [`set_clock_offset`]) while a renewed lease is held on it.
//!
//! What it asserts, with the lease renewed every [`INTERVAL`] at a [`TTL`]:
//! * the renewal after a jump of [`JUMP`] ahead grants a validity at least [`SHRUNK_BY`] shorter
//!   than a renewal without one, and `dlock_clock_jumps_total{direction="ahead"}` counts it;
//! * the jump back (the offset returns to 0) is counted as `direction="behind"`, and the renewal
//!   after it grants the full validity again.
//!
//! A client that ignores its clock watch ([`IgnoresClockWatch`]) fails the first assertion.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use async_trait::async_trait;
use dlock_core::backend::{ExtendRequest, Extension, LeaseRef};
use dlock_core::layer::Layer;
use dlock_core::{AutoRenew, DistributedLock, DistributedLockExt, Lease, LockOptions, Result};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::time::Instant;

use crate::fixtures::redis::set_clock_offset;
use crate::fixtures::Member;

/// The lease's TTL.
pub const TTL: Duration = Duration::from_secs(9);
/// Its renewal interval.
pub const INTERVAL: Duration = Duration::from_secs(3);
/// How far the server's clock jumps ahead. A key renewed `INTERVAL` before the next renewal
/// still has `TTL − INTERVAL − JUMP` = 1.5 s on the server when that renewal comes.
pub const JUMP: Duration = Duration::from_millis(4_500);
/// How much shorter the renewal after the jump must make the validity: the jump less the
/// round trips' share and a generous slack (a broken client shrinks it by nothing).
pub const SHRUNK_BY: Duration = Duration::from_millis(2_500);

/// The test process's metrics, read back: a debugging recorder installed once, globally, since
/// the backend counts from its own tasks.
fn snapshotter() -> anyhow::Result<&'static Snapshotter> {
    static SNAPSHOTTER: OnceLock<Option<Snapshotter>> = OnceLock::new();
    SNAPSHOTTER
        .get_or_init(|| {
            let recorder = DebuggingRecorder::new();
            let snapshotter = recorder.snapshotter();
            recorder.install().ok().map(|()| snapshotter)
        })
        .as_ref()
        .context("another metrics recorder is installed in this test process")
}

/// `dlock_clock_jumps_total{backend, direction}` so far in this process (installs the recorder
/// that reads it back at the first call: counts from before are not seen).
pub fn jumps(backend: &str, direction: &str) -> anyhow::Result<u64> {
    let snapshot = snapshotter()?.snapshot().into_vec();
    Ok(snapshot
        .into_iter()
        .filter(|(key, _, _, _)| {
            let key = key.key();
            key.name() == "dlock_clock_jumps_total"
                && key
                    .labels()
                    .any(|l| l.key() == "backend" && l.value() == backend)
                && key
                    .labels()
                    .any(|l| l.key() == "direction" && l.value() == direction)
        })
        .map(|(_, _, _, value)| match value {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum())
}

/// The server's clock (`TIME`) in microseconds since the Unix epoch.
async fn server_time(url: &str) -> anyhow::Result<i64> {
    let client = redis::Client::open(url)?;
    let mut con = client.get_multiplexed_async_connection().await?;
    let (seconds, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut con).await?;
    Ok(seconds * 1_000_000 + micros)
}

/// Moves `member`'s clock by `offset_ms` and checks with `TIME` at `url` that it moved.
async fn jump(member: &Member, url: &str, offset_ms: i64, from_ms: i64) -> anyhow::Result<()> {
    let before = server_time(url).await?;
    let start = Instant::now();
    set_clock_offset(member, offset_ms).await?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let after = server_time(url).await?;
    let moved_ms = (after - before) / 1000 - start.elapsed().as_millis() as i64;
    let expected = offset_ms - from_ms;
    ensure!(
        (moved_ms - expected).abs() < 1_000,
        "the server's clock moved {moved_ms} ms beside the true time, not {expected} ms: the \
         Redis image must carry {} (scripts/test-images builds it)",
        crate::fixtures::redis::JUMPCLOCK_LIBRARY
    );
    Ok(())
}

/// The validity each renewal grants, as seen by polling the lease: the remaining time at the
/// first look after its deadline moved. Waits up to `within` for the next renewal.
async fn next_renewal(lease: &Lease, within: Duration) -> anyhow::Result<Duration> {
    let seen = lease.valid_until();
    let end = Instant::now() + within;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
        ensure!(
            lease.is_held(),
            "the lease is no longer held: {:?}",
            lease.state()
        );
        let until = lease.valid_until();
        if until != seen {
            return Ok(until.saturating_duration_since(Instant::now()));
        }
    }
    bail!("no renewal within {within:?}")
}

/// The check (see the module docs): `client` holds `key` on servers of `backend` (the metric's
/// label), one of which, `member` at `url`, has the jumping clock. The clock is put back however
/// the check ends.
pub async fn check(
    client: &Arc<dyn DistributedLock>,
    backend: &str,
    key: &str,
    member: &Member,
    url: &str,
) -> anyhow::Result<()> {
    snapshotter()?;
    let opts = LockOptions::new(TTL).with_renewal(AutoRenew {
        interval: Some(INTERVAL),
        max_hold: None,
    });
    let lease = client.acquire(key, &opts).await?;
    let result = check_held(&lease, backend, member, url).await;
    let reset = set_clock_offset(member, 0).await;
    lease.release().await?;
    result?;
    reset?;
    Ok(())
}

async fn check_held(
    lease: &Lease,
    backend: &str,
    member: &Member,
    url: &str,
) -> anyhow::Result<()> {
    let within = INTERVAL * 2;
    // A renewal without a jump sets the baseline and the full validity.
    next_renewal(lease, within).await?;
    let full = next_renewal(lease, within).await?;

    let ahead_before = jumps(backend, "ahead")?;
    jump(member, url, JUMP.as_millis() as i64, 0).await?;
    let shrunk = next_renewal(lease, within).await?;
    ensure!(
        shrunk + SHRUNK_BY <= full,
        "the renewal after the server's clock jumped {JUMP:?} ahead granted {shrunk:?} of \
         validity, against {full:?} before: the clock watch did not shorten the lease's validity"
    );
    let ahead = jumps(backend, "ahead")? - ahead_before;
    ensure!(
        ahead >= 1,
        "the jump ahead was not counted in dlock_clock_jumps_total"
    );

    let behind_before = jumps(backend, "behind")?;
    jump(member, url, 0, JUMP.as_millis() as i64).await?;
    let back = next_renewal(lease, within).await?;
    ensure!(
        back + SHRUNK_BY > full,
        "the renewal after the clock went back granted {back:?}, against {full:?} before"
    );
    let behind = jumps(backend, "behind")? - behind_before;
    ensure!(
        behind >= 1,
        "the jump back was not counted in dlock_clock_jumps_total"
    );
    eprintln!(
        "[clock-watch] {backend}: validity granted {full:?} before the jump, {shrunk:?} after it, {back:?} after the jump back"
    );
    Ok(())
}

/// A deliberately broken client for the check's teeth: it takes every renewal as a plain
/// [`Extension::Extended`], as a client without a clock watch would.
#[derive(Debug)]
pub struct IgnoresClockWatch(pub Arc<dyn DistributedLock>);

#[async_trait]
impl Layer for IgnoresClockWatch {
    fn inner(&self) -> &dyn DistributedLock {
        self.0.as_ref()
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        self.0.extend(lease, ttl).await.map(plain)
    }

    async fn extend_many(&self, requests: &[ExtendRequest<'_>]) -> Vec<Result<Extension>> {
        let answers = self.0.extend_many(requests).await;
        answers.into_iter().map(|a| a.map(plain)).collect()
    }
}

fn plain(extension: Extension) -> Extension {
    match extension {
        Extension::ClockAhead(_) => Extension::Extended,
        other => other,
    }
}

/// The teeth: the check must fail on [`IgnoresClockWatch`] around `client`, for the validity.
pub async fn check_catches_a_client_without_the_watch(
    client: Arc<dyn DistributedLock>,
    backend: &str,
    key: &str,
    member: &Member,
    url: &str,
) -> anyhow::Result<()> {
    let broken: Arc<dyn DistributedLock> = Arc::new(IgnoresClockWatch(client));
    match check(&broken, backend, key, member, url).await {
        Ok(()) => bail!("the clock-watch check passed a client that ignores its clock watch"),
        Err(e) if e.to_string().contains("did not shorten") => Ok(()),
        Err(e) => Err(e.context("the clock-watch check failed otherwise than expected")),
    }
}
