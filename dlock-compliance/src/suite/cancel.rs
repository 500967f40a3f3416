//! Cancellation: dropped acquires and dropped leases leave nothing held for long.

use std::time::Duration;

use dlock_core::DistributedLockExt;
use tokio::time::Instant;

use super::Ctx;

const DROPS: usize = 25;

/// Acquire futures dropped at random moments (mid-request, mid-wait) leave the key free soon
/// after, far sooner than the long TTL they asked for.
pub(crate) async fn dropped_acquire_leaves_nothing_held(cx: Ctx) -> anyhow::Result<()> {
    let [client, other] = cx.clients().await?;
    let key = cx.key("dropped");
    let opts = cx.opts(cx.long_ttl()).with_wait(Duration::from_secs(30));
    for i in 0..DROPS {
        let budget = Duration::from_micros(rand::random::<u64>() % 3_000);
        if let Ok(lease) = tokio::time::timeout(budget, client.acquire(&key, &opts)).await {
            lease?.release().await?;
        }
        if i % 5 == 0 {
            // Also drop waiters queued behind a holder.
            let holder = other.acquire(&key, &opts).await?;
            let _ =
                tokio::time::timeout(Duration::from_millis(20), client.acquire(&key, &opts)).await;
            holder.release().await?;
        }
    }
    let lease = cx
        .acquire_promptly(
            &other,
            &key,
            Instant::now(),
            "the key stayed held after dropped acquires",
        )
        .await?;
    lease.release().await?;
    Ok(())
}

/// Dropping a lease without releasing it frees the lock promptly (a background release).
pub(crate) async fn dropped_lease_is_released_promptly(cx: Ctx) -> anyhow::Result<()> {
    let [holder, other] = cx.clients().await?;
    let (key, lease) = cx.hold(&holder, "dropped-lease").await?;
    let dropped_at = Instant::now();
    drop(lease);
    let next = cx
        .acquire_promptly(&other, &key, dropped_at, "the dropped lease held the lock")
        .await?;
    next.release().await?;
    Ok(())
}
