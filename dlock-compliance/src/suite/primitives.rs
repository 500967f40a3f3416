//! The primitives beside the lock: semaphore, read-write lock, election and `acquire_all`.
//!
//! Each property is checked on what the clients observed: how many were inside at once, which
//! tokens they were granted, which leaders every observer saw in which order.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use dlock_core::backend::Primitive;
use dlock_core::{DistributedLock, DistributedLockExt, Error, FencingToken, LeaseState, Semaphore};
use futures::StreamExt;
use tokio::time::Instant;

use super::Ctx;

/// The most holders seen inside at once, kept by an in-process witness.
#[derive(Default)]
struct Witness {
    inside: AtomicUsize,
    most: AtomicUsize,
}

impl Witness {
    fn enter(&self) -> usize {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        now
    }

    fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

fn expect_mismatch<T>(result: dlock_core::Result<T>, what: &str) -> anyhow::Result<()> {
    match result {
        Err(Error::Mismatch { .. }) => Ok(()),
        Err(other) => bail!("{what}: expected a mismatch error, got {other}"),
        Ok(_) => bail!("{what}: it was granted"),
    }
}

/// A primitive the subject does not declare answers "unsupported", and one it declares is
/// served: the declaration is true.
pub(crate) async fn primitives_are_served_as_declared(cx: Ctx) -> anyhow::Result<()> {
    let client = cx.client().await?;
    let declared = cx.subject().capabilities.primitives;
    for primitive in [
        Primitive::semaphore(2),
        Primitive::Read,
        Primitive::Write,
        Primitive::candidate("v"),
        Primitive::observer(),
    ] {
        let served = client.primitive(&primitive);
        match (declared.serves(&primitive), served) {
            (true, Ok(_)) | (false, Err(Error::Unsupported { .. })) => {}
            (true, Err(e)) => bail!("the declared {} is not served: {e}", primitive.name()),
            (false, Ok(_)) => bail!("{} is served but not declared", primitive.name()),
            (false, Err(e)) => bail!("an undeclared {} fails with {e}", primitive.name()),
        }
    }
    for bad in [Primitive::semaphore(0), Primitive::candidate("")] {
        match client.primitive(&bad) {
            Err(Error::InvalidInput { .. }) => {}
            other => bail!("{bad:?} was not refused as invalid: {other:?}"),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Semaphore

const PERMITS: u32 = 3;

async fn semaphores<const N: usize>(
    cx: &Ctx,
    name: &str,
    permits: u32,
) -> anyhow::Result<[Semaphore; N]> {
    let mut all = Vec::with_capacity(N);
    for _ in 0..N {
        all.push(cx.client().await?.semaphore(&cx.key(name), permits)?);
    }
    all.try_into()
        .map_err(|_| anyhow::anyhow!("could not make {N} semaphores"))
}

/// Exactly `permits` clients hold at once: the next is busy until one gives its permit back,
/// and every permit has a fencing token of its own, increasing in grant order where tokens
/// are ordered.
pub(crate) async fn semaphore_grants_exactly_its_permits(cx: Ctx) -> anyhow::Result<()> {
    let clients: [Semaphore; 4] = semaphores(&cx, "permits", PERMITS).await?;
    let opts = cx.opts(cx.long_ttl());
    let mut held = Vec::new();
    for (i, semaphore) in clients.iter().take(PERMITS as usize).enumerate() {
        let permit = semaphore
            .try_acquire(&opts)
            .await?
            .with_context(|| format!("permit {} of {PERMITS} was refused", i + 1))?;
        held.push(permit);
    }
    let extra = clients[3].try_acquire(&opts).await?;
    ensure!(extra.is_none(), "a fourth holder got a permit of three");
    let holding = clients[3].holding().await?;
    if let Some(holder) = holding.holder() {
        ensure!(
            holder.holders.is_none_or(|n| n == PERMITS as usize),
            "inspect counts {:?} holders of {PERMITS}",
            holder.holders
        );
    }
    let tokens: Vec<FencingToken> = held.iter().map(|p| p.fencing_token()).collect();
    if cx.fenced() {
        ensure!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "permit tokens are not increasing in grant order: {tokens:?}"
        );
    }
    let released_at = Instant::now();
    held.remove(0).release().await?;
    let next = clients[3]
        .acquire(&opts.clone().with_wait(cx.slack()))
        .await
        .context("a released permit was not granted to the next holder")?;
    ensure!(
        released_at.elapsed() <= cx.slack(),
        "the released permit came back only after {:?}",
        released_at.elapsed()
    );
    if cx.fenced() {
        let last = tokens.iter().max().copied().context("no permit was held")?;
        ensure!(
            next.fencing_token() > last,
            "the next permit's token {} is not above the earlier {last}",
            next.fencing_token()
        );
    }
    next.release().await?;
    for permit in held {
        permit.release().await?;
    }
    Ok(())
}

/// Many clients, many rounds: never more than `permits` inside at once, and more than one
/// inside at some point (a semaphore that behaves as a lock is wrong too).
pub(crate) async fn semaphore_never_exceeds_its_permits(cx: Ctx) -> anyhow::Result<()> {
    const CLIENTS: usize = 4;
    const TASKS: usize = 2;
    const ROUNDS: usize = 6;
    let witness = Arc::new(Witness::default());
    let opts = cx
        .opts(cx.long_ttl())
        .with_wait(Duration::from_secs(60) + cx.slack());
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let semaphore = cx.client().await?.semaphore(&cx.key("busy"), PERMITS)?;
        for t in 0..TASKS {
            let (semaphore, opts, witness) = (semaphore.clone(), opts.clone(), witness.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..ROUNDS {
                    let permit = semaphore
                        .acquire(&opts)
                        .await
                        .with_context(|| format!("task {c}.{t} round {round}: acquire"))?;
                    witness.enter();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    witness.leave();
                    permit.release().await?;
                }
                anyhow::Ok(())
            }));
        }
    }
    for task in tasks {
        task.await??;
    }
    let most = witness.most();
    ensure!(
        most <= PERMITS as usize,
        "{most} holders were inside a semaphore of {PERMITS} at once"
    );
    ensure!(
        most > 1,
        "never more than one holder inside a semaphore of {PERMITS}"
    );
    Ok(())
}

/// While the semaphore is held, a client that names another number of permits is refused with
/// a mismatch, and nothing changes: the holders' number still applies.
pub(crate) async fn semaphore_refuses_another_number_of_permits(cx: Ctx) -> anyhow::Result<()> {
    let [two, also_two] = semaphores(&cx, "agree", 2).await?;
    let three = cx.client().await?.semaphore(&cx.key("agree"), 3)?;
    let opts = cx.opts(cx.long_ttl());
    let first = two
        .try_acquire(&opts)
        .await?
        .context("a free permit was refused")?;
    expect_mismatch(
        three.try_acquire(&opts).await,
        "a client with 3 permits joined a semaphore of 2",
    )?;
    expect_mismatch(
        three.acquire(&opts.clone().with_wait(cx.slack())).await,
        "a waiting client with 3 permits joined a semaphore of 2",
    )?;
    let second = also_two
        .try_acquire(&opts)
        .await?
        .context("the refused client took the second permit")?;
    ensure!(
        two.try_acquire(&opts).await?.is_none(),
        "a third permit of two was granted after the refused request"
    );
    first.release().await?;
    second.release().await?;
    Ok(())
}

/// A permit whose holder vanished (never released, never renewed) returns once its TTL is
/// over, not before.
pub(crate) async fn crashed_permit_returns_after_its_ttl(cx: Ctx) -> anyhow::Result<()> {
    let [crashing, waiting] = semaphores(&cx, "crash", 1).await?;
    let ttl = cx.ttl();
    let taken_at = Instant::now();
    let permit = crashing
        .try_acquire(&cx.opts(ttl))
        .await?
        .context("a free permit was refused")?;
    // The holder crashes: no release, no renewal, nothing in the background.
    std::mem::forget(permit);
    let next = waiting
        .acquire(&cx.opts(cx.long_ttl()).with_wait(ttl + cx.slack() * 2))
        .await
        .context("the crashed holder's permit never returned")?;
    let after = taken_at.elapsed();
    ensure!(
        after + cx.slack() / 4 >= ttl,
        "the crashed holder's permit returned after {after:?}, before its TTL of {ttl:?}"
    );
    next.release().await?;
    Ok(())
}

/// Waiters for a permit that give up (timed out or dropped) leave nothing behind: once the
/// holder leaves, the permit is granted at once.
pub(crate) async fn abandoned_permit_waiters_leave_nothing(cx: Ctx) -> anyhow::Result<()> {
    let [holder, waiter, last] = semaphores(&cx, "abandoned", 1).await?;
    let opts = cx.opts(cx.long_ttl());
    let held = holder
        .try_acquire(&opts)
        .await?
        .context("a free permit was refused")?;
    let timed_out = waiter
        .acquire(&opts.clone().with_wait(Duration::from_millis(300)))
        .await;
    super::expect_timeout(timed_out, "a busy semaphore granted a permit")?;
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        waiter.acquire(&opts.clone().with_wait(Duration::from_secs(30))),
    )
    .await;
    ensure!(dropped.is_err(), "a busy semaphore granted a permit");
    let released_at = Instant::now();
    held.release().await?;
    let next = last
        .acquire(&opts.clone().with_wait(cx.slack()))
        .await
        .context("after the waiters gave up, the free permit was not granted")?;
    ensure!(
        released_at.elapsed() <= cx.slack(),
        "the free permit was granted only {:?} after the release",
        released_at.elapsed()
    );
    next.release().await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Read-write lock

/// Readers share; a writer excludes readers and writers; a writer's token is above every
/// earlier reader's.
pub(crate) async fn readers_share_and_a_writer_excludes(cx: Ctx) -> anyhow::Result<()> {
    let [a, b, c] = cx.clients().await?;
    let name = cx.key("rw");
    let (ra, rb, w) = (a.rw(&name)?, b.rw(&name)?, c.rw(&name)?);
    let opts = cx.opts(cx.long_ttl());
    let one = ra
        .try_read(&opts)
        .await?
        .context("a free read was refused")?;
    let two = rb
        .try_read(&opts)
        .await?
        .context("a second reader was refused while only a reader held")?;
    ensure!(
        w.try_write(&opts).await?.is_none(),
        "a writer got in while two readers held"
    );
    let readers = [one.fencing_token(), two.fencing_token()];
    let released_at = Instant::now();
    one.release().await?;
    two.release().await?;
    let writer = w
        .write(&opts.clone().with_wait(cx.slack()))
        .await
        .context("the writer was refused after the readers left")?;
    ensure!(
        released_at.elapsed() <= cx.slack(),
        "the writer got in {:?} after the readers left",
        released_at.elapsed()
    );
    if cx.fenced() {
        ensure!(
            readers.iter().all(|r| writer.fencing_token() > *r),
            "the writer's token {} is not above the earlier readers' {readers:?}",
            writer.fencing_token()
        );
    }
    ensure!(
        ra.try_read(&opts).await?.is_none(),
        "a reader got in while a writer held"
    );
    ensure!(
        rb.try_write(&opts).await?.is_none(),
        "a second writer got in while a writer held"
    );
    writer.release().await?;
    let after = ra
        .try_read(&opts)
        .await?
        .context("a read was refused after the writer left")?;
    after.release().await?;
    Ok(())
}

/// Readers and writers on many clients, many rounds: no reader is inside with a writer, no
/// two writers are inside together, and readers were inside together at some point.
pub(crate) async fn no_reader_overlaps_a_writer(cx: Ctx) -> anyhow::Result<()> {
    const CLIENTS: usize = 3;
    const ROUNDS: usize = 5;
    let readers = Arc::new(Witness::default());
    let writers = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let opts = cx
        .opts(cx.long_ttl())
        .with_wait(Duration::from_secs(60) + cx.slack());
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let rw = cx.client().await?.rw(&cx.key("mixed"))?;
        for role in ["reader", "reader", "writer"] {
            let (rw, opts) = (rw.clone(), opts.clone());
            let (readers, writers, violations) =
                (readers.clone(), writers.clone(), violations.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..ROUNDS {
                    let what = format!("{role} {c} round {round}");
                    if role == "reader" {
                        let lease = rw.read(&opts).await.context(what.clone())?;
                        readers.enter();
                        if writers.load(Ordering::SeqCst) > 0 {
                            note(&violations, format!("{what} read while a writer wrote"));
                        }
                        tokio::time::sleep(Duration::from_millis(15)).await;
                        readers.leave();
                        lease.release().await?;
                    } else {
                        let lease = rw.write(&opts).await.context(what.clone())?;
                        if writers.fetch_add(1, Ordering::SeqCst) > 0 {
                            note(&violations, format!("{what} wrote beside another writer"));
                        }
                        if readers.inside.load(Ordering::SeqCst) > 0 {
                            note(&violations, format!("{what} wrote while readers read"));
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        writers.fetch_sub(1, Ordering::SeqCst);
                        lease.release().await?;
                    }
                }
                anyhow::Ok(())
            }));
        }
    }
    for task in tasks {
        task.await??;
    }
    let violations = violations.lock().map(|v| v.clone()).unwrap_or_default();
    ensure!(violations.is_empty(), "{}", violations.join("; "));
    ensure!(readers.most() > 1, "readers never read together");
    Ok(())
}

fn note(violations: &Mutex<Vec<String>>, what: String) {
    if let Ok(mut v) = violations.lock() {
        v.push(what);
    }
}

/// A waiting writer holds back readers that come after it, so a stream of readers cannot keep
/// it out; when it gives up (dropped), readers get in again within the slack (or, where the
/// backend keeps the writer's place under a TTL, within that TTL).
pub(crate) async fn a_waiting_writer_is_not_starved_by_readers(cx: Ctx) -> anyhow::Result<()> {
    let [a, b, c] = cx.clients().await?;
    let name = cx.key("starve");
    let (first, writer, late) = (a.rw(&name)?, b.rw(&name)?, c.rw(&name)?);
    let opts = cx.opts(cx.long_ttl());
    let reading = first
        .try_read(&opts)
        .await?
        .context("a free read was refused")?;
    let waiting = {
        let (writer, opts) = (
            writer.clone(),
            opts.clone().with_wait(Duration::from_secs(60)),
        );
        tokio::spawn(async move { writer.write(&opts).await })
    };
    // Readers keep arriving while the writer waits: once the writer stands in line (within the
    // slack of its first attempt), each must wait behind it.
    let queued_by = Instant::now() + cx.slack();
    while let Some(read) = late.try_read(&opts).await? {
        read.release().await?;
        ensure!(
            Instant::now() <= queued_by,
            "a reader that came after a waiting writer went ahead of it"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..3 {
        ensure!(
            late.try_read(&opts).await?.is_none(),
            "a reader that came after a waiting writer went ahead of it"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let released_at = Instant::now();
    reading.release().await?;
    let written = tokio::time::timeout(cx.slack() * 2, waiting)
        .await
        .context("the waiting writer did not get in after the reader left")???;
    ensure!(
        released_at.elapsed() <= cx.slack(),
        "the writer got in only {:?} after the reader left",
        released_at.elapsed()
    );
    written.release().await?;

    // A writer that gives up stops holding readers back.
    let reading = first
        .try_read(&opts)
        .await?
        .context("a free read was refused")?;
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        writer.write(&opts.clone().with_wait(Duration::from_secs(30))),
    )
    .await;
    ensure!(gave_up.is_err(), "a writer got in while a reader read");
    let dropped_at = Instant::now();
    let bound = cx.ttl() + cx.slack();
    loop {
        if let Some(read) = late.try_read(&opts).await? {
            read.release().await?;
            break;
        }
        ensure!(
            dropped_at.elapsed() <= bound,
            "a writer that gave up still held readers back {:?} later",
            dropped_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    reading.release().await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Election

/// Candidates lead one at a time, each term above the last; every observer sees the terms in
/// the same increasing order, each with the value of the candidate that held it.
pub(crate) async fn one_leader_per_term_and_observers_agree(cx: Ctx) -> anyhow::Result<()> {
    const CANDIDATES: usize = 3;
    const TERMS_EACH: usize = 3;
    let name = cx.key("election");
    let mut observers = Vec::new();
    let mut sightings = Vec::new();
    for _ in 0..2 {
        let election = cx.client().await?.election(&name)?;
        let seen: Arc<Mutex<Vec<Sighting>>> = Arc::default();
        sightings.push(seen.clone());
        observers.push(tokio::spawn(async move {
            let mut stream = Box::pin(election.observe());
            while let Some(leader) = stream.next().await {
                let leader = leader?;
                if let Ok(mut seen) = seen.lock() {
                    seen.push((leader.term, leader.value));
                }
            }
            anyhow::Ok(())
        }));
    }
    let leading = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(Mutex::new(BTreeMap::<FencingToken, String>::new()));
    let opts = cx
        .opts(cx.long_ttl())
        .with_wait(Duration::from_secs(60) + cx.slack());
    let mut tasks = Vec::new();
    for c in 0..CANDIDATES {
        let election = cx.client().await?.election(&name)?;
        let (opts, leading, terms) = (opts.clone(), leading.clone(), terms.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..TERMS_EACH {
                let value = format!("candidate-{c}-{round}");
                let leadership = election.campaign(&value, &opts).await?;
                ensure!(
                    leading.fetch_add(1, Ordering::SeqCst) == 0,
                    "{value} leads beside another leader"
                );
                if let Ok(mut terms) = terms.lock() {
                    if let Some(other) = terms.insert(leadership.term(), value.clone()) {
                        bail!("{value} and {other} both lead term {}", leadership.term());
                    }
                }
                // Long enough for the observers to look.
                tokio::time::sleep(dlock_core::limits::OBSERVE_INTERVAL * 3).await;
                leading.fetch_sub(1, Ordering::SeqCst);
                leadership.resign().await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    tokio::time::sleep(dlock_core::limits::OBSERVE_INTERVAL * 3).await;
    let terms = terms.lock().map(|t| t.clone()).unwrap_or_default();
    ensure!(
        terms.len() == CANDIDATES * TERMS_EACH,
        "{} terms for {} leaderships",
        terms.len(),
        CANDIDATES * TERMS_EACH
    );
    for observer in &observers {
        if observer.is_finished() {
            bail!("an observer's stream ended while the election went on");
        }
        observer.abort();
    }
    for (i, seen) in sightings.iter().enumerate() {
        let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
        check_sightings(i, &seen, &terms)?;
    }
    Ok(())
}

/// What an observer saw: a term and the value published with it.
type Sighting = (Option<FencingToken>, Option<String>);

/// Observer `i` saw terms in increasing order, each with the value of the candidate that led
/// it, and most of the terms (each lasted three looks).
fn check_sightings(
    i: usize,
    seen: &[Sighting],
    terms: &BTreeMap<FencingToken, String>,
) -> anyhow::Result<()> {
    let mut last = None;
    for (term, value) in seen {
        let term = term.with_context(|| format!("observer {i} saw a leader without a term"))?;
        ensure!(
            last.is_none_or(|last| term > last),
            "observer {i} saw term {term} after term {last:?}: {seen:?}"
        );
        last = Some(term);
        let led_by = terms
            .get(&term)
            .with_context(|| format!("observer {i} saw term {term}, which nobody led"))?;
        ensure!(
            value.as_deref() == Some(led_by.as_str()),
            "observer {i} saw term {term} with value {value:?}; {led_by} led it"
        );
    }
    ensure!(
        seen.len() * 2 >= terms.len(),
        "observer {i} saw only {} of {} terms",
        seen.len(),
        terms.len()
    );
    Ok(())
}

/// Resigning hands leadership over at once (long before the TTL), to a higher term that
/// observers see with the new leader's value.
pub(crate) async fn resigning_hands_over_at_once(cx: Ctx) -> anyhow::Result<()> {
    let [a, b, c] = cx.clients().await?;
    let name = cx.key("resign");
    let (first, second, watching) = (a.election(&name)?, b.election(&name)?, c.election(&name)?);
    let opts = cx.opts(cx.long_ttl());
    let leading = first.campaign("first", &opts).await?;
    let observed = watching.leader().await?.context("no leader seen")?;
    ensure!(
        observed.value.as_deref() == Some("first") && observed.term == Some(leading.term()),
        "the observer saw {observed:?}, not the first leader of term {}",
        leading.term()
    );
    ensure!(
        second.try_campaign("second", &opts).await?.is_none(),
        "a second candidate led beside the first"
    );
    let waiting = {
        let opts = opts.clone().with_wait(Duration::from_secs(60));
        tokio::spawn(async move { second.campaign("second", &opts).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let old = leading.term();
    let resigned_at = Instant::now();
    leading.resign().await?;
    let next = tokio::time::timeout(cx.slack() * 2, waiting)
        .await
        .context("nobody took over after the leader resigned")???;
    ensure!(
        resigned_at.elapsed() <= cx.slack(),
        "the hand-over took {:?}",
        resigned_at.elapsed()
    );
    if cx.fenced() {
        ensure!(
            next.term() > old,
            "the new term {} is not above the old {old}",
            next.term()
        );
    }
    let mut stream = Box::pin(watching.observe());
    let seen = tokio::time::timeout(cx.slack(), stream.next())
        .await
        .context("the observer saw nothing")?
        .context("the observer's stream ended")??;
    ensure!(
        seen.value.as_deref() == Some("second") && seen.term == Some(next.term()),
        "the observer saw {seen:?} after the hand-over to term {}",
        next.term()
    );
    next.resign().await?;
    Ok(())
}

/// A leader that stops renewing loses its leadership when the TTL ends (its state says lost),
/// and the next leader's term is above it, so a fenced resource refuses the old leader.
pub(crate) async fn a_leader_that_stops_renewing_is_lost(cx: Ctx) -> anyhow::Result<()> {
    let [a, b] = cx.clients().await?;
    let name = cx.key("paused");
    let (first, second) = (a.election(&name)?, b.election(&name)?);
    let old = first.campaign("paused", &cx.opts(cx.ttl())).await?;
    let fence = dlock_core::Fenced::new(0u32);
    fence
        .write(old.term(), |n| *n += 1)
        .context("the leader's first write was refused")?;
    let next = second
        .campaign(
            "next",
            &cx.opts(cx.long_ttl()).with_wait(cx.ttl() + cx.slack() * 2),
        )
        .await
        .context("the next candidate never led after the old leader stopped renewing")?;
    ensure!(
        matches!(old.state(), LeaseState::Lost(_)),
        "the old leader still believes it leads: {:?}",
        old.state()
    );
    if cx.fenced() {
        fence
            .write(next.term(), |n| *n += 1)
            .context("the new leader's write was refused")?;
        ensure!(
            fence.write(old.term(), |n| *n += 1).is_err(),
            "the fence took the old leader's late write"
        );
    }
    next.resign().await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// acquire_all

/// Clients naming overlapping sets in different orders all finish (no deadlock), no key has
/// two holders, and each key of a hold has a token of its own.
pub(crate) async fn acquire_all_does_not_deadlock(cx: Ctx) -> anyhow::Result<()> {
    const ROUNDS: usize = 5;
    let sets: [&[&str]; 4] = [&["a", "b", "c"], &["c", "b"], &["b", "d", "a"], &["d", "c"]];
    let inside: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let opts = cx
        .opts(cx.long_ttl())
        .with_wait(Duration::from_secs(60) + cx.slack());
    let mut tasks = Vec::new();
    for (c, set) in sets.iter().enumerate() {
        let client = cx.client().await?;
        let keys: Vec<String> = set.iter().map(|k| cx.key(k)).collect();
        let (opts, inside, violations) = (opts.clone(), inside.clone(), violations.clone());
        tasks.push(tokio::spawn(async move {
            let names: Vec<&str> = keys.iter().map(String::as_str).collect();
            for round in 0..ROUNDS {
                let all = client
                    .acquire_all(&names, &opts)
                    .await
                    .with_context(|| format!("client {c} round {round}"))?;
                ensure!(
                    all.leases().len() == names.len(),
                    "{} leases for {} keys",
                    all.leases().len(),
                    names.len()
                );
                enter_all(&inside, &violations, &names, c);
                tokio::time::sleep(Duration::from_millis(10)).await;
                leave_all(&inside, &names);
                all.release().await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let violations = violations.lock().map(|v| v.clone()).unwrap_or_default();
    ensure!(violations.is_empty(), "{}", violations.join("; "));
    Ok(())
}

fn enter_all(
    inside: &Mutex<BTreeMap<String, usize>>,
    violations: &Mutex<Vec<String>>,
    keys: &[&str],
    client: usize,
) {
    if let Ok(mut inside) = inside.lock() {
        for key in keys {
            let count = inside.entry(key.to_string()).or_default();
            *count += 1;
            if *count > 1 {
                note(violations, format!("client {client} shares {key}"));
            }
        }
    }
}

fn leave_all(inside: &Mutex<BTreeMap<String, usize>>, keys: &[&str]) {
    if let Ok(mut inside) = inside.lock() {
        for key in keys {
            if let Some(count) = inside.get_mut(*key) {
                *count -= 1;
            }
        }
    }
}

/// With one key busy, `acquire_all` (one attempt, a timed-out wait, a dropped wait) leaves
/// none of the other keys held; once the key is free, it takes every key.
pub(crate) async fn acquire_all_takes_every_key_or_none(cx: Ctx) -> anyhow::Result<()> {
    let [client, other] = cx.clients().await?;
    let keys = [cx.key("x"), cx.key("y"), cx.key("z")];
    let names: Vec<&str> = keys.iter().map(String::as_str).collect();
    let opts = cx.opts(cx.long_ttl());
    let busy = other.acquire(&keys[1], &opts).await?;
    ensure!(
        client.try_acquire_all(&names, &opts).await?.is_none(),
        "one attempt took every key while one was busy"
    );
    let all_free = |what: &'static str| free_but(&cx, &other, [&keys[0], &keys[2]], what);
    all_free("after one attempt").await?;
    let timed_out = client
        .acquire_all(&names, &opts.clone().with_wait(Duration::from_millis(300)))
        .await;
    ensure!(
        matches!(timed_out, Err(Error::Timeout { .. })),
        "a wait for a busy key did not time out: {:?}",
        timed_out.map(|all| all.leases().len())
    );
    all_free("after a timed-out wait").await?;
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        client.acquire_all(&names, &opts.clone().with_wait(Duration::from_secs(30))),
    )
    .await;
    ensure!(dropped.is_err(), "a wait for a busy key ended early");
    let dropped_at = Instant::now();
    for key in [&keys[0], &keys[2]] {
        let lease = cx
            .acquire_promptly(&other, key, dropped_at, "a dropped acquire_all kept a key")
            .await?;
        lease.release().await?;
    }
    let released_at = Instant::now();
    busy.release().await?;
    let all = client
        .acquire_all(&names, &opts.clone().with_wait(cx.slack()))
        .await
        .context("every key was free, yet acquire_all failed")?;
    ensure!(
        released_at.elapsed() <= cx.slack(),
        "acquire_all took {:?}",
        released_at.elapsed()
    );
    for key in &keys {
        ensure!(
            all.fencing_token(key).is_some(),
            "no lease on {key} in the hold"
        );
    }
    for key in &keys {
        cx.ensure_busy(&other, key, "a key of the hold was free")
            .await?;
    }
    all.release().await?;
    Ok(())
}

/// Each of `keys` is free for `client` now; fails with `what` otherwise.
async fn free_but<const N: usize>(
    cx: &Ctx,
    client: &Arc<dyn DistributedLock>,
    keys: [&String; N],
    what: &str,
) -> anyhow::Result<()> {
    for key in keys {
        let lease = client
            .try_acquire(key, &cx.opts(cx.ttl()))
            .await?
            .with_context(|| format!("{key} stayed held {what}"))?;
        lease.release().await?;
    }
    Ok(())
}

/// Readers and writers that give up waiting (timed out or dropped) leave no place in the
/// queue: once the writer leaves, a new writer gets in at once.
pub(crate) async fn abandoned_rw_waiters_leave_nothing(cx: Ctx) -> anyhow::Result<()> {
    let [a, b, c] = cx.clients().await?;
    let name = cx.key("abandoned-rw");
    let (holder, quitter, last) = (a.rw(&name)?, b.rw(&name)?, c.rw(&name)?);
    let opts = cx.opts(cx.long_ttl());
    let writing = holder
        .try_write(&opts)
        .await?
        .context("a free write was refused")?;
    let short = opts.clone().with_wait(Duration::from_millis(200));
    super::expect_timeout(
        quitter.read(&short).await,
        "a reader got in beside a writer",
    )?;
    super::expect_timeout(quitter.write(&short).await, "a second writer got in")?;
    let long = opts.clone().with_wait(Duration::from_secs(30));
    for read in [true, false] {
        let gave_up = if read {
            tokio::time::timeout(Duration::from_millis(200), quitter.read(&long)).await
        } else {
            tokio::time::timeout(Duration::from_millis(200), quitter.write(&long)).await
        };
        ensure!(gave_up.is_err(), "a waiter got in beside a writer");
    }
    let released_at = Instant::now();
    writing.release().await?;
    let next = last
        .write(&opts.clone().with_wait(cx.slack()))
        .await
        .context("after the waiters gave up, the free lock was not granted to a writer")?;
    ensure!(
        released_at.elapsed() <= cx.slack(),
        "the writer got in only {:?} after the release",
        released_at.elapsed()
    );
    next.release().await?;
    Ok(())
}

/// Candidates that give up campaigning (timed out or dropped) leave no candidacy: when the
/// leader resigns, nobody leads until a live candidate campaigns, and it leads at once.
pub(crate) async fn abandoned_campaigns_leave_no_candidacy(cx: Ctx) -> anyhow::Result<()> {
    let [a, b, c] = cx.clients().await?;
    let name = cx.key("abandoned-campaign");
    let (leader, quitter, last) = (a.election(&name)?, b.election(&name)?, c.election(&name)?);
    let opts = cx.opts(cx.long_ttl());
    let leading = leader.campaign("leader", &opts).await?;
    let timed_out = quitter
        .campaign(
            "quitter",
            &opts.clone().with_wait(Duration::from_millis(200)),
        )
        .await;
    ensure!(
        matches!(timed_out, Err(Error::Timeout { .. })),
        "a campaign beside a leader did not time out: {:?}",
        timed_out.map(|l| l.term())
    );
    let dropped = tokio::time::timeout(
        Duration::from_millis(200),
        quitter.campaign("quitter", &opts.clone().with_wait(Duration::from_secs(30))),
    )
    .await;
    ensure!(dropped.is_err(), "a campaign beside a leader won");
    let resigned_at = Instant::now();
    leading.resign().await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    if let Some(ghost) = last.leader().await? {
        bail!("after the leader resigned, an abandoned candidacy leads: {ghost:?}");
    }
    let next = last
        .campaign("last", &opts.clone().with_wait(cx.slack()))
        .await
        .context("a live candidate could not lead after the others gave up")?;
    ensure!(
        resigned_at.elapsed() <= cx.slack() + Duration::from_millis(300),
        "the live candidate led only {:?} after the resignation",
        resigned_at.elapsed()
    );
    next.resign().await?;
    Ok(())
}
