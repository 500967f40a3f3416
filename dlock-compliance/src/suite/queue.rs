//! Waiters that give up: a timed-out or dropped acquire leaves nothing in the lock's queue, so the
//! waiters behind it are not held up.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use dlock_core::{Backoff, DistributedLock, DistributedLockExt, Error, LockOptions};
use tokio::time::Instant;

use super::Ctx;

/// Rounds per case.
const ROUNDS: usize = 20;

/// How soon after the holder's release the waiter behind a waiter that gave up holds, as a rule
/// (the median of the rounds).
const HAND_OFF: Duration = Duration::from_millis(50);

/// The bound on the slowest round: [`HAND_OFF`] plus room for a scheduling hiccup on a loaded
/// machine. A place left in the queue costs far more — the session timeout, seconds.
const SLOWEST_HAND_OFF: Duration = Duration::from_millis(500);
const _: () = assert!(
    ROUNDS < 100,
    "the p99 of fewer than 100 rounds is the slowest"
);

/// How long the middle waiter waits before it gives up.
const GIVE_UP_AFTER: Duration = Duration::from_millis(1_000);

/// How the middle waiter gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GivesUp {
    /// Its wait runs out.
    TimesOut,
    /// Its future is dropped while it waits.
    IsDropped,
}

/// A holds, B waits 1 s and times out, C waits, A releases: C holds within 50 ms.
pub(crate) async fn a_timed_out_waiter_leaves_nothing_in_the_queue(cx: Ctx) -> anyhow::Result<()> {
    hand_off_past_a_waiter_that_gave_up(cx, GivesUp::TimesOut).await
}

/// The same with B's acquire future dropped after 1 s instead.
pub(crate) async fn a_dropped_waiter_leaves_nothing_in_the_queue(cx: Ctx) -> anyhow::Result<()> {
    hand_off_past_a_waiter_that_gave_up(cx, GivesUp::IsDropped).await
}

async fn hand_off_past_a_waiter_that_gave_up(cx: Ctx, how: GivesUp) -> anyhow::Result<()> {
    let a = cx.client().await?;
    let b = cx.client().await?;
    let c = cx.client().await?;
    let ttl = cx.long_ttl();
    // C polls often where the backend has no wake-up, so that the hand-off time measures what
    // stands in C's way, not the backoff.
    let c_opts = cx.opts(ttl).with_retry(Backoff {
        initial: Duration::from_millis(2),
        max: Duration::from_millis(10),
        ..Backoff::default()
    });
    let mut hand_offs = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        let key = cx.key(&format!("gave-up/{round}"));
        let holder = a.acquire(&key, &cx.opts(ttl)).await?;
        let middle = give_up(&b, &key, cx.opts(ttl), how);
        // C queues behind B: started once B is surely queued, before B gives up.
        tokio::time::sleep(GIVE_UP_AFTER / 4).await;
        let behind = {
            let (c, key, opts) = (c.clone(), key.clone(), c_opts.clone());
            tokio::spawn(async move {
                let lease = c.acquire(&key, &opts).await?;
                Ok::<_, Error>((Instant::now(), lease))
            })
        };
        middle
            .await
            .with_context(|| format!("round {round}: the waiter that gives up"))??;
        ensure!(!behind.is_finished(), "round {round}: C held while A held");
        let released = Instant::now();
        holder.release().await?;
        let (held, lease) = behind.await??;
        let hand_off = held.saturating_duration_since(released);
        lease.release().await?;
        // With this many rounds the p99 is the slowest round: one over the bound decides.
        ensure!(
            hand_off <= SLOWEST_HAND_OFF,
            "round {round}: after a waiter {}, the next waiter held {hand_off:?} after the \
             release (at most {SLOWEST_HAND_OFF:?}): something stood in its way",
            gave_up(how)
        );
        hand_offs.push(hand_off);
    }
    hand_offs.sort();
    let p99 = hand_offs[(hand_offs.len() * 99).div_ceil(100) - 1];
    let median = hand_offs[hand_offs.len() / 2];
    let gave_up = gave_up(how);
    eprintln!(
        "[hand-off] {}: after a waiter {gave_up}: median {median:?}, p99 {p99:?} over {ROUNDS} rounds",
        cx.subject().name()
    );
    ensure!(
        median <= HAND_OFF && p99 <= SLOWEST_HAND_OFF,
        "after a waiter {gave_up}, the next waiter held {median:?} (median of {ROUNDS} rounds; \
         p99 {p99:?}) after the release: something stood in its way"
    );
    Ok(())
}

/// How the middle waiter gave up, for messages.
fn gave_up(how: GivesUp) -> &'static str {
    match how {
        GivesUp::TimesOut => "timed out",
        GivesUp::IsDropped => "was dropped",
    }
}

/// B's acquire, which must end without the lock, as `how` says.
fn give_up(
    b: &Arc<dyn DistributedLock>,
    key: &str,
    opts: LockOptions,
    how: GivesUp,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    let (b, key) = (b.clone(), key.to_owned());
    tokio::spawn(async move {
        match how {
            GivesUp::TimesOut => match b.acquire(&key, &opts.with_wait(GIVE_UP_AFTER)).await {
                Err(Error::Timeout { .. }) => Ok(()),
                Err(e) => bail!("expected a timeout, got {e}"),
                Ok(_) => bail!("acquired a lock that was held"),
            },
            GivesUp::IsDropped => {
                match tokio::time::timeout(GIVE_UP_AFTER, b.acquire(&key, &opts)).await {
                    Err(_) => Ok(()),
                    Ok(answer) => bail!(
                        "the acquire ended before it was dropped: {:?}",
                        answer.err()
                    ),
                }
            }
        }
    })
}
