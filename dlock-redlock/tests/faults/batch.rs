//! Batched renewal (`extend_many`) while masters are down: each lease of a batch gets the answer
//! a single `extend` gives it.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure};
use dlock_core::backend::{Attempt, ExtendRequest, Extension, LeaseRef, LockKey, LockRequest};
use dlock_core::{DistributedLock, Error, OwnerToken, Result};
use dlock_redis::EXTEND_BATCH;
use dlock_redlock::RedlockLock;
use dlock_testkit::case;
use dlock_testkit::fixtures::RedisMasters;
use dlock_testkit::trials::Case;
use tokio::time::Instant;

use crate::support::{self, unique, NODE_TIMEOUT, SLACK};

/// The cases of this module, in the order they run.
pub fn cases() -> Vec<(&'static str, Case<Arc<RedisMasters>>)> {
    vec![
        case!(a_mixed_batch_with_one_master_down_answers_like_extend),
        case!(three_of_five_masters_down_answer_unavailable_per_lease),
        case!(a_large_batch_lets_the_clients_other_requests_through),
        case!(a_batch_without_a_quorum_costs_one_chunks_timeout),
    ]
}

/// The TTL the leases are taken with, and the longer one the batch re-arms them with.
const HELD_TTL: Duration = Duration::from_secs(10);
const RENEWED_TTL: Duration = Duration::from_secs(20);

/// The TTL of the leases left to expire.
const SHORT_TTL: Duration = Duration::from_secs(1);

/// One lease of a trial: its key and owner.
struct Lease {
    key: LockKey,
    owner: OwnerToken,
}

impl Lease {
    fn new(name: &str) -> anyhow::Result<Self> {
        Ok(Lease {
            key: LockKey::new(&unique(name))?,
            owner: OwnerToken::random(),
        })
    }

    fn as_ref(&self) -> LeaseRef<'_> {
        LeaseRef {
            key: &self.key,
            owner: self.owner,
            fencing: None,
        }
    }

    /// Takes the lock for this lease's owner; fails unless granted.
    async fn take(&self, client: &RedlockLock, ttl: Duration) -> anyhow::Result<()> {
        let request = LockRequest {
            key: &self.key,
            owner: self.owner,
            ttl,
        };
        match client.try_lock(&request).await? {
            Attempt::Acquired(_) => Ok(()),
            other => bail!("{} not granted: {other:?}", self.key),
        }
    }
}

/// An answer in a form that compares: the outcome, or the kind of error with its counts.
fn describe(answer: &Result<Extension>) -> String {
    match answer {
        Ok(extension) => format!("{extension:?}"),
        Err(Error::Unavailable {
            reached, needed, ..
        }) => format!("Unavailable(reached {reached}, needed {needed})"),
        Err(Error::InvalidInput { .. }) => "InvalidInput".to_owned(),
        Err(other) => format!("other error: {other}"),
    }
}

/// The batch's answers and those of one `extend` per lease, after the batch.
async fn batch_then_each(
    client: &RedlockLock,
    requests: &[ExtendRequest<'_>],
) -> (Vec<String>, Vec<String>) {
    let batch = client.extend_many(requests).await;
    let mut each = Vec::with_capacity(requests.len());
    for request in requests {
        each.push(describe(&client.extend(&request.lease, request.ttl).await));
    }
    (batch.iter().map(describe).collect(), each)
}

/// `count` leases taken with [`HELD_TTL`].
async fn held_leases(client: &RedlockLock, count: usize) -> anyhow::Result<Vec<Lease>> {
    let mut held = Vec::with_capacity(count);
    for i in 0..count {
        let lease = Lease::new(&format!("held-{i}"))?;
        lease.take(client, HELD_TTL).await?;
        held.push(lease);
    }
    Ok(held)
}

/// The milliseconds `key` has left on the master at `url` (negative: no key or no TTL).
async fn pttl(url: &str, key: &LockKey) -> anyhow::Result<i64> {
    let mut con = support::raw(url).await?;
    Ok(redis::cmd("PTTL")
        .arg(key.as_str())
        .query_async(&mut con)
        .await?)
}

/// With one of five masters stopped, a batch mixing held, expired, taken-over and never-held
/// leases (and one TTL the client refuses) answers each lease as one `extend` does, and really
/// re-arms the held ones on the masters still up.
pub async fn a_mixed_batch_with_one_master_down_answers_like_extend(
    masters: Arc<RedisMasters>,
) -> anyhow::Result<()> {
    support::all_serving(&masters).await?;
    let urls = masters.urls();
    let client = support::client_with(&urls, |b| b).await?;

    let expired: Vec<Lease> = (0..2)
        .map(|i| Lease::new(&format!("expired-{i}")))
        .collect::<anyhow::Result<_>>()?;
    let taken: Vec<Lease> = (0..2)
        .map(|i| Lease::new(&format!("taken-{i}")))
        .collect::<anyhow::Result<_>>()?;
    for lease in expired.iter().chain(&taken) {
        lease.take(&client, SHORT_TTL).await?;
    }
    tokio::time::sleep(SHORT_TTL + Duration::from_millis(500)).await;
    // Another owner now holds the keys of the taken-over leases.
    for lease in &taken {
        let thief = Lease {
            key: lease.key.clone(),
            owner: OwnerToken::random(),
        };
        thief.take(&client, HELD_TTL).await?;
    }
    let held = held_leases(&client, 3).await?;
    let never = Lease::new("never")?;

    masters.member(0)?.stop().await?;

    // Mixed, so that an answer in the wrong position shows.
    let too_short = Duration::from_millis(100);
    let plan: Vec<(&Lease, Duration, &str)> = vec![
        (&held[0], RENEWED_TTL, "Extended"),
        (&expired[0], RENEWED_TTL, "Expired"),
        (&taken[0], RENEWED_TTL, "TakenOver"),
        (&held[1], RENEWED_TTL, "Extended"),
        (&never, RENEWED_TTL, "Expired"),
        (&held[2], too_short, "InvalidInput"),
        (&taken[1], RENEWED_TTL, "TakenOver"),
        (&expired[1], RENEWED_TTL, "Expired"),
    ];
    let requests: Vec<ExtendRequest<'_>> = plan
        .iter()
        .map(|(lease, ttl, _)| ExtendRequest {
            lease: lease.as_ref(),
            ttl: *ttl,
        })
        .collect();
    let expected: Vec<String> = plan.iter().map(|(_, _, e)| (*e).to_owned()).collect();

    let batch = client.extend_many(&requests).await;
    let batch: Vec<String> = batch.iter().map(describe).collect();
    ensure!(batch == expected, "batch {batch:?}, expected {expected:?}");

    // The batch re-armed held-0 and held-1 to the longer TTL on the masters still up; held-2's
    // refused request changed nothing.
    for url in &urls[1..] {
        for lease in &held[..2] {
            let left = pttl(url, &lease.key).await?;
            ensure!(
                left > HELD_TTL.as_millis() as i64,
                "{} has {left} ms left on {url} after a batch re-armed it to {RENEWED_TTL:?}",
                lease.key
            );
        }
        let left = pttl(url, &held[2].key).await?;
        ensure!(
            (0..=HELD_TTL.as_millis() as i64).contains(&left),
            "{} has {left} ms left on {url}, though its request was refused",
            held[2].key
        );
    }

    // One extend per lease gives the same answers (the batch changed no owner, so repeating it
    // one lease at a time must agree).
    let (again, each) = batch_then_each(&client, &requests).await;
    ensure!(
        again == expected,
        "second batch {again:?}, expected {expected:?}"
    );
    ensure!(
        each == expected,
        "one extend each {each:?}, expected {expected:?}"
    );

    Ok(())
}

/// With three of five masters stopped no lease of a batch can be decided: each answers
/// `Unavailable` with 2 reached and 3 needed, as one `extend` does, and at once.
pub async fn three_of_five_masters_down_answer_unavailable_per_lease(
    masters: Arc<RedisMasters>,
) -> anyhow::Result<()> {
    let client = support::serving_client(&masters).await?;
    let held = held_leases(&client, 3).await?;
    let never = Lease::new("never")?;
    for i in 0..3 {
        masters.member(i)?.stop().await?;
    }
    let requests: Vec<ExtendRequest<'_>> = held
        .iter()
        .chain([&never])
        .map(|lease| ExtendRequest {
            lease: lease.as_ref(),
            ttl: RENEWED_TTL,
        })
        .collect();
    let unavailable = "Unavailable(reached 2, needed 3)".to_owned();
    let expected = vec![unavailable; requests.len()];

    let start = Instant::now();
    let batch: Vec<String> = client
        .extend_many(&requests)
        .await
        .iter()
        .map(describe)
        .collect();
    let took = start.elapsed();
    ensure!(batch == expected, "batch {batch:?}, expected {expected:?}");
    // Stopped masters refuse at once; even a timeout would cost one node timeout.
    ensure!(
        took <= NODE_TIMEOUT + SLACK,
        "the batch took {took:?} to fail"
    );

    let (_, each) = batch_then_each(&client, &requests).await;
    ensure!(
        each == expected,
        "one extend each {each:?}, expected {expected:?}"
    );

    Ok(())
}

/// `count` leases nobody holds, for batches whose every answer is `Expired`.
fn unheld(count: usize) -> anyhow::Result<Vec<Lease>> {
    (0..count)
        .map(|i| Lease::new(&format!("unheld-{i}")))
        .collect()
}

fn renewals(leases: &[Lease]) -> Vec<ExtendRequest<'_>> {
    leases
        .iter()
        .map(|lease| ExtendRequest {
            lease: lease.as_ref(),
            ttl: RENEWED_TTL,
        })
        .collect()
}

/// The share of a CPU each master gets while a large batch is measured: the masters, not this
/// client, are then the slow side, as they are for a client built for release beside busy
/// masters.
const BUSY_MASTER_PERCENT: u32 = 5;

/// A batch of many chunks (what auto-renew sends for tens of thousands of leases) to busy masters
/// does not hold back the client's other requests, and none of its chunks runs out of time: an
/// acquire made while the batch is under way is answered before the batch is, and every lease of
/// the batch gets its answer. Sent all at once, the chunks would queue on every master's
/// connection ahead of the acquire, and the last of them would outlive their time limits while
/// the masters worked through the first.
pub async fn a_large_batch_lets_the_clients_other_requests_through(
    masters: Arc<RedisMasters>,
) -> anyhow::Result<()> {
    let client = support::serving_client(&masters).await?;
    let leases = Arc::new(unheld(EXTEND_BATCH * 100)?);
    let members = masters.members()?;
    for member in members {
        member.throttle(BUSY_MASTER_PERCENT).await?;
    }
    let outcome = async {
        let batch = tokio::spawn({
            let (client, leases) = (client.clone(), leases.clone());
            async move {
                let started = Instant::now();
                let answers = client.extend_many(&renewals(&leases)).await;
                (answers, started.elapsed())
            }
        });
        // Let the batch get going.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let other = Lease::new("other")?;
        let start = Instant::now();
        other.take(&client, HELD_TTL).await?;
        let acquired_in = start.elapsed();
        let batch_done = batch.is_finished();
        let (answers, batch_took) = batch.await?;
        eprintln!(
            "[timing] busy masters: an acquire during a batch of {} leases took {acquired_in:?}; \
             the batch took {batch_took:?}",
            leases.len()
        );
        let answers: Vec<String> = answers.iter().map(describe).collect();
        let odd: Vec<&String> = answers.iter().filter(|a| *a != "Expired").collect();
        ensure!(
            odd.is_empty(),
            "{} of {} leases nobody holds were not answered Expired, the first {:?}",
            odd.len(),
            answers.len(),
            odd.first()
        );
        ensure!(
            !batch_done,
            "the acquire ({acquired_in:?}) was answered only after the whole batch ({batch_took:?})"
        );
        anyhow::Ok(())
    }
    .await;
    for member in members {
        member.unthrottle().await?;
    }
    outcome
}

/// With three of five masters frozen, a batch of many chunks answers every lease `Unavailable`
/// within about one chunk's time limit, though the chunks go one after another: the first
/// timeout retires the frozen masters' connections, and the following chunks fail on them at
/// once rather than each waiting out its own limit.
pub async fn a_batch_without_a_quorum_costs_one_chunks_timeout(
    masters: Arc<RedisMasters>,
) -> anyhow::Result<()> {
    let client = support::serving_client(&masters).await?;
    let chunks = 20;
    let leases = unheld(EXTEND_BATCH * chunks)?;
    let requests = renewals(&leases);
    let frozen = [masters.member(0)?, masters.member(1)?, masters.member(2)?];
    for member in &frozen {
        member.pause().await?;
    }
    let start = Instant::now();
    let answers = client.extend_many(&requests).await;
    let took = start.elapsed();
    for member in &frozen {
        member.unpause().await?;
    }
    let unavailable = "Unavailable(reached 2, needed 3)";
    let odd = answers
        .iter()
        .map(describe)
        .filter(|a| a != unavailable)
        .count();
    ensure!(
        odd == 0,
        "{odd} of {} answers were not {unavailable}",
        answers.len()
    );
    // A chunk's limit is the node timeout plus 10 ms; one per chunk would be over four seconds.
    ensure!(
        took <= NODE_TIMEOUT + SLACK,
        "the batch of {chunks} chunks took {took:?} to fail"
    );
    Ok(())
}
