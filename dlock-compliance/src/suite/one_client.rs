//! Many calls of one client out at the same time, as a service that shares one client between its
//! workers makes them: each is answered as if sent alone.

use std::collections::HashMap;

use anyhow::{ensure, Context};
use dlock_core::{DistributedLockExt, FencingToken, Released};
use futures::future::try_join_all;

use super::Ctx;

/// Keys taken at once in [`calls_out_together_are_each_answered_as_alone`].
const AT_ONCE: usize = 64;

/// Sixty-four tasks of one client take a key each at the same moment, extend, release and take
/// them again: every call gets its own answer. Each grant is the one the server records for its
/// key (`holding`: its token), each extension and release succeeds for its own lease, and each
/// key's second token is greater than its first.
pub(crate) async fn calls_out_together_are_each_answered_as_alone(cx: Ctx) -> anyhow::Result<()> {
    let client = cx.client().await?;
    let opts = cx.opts(cx.long_ttl());
    let keys: Vec<String> = (0..AT_ONCE)
        .map(|i| cx.key(&format!("at-once/{i}")))
        .collect();
    let mut first: HashMap<String, FencingToken> = HashMap::new();
    for round in 0..2 {
        let leases = try_join_all(keys.iter().map(|key| client.try_acquire(key, &opts)))
            .await
            .with_context(|| format!("round {round}: the acquires"))?;
        let mut held = Vec::with_capacity(AT_ONCE);
        for (key, lease) in keys.iter().zip(leases) {
            let lease = lease.with_context(|| format!("round {round}: free key {key} was busy"))?;
            ensure!(
                lease.key() == key,
                "a grant for {key} came as one for {}",
                lease.key()
            );
            held.push(lease);
        }
        let holdings = try_join_all(keys.iter().map(|key| client.holding(key)))
            .await
            .with_context(|| format!("round {round}: the holdings"))?;
        for (lease, holding) in held.iter().zip(holdings) {
            let recorded = holding.holder().and_then(|h| h.fencing);
            if let Some(recorded) = recorded {
                ensure!(
                    recorded == lease.fencing_token(),
                    "round {round}: {} was granted with token {:?}, but its holder has {recorded:?}",
                    lease.key(),
                    lease.fencing_token()
                );
            }
            ensure!(
                holding.is_held(),
                "round {round}: {} is not held",
                lease.key()
            );
            if let Some(before) = first.get(lease.key()) {
                ensure!(
                    !cx.fenced() || *before < lease.fencing_token(),
                    "{}: token {before:?} then {:?}",
                    lease.key(),
                    lease.fencing_token()
                );
            }
            first.insert(lease.key().to_owned(), lease.fencing_token());
        }
        try_join_all(held.iter_mut().map(|lease| lease.extend(cx.long_ttl())))
            .await
            .with_context(|| format!("round {round}: the extensions"))?;
        let released = try_join_all(held.into_iter().map(|lease| lease.release()))
            .await
            .with_context(|| format!("round {round}: the releases"))?;
        ensure!(
            released.iter().all(|r| *r == Released::Released),
            "round {round}: releases answered {released:?}"
        );
    }
    Ok(())
}
