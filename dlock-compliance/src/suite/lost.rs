//! The lost signal and auto-renew: a holder learns of a loss before anyone else can hold the lock,
//! and renewal keeps a lock exactly as long as it should.

use anyhow::{bail, ensure};
use dlock_core::DistributedLockExt;
use dlock_testkit::trials::ensure_stays_lost;
use tokio::time::Instant;

use super::{expect_timeout, release_held, Ctx};

/// A renewing holder is frozen (a GC pause); its lease ends on the server. Its lost signal must
/// have fired by the time another client holds the lock, and thawing must not revive it.
pub(crate) async fn lost_signal_fires_when_the_lease_ends_behind_the_holders_back(
    cx: Ctx,
) -> anyhow::Result<()> {
    let (holder, freezable) = cx.subject().freezable_client().await?;
    let [other, third] = cx.clients().await?;
    let key = cx.key("lost");
    let ttl = cx.ttl();
    let lease = holder
        .acquire(&key, &cx.opts(ttl).with_auto_renew())
        .await?;
    let watch = lease.watch();
    let signal = tokio::spawn(async move {
        let reason = watch.lost().await;
        (reason, Instant::now())
    });
    freezable.freeze();
    let successor = other
        .acquire(
            &key,
            &cx.opts(cx.long_ttl()).with_wait(ttl * 3 + cx.slack()),
        )
        .await?;
    let taken_at = Instant::now();
    // The signal task records when the signal fired; on a loaded machine it may be scheduled
    // late, so it gets the slack to report (a signal that never fires still fails here).
    let Ok(joined) = tokio::time::timeout(cx.slack(), signal).await else {
        bail!("another client holds the lock but the holder's lost signal has not fired");
    };
    let (reason, fired_at) = joined?;
    // The signal task may run late on a loaded machine; the lease's own deadline says when the
    // holder's state turned lost, and that must not be after the successor's grant either.
    ensure!(
        fired_at <= taken_at || lease.valid_until() <= taken_at,
        "lost signal ({reason}) fired {:?} after another client took the lock, and the lease \
         was valid until {:?} after it",
        fired_at - taken_at,
        lease.valid_until() - taken_at
    );
    freezable.thaw();
    ensure_stays_lost(lease, ttl / 2).await?;
    cx.release_still_held(
        successor,
        &third,
        &key,
        "the successor's lock is gone",
        "successor could not release",
    )
    .await
}

/// Auto-renew holds a lock across several TTLs while others wait in vain, and stops with release.
pub(crate) async fn auto_renew_keeps_the_lock_and_stops_after_release(
    cx: Ctx,
) -> anyhow::Result<()> {
    let [holder, other, third] = cx.clients().await?;
    let key = cx.key("renew");
    let ttl = cx.ttl();
    let lease = holder
        .acquire(&key, &cx.opts(ttl).with_auto_renew())
        .await?;
    expect_timeout(
        other.acquire(&key, &cx.opts(ttl).with_wait(ttl * 3)).await,
        "another client acquired a lock that was being renewed",
    )?;
    ensure!(lease.is_held(), "renewed lease is {:?}", lease.state());
    release_held(lease, "release failed").await?;
    let successor = cx
        .acquire_promptly(
            &other,
            &key,
            Instant::now(),
            "release was slow to free the lock",
        )
        .await?;
    // If renewal outlived the release it would fight the successor now.
    tokio::time::sleep(ttl).await;
    ensure!(successor.is_held(), "successor is {:?}", successor.state());
    cx.release_still_held(
        successor,
        &third,
        &key,
        "successor lost the lock",
        "successor could not release",
    )
    .await
}
