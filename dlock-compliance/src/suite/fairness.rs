//! The fair queue ([`Capabilities::fair_queue`](dlock_core::backend::Capabilities::fair_queue)): waiters
//! are served in the order they asked (each on its own client, or all on one), a releasing task that asks again queues behind them, a
//! waiter that crashed while queued holds nobody up for longer than its session or lease, and
//! many waiters on one key still exclude each other with increasing tokens.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{ensure, Context};
use dlock_core::{DistributedLock, DistributedLockExt, FencingToken};
use dlock_testkit::trials::until_waiting;
use tokio::time::Instant;

use super::Ctx;

/// The pause between two waiters' requests where the backend does not count its waiters, so
/// that their arrival order is beyond doubt (each request has reached the server and queued
/// long before the next). Where it counts them, the next waiter asks once the count shows the
/// last one in line (see [`in_line`]).
const ARRIVAL_GAP: Duration = Duration::from_millis(200);

/// How long each waiter holds the lock once it has it.
const HOLD: Duration = Duration::from_millis(20);

/// Waiters queued one after another in [`waiters_are_served_in_arrival_order`].
const IN_LINE: usize = 5;

/// Rounds of [`a_releaser_that_asks_again_queues_behind_the_waiters`].
const ROUNDS: usize = 5;

/// Clients and tasks per client of [`many_waiters_exclude_each_other_with_growing_tokens`].
const CLIENTS: usize = 8;
const TASKS_PER_CLIENT: usize = 4;

/// Who held, in the order they were granted, with their tokens.
type Grants = Arc<Mutex<Vec<(usize, FencingToken)>>>;

fn record(grants: &Grants, who: usize, token: FencingToken) {
    grants
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push((who, token));
}

fn taken(grants: &Grants) -> Vec<(usize, FencingToken)> {
    grants
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// Returns once `waiting` contenders wait for `key` (as `client` inspects it), failing if that
/// takes longer than the slack; where the backend does not count its waiters, after
/// [`ARRIVAL_GAP`]. A fixed pause alone was outrun on a loaded machine: a waiter spawned first
/// could reach the server after the next one.
async fn in_line(
    cx: &Ctx,
    client: &Arc<dyn DistributedLock>,
    key: &str,
    waiting: usize,
) -> anyhow::Result<()> {
    if !until_waiting(client.clone(), key, waiting, cx.slack()).await? {
        tokio::time::sleep(ARRIVAL_GAP).await;
    }
    Ok(())
}

/// Fails unless `tokens` grow strictly (where the subject orders them); `what` names the grants.
fn ensure_growing(cx: &Ctx, tokens: &[FencingToken], what: &str) -> anyhow::Result<()> {
    if !cx.fenced() {
        return Ok(());
    }
    for pair in tokens.windows(2) {
        ensure!(
            pair[0] < pair[1],
            "{what}: token {:?} followed by {:?} (all: {tokens:?})",
            pair[0],
            pair[1]
        );
    }
    Ok(())
}

/// A holds; five waiters, each on its own client, ask one after another; A releases: they hold
/// in the order they asked, each with a greater token than the one before.
pub(crate) async fn waiters_are_served_in_arrival_order(cx: Ctx) -> anyhow::Result<()> {
    served_in_arrival_order(cx, false).await
}

/// As [`waiters_are_served_in_arrival_order`], with the five waiters on one client, whose calls
/// may travel together and whose wake-ups arrive on one channel.
pub(crate) async fn waiters_of_one_client_are_served_in_arrival_order(
    cx: Ctx,
) -> anyhow::Result<()> {
    served_in_arrival_order(cx, true).await
}

async fn served_in_arrival_order(cx: Ctx, one_client: bool) -> anyhow::Result<()> {
    let holder = cx.client().await?;
    let key = cx.key("arrival-order");
    let held = holder.acquire(&key, &cx.opts(cx.long_ttl())).await?;
    let grants: Grants = Arc::default();
    let mut waiters = Vec::with_capacity(IN_LINE);
    let shared = cx.client().await?;
    for who in 0..IN_LINE {
        let client = if one_client {
            shared.clone()
        } else {
            cx.client().await?
        };
        let (name, grants) = (key.clone(), grants.clone());
        let opts = cx
            .opts(cx.long_ttl())
            .with_wait(ARRIVAL_GAP * 2 * IN_LINE as u32 + cx.slack() * 2);
        waiters.push(tokio::spawn(async move {
            let lease = client.acquire(&name, &opts).await?;
            record(&grants, who, lease.fencing_token());
            tokio::time::sleep(HOLD).await;
            lease.release().await?;
            anyhow::Ok(())
        }));
        if one_client {
            // A client may line its own tasks up itself and wait on the server as one (etcd,
            // ZooKeeper, PostgreSQL): the server then counts one waiter, whoever else waits.
            in_line(&cx, &holder, &key, 1).await?;
            tokio::time::sleep(ARRIVAL_GAP).await;
        } else {
            in_line(&cx, &holder, &key, who + 1).await?;
        }
    }
    ensure!(taken(&grants).is_empty(), "a waiter held while A held");
    held.release().await?;
    for (who, waiter) in waiters.into_iter().enumerate() {
        waiter
            .await?
            .with_context(|| format!("waiter {who} (in arrival order)"))?;
    }
    let grants = taken(&grants);
    let order: Vec<usize> = grants.iter().map(|(who, _)| *who).collect();
    ensure!(
        order == (0..IN_LINE).collect::<Vec<_>>(),
        "waiters that asked in the order 0..{IN_LINE} held in the order {order:?}"
    );
    let tokens: Vec<FencingToken> = grants.iter().map(|(_, token)| *token).collect();
    ensure_growing(&cx, &tokens, "in arrival order")
}

/// A holds and B waits; A releases and at once asks again: B holds first, A only after B.
pub(crate) async fn a_releaser_that_asks_again_queues_behind_the_waiters(
    cx: Ctx,
) -> anyhow::Result<()> {
    let [a, b] = cx.clients().await?;
    let wait = cx.slack() * 2;
    for round in 0..ROUNDS {
        let key = cx.key(&format!("releaser/{round}"));
        let held = a.acquire(&key, &cx.opts(cx.long_ttl())).await?;
        let waiter = {
            let (b, key, opts) = (
                b.clone(),
                key.clone(),
                cx.opts(cx.long_ttl()).with_wait(wait),
            );
            tokio::spawn(async move {
                let lease = b.acquire(&key, &opts).await?;
                let held_at = Instant::now();
                tokio::time::sleep(HOLD).await;
                lease.release().await?;
                anyhow::Ok(held_at)
            })
        };
        in_line(&cx, &a, &key, 1).await?;
        ensure!(!waiter.is_finished(), "round {round}: B held while A held");
        held.release().await?;
        let again = a
            .acquire(&key, &cx.opts(cx.long_ttl()).with_wait(wait))
            .await
            .with_context(|| format!("round {round}: A asking again"))?;
        let again_at = Instant::now();
        let b_at = waiter
            .await?
            .with_context(|| format!("round {round}: the queued waiter B"))?;
        ensure!(
            b_at < again_at,
            "round {round}: A released and asked again, and held before B, which was in line: \
             the releaser jumped the queue"
        );
        again.release().await?;
    }
    Ok(())
}

/// A holds; W (its link about to freeze) queues with the short TTL and crashes — it is never
/// polled or dropped again, so it neither withdraws nor renews anything; N queues behind it; A
/// releases. N holds within three TTLs and the slack of the release (the crashed waiter's
/// session or queue entry lapses; nobody must wait for a wake-up sent to the dead waiter).
pub(crate) async fn a_crashed_queued_waiter_does_not_block_the_queue(
    cx: Ctx,
) -> anyhow::Result<()> {
    let holder = cx.client().await?;
    let (crashing, freeze) = cx.subject().freezable_client().await?;
    let next = cx.client().await?;
    let key = cx.key("crashed-waiter");
    let ttl = cx.ttl();
    let bound = ttl * 3 + cx.slack();
    let held = holder.acquire(&key, &cx.opts(cx.long_ttl())).await?;
    let mut crashed = Box::pin({
        let (crashing, key, opts) = (crashing.clone(), key.clone(), cx.opts(ttl));
        async move { crashing.acquire(&key, &opts).await }
    });
    ensure!(
        tokio::time::timeout(ARRIVAL_GAP, &mut crashed)
            .await
            .is_err(),
        "W held while A held"
    );
    // The crash: W's link goes silent, and its acquire is never polled nor dropped again (a
    // dropped acquire would withdraw its place).
    freeze.freeze();
    std::mem::forget(crashed);
    let behind = {
        let (next, key) = (next.clone(), key.clone());
        let opts = cx.opts(cx.long_ttl()).with_wait(bound + cx.slack());
        tokio::spawn(async move {
            let lease = next.acquire(&key, &opts).await?;
            anyhow::Ok((Instant::now(), lease))
        })
    };
    tokio::time::sleep(ARRIVAL_GAP).await;
    ensure!(!behind.is_finished(), "N held while A held");
    let released = Instant::now();
    held.release().await?;
    let (held_at, lease) = behind
        .await?
        .context("N, queued behind the crashed waiter W")?;
    let gap = held_at.saturating_duration_since(released);
    ensure!(
        gap <= bound,
        "N held {gap:?} after the release, behind a waiter that crashed (TTL {ttl:?}; allowed \
         {bound:?}): a lost wake-up"
    );
    lease.release().await?;
    Ok(())
}

/// 32 tasks on 8 clients ask for one key at once, each holding it briefly: never two at a time,
/// and each holder's token greater than the one before.
pub(crate) async fn many_waiters_exclude_each_other_with_growing_tokens(
    cx: Ctx,
) -> anyhow::Result<()> {
    let key = cx.key("many-waiters");
    let inside = Arc::new(AtomicBool::new(false));
    let grants: Grants = Arc::default();
    let wait = cx.slack() * 4 + HOLD * (CLIENTS * TASKS_PER_CLIENT) as u32 * 4;
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let client: Arc<dyn DistributedLock> = cx.client().await?;
        for t in 0..TASKS_PER_CLIENT {
            let who = c * TASKS_PER_CLIENT + t;
            let (client, key, inside, grants) =
                (client.clone(), key.clone(), inside.clone(), grants.clone());
            let opts = cx.opts(cx.long_ttl()).with_wait(wait);
            tasks.push(tokio::spawn(async move {
                let lease = client.acquire(&key, &opts).await?;
                let overlap = inside.swap(true, Ordering::SeqCst);
                record(&grants, who, lease.fencing_token());
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.store(false, Ordering::SeqCst);
                lease.release().await?;
                ensure!(!overlap, "task {who} held while another task held");
                anyhow::Ok(())
            }));
        }
    }
    for (who, task) in tasks.into_iter().enumerate() {
        task.await?.with_context(|| format!("task {who}"))?;
    }
    let grants = taken(&grants);
    ensure!(
        grants.len() == CLIENTS * TASKS_PER_CLIENT,
        "{} of {} tasks held",
        grants.len(),
        CLIENTS * TASKS_PER_CLIENT
    );
    let tokens: Vec<FencingToken> = grants.iter().map(|(_, token)| *token).collect();
    ensure_growing(&cx, &tokens, "in grant order")
}
