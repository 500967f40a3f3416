//! The semaphore, the read-write lock and the election against real servers: never more than
//! the permits under contention, disagreeing permits refused, a crashed holder's permit back
//! after its TTL, readers sharing and a writer excluding, a waiting writer not starved by new
//! readers (and leaving nothing behind when it gives up), election terms that grow and a
//! resignation that hands over at once.
//!
//! Self-contained, so that the Redlock tests run the read-write and election cases too: each
//! case gets a [`Connect`] that makes an independent client of the service under test.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use dlock_core::backend::{LockKey, LockRequest, Primitive};
use dlock_core::inspect::Holding;
use dlock_core::{Backoff, DistributedLock, DistributedLockExt, Error, LockOptions, OwnerToken};
use dlock_testkit::case;
use dlock_testkit::trials::Case;

/// Makes an independent client (its own connections) of the service under test.
pub type Connect = Arc<dyn Fn() -> dlock_compliance::subject::ClientFuture + Send + Sync + 'static>;

/// What a notified hand-over may take at most on this noisy machine.
const PROMPT: Duration = Duration::from_millis(750);

/// The semaphore cases (single Redis and Cluster).
pub fn semaphore_cases() -> Vec<(&'static str, Case<Connect>)> {
    vec![
        case!(a_semaphore_never_has_more_holders_than_permits),
        case!(disagreeing_permits_are_refused_while_held),
        case!(a_crashed_holders_permit_returns_after_its_ttl),
    ]
}

/// The read-write lock and election cases (every backend of this workspace's Redis crates).
pub fn rw_and_election_cases() -> Vec<(&'static str, Case<Connect>)> {
    vec![
        case!(readers_share_and_a_writer_excludes),
        case!(a_waiting_writer_is_not_starved_by_new_readers),
        case!(a_writer_that_gives_up_leaves_no_mark),
        case!(election_terms_grow_and_resign_hands_over),
    ]
}

/// Every case.
pub fn cases() -> Vec<(&'static str, Case<Connect>)> {
    let mut cases = semaphore_cases();
    cases.extend(rw_and_election_cases());
    cases
}

fn unique(name: &str) -> String {
    format!("dlock-prim-test/{:016x}/{name}", rand::random::<u64>())
}

async fn clients(connect: &Connect, n: usize) -> anyhow::Result<Vec<Arc<dyn DistributedLock>>> {
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        clients.push(connect().await?);
    }
    Ok(clients)
}

fn quick_retry() -> Backoff {
    Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(100),
        multiplier: 2.0,
        jitter: 0.5,
    }
}

/// How a waiter of the primitive `view` waits, and how soon after a release it must be served:
/// where the view declares release notifications, a poll so slow (30 s) that only the
/// notification explains a prompt hand-over; without (Redlock's primitives), a quick poll.
fn hand_over(view: &Arc<dyn DistributedLock>) -> (Backoff, Duration) {
    if view.capabilities().notifies_waiters {
        let slow = Backoff {
            initial: Duration::from_secs(30),
            max: Duration::from_secs(30),
            multiplier: 1.0,
            jitter: 0.0,
        };
        (slow, PROMPT)
    } else {
        (quick_retry(), PROMPT)
    }
}

/// Six tasks on three clients take a 3-permit semaphore 8 times each; no more than 3 ever
/// hold it together, all 3 are used, and every grant has its own fencing token.
pub async fn a_semaphore_never_has_more_holders_than_permits(
    connect: Connect,
) -> anyhow::Result<()> {
    let clients = clients(&connect, 3).await?;
    let name = unique("sem");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for task in 0..6 {
        let client = clients[task % 3].clone();
        let (name, inside, most, tokens) =
            (name.clone(), inside.clone(), most.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            let semaphore = client.semaphore(&name, 3)?;
            let opts = LockOptions::new(Duration::from_secs(5))
                .with_wait(Duration::from_secs(30))
                .with_retry(quick_retry());
            for _ in 0..8 {
                let lease = semaphore.acquire(&opts).await?;
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokens
                    .lock()
                    .map_err(|_| anyhow::anyhow!("poisoned"))?
                    .push(lease.fencing_token());
                tokio::time::sleep(Duration::from_millis(rand::random_range(5..40))).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                lease.release().await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let most = most.load(Ordering::SeqCst);
    ensure!(most <= 3, "{most} holders of a 3-permit semaphore at once");
    ensure!(
        most == 3,
        "the permits were never all used (at most {most})"
    );
    let mut tokens = tokens
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    let count = tokens.len();
    tokens.sort();
    tokens.dedup();
    ensure!(tokens.len() == count, "fencing tokens repeat");
    Ok(())
}

/// While a 2-permit semaphore is held, asking with 3 permits fails with `Mismatch` and takes
/// nothing; once it is free, 3 permits are accepted.
pub async fn disagreeing_permits_are_refused_while_held(connect: Connect) -> anyhow::Result<()> {
    let clients = clients(&connect, 2).await?;
    let name = unique("mismatch");
    let opts = LockOptions::new(Duration::from_secs(10));
    let held = clients[0]
        .semaphore(&name, 2)?
        .try_acquire(&opts)
        .await?
        .context("a free semaphore")?;
    let other = clients[1].semaphore(&name, 3)?;
    match other.try_acquire(&opts).await {
        Err(Error::Mismatch { .. }) => {}
        other => anyhow::bail!("3 permits against 2: {other:?}"),
    }
    match clients[1].semaphore(&name, 2)?.holding().await? {
        Holding::Held(holder) => ensure!(
            holder.holders == Some(1),
            "the refused request took a permit: {holder:?}"
        ),
        other => anyhow::bail!("not held: {other:?}"),
    }
    held.release().await?;
    let agreed = other
        .try_acquire(&opts)
        .await?
        .context("3 permits once the semaphore is free")?;
    agreed.release().await?;
    Ok(())
}

/// A holder that takes the only permit and never renews nor releases (a crash): the permit is
/// busy until its TTL and free right after.
pub async fn a_crashed_holders_permit_returns_after_its_ttl(
    connect: Connect,
) -> anyhow::Result<()> {
    let clients = clients(&connect, 2).await?;
    let name = unique("crash");
    let key = LockKey::new(&name)?;
    let ttl = Duration::from_millis(1_500);
    let view = clients[0].primitive(&Primitive::semaphore(1))?;
    let crashed = LockRequest {
        key: &key,
        owner: OwnerToken::random(),
        ttl,
    };
    let taken = Instant::now();
    ensure!(
        matches!(
            view.try_lock(&crashed).await?,
            dlock_core::backend::Attempt::Acquired(_)
        ),
        "the first permit"
    );
    let semaphore = clients[1].semaphore(&name, 1)?;
    let opts = LockOptions::new(Duration::from_secs(5));
    ensure!(
        semaphore.try_acquire(&opts).await?.is_none(),
        "the crashed holder's permit was free at once"
    );
    let waited = semaphore
        .acquire(&opts.clone().with_wait(Duration::from_secs(10)))
        .await?;
    let after = taken.elapsed();
    ensure!(after >= ttl, "granted after {after:?}, before the TTL");
    ensure!(
        after <= ttl + Duration::from_secs(2),
        "granted only after {after:?}"
    );
    waited.release().await?;
    Ok(())
}

/// Two readers hold together; a writer is refused while they do, takes it once they left, and
/// refuses readers meanwhile; its token is above both readers'.
pub async fn readers_share_and_a_writer_excludes(connect: Connect) -> anyhow::Result<()> {
    let clients = clients(&connect, 3).await?;
    let name = unique("rw");
    let opts = LockOptions::new(Duration::from_secs(10));
    let a = clients[0]
        .rw(&name)?
        .try_read(&opts)
        .await?
        .context("reader a")?;
    let b = clients[1]
        .rw(&name)?
        .try_read(&opts)
        .await?
        .context("reader b")?;
    match clients[2].rw(&name)?.holding().await? {
        Holding::Held(holder) => ensure!(holder.holders == Some(2), "{holder:?}"),
        other => anyhow::bail!("not held: {other:?}"),
    }
    let writer = clients[2].rw(&name)?;
    ensure!(
        writer.try_write(&opts).await?.is_none(),
        "a writer beside readers"
    );
    let tokens = [a.fencing_token(), b.fencing_token()];
    a.release().await?;
    b.release().await?;
    let w = writer.try_write(&opts).await?.context("the writer alone")?;
    ensure!(
        tokens.iter().all(|t| *t < w.fencing_token()),
        "writer token {:?} not above the readers' {tokens:?}",
        w.fencing_token()
    );
    ensure!(
        clients[0].rw(&name)?.try_read(&opts).await?.is_none(),
        "a reader beside the writer"
    );
    ensure!(
        clients[1].rw(&name)?.try_write(&opts).await?.is_none(),
        "a second writer"
    );
    w.release().await?;
    let again = clients[0]
        .rw(&name)?
        .try_read(&opts)
        .await?
        .context("reader after")?;
    again.release().await?;
    Ok(())
}

/// A reader holds and a writer waits: new readers are refused although only readers hold; when
/// the reader leaves, the writer gets it at once (woken, not polling) with a greater token.
pub async fn a_waiting_writer_is_not_starved_by_new_readers(
    connect: Connect,
) -> anyhow::Result<()> {
    let clients = clients(&connect, 3).await?;
    let name = unique("starve");
    let opts = LockOptions::new(Duration::from_secs(10));
    let first = clients[0]
        .rw(&name)?
        .try_read(&opts)
        .await?
        .context("reader")?;
    let (retry, prompt) = hand_over(&clients[1].primitive(&Primitive::Write)?);
    let writer = {
        let rw = clients[1].rw(&name)?;
        let opts = opts
            .clone()
            .with_wait(Duration::from_secs(20))
            .with_retry(retry);
        tokio::spawn(async move {
            let lease = rw.write(&opts).await;
            (lease, Instant::now())
        })
    };
    // Once the writer stands in line (within the slack of its first attempt), new readers wait.
    let late = clients[2].rw(&name)?;
    let queued_by = Instant::now() + Duration::from_secs(3);
    while let Some(read) = late.try_read(&opts).await? {
        read.release().await?;
        ensure!(
            Instant::now() <= queued_by,
            "a new reader passed the waiting writer"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(!writer.is_finished(), "the writer beside a reader");
    for _ in 0..5 {
        ensure!(
            late.try_read(&opts).await?.is_none(),
            "a new reader passed the waiting writer"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first_token = first.fencing_token();
    let left = Instant::now();
    first.release().await?;
    let (lease, got) = writer.await?;
    let lease = lease.context("the waiting writer")?;
    ensure!(got - left <= prompt, "the writer took {:?}", got - left);
    ensure!(
        lease.fencing_token() > first_token,
        "writer token not above the reader's"
    );
    lease.release().await?;
    let after = late
        .try_read(&opts)
        .await?
        .context("a reader after the writer")?;
    after.release().await?;
    Ok(())
}

/// A writer that gives up waiting (timeout) withdraws its intent: readers are admitted at once.
pub async fn a_writer_that_gives_up_leaves_no_mark(connect: Connect) -> anyhow::Result<()> {
    let clients = clients(&connect, 3).await?;
    let name = unique("gives-up");
    let opts = LockOptions::new(Duration::from_secs(10));
    let reader = clients[0]
        .rw(&name)?
        .try_read(&opts)
        .await?
        .context("reader")?;
    let waited = clients[1]
        .rw(&name)?
        .write(
            &opts
                .clone()
                .with_wait(Duration::from_millis(400))
                .with_retry(quick_retry()),
        )
        .await;
    ensure!(
        matches!(waited, Err(Error::Timeout { .. })),
        "the writer: {waited:?}"
    );
    let next = clients[2]
        .rw(&name)?
        .try_read(&opts)
        .await?
        .context("a reader right after the writer gave up")?;
    next.release().await?;
    reader.release().await?;
    Ok(())
}

/// Candidate a leads (observers see its value and term); b waits; a resigns and b leads at once
/// with a greater term, which an observer sees too.
pub async fn election_terms_grow_and_resign_hands_over(connect: Connect) -> anyhow::Result<()> {
    let clients = clients(&connect, 3).await?;
    let name = unique("elect");
    let opts = LockOptions::new(Duration::from_secs(10));
    let a = clients[0]
        .election(&name)?
        .campaign("host-a:80", &opts)
        .await?;
    let observer = clients[2].election(&name)?;
    let seen = observer.leader().await?.context("a leader")?;
    ensure!(seen.value.as_deref() == Some("host-a:80"), "{seen:?}");
    ensure!(
        seen.term == Some(a.term()),
        "{seen:?} vs term {:?}",
        a.term()
    );
    let (retry, prompt) = hand_over(&clients[1].primitive(&Primitive::candidate("b"))?);
    let b = {
        let election = clients[1].election(&name)?;
        let opts = opts
            .clone()
            .with_wait(Duration::from_secs(20))
            .with_retry(retry);
        tokio::spawn(async move {
            let leadership = election.campaign("host-b:80", &opts).await;
            (leadership, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(!b.is_finished(), "two leaders");
    let a_term = a.term();
    let resigned = Instant::now();
    a.resign().await?;
    let (b, led) = b.await?;
    let b = b.context("candidate b")?;
    ensure!(
        led - resigned <= prompt,
        "hand-over took {:?}",
        led - resigned
    );
    ensure!(b.term() > a_term, "term {:?} after {a_term:?}", b.term());
    let seen = observer.leader().await?.context("the new leader")?;
    ensure!(
        seen.value.as_deref() == Some("host-b:80") && seen.term == Some(b.term()),
        "{seen:?}"
    );
    match clients[2]
        .primitive(&Primitive::observer())?
        .try_lock(&LockRequest {
            key: &LockKey::new(&name)?,
            owner: OwnerToken::random(),
            ttl: Duration::from_secs(1),
        })
        .await
    {
        Err(Error::InvalidInput { .. }) => {}
        other => anyhow::bail!("an observer campaigned: {other:?}"),
    }
    b.resign().await?;
    ensure!(
        observer.leader().await?.is_none(),
        "a leader after both resigned"
    );
    Ok(())
}
