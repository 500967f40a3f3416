//! The in-process primitives with switchable defects, each a classic way to get a semaphore, a
//! read-write lock or an election wrong.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Attempt, Grant, LockRequest, Primitive};
use dlock_core::layer::Layer;
use dlock_core::limits::MAX_PERMITS;
use dlock_core::{Backoff, DistributedLock, Error, FencingToken, InMemoryLock, Result};
use tokio::time::Instant;

/// The defects. Each must be caught by at least one case of the suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrimitiveDefect {
    /// The semaphore grants one permit more than it has.
    SemaphoreOverGrants,
    /// A client naming another number of permits is answered "busy" (or left waiting) instead
    /// of refused, so a fleet that disagrees on the number never finds out.
    PermitsMismatchIgnored,
    /// Readers do not look at writers (and writers not at readers).
    ReadersIgnoreWriters,
    /// A waiting writer does not hold back readers that come after it, so a stream of readers
    /// starves it.
    WriterStarves,
    /// Every leadership gets term 1, so a fenced resource cannot tell an old leader from a new.
    TermsRepeat,
}

impl PrimitiveDefect {
    pub const ALL: [PrimitiveDefect; 5] = [
        PrimitiveDefect::SemaphoreOverGrants,
        PrimitiveDefect::PermitsMismatchIgnored,
        PrimitiveDefect::ReadersIgnoreWriters,
        PrimitiveDefect::WriterStarves,
        PrimitiveDefect::TermsRepeat,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PrimitiveDefect::SemaphoreOverGrants => "semaphore grants a permit too many",
            PrimitiveDefect::PermitsMismatchIgnored => "semaphore ignores a permits mismatch",
            PrimitiveDefect::ReadersIgnoreWriters => "readers ignore writers",
            PrimitiveDefect::WriterStarves => "a waiting writer starves behind readers",
            PrimitiveDefect::TermsRepeat => "election terms repeat",
        }
    }
}

/// The in-process backend whose primitives have at most one defect.
#[derive(Debug, Clone)]
pub struct BrokenPrimitives {
    inner: InMemoryLock,
    defect: Option<PrimitiveDefect>,
}

impl BrokenPrimitives {
    pub fn new(defect: Option<PrimitiveDefect>) -> Self {
        BrokenPrimitives {
            inner: InMemoryLock::new(),
            defect,
        }
    }
}

#[async_trait]
impl Layer for BrokenPrimitives {
    fn inner(&self) -> &dyn DistributedLock {
        &self.inner
    }

    fn primitive(&self, primitive: &Primitive) -> Result<Arc<dyn DistributedLock>> {
        use PrimitiveDefect as D;
        let view = match (self.defect, primitive) {
            (Some(D::SemaphoreOverGrants), Primitive::Semaphore { permits }) => {
                primitive.validate()?;
                self.inner.primitive(&Primitive::semaphore(permits + 1))?
            }
            // A semaphore of its own: readers never meet the writers.
            (Some(D::ReadersIgnoreWriters), Primitive::Read) => {
                self.inner.primitive(&Primitive::semaphore(MAX_PERMITS))?
            }
            _ => self.inner.primitive(primitive)?,
        };
        let defect = match (self.defect, primitive) {
            (Some(D::PermitsMismatchIgnored), Primitive::Semaphore { .. })
            | (Some(D::WriterStarves), Primitive::Write)
            | (Some(D::TermsRepeat), Primitive::Election { .. }) => self.defect,
            _ => None,
        };
        Ok(match defect {
            Some(defect) => Arc::new(BrokenView {
                inner: view,
                defect,
            }),
            None => view,
        })
    }
}

/// A correct view with a defect in how it takes.
#[derive(Debug)]
struct BrokenView {
    inner: Arc<dyn DistributedLock>,
    defect: PrimitiveDefect,
}

impl BrokenView {
    fn spoil(&self, attempt: Result<Attempt>) -> Result<Attempt> {
        match (self.defect, attempt) {
            (PrimitiveDefect::PermitsMismatchIgnored, Err(Error::Mismatch { .. })) => {
                Ok(Attempt::Busy { retry_after: None })
            }
            (PrimitiveDefect::TermsRepeat, Ok(Attempt::Acquired(grant))) => Ok(Attempt::Acquired(
                Grant::new(FencingToken(1), grant.sent_at),
            )),
            (_, attempt) => attempt,
        }
    }
}

#[async_trait]
impl Layer for BrokenView {
    fn inner(&self) -> &dyn DistributedLock {
        self.inner.as_ref()
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        self.spoil(self.inner.try_lock(req).await)
    }

    /// Plain polling on the spoiled attempts: no waiting writer is ever registered.
    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        _retry: &Backoff,
    ) -> Result<Grant> {
        loop {
            let sent = Instant::now();
            if let Attempt::Acquired(grant) = Layer::try_lock(self, req).await? {
                return Ok(grant.sent_no_later_than(sent));
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Err(Error::Timeout {
                    key: req.key.to_string(),
                    waited: Duration::ZERO,
                });
            }
            let until = now + Duration::from_millis(10);
            self.inner
                .wait_for_release(req.key, deadline.map_or(until, |d| d.min(until)))
                .await?;
        }
    }
}
