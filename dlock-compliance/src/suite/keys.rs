//! Keys: any UTF-8 string within the limit works, and distinct keys never collide.

use anyhow::ensure;
use dlock_core::limits::MAX_KEY_LEN;
use dlock_core::DistributedLockExt;

use super::Ctx;

/// Keys that break naive encodings: separators, escapes, hash tags, unicode, the longest key.
pub(crate) async fn unusual_keys_work_and_do_not_collide(cx: Ctx) -> anyhow::Result<()> {
    let a = cx.client().await?;
    let b = cx.client().await?;
    let suffixes = [
        "a/b", "a%2Fb", "a_b", "a b", "a+b", "a:b", "a.b", "a\\b", "{a}b", "{a}c", "..", "/", "//",
        "a\nb", "a\tb", "ключ", "🔒", "A/B", "a%2fb", "-", "_",
    ];
    let mut keys: Vec<String> = suffixes.iter().map(|s| cx.key(s)).collect();
    let prefix_len = cx.key("").len();
    keys.push(cx.key(&"x".repeat(MAX_KEY_LEN - prefix_len)));
    keys.push(cx.key(&"é".repeat((MAX_KEY_LEN - prefix_len) / 2)));
    let opts = cx.opts(cx.long_ttl());
    let mut leases = Vec::new();
    for key in &keys {
        let lease = a.try_acquire(key, &opts).await?;
        ensure!(
            lease.is_some(),
            "{key:?} was busy although no other key is equal to it"
        );
        leases.push(lease);
    }
    for key in &keys {
        ensure!(
            b.try_acquire(key, &opts).await?.is_none(),
            "{key:?} was free while held"
        );
    }
    // Free exactly one; its look-alikes must stay held.
    if let Some(lease) = leases.remove(0) {
        lease.release().await?;
    }
    ensure!(
        b.try_acquire(&keys[1], &opts).await?.is_none(),
        "releasing \"a/b\" freed \"a%2Fb\""
    );
    let freed = b.try_acquire(&keys[0], &opts).await?;
    ensure!(freed.is_some(), "\"a/b\" is still held after its release");
    for lease in leases.into_iter().flatten().chain(freed) {
        lease.release().await?;
    }
    Ok(())
}
