//! Fencing: tokens grow with every holder, so a resource can reject a paused holder's writes.

use std::sync::Arc;

use anyhow::{bail, ensure};
use dlock_core::{DistributedLockExt, Fenced, FencingToken};

use super::Ctx;
use dlock_testkit::History;

const HOLDERS: usize = 9;

/// Successive holders from several clients get strictly increasing tokens, whether the previous
/// holder released or let its lease expire.
pub(crate) async fn fencing_tokens_increase_across_holders(cx: Ctx) -> anyhow::Result<()> {
    let clients = [cx.client().await?, cx.client().await?, cx.client().await?];
    let key = cx.key("tokens");
    let history = History::new();
    let mut last: Option<FencingToken> = None;
    for i in 0..HOLDERS {
        let expire = i % 3 == 2;
        let ttl = if expire { cx.ttl() / 2 } else { cx.long_ttl() };
        let opts = cx.opts(ttl).with_wait(cx.ttl() * 2 + cx.slack());
        let lease = clients[i % clients.len()].acquire(&key, &opts).await?;
        let token = lease.fencing_token();
        history.acquired(i, &key, token, lease.valid_until());
        if let Some(last) = last {
            ensure!(token > last, "holder {i} got token {token} after {last}");
        }
        last = Some(token);
        if expire {
            std::mem::forget(lease);
        } else {
            history.releasing(i, &key, token);
            lease.release().await?;
        }
    }
    history.check(true).map_err(anyhow::Error::new)?;
    Ok(())
}

/// The GC-pause case: a holder pauses past its TTL, another takes the lock and writes, and the
/// paused holder's late write is rejected by a fenced resource.
pub(crate) async fn paused_holders_write_is_rejected_by_the_fence(cx: Ctx) -> anyhow::Result<()> {
    let paused = cx.client().await?;
    let next = cx.client().await?;
    let key = cx.key("fenced");
    let resource = Arc::new(Fenced::new(Vec::<&'static str>::new()));
    let lease = paused.acquire(&key, &cx.opts(cx.ttl())).await?;
    let old = lease.fencing_token();
    resource.write(old, |log| log.push("paused holder, before the pause"))?;
    // The pause: no renewal, no release; the holder is simply not running.
    let successor = next
        .acquire(
            &key,
            &cx.opts(cx.long_ttl()).with_wait(cx.ttl() * 2 + cx.slack()),
        )
        .await?;
    let new = successor.fencing_token();
    resource.write(new, |log| log.push("successor"))?;
    // The paused holder wakes up and writes as if nothing happened.
    ensure!(
        lease.state().is_lost(),
        "the paused lease still claims {:?}",
        lease.state()
    );
    match resource.write(old, |log| log.push("paused holder, after the pause")) {
        Err(stale) => ensure!(stale.presented == old && stale.highest == new, "{stale}"),
        Ok(()) => {
            bail!("the fence admitted the paused holder's token {old} after the successor's {new}")
        }
    }
    let log = resource.read(|log| log.clone());
    ensure!(
        log == ["paused holder, before the pause", "successor"],
        "resource holds {log:?}"
    );
    successor.release().await?;
    drop(lease);
    Ok(())
}
