//! Expiry: TTLs free abandoned locks; extend prolongs a live lease and never revives a dead one.

use anyhow::{bail, ensure};
use dlock_core::backend::{LeaseRef, LockKey};
use dlock_core::{DistributedLockExt, Error};
use tokio::time::Instant;

use super::Ctx;

/// A holder that vanishes without releasing blocks others for about its TTL, never less.
pub(crate) async fn abandoned_lock_is_acquirable_after_its_ttl(cx: Ctx) -> anyhow::Result<()> {
    let [crashed, next] = cx.clients().await?;
    let key = cx.key("abandoned");
    let ttl = cx.ttl();
    let lease = crashed.acquire(&key, &cx.opts(ttl)).await?;
    let (valid_until, sent) = (lease.valid_until(), lease.acquired_at());
    // A crash: no release, no drop, no renewal.
    std::mem::forget(lease);
    drop(crashed);
    let successor = next
        .acquire(&key, &cx.opts(cx.long_ttl()).with_wait(ttl + cx.slack()))
        .await?;
    let at = Instant::now();
    ensure!(
        at >= valid_until,
        "taken over {:?} before the abandoned lease's validity ended",
        valid_until - at
    );
    ensure!(
        at <= sent + ttl + cx.slack(),
        "taken over only {:?} after the abandoned acquire (ttl {ttl:?})",
        at - sent
    );
    successor.release().await?;
    Ok(())
}

/// Extending a live lease moves its deadline, on the client and on the server.
pub(crate) async fn extend_prolongs_the_lease(cx: Ctx) -> anyhow::Result<()> {
    let [holder, other] = cx.clients().await?;
    let key = cx.key("extend");
    let ttl = cx.ttl();
    let mut lease = holder.acquire(&key, &cx.opts(ttl)).await?;
    let first_deadline = lease.valid_until();
    tokio::time::sleep(ttl / 4).await;
    lease.extend(ttl * 4).await?;
    ensure!(
        lease.valid_until() > first_deadline,
        "extend did not move the deadline"
    );
    tokio::time::sleep_until(lease.acquired_at() + ttl + ttl / 2).await;
    ensure!(
        lease.is_held(),
        "not held after extend: {:?}",
        lease.state()
    );
    cx.release_still_held(
        lease,
        &other,
        &key,
        "the server let the lock go at the original TTL despite the extension",
        "release after extend failed",
    )
    .await
}

/// Once expired, a lease cannot be extended: the lease says lost, the server refuses.
pub(crate) async fn extend_after_expiry_fails_as_lost(cx: Ctx) -> anyhow::Result<()> {
    let [holder, other] = cx.clients().await?;
    let key = cx.key("late-extend");
    let ttl = cx.ttl();
    let mut lease = holder.acquire(&key, &cx.opts(ttl)).await?;
    tokio::time::sleep_until(lease.acquired_at() + ttl + ttl / 2).await;
    match lease.extend(ttl * 4).await {
        Err(Error::Lost { .. } | Error::NotOwner { .. }) => {}
        Err(other) => bail!("expected a lost lease, got {other}"),
        Ok(()) => bail!("an expired lease was extended"),
    }
    ensure!(
        lease.state().is_lost(),
        "still {:?} after a failed extend",
        lease.state()
    );
    // The server must refuse too, not revive the lock.
    let lock_key = LockKey::new(lease.key())?;
    let raw = LeaseRef {
        key: &lock_key,
        owner: lease.owner(),
        fencing: Some(lease.fencing_token()),
    };
    let answer = holder.extend(&raw, ttl * 4).await?;
    ensure!(!answer.is_extended(), "the server revived an expired lock");
    let next = other.try_acquire(&key, &cx.opts(ttl)).await?;
    ensure!(next.is_some(), "the expired lock is still held");
    Ok(())
}
