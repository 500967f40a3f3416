//! Mutual exclusion: many clients, many rounds, one holder at a time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use dlock_core::DistributedLockExt;

use super::Ctx;
use dlock_testkit::History;

const CLIENTS: usize = 4;
const TASKS_PER_CLIENT: usize = 2;
const ROUNDS: usize = 15;

/// Clients × tasks × rounds acquire one key; an in-process witness counts holders inside the
/// critical section, and the history is checked for overlaps and token order.
pub(crate) async fn mutual_exclusion_under_contention(cx: Ctx) -> anyhow::Result<()> {
    let key = cx.key("hot");
    let history = Arc::new(History::new());
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let opts = cx
        .opts(cx.long_ttl())
        .with_wait(Duration::from_secs(60) + cx.slack());
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let client = cx.client().await?;
        for t in 0..TASKS_PER_CLIENT {
            let (client, key, opts) = (client.clone(), key.clone(), opts.clone());
            let (history, inside, overlaps) = (history.clone(), inside.clone(), overlaps.clone());
            let id = c * TASKS_PER_CLIENT + t;
            tasks.push(tokio::spawn(async move {
                for round in 0..ROUNDS {
                    let lease = client
                        .acquire(&key, &opts)
                        .await
                        .with_context(|| format!("client {id} round {round}: acquire"))?;
                    history.acquired(id, &key, lease.fencing_token(), lease.valid_until());
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    history.releasing(id, &key, lease.fencing_token());
                    lease
                        .release()
                        .await
                        .with_context(|| format!("client {id} round {round}: release"))?;
                }
                anyhow::Ok(())
            }));
        }
    }
    for task in tasks {
        task.await??;
    }
    let overlaps = overlaps.load(Ordering::SeqCst);
    ensure!(
        overlaps == 0,
        "{overlaps} times a second holder entered the critical section"
    );
    history.check(cx.fenced()).map_err(anyhow::Error::new)?;
    Ok(())
}

/// A held key does not make another key busy.
pub(crate) async fn independent_keys_do_not_block_each_other(cx: Ctx) -> anyhow::Result<()> {
    let a = cx.client().await?;
    let b = cx.client().await?;
    let opts = cx.opts(cx.long_ttl());
    let first = a.try_acquire(&cx.key("one"), &opts).await?;
    ensure!(first.is_some(), "a free key was busy");
    let second = b.try_acquire(&cx.key("two"), &opts).await?;
    ensure!(second.is_some(), "holding \"one\" made \"two\" busy");
    let nested = b.try_acquire(&cx.key("one/two"), &opts).await?;
    ensure!(nested.is_some(), "holding \"one\" made \"one/two\" busy");
    for lease in [first, second, nested].into_iter().flatten() {
        lease.release().await?;
    }
    Ok(())
}
