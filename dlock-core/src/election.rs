//! Leader election: one leader at a time, its term a fencing token, observed by everyone in the
//! same order.

use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::time::Instant;

use crate::backend::{DistributedLock, Released};
use crate::error::{LostReason, Result};
use crate::inspect::Holding;
use crate::key::LockKey;
use crate::lease::Lease;
use crate::options::LockOptions;
use crate::owner::OwnerRecord;
use crate::primitive::{check_value, Primitive};
use crate::state::{Expiring, LeaseState, LeaseWatch};
use crate::token::FencingToken;

/// How often an observer looks again when no release wakes it: the longest a new leader of a
/// name that had none goes unseen.
pub const OBSERVE_INTERVAL: Duration = Duration::from_millis(100);

/// A named election, from [`DistributedLockExt::election`](crate::DistributedLockExt::election).
///
/// A candidate [`campaign`](Election::campaign)s with a value (its address, say) and, once it
/// leads, holds a [`Leadership`]: a lease whose fencing token is the **term**, strictly greater
/// for every later leader. Leadership ends when the candidate
/// [`resign`](Leadership::resign)s (the next candidate is served at once), or when the lease is
/// lost (a pause past its TTL, a partition, a session that expired) — seen through the same
/// held/uncertain/lost states as a lock's lease. Campaign with
/// [`auto-renew`](LockOptions::with_auto_renew) to lead for longer than one TTL.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock_core::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use dlock_core::{DistributedLock, DistributedLockExt, InMemoryLock, LockOptions};
///
/// let locks: Arc<dyn DistributedLock> = Arc::new(InMemoryLock::new());
/// let election = locks.election("scheduler")?;
/// let opts = LockOptions::new(Duration::from_secs(10)).with_auto_renew();
/// let leadership = election.campaign("10.0.0.7:8080", &opts).await?;
/// let leader = election.leader().await?.expect("someone leads");
/// assert_eq!(leader.value.as_deref(), Some("10.0.0.7:8080"));
/// assert_eq!(leader.term, Some(leadership.term()));
/// leadership.resign().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    backend: Arc<dyn DistributedLock>,
    name: LockKey,
}

/// A leader as an observer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The value the leader published; `None` for a leader that published nothing readable.
    pub value: Option<String>,
    /// The leader's term (its fencing token), where the backend can tell.
    pub term: Option<FencingToken>,
    /// The leader's owner record, for a dlock leader.
    pub owner: Option<OwnerRecord>,
}

impl Election {
    pub(crate) fn new(backend: Arc<dyn DistributedLock>, name: &str) -> Result<Self> {
        let name = LockKey::new(name)?;
        // Refused here, as the other primitives are; the views are made when used, so that a
        // campaign does not pay for an observer's.
        backend
            .capabilities()
            .primitives
            .require(backend.backend_name(), &Primitive::observer())?;
        Ok(Election { backend, name })
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// Waits until this candidate leads (up to `opts.wait`), publishing `value`.
    ///
    /// # Cancel safety
    /// Cancel safe in effect: a dropped campaign leaves no candidacy behind and gives back a
    /// leadership it may have won.
    pub async fn campaign(&self, value: &str, opts: &LockOptions) -> Result<Leadership> {
        let (candidate, value) = self.candidate(value)?;
        let lease = crate::acquire::acquire(candidate, Ok(self.name.clone()), opts).await?;
        Ok(Leadership { lease, value })
    }

    /// One attempt: leadership if nobody leads, `None` otherwise.
    pub async fn try_campaign(
        &self,
        value: &str,
        opts: &LockOptions,
    ) -> Result<Option<Leadership>> {
        let (candidate, value) = self.candidate(value)?;
        let lease = crate::acquire::try_acquire(candidate, Ok(self.name.clone()), opts).await?;
        Ok(lease.map(|lease| Leadership { lease, value }))
    }

    /// The view of a candidate publishing `value`, and the value as it shares it.
    fn candidate(&self, value: &str) -> Result<(Arc<dyn DistributedLock>, Arc<str>)> {
        check_value(value)?;
        let value: Arc<str> = Arc::from(value);
        let view = self
            .backend
            .primitive(&Primitive::candidate(value.clone()))?;
        Ok((view, value))
    }

    /// The leader now, if there is one.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        self.leader_seen_by(self.observer()?.as_ref()).await
    }

    fn observer(&self) -> Result<Arc<dyn DistributedLock>> {
        self.backend.primitive(&Primitive::observer())
    }

    async fn leader_seen_by(&self, observer: &dyn DistributedLock) -> Result<Option<Leader>> {
        Ok(match observer.inspect(&self.name).await? {
            Holding::Held(holder) => Some(Leader {
                value: holder.value,
                term: holder.fencing,
                owner: holder.owner,
            }),
            _ => None,
        })
    }

    /// The leaders from now on: the current one first (if any), then each new one as it takes
    /// over.
    ///
    /// Every observer sees terms in the same, strictly increasing order, each with the same
    /// value. An observer reports the leader it finds when it looks — on every release the
    /// backend signals and every [`OBSERVE_INTERVAL`] — so a term that begins and ends between
    /// two looks is skipped, never reordered. A leader whose term the backend cannot tell is
    /// reported once when it appears. The stream ends at the first error.
    pub fn observe(&self) -> impl Stream<Item = Result<Leader>> + Send + 'static {
        futures::stream::unfold(Some((self.clone(), None)), |state| async move {
            let (election, last) = state?;
            match election.next_leader(last.as_ref()).await {
                Ok(leader) => Some((Ok(leader.clone()), Some((election, Some(leader))))),
                Err(error) => Some((Err(error), None)),
            }
        })
    }

    /// Looks until the leader is newer than `last`.
    async fn next_leader(&self, last: Option<&Leader>) -> Result<Leader> {
        let observer = self.observer()?;
        loop {
            let looked = Instant::now();
            let leader = self.leader_seen_by(observer.as_ref()).await?;
            match leader {
                Some(leader) if is_newer(&leader, last) => return Ok(leader),
                // Someone leads: a release wakes us early.
                Some(_) => {
                    observer
                        .wait_for_release(&self.name, looked + OBSERVE_INTERVAL)
                        .await?;
                    // A backend whose wait returns at once must not turn this into a busy loop.
                    tokio::time::sleep_until(looked + OBSERVE_INTERVAL / 10).await;
                }
                None => tokio::time::sleep_until(looked + OBSERVE_INTERVAL).await,
            }
        }
    }
}

/// Whether `leader` is a change from `last`: a greater term, or a different leader where terms
/// are unknown.
fn is_newer(leader: &Leader, last: Option<&Leader>) -> bool {
    let Some(last) = last else {
        return true;
    };
    match (leader.term, last.term) {
        (Some(now), Some(before)) => now > before,
        _ => leader != last,
    }
}

/// This candidate's leadership: a lease on the election whose fencing token is the term.
#[derive(Debug)]
pub struct Leadership {
    lease: Lease,
    value: Arc<str>,
}

impl Leadership {
    /// The term: strictly greater for every later leader of the election. Present it to fenced
    /// resources like a lock's fencing token.
    pub fn term(&self) -> FencingToken {
        self.lease.fencing_token()
    }

    /// The value this leader published.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The state now: held, uncertain (stop starting leader work) or lost.
    pub fn state(&self) -> LeaseState {
        self.lease.state()
    }

    /// Whether this candidate still leads for certain.
    pub fn is_leader(&self) -> bool {
        self.lease.is_held()
    }

    /// Completes when the leadership is lost, with the reason.
    pub fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        self.lease.lost()
    }

    /// Completes when the leadership is lost, or when its validity deadline is `margin` away or
    /// less and no renewal has moved it: the moment to begin stepping down before another
    /// candidate can take over. See [`LeaseWatch::expiring`].
    pub fn expiring(
        &self,
        margin: std::time::Duration,
    ) -> impl std::future::Future<Output = Expiring> + Send + 'static {
        self.lease.expiring(margin)
    }

    /// A cloneable view of the leadership's state for the tasks doing leader work.
    pub fn watch(&self) -> LeaseWatch {
        self.lease.watch()
    }

    /// The lease behind the leadership.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Hands leadership over at once: the next candidate is served as soon as the server sees
    /// the release.
    pub async fn resign(self) -> Result<Released> {
        self.lease.release().await
    }
}
