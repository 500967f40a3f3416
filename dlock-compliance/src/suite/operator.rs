//! What operators see and do: who holds a lock (its owner record), which locks are held, and a
//! forced unlock that the fence keeps safe.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use dlock_core::inspect::{Eviction, Holder, Holding};
use dlock_core::{Admin, DistributedLockExt, Fenced, FencingToken, Lease, Owner};
use tokio::time::Instant;

use super::Ctx;

/// A holder's record names this process: its host and pid.
fn ensure_ours(holder: &Holder, what: &str) -> anyhow::Result<()> {
    let owner = holder
        .owner
        .as_ref()
        .with_context(|| format!("{what}: no owner record in {holder:?}"))?;
    let us = Owner::this_process().record();
    ensure!(
        owner.pid == us.pid && owner.host == us.host,
        "{what}: the record names {owner}, not this process ({us})"
    );
    Ok(())
}

/// The holder's token, where the backend tells it, is the lease's; a backend that orders tokens
/// must tell it.
fn ensure_token(cx: &Ctx, holder: &Holder, lease: &Lease, what: &str) -> anyhow::Result<()> {
    match holder.fencing {
        Some(token) => ensure!(
            token == lease.fencing_token(),
            "{what}: shows token {token}, the lease has {}",
            lease.fencing_token()
        ),
        None => ensure!(!cx.fenced(), "{what}: the holder's token is not shown"),
    }
    Ok(())
}

/// Another client looking at a held lock sees its holder: the owner record of the process that
/// took it and its fencing token; after the release, nobody.
pub(crate) async fn holding_names_the_holder_and_its_owner(cx: Ctx) -> anyhow::Result<()> {
    let [holder, observer] = cx.clients().await?;
    let key = cx.key("held-by");
    let lease = holder.acquire(&key, &cx.opts(cx.long_ttl())).await?;
    let seen = observer.holding(&key).await?;
    let Holding::Held(shown) = &seen else {
        bail!("a held lock shows as {seen:?}");
    };
    ensure_ours(shown, "holding()")?;
    ensure_token(&cx, shown, &lease, "holding()")?;
    lease.release().await?;
    let seen = observer.holding(&key).await?;
    ensure!(seen == Holding::Free, "a released lock shows as {seen:?}");
    Ok(())
}

/// Listing by prefix finds exactly the held locks whose names start with it, with their
/// holders, and forgets a lock once it is released.
pub(crate) async fn list_shows_the_held_locks_under_a_prefix(cx: Ctx) -> anyhow::Result<()> {
    let [holder, observer] = cx.clients().await?;
    let admin = Admin::new(&observer);
    let prefix = cx.key("listed/");
    let opts = cx.opts(cx.long_ttl());
    let first = holder.acquire(&format!("{prefix}a"), &opts).await?;
    let second = holder.acquire(&format!("{prefix}b/c"), &opts).await?;
    let outside = holder.acquire(&cx.key("listed-not"), &opts).await?;
    let listed = admin.list(&prefix).await?;
    let names: Vec<&str> = listed.iter().map(|held| held.key.as_str()).collect();
    ensure!(
        names == [format!("{prefix}a"), format!("{prefix}b/c")],
        "listed {names:?}"
    );
    for (held, lease) in listed.iter().zip([&first, &second]) {
        ensure_ours(&held.holder, &held.key)?;
        ensure_token(&cx, &held.holder, lease, &held.key)?;
    }
    first.release().await?;
    let names: Vec<String> = admin
        .list(&prefix)
        .await?
        .into_iter()
        .map(|held| held.key)
        .collect();
    ensure!(
        names == [format!("{prefix}b/c")],
        "after a release, listed {names:?}"
    );
    second.release().await?;
    outside.release().await?;
    Ok(())
}

/// The stuck-holder drill: an operator evicts a holder that is paused (not renewing), naming the
/// token they were shown. A waiter gets the lock at once rather than at the holder's TTL, with a
/// greater token; the evicted holder's late write is rejected by the fence, and its lease turns
/// lost. Evicting with a token that is not the holder's, or a free lock, changes nothing.
pub(crate) async fn forced_unlock_fences_out_the_evicted_holder(cx: Ctx) -> anyhow::Result<()> {
    let [paused, waiter, operator] = cx.clients().await?;
    let admin = Admin::new(&operator);
    let key = cx.key("evicted");
    let free = admin.force_unlock(&key, None).await?;
    ensure!(free == Eviction::Free, "evicting a free lock: {free:?}");

    let resource = Arc::new(Fenced::new(Vec::<&'static str>::new()));
    let mut lease = paused.acquire(&key, &cx.opts(cx.long_ttl())).await?;
    let old = lease.fencing_token();
    resource.write(old, |log| log.push("evicted holder, before"))?;

    let shown = operator
        .holding(&key)
        .await?
        .holder()
        .and_then(|h| h.fencing);
    if let Some(token) = shown {
        let wrong = Some(FencingToken(token.0 + 1_000_000));
        let answer = admin.force_unlock(&key, wrong).await?;
        ensure!(
            matches!(answer, Eviction::Changed(_)),
            "evicting with another holder's token: {answer:?}"
        );
        ensure!(lease.is_held(), "a refused eviction ended the lease");
        cx.ensure_busy(&waiter, &key, "a refused eviction freed the lock")
            .await?;
    }

    // A waiter queued behind the stuck holder, which would otherwise wait a minute.
    let waiting = {
        let (waiter, key) = (waiter.clone(), key.clone());
        let opts = cx.opts(cx.long_ttl()).with_wait(cx.long_ttl());
        tokio::spawn(async move { waiter.acquire(&key, &opts).await })
    };
    tokio::time::sleep(cx.slack() / 4).await;
    let evicted_at = Instant::now();
    match admin.force_unlock(&key, shown).await? {
        Eviction::Evicted(holder) => ensure_ours(&holder, "the evicted holder")?,
        other => bail!("evicting the holder: {other:?}"),
    }
    let bound = cx.ttl() + cx.slack();
    let successor = tokio::time::timeout(bound, waiting)
        .await
        .with_context(|| format!("the waiter did not get the evicted lock within {bound:?}"))??
        .context("the waiter's acquire")?;
    let new = successor.fencing_token();
    if cx.fenced() {
        ensure!(
            new > old,
            "the successor's token {new} is not above the evicted {old}"
        );
        resource.write(new, |log| log.push("successor"))?;
        ensure!(
            resource
                .write(old, |log| log.push("evicted holder, after"))
                .is_err(),
            "the fence admitted the evicted holder's token {old} after {new}"
        );
    }

    // The evicted holder finds out at its next renewal at the latest.
    let renewed = lease.extend(cx.long_ttl()).await;
    ensure!(
        renewed.is_err() && lease.state().is_lost(),
        "the evicted lease renewed ({renewed:?}) and says {:?}",
        lease.state()
    );
    ensure!(
        evicted_at.elapsed() < Duration::from_secs(30),
        "the drill took {:?}",
        evicted_at.elapsed()
    );
    successor.release().await?;
    drop(lease);
    Ok(())
}
