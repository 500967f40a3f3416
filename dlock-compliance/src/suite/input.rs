//! Bad input: a clear error that names the field, and nothing written to the server.

use std::time::Duration;

use anyhow::{bail, ensure};
use dlock_core::limits::{MAX_KEY_LEN, MAX_TTL};
use dlock_core::{AutoRenew, Backoff, DistributedLockExt, Drift, Error, LockOptions};

use super::Ctx;

/// Every kind of invalid input is rejected with `InvalidInput` naming its field, and leaves no
/// state behind (checked on the server where the subject can inspect it).
pub(crate) async fn invalid_input_is_rejected_and_leaves_no_state(cx: Ctx) -> anyhow::Result<()> {
    let client = cx.client().await?;
    let before = match &cx.subject().inspect {
        Some(inspect) => Some(inspect.stored(cx.namespace()).await?),
        None => None,
    };
    let good = cx.opts(cx.ttl());
    let key = cx.key("valid");
    let oversized = cx.key(&"x".repeat(MAX_KEY_LEN));
    let cases: Vec<(&str, &str, LockOptions)> = vec![
        ("key", "", good.clone()),
        ("key", oversized.as_str(), good.clone()),
        ("ttl", &key, good.clone().with_ttl(Duration::ZERO)),
        ("ttl", &key, good.clone().with_ttl(Duration::from_millis(1))),
        ("ttl", &key, good.clone().with_ttl(MAX_TTL * 2)),
        ("ttl", &key, good.clone().with_ttl(Duration::MAX)),
        ("wait", &key, good.clone().with_wait(Duration::MAX)),
        (
            "drift",
            &key,
            good.clone().with_drift(Drift {
                factor: 0.5,
                fixed: cx.ttl(),
            }),
        ),
        (
            "retry.max",
            &key,
            good.clone().with_retry(Backoff {
                max: Duration::ZERO,
                ..Backoff::default()
            }),
        ),
        (
            "auto_renew.interval",
            &key,
            good.clone().with_renewal(AutoRenew {
                interval: Some(cx.ttl() * 2),
                max_hold: None,
            }),
        ),
    ];
    for (field, key, opts) in &cases {
        for wait in [false, true] {
            let result = if wait {
                client.acquire(key, opts).await.map(|_| ())
            } else {
                client.try_acquire(key, opts).await.map(|_| ())
            };
            match result {
                Err(Error::InvalidInput { field: f, message }) => {
                    ensure!(
                        f == *field,
                        "expected field {field}, error names {f}: {message}"
                    );
                }
                Err(e) => bail!("{field}: expected InvalidInput, got {e}"),
                Ok(()) => bail!("{field}: invalid input was accepted"),
            }
        }
    }
    if let (Some(before), Some(inspect)) = (before, &cx.subject().inspect) {
        let after = inspect.stored(cx.namespace()).await?;
        ensure!(
            after == before,
            "rejected input changed the server: {before} → {after} entries"
        );
    }
    let lease = client.try_acquire(&key, &good).await?;
    ensure!(lease.is_some(), "the key used with bad options is held");
    if let Some(lease) = lease {
        lease.release().await?;
    }
    Ok(())
}
