//! Acquiring: busy answers, deadlines, prompt hand-over, honest validity.

use std::time::Duration;

use anyhow::{bail, ensure};
use dlock_core::{Backoff, DistributedLockExt, Released};
use dlock_testkit::trials::ensure_token_above;
use tokio::time::Instant;

use super::{expect_timeout, release_held, Ctx};

/// `try_acquire` on a held key answers "busy" quickly instead of waiting.
pub(crate) async fn try_acquire_answers_busy_fast(cx: Ctx) -> anyhow::Result<()> {
    let [holder, other] = cx.clients().await?;
    let key = cx.key("busy");
    let opts = cx.opts(cx.long_ttl());
    let lease = holder.acquire(&key, &opts).await?;
    for _ in 0..5 {
        let start = Instant::now();
        let answer = other.try_acquire(&key, &opts).await?;
        let took = start.elapsed();
        ensure!(answer.is_none(), "try_acquire took a held lock");
        ensure!(took <= cx.slack(), "busy answer took {took:?}");
    }
    lease.release().await?;
    Ok(())
}

/// A waiting `acquire` gives up with `Timeout` at its deadline, not much later.
pub(crate) async fn acquire_respects_its_deadline(cx: Ctx) -> anyhow::Result<()> {
    let [holder, other] = cx.clients().await?;
    let (key, lease) = cx.hold(&holder, "deadline").await?;
    let wait = cx.ttl();
    let start = Instant::now();
    let result = other
        .acquire(&key, &cx.opts(cx.long_ttl()).with_wait(wait))
        .await;
    let took = start.elapsed();
    expect_timeout(result, "acquired a lock that was held")?;
    ensure!(
        took + Duration::from_millis(5) >= wait,
        "gave up after {took:?}, before its {wait:?} deadline"
    );
    ensure!(
        took <= wait + cx.slack(),
        "gave up after {took:?}, deadline was {wait:?}"
    );
    lease.release().await?;
    Ok(())
}

/// A waiter gets the lock soon after the holder releases, long before the TTL.
pub(crate) async fn release_frees_promptly_for_a_waiter(cx: Ctx) -> anyhow::Result<()> {
    hand_over(&cx, "handover", Backoff::default()).await
}

/// How long a waiter of [`a_release_wakes_a_waiter_that_does_not_poll`] would sleep between
/// attempts if nothing woke it: far beyond any subject's slack.
const NO_POLLING: Duration = Duration::from_secs(20);

/// On a backend that declares that releases wake waiters, a waiter whose backoff would keep it
/// asleep for [`NO_POLLING`] (and whose holder's TTL is longer still) gets the lock within the
/// slack of the release: it was woken, not polling.
pub(crate) async fn a_release_wakes_a_waiter_that_does_not_poll(cx: Ctx) -> anyhow::Result<()> {
    let retry = Backoff {
        initial: NO_POLLING,
        max: NO_POLLING,
        multiplier: 1.0,
        jitter: 0.0,
    };
    hand_over(&cx, "wake", retry).await
}

/// A holder of `name` with a long TTL, a waiter with backoff `retry`; the holder releases and
/// the waiter must have the lock within the slack, with a larger token.
async fn hand_over(cx: &Ctx, name: &str, retry: Backoff) -> anyhow::Result<()> {
    let [holder, waiter] = cx.clients().await?;
    let key = cx.key(name);
    let opts = cx.opts(cx.long_ttl());
    let lease = holder.acquire(&key, &opts).await?;
    let first = lease.fencing_token();
    let wait_opts = opts
        .clone()
        .with_wait(Duration::from_secs(30))
        .with_retry(retry);
    let waiting = {
        let key = key.clone();
        tokio::spawn(async move {
            let lease = waiter.acquire(&key, &wait_opts).await;
            (lease, Instant::now())
        })
    };
    tokio::time::sleep(cx.ttl() / 4).await;
    ensure!(!waiting.is_finished(), "the waiter acquired a held lock");
    let released_at = Instant::now();
    release_held(lease, "release did not release").await?;
    let (second, acquired_at) = waiting.await?;
    let second = second?;
    let gap = acquired_at - released_at;
    ensure!(
        gap <= cx.slack(),
        "the waiter took {gap:?} to notice the release"
    );
    if cx.fenced() {
        ensure_token_above(&second, first, "the hand-over")?;
    }
    second.release().await?;
    Ok(())
}

/// How much later than the caller's clock reading a backend may stamp its request as sent. The
/// gap is scheduling noise: a few milliseconds alone, but in CI, with two test binaries, their
/// servers and the compile checks on two cores, a Redis case once took more than 10 ms. A
/// backend that stamps on the reply's arrival is still caught: the suite's own tooth delays that
/// reply by 100 ms.
const STAMP_TOLERANCE: Duration = Duration::from_millis(40);

/// The validity deadline starts before the request was sent and leaves the drift allowance.
pub(crate) async fn validity_is_measured_from_before_the_request(cx: Ctx) -> anyhow::Result<()> {
    let client = cx.client().await?;
    let ttl = cx.ttl() * 4;
    let opts = cx.opts(ttl);
    for mode in ["try_acquire", "acquire"] {
        let key = cx.key(mode);
        let before = Instant::now();
        let lease = if mode == "try_acquire" {
            client.try_acquire(&key, &opts).await?
        } else {
            Some(client.acquire(&key, &opts).await?)
        };
        let Some(lease) = lease else {
            bail!("{mode}: a free key was busy");
        };
        // The request leaves after `before`, by no more than scheduling noise; a backend that
        // starts the validity when the reply arrives overshoots by a whole round trip or more.
        let latest = before + opts.drift.validity(ttl) + STAMP_TOLERANCE;
        ensure!(
            lease.valid_until() <= latest,
            "{mode}: valid until {:?} after the request started, more than ttl − drift = {:?}",
            lease.valid_until() - before,
            opts.drift.validity(ttl)
        );
        ensure!(
            lease.acquired_at() >= before,
            "{mode}: validity starts before the call"
        );
        lease.release().await?;
    }
    Ok(())
}

/// A zero wait is one attempt, like `try_acquire`: a free key is taken every time, never answered
/// with a timeout before the first attempt had its answer.
pub(crate) async fn zero_wait_takes_a_free_key(cx: Ctx) -> anyhow::Result<()> {
    const TRIES: usize = 50;
    let client = cx.client().await?;
    let opts = cx.opts(cx.long_ttl()).with_wait(Duration::ZERO);
    for i in 0..TRIES {
        // A fresh key now and then, so that backends which set up per-key state on first use
        // (a parent node, a counter) are tried on that path too.
        let key = cx.key(&format!("zero-wait/{}", i % 5));
        match client.acquire(&key, &opts).await {
            Ok(lease) => {
                ensure!(lease.release().await? == Released::Released);
            }
            Err(e) => bail!(
                "try {} of {TRIES}: a zero wait on a free key failed: {e}",
                i + 1
            ),
        }
    }
    Ok(())
}
