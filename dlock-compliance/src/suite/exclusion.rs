//! Mutual exclusion: many clients, or many tasks of one client, many rounds, one holder at a
//! time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use dlock_core::{DistributedLockExt, Released};

use super::Ctx;
use dlock_testkit::History;

/// Who contends in [`contend`]: `clients` clients with `tasks` tasks each, on `keys` keys (task
/// `i` on key `i % keys`), `rounds` acquisitions per task, each waiting up to `wait`.
struct Contention {
    clients: usize,
    tasks: usize,
    keys: usize,
    rounds: usize,
    wait: Duration,
}

/// Every task acquires its key, holds it a moment and releases it, `rounds` times; an in-process
/// witness per key counts holders inside the critical section, each release must find its lease
/// still held, and the history is checked for overlaps and token order.
async fn contend(cx: &Ctx, name: &str, plan: Contention) -> anyhow::Result<()> {
    let history = Arc::new(History::new());
    let inside: Arc<Vec<AtomicUsize>> =
        Arc::new((0..plan.keys).map(|_| AtomicUsize::new(0)).collect());
    let overlaps = Arc::new(AtomicUsize::new(0));
    let opts = cx.opts(cx.long_ttl()).with_wait(plan.wait);
    let mut tasks = Vec::new();
    for c in 0..plan.clients {
        let client = cx.client().await?;
        for t in 0..plan.tasks {
            let id = c * plan.tasks + t;
            let slot = id % plan.keys;
            let key = cx.key(&format!("{name}/{slot}"));
            let (client, opts) = (client.clone(), opts.clone());
            let (history, inside, overlaps) = (history.clone(), inside.clone(), overlaps.clone());
            let rounds = plan.rounds;
            tasks.push(tokio::spawn(async move {
                for round in 0..rounds {
                    let lease = client
                        .acquire(&key, &opts)
                        .await
                        .with_context(|| format!("task {id} round {round}: acquire"))?;
                    history.acquired(id, &key, lease.fencing_token(), lease.valid_until());
                    if inside[slot].fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside[slot].fetch_sub(1, Ordering::SeqCst);
                    history.releasing(id, &key, lease.fencing_token());
                    let released = lease
                        .release()
                        .await
                        .with_context(|| format!("task {id} round {round}: release"))?;
                    ensure!(
                        released == Released::Released,
                        "task {id} round {round}: its release answered {released:?}"
                    );
                }
                anyhow::Ok(())
            }));
        }
    }
    for (id, task) in tasks.into_iter().enumerate() {
        task.await?.with_context(|| format!("task {id}"))?;
    }
    let overlaps = overlaps.load(Ordering::SeqCst);
    ensure!(
        overlaps == 0,
        "{overlaps} times a second holder entered the critical section"
    );
    history.check(cx.fenced()).map_err(anyhow::Error::new)?;
    Ok(())
}

/// Four clients with two tasks each acquire one key fifteen times each.
pub(crate) async fn mutual_exclusion_under_contention(cx: Ctx) -> anyhow::Result<()> {
    let wait = Duration::from_secs(60) + cx.slack();
    let plan = Contention {
        clients: 4,
        tasks: 2,
        keys: 1,
        rounds: 15,
        wait,
    };
    contend(&cx, "hot", plan).await
}

/// Thirty-two tasks of one client, as a service shares one client between its workers, take
/// four keys in turns, five times each. Every waiter is woken by the release before it: the wait
/// is far below the 60 s TTL, so a wake-up lost among the client's tasks would leave a waiter
/// to wait out the TTL and fail.
pub(crate) async fn tasks_of_one_client_exclude_each_other(cx: Ctx) -> anyhow::Result<()> {
    let plan = Contention {
        clients: 1,
        tasks: 32,
        keys: 4,
        rounds: 5,
        wait: Duration::from_secs(20) + cx.slack(),
    };
    contend(&cx, "one-client", plan).await
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
