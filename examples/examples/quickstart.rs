//! Quickstart: one lock key, a fenced resource, and the paused holder that fencing exists for.
//!
//! Run it with `cargo run -p examples --example quickstart`. It needs no server: by default it
//! uses `memory://`, the in-process backend ([`InMemoryLock`](dlock::InMemoryLock)), which keeps
//! real TTLs, owner checks and fencing tokens, so everything below behaves as it would against a
//! lock server. Set `DLOCK_URL` to run the same program on a server, with that backend's feature,
//! e.g. `DLOCK_URL=redis://localhost:6379 cargo run -p examples --features redis --example
//! quickstart` (see `dlock::connect` for every URL form). It prints a timeline and exits with a non-zero status if
//! anything it demonstrates does not hold.
//!
//! 1. **Taking turns.** Four workers contend for the key `"ledger"` with
//!    [`acquire`](Locks::acquire) (waiting up to a deadline). Each holder appends an
//!    entry to a ledger guarded by a [`Fenced`] value, presenting its lease's fencing token. The
//!    example counts concurrent holders (never more than one) and checks that the tokens admitted by
//!    the ledger strictly increase.
//! 2. **The paused holder.** A lock alone cannot make a resource safe: a holder can be paused
//!    (a stop-the-world GC, a swapped-out VM, a slow disk) past the end of its lease, and when it
//!    resumes it still believes it holds the lock. This is the case Martin Kleppmann describes in
//!    "How to do distributed locking" (2016). Here `worker-1` takes the lock with a 300 ms TTL and
//!    no auto-renew, then sleeps for 700 ms. Its lease's [`lost`](dlock::Lease::lost) future
//!    fires when the validity runs out, `worker-2` takes the lock with a higher fencing token and
//!    writes, and when `worker-1` wakes and attempts its late write with its old token, the ledger
//!    rejects it with a [`StaleToken`](dlock::StaleToken) error. Fencing, not timing, is what
//!    keeps the ledger correct.
//! 3. **Auto-renew.** [`with_lock`](Locks::with_lock) with a 200 ms TTL and
//!    [auto-renew](LockOptions::with_auto_renew) runs 500 ms of work: the lease is renewed in the
//!    background, nobody else can take the key meanwhile, and the lock is released at the end.

use std::error::Error;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Fenced, FencingToken, LeaseEnd, LeaseState, LockOptions, Locks, LostReason, Released};

/// The one lock key, named after the resource it guards.
const KEY: &str = "ledger";
/// Workers contending in part 1, and how many times each takes the lock.
const WORKERS: usize = 4;
const ROUNDS: usize = 2;
/// Part 2: the short TTL of the paused holder, and how long it is paused.
const SHORT_TTL: Duration = Duration::from_millis(300);
const PAUSE: Duration = Duration::from_millis(700);

type BoxError = Box<dyn Error + Send + Sync>;
type Outcome<T = ()> = Result<T, BoxError>;

/// One ledger line, written by a lock holder.
#[derive(Debug)]
struct Entry {
    writer: String,
    token: FencingToken,
    text: String,
}

/// The guarded resource: a ledger that admits a write only with a fencing token at least as high
/// as any it has seen (a real store does the same check in its own transaction).
type Ledger = Fenced<Vec<Entry>>;

fn append(ledger: &Ledger, writer: &str, token: FencingToken, text: &str) -> Outcome<usize> {
    let position = ledger.write(token, |entries| {
        entries.push(Entry {
            writer: writer.to_string(),
            token,
            text: text.to_string(),
        });
        entries.len()
    })?;
    Ok(position)
}

/// Prints timeline lines with the time elapsed since the start.
#[derive(Debug, Clone, Copy)]
struct Timeline {
    start: Instant,
}

impl Timeline {
    fn log(&self, who: &str, what: impl fmt::Display) {
        let ms = self.start.elapsed().as_millis();
        println!("[{ms:>4} ms] {who} {what}");
    }

    fn heading(&self, title: &str) {
        println!("\n-- {title}");
    }
}

/// A property the example demonstrates did not hold.
struct Broken(String);

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "demonstration failed: {}", self.0)
    }
}

// `main` prints a returned error with `Debug`: make that the readable message.
impl fmt::Debug for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Error for Broken {}

fn ensure(holds: bool, what: impl Into<String>) -> Outcome {
    if holds {
        Ok(())
    } else {
        Err(Broken(what.into()).into())
    }
}

#[tokio::main]
async fn main() -> Outcome {
    let timeline = Timeline {
        start: Instant::now(),
    };
    // Services hold the backend as a trait object, chosen at run time by one setting.
    let url = match std::env::var("DLOCK_URL") {
        Ok(url) => url,
        Err(std::env::VarError::NotPresent) => "memory://".to_owned(),
        Err(e) => return Err(format!("DLOCK_URL: {e}").into()),
    };
    let locks = dlock::connect(&url).await?;
    println!(
        "backend: {} ({})",
        locks.backend().backend_name(),
        locks.url()
    );
    let ledger = Arc::new(Ledger::new(Vec::new()));

    timeline.heading(&format!(
        "1. {WORKERS} workers take turns on {KEY:?}, writing with their fencing tokens"
    ));
    take_turns(timeline, &locks, &ledger).await?;

    timeline.heading("2. A holder paused past its TTL is fenced off");
    paused_holder(timeline, &locks, &ledger).await?;

    timeline.heading("3. with_lock + auto-renew: work longer than the TTL");
    auto_renew(timeline, &locks, &ledger).await?;

    let tokens: Vec<u64> = ledger.read(|entries| entries.iter().map(|e| e.token.get()).collect());
    ensure(
        tokens.windows(2).all(|w| w[0] < w[1]),
        format!("ledger tokens are not strictly increasing: {tokens:?}"),
    )?;
    println!(
        "\nledger: {} entries, tokens {tokens:?} (strictly increasing; the late write is not there)",
        tokens.len()
    );
    if let Some(last) = ledger.read(|entries| {
        entries
            .last()
            .map(|e| format!("{} wrote {:?}", e.writer, e.text))
    }) {
        println!("last entry: {last}");
    }
    println!("OK: mutual exclusion held, tokens increased, the stale write was rejected");
    Ok(())
}

/// Part 1: workers contend for one key; at most one holds it at a time, tokens increase.
async fn take_turns(timeline: Timeline, locks: &Locks, ledger: &Arc<Ledger>) -> Outcome {
    let holders = Arc::new(AtomicUsize::new(0));
    let most_holders = Arc::new(AtomicUsize::new(0));
    let opts = LockOptions::new(Duration::from_secs(5)).with_wait(Duration::from_secs(5));

    let mut workers = Vec::new();
    for n in 1..=WORKERS {
        let (locks, ledger, opts) = (locks.clone(), ledger.clone(), opts.clone());
        let (holders, most_holders) = (holders.clone(), most_holders.clone());
        workers.push(tokio::spawn(async move {
            let name = format!("worker-{n}");
            for round in 1..=ROUNDS {
                let lease = locks.acquire(KEY, &opts).await?;
                let now_holding = holders.fetch_add(1, Ordering::SeqCst) + 1;
                most_holders.fetch_max(now_holding, Ordering::SeqCst);
                let token = lease.fencing_token();
                timeline.log(
                    &name,
                    format_args!("acquired {KEY:?} (fencing token {token})"),
                );

                tokio::time::sleep(Duration::from_millis(10)).await; // the guarded work
                let text = format!("{name}, round {round}");
                let position = append(&ledger, &name, token, &text)?;
                timeline.log(
                    &name,
                    format_args!("wrote ledger entry #{position} with token {token}, releasing"),
                );

                holders.fetch_sub(1, Ordering::SeqCst);
                let released = lease.release().await?;
                ensure(
                    released == Released::Released,
                    format!("{name}'s release found {released:?}"),
                )?;
                // Work outside the lock, so that the others get their turn.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Outcome::Ok(())
        }));
    }
    for worker in workers {
        worker.await??;
    }

    let most = most_holders.load(Ordering::SeqCst);
    let tokens: Vec<u64> = ledger.read(|entries| entries.iter().map(|e| e.token.get()).collect());
    ensure(most == 1, format!("{most} workers held {KEY:?} at once"))?;
    ensure(
        tokens.len() == WORKERS * ROUNDS,
        format!(
            "expected {} entries, found {}",
            WORKERS * ROUNDS,
            tokens.len()
        ),
    )?;
    ensure(
        tokens.windows(2).all(|w| w[0] < w[1]),
        format!("tokens are not strictly increasing: {tokens:?}"),
    )?;
    timeline.log(
        "check",
        format_args!("at most {most} holder at a time; tokens {tokens:?} strictly increase"),
    );
    Ok(())
}

/// Part 2: the Kleppmann case. A holder is paused past its TTL, another takes over, and the
/// paused holder's late write is rejected by the fence.
async fn paused_holder(timeline: Timeline, locks: &Locks, ledger: &Arc<Ledger>) -> Outcome {
    // No auto-renew: nothing keeps the lease alive while its holder is paused.
    let short = LockOptions::new(SHORT_TTL).with_wait(Duration::from_secs(2));
    let lease = locks.acquire(KEY, &short).await?;
    let old = lease.fencing_token();
    timeline.log(
        "worker-1",
        format_args!(
            "acquired {KEY:?} (fencing token {old}, TTL {} ms, no auto-renew)",
            SHORT_TTL.as_millis()
        ),
    );
    let position = append(ledger, "worker-1", old, "worker-1, before the pause")?;
    timeline.log(
        "worker-1",
        format_args!("wrote ledger entry #{position} with token {old}"),
    );

    // Whoever else watches the lease (a supervisor, the task doing the work) learns the moment
    // it is lost, without asking the server.
    let lost = lease.lost();
    let watchdog = tokio::spawn(async move {
        let reason = lost.await;
        timeline.log(
            "watchdog",
            format_args!("worker-1's lease is lost: {reason}"),
        );
        reason
    });

    // Another worker wants the lock too; it gets it once the paused holder's TTL has run out.
    let rival = {
        let (locks, ledger) = (locks.clone(), ledger.clone());
        let opts = LockOptions::new(Duration::from_secs(5)).with_wait(Duration::from_secs(2));
        tokio::spawn(async move {
            let lease = locks.acquire(KEY, &opts).await?;
            let new = lease.fencing_token();
            timeline.log(
                "worker-2",
                format_args!("acquired {KEY:?} (fencing token {new}) after worker-1's TTL ran out"),
            );
            let position = append(
                &ledger,
                "worker-2",
                new,
                "worker-2, while worker-1 is paused",
            )?;
            timeline.log(
                "worker-2",
                format_args!("wrote ledger entry #{position} with token {new}, releasing"),
            );
            lease.release().await?;
            Outcome::Ok(new)
        })
    };

    timeline.log(
        "worker-1",
        format_args!(
            "is paused for {} ms (think: a stop-the-world GC)",
            PAUSE.as_millis()
        ),
    );
    tokio::time::sleep(PAUSE).await;

    // A paused process cannot notice its loss in time: checking the state and then writing is not
    // atomic. We print the state for the reader, but write anyway, as the paused process would.
    let state = lease.state();
    timeline.log(
        "worker-1",
        format_args!(
            "wakes up, lease state: {}; attempts its late write with token {old}",
            state
        ),
    );
    let late = ledger.write(old, |entries| {
        entries.push(Entry {
            writer: "worker-1".to_string(),
            token: old,
            text: "worker-1, LATE write after the pause".to_string(),
        })
    });
    let rejection = match late {
        Ok(()) => {
            return Err(Broken(format!(
                "the ledger accepted worker-1's late write with stale token {old}"
            ))
            .into())
        }
        Err(stale) => stale,
    };
    timeline.log(
        "worker-1",
        format_args!("late write REJECTED by the fence: {rejection}"),
    );
    let released = lease.release().await?;
    timeline.log(
        "worker-1",
        format_args!("release: {released:?} (the lock was no longer worker-1's to free)"),
    );

    let new = rival.await??;
    let reason = watchdog.await?;
    ensure(
        reason == LostReason::Expired,
        format!("worker-1's lease ended with {reason:?}, expected expiry"),
    )?;
    ensure(
        matches!(state, LeaseState::Lost(LostReason::Expired)),
        format!("worker-1's lease was {state:?} after the pause"),
    )?;
    ensure(
        new > old,
        format!("worker-2's token {new} is not above worker-1's {old}"),
    )?;
    ensure(
        rejection.presented == old && rejection.highest == new,
        format!("unexpected rejection {rejection:?}"),
    )?;
    ensure(
        released != Released::Released,
        "worker-1's late release freed a lock it no longer held",
    )?;
    Ok(())
}

/// Part 3: auto-renew keeps a short lease alive for as long as the work runs.
async fn auto_renew(timeline: Timeline, locks: &Locks, ledger: &Arc<Ledger>) -> Outcome {
    let ttl = Duration::from_millis(200);
    let work = Duration::from_millis(500);
    let opts = LockOptions::new(ttl)
        .with_wait(Duration::from_secs(2))
        .with_auto_renew();
    let (probe, guarded) = (locks.clone(), ledger.clone());
    let section = locks
        .with_lock(KEY, &opts, |lease| async move {
            let token = lease.fencing_token();
            timeline.log(
                "worker-3",
                format_args!(
                    "acquired {KEY:?} (fencing token {token}, TTL {} ms, auto-renew); working {} ms",
                    ttl.as_millis(),
                    work.as_millis()
                ),
            );
            tokio::time::sleep(work).await;
            // Long past the first TTL, the key is still taken: the renewals kept it.
            let intruder = probe.try_acquire(KEY, &LockOptions::default()).await?;
            ensure(
                intruder.is_none(),
                "another client took the key while auto-renew should have kept it",
            )?;
            let position = append(&guarded, "worker-3", token, "worker-3, renewed lease")?;
            timeline.log(
                "worker-3",
                format_args!(
                    "still {} after {} ms (a try_acquire by another client found it busy); wrote entry #{position}",
                    lease.state(),
                    work.as_millis()
                ),
            );
            Outcome::Ok(())
        })
        .await?;
    let completed = section.completed_under_lock();
    match section.output {
        Some(result) => result?,
        None => return Err(Broken("the work was cancelled: the lease was lost".into()).into()),
    }
    ensure(
        completed,
        format!("the lease did not last the work: {:?}", section.end),
    )?;
    if let LeaseEnd::Released(outcome) = section.end {
        timeline.log(
            "worker-3",
            format_args!("done, completed under lock; release: {outcome:?}"),
        );
    }
    Ok(())
}
