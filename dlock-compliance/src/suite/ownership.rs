//! Ownership: only the current owner may extend or release.

use anyhow::{bail, ensure};
use dlock_core::backend::{ExtendRequest, Extension, LeaseRef, LockKey};
use dlock_core::{DistributedLockExt, OwnerToken, Released};

use super::{release_held, Ctx};

/// A lease that expired and was taken over cannot release or extend the successor's lock.
pub(crate) async fn stale_lease_cannot_release_or_extend(cx: Ctx) -> anyhow::Result<()> {
    let [old, new, third] = cx.clients().await?;
    let key = cx.key("stale");
    let mut stale = old.acquire(&key, &cx.opts(cx.ttl())).await?;
    let successor = new
        .acquire(
            &key,
            &cx.opts(cx.long_ttl()).with_wait(cx.ttl() * 2 + cx.slack()),
        )
        .await?;
    if stale.extend(cx.ttl()).await.is_ok() {
        bail!("the stale lease extended the successor's lock");
    }
    let released = stale.release().await?;
    ensure!(
        released != Released::Released,
        "the stale lease released the successor's lock"
    );
    cx.ensure_busy(
        &third,
        &key,
        "the successor's lock is gone after the stale lease's release",
    )
    .await?;
    ensure!(
        successor.is_held(),
        "the successor's lease is not held: {:?}",
        successor.state()
    );
    release_held(successor, "the successor could not release its own lock").await
}

/// An owner token that never held the lock cannot release or extend it.
pub(crate) async fn foreign_owner_cannot_release_or_extend(cx: Ctx) -> anyhow::Result<()> {
    let [holder, stranger] = cx.clients().await?;
    let (key, lease) = cx.hold(&holder, "foreign").await?;
    let lock_key = LockKey::new(&key)?;
    let foreign = LeaseRef {
        key: &lock_key,
        owner: OwnerToken::random(),
        fencing: None,
    };
    let released = stranger.release(&foreign).await?;
    ensure!(
        released != Released::Released,
        "a stranger released the lock"
    );
    let extended = stranger.extend(&foreign, cx.long_ttl()).await?;
    ensure!(!extended.is_extended(), "a stranger extended the lock");
    cx.release_still_held(
        lease,
        &stranger,
        &key,
        "the lock is free after a stranger's release",
        "the owner could not release",
    )
    .await
}

/// A batch of extensions (what auto-renew sends) answers each lease as `extend` would: the
/// owner's lease is extended, a released one and another owner's are not, and the other owner
/// keeps its lock.
pub(crate) async fn extend_many_answers_each_lease_like_extend(cx: Ctx) -> anyhow::Result<()> {
    let [holder, other] = cx.clients().await?;
    let (own_key, gone_key, other_key) = (cx.key("own"), cx.key("gone"), cx.key("other"));
    let own = holder.acquire(&own_key, &cx.opts(cx.long_ttl())).await?;
    let gone = holder.acquire(&gone_key, &cx.opts(cx.long_ttl())).await?;
    let gone_owner = gone.owner();
    gone.release().await?;
    let others = other.acquire(&other_key, &cx.opts(cx.long_ttl())).await?;
    let (own_name, gone_name, other_name) = (
        LockKey::new(&own_key)?,
        LockKey::new(&gone_key)?,
        LockKey::new(&other_key)?,
    );
    let request = |key, owner, fencing| ExtendRequest {
        lease: LeaseRef {
            key,
            owner,
            fencing,
        },
        ttl: cx.long_ttl(),
    };
    let requests = [
        request(&own_name, own.owner(), Some(own.fencing_token())),
        request(&gone_name, gone_owner, None),
        request(&other_name, OwnerToken::random(), None),
    ];
    let answers = holder.extend_many(&requests).await;
    ensure!(
        answers.len() == 3,
        "{} answers to 3 requests",
        answers.len()
    );
    let answers: Vec<Extension> = answers.into_iter().collect::<Result<_, _>>()?;
    ensure!(
        answers[0].is_extended(),
        "the owner's lease was not extended: {:?}",
        answers[0]
    );
    ensure!(!answers[1].is_extended(), "a released lease was extended");
    ensure!(
        !answers[2].is_extended(),
        "another owner's lock was extended"
    );
    cx.ensure_busy(
        &holder,
        &other_key,
        "the other owner's lock is free after the batch",
    )
    .await?;
    ensure!(own.is_held() && others.is_held(), "a lease was lost");
    own.release().await?;
    others.release().await?;
    Ok(())
}
