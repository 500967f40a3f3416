//! What a cell's scenario runs on: the lock, or an exclusive view of one of the primitives.
//!
//! Every exclusive primitive view is itself a [`DistributedLock`]: the write side of the
//! read-write lock, a one-permit semaphore and an election candidate. The scenarios run on it
//! unchanged through [`PrimitiveTarget`], whose clients are the views of the backend's clients;
//! grants are ordinary leases (same renewal, loss and fencing as the lock), so a primitive cell
//! expects what the backend declares for its lock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Primitive, Primitives};
use dlock_core::DistributedLock;
use serde::Serialize;

use crate::targets::{FaultUnavailable, FreezableClient, Replication, Target};

/// The lock, or one exclusive primitive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Subject {
    /// The lock itself.
    Lock,
    /// The write side of the read-write lock (`Primitive::Write`).
    Write,
    /// A semaphore of one permit (`Primitive::semaphore(1)`).
    Semaphore,
    /// An election candidate (`Primitive::candidate(…)`).
    Election,
}

impl Subject {
    /// Every subject, in matrix order.
    pub const ALL: [Subject; 4] = [
        Subject::Lock,
        Subject::Write,
        Subject::Semaphore,
        Subject::Election,
    ];

    /// The primitives, without the lock.
    pub const PRIMITIVES: [Subject; 3] = [Subject::Write, Subject::Semaphore, Subject::Election];

    /// The name in `--only`, progress lines and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Subject::Lock => "lock",
            Subject::Write => "write",
            Subject::Semaphore => "semaphore",
            Subject::Election => "election",
        }
    }

    /// The name in tables.
    pub fn title(self) -> &'static str {
        match self {
            Subject::Lock => "lock",
            Subject::Write => "write lock",
            Subject::Semaphore => "semaphore, 1 permit",
            Subject::Election => "election",
        }
    }

    /// What a backend declares to serve it (the flag of `Primitives`).
    pub fn declared_as(self) -> &'static str {
        match self {
            Subject::Lock => "lock",
            Subject::Write => "read-write lock",
            Subject::Semaphore => "semaphore",
            Subject::Election => "election",
        }
    }

    /// What a grant of it is called.
    pub fn grant(self) -> &'static str {
        match self {
            Subject::Lock => "a hold of the lock",
            Subject::Write => "a write hold",
            Subject::Semaphore => "a permit",
            Subject::Election => "a leadership",
        }
    }

    /// Parses a name, as given to `--only`.
    pub fn parse(s: &str) -> Option<Subject> {
        Subject::ALL.into_iter().find(|p| p.name() == s)
    }

    /// The primitive a candidate of this subject asks for, `None` for the lock.
    pub fn primitive(self, candidate: usize) -> Option<Primitive> {
        match self {
            Subject::Lock => None,
            Subject::Write => Some(Primitive::Write),
            Subject::Semaphore => Some(Primitive::semaphore(1)),
            Subject::Election => Some(Primitive::candidate(format!("candidate-{candidate}"))),
        }
    }

    /// Whether a backend that declares `served` serves this subject.
    pub fn served_by(self, served: &Primitives) -> bool {
        self.primitive(0).is_none_or(|p| served.serves(&p))
    }
}

/// A target whose clients are the views of `subject` of another target's clients.
pub struct PrimitiveTarget<'a> {
    inner: &'a dyn Target,
    subject: Subject,
    candidates: AtomicUsize,
}

impl<'a> PrimitiveTarget<'a> {
    /// The views of `subject` (not the lock) of `inner`'s clients.
    pub fn new(inner: &'a dyn Target, subject: Subject) -> Self {
        PrimitiveTarget {
            inner,
            subject,
            candidates: AtomicUsize::new(0),
        }
    }

    /// The view of `client`; each candidate publishes a value of its own.
    fn view(&self, client: Arc<dyn DistributedLock>) -> anyhow::Result<Arc<dyn DistributedLock>> {
        let n = self.candidates.fetch_add(1, Ordering::Relaxed);
        match self.subject.primitive(n) {
            Some(primitive) => Ok(client.primitive(&primitive)?),
            None => Ok(client),
        }
    }
}

#[async_trait]
impl Target for PrimitiveTarget<'_> {
    async fn client(&self) -> anyhow::Result<Arc<dyn DistributedLock>> {
        self.view(self.inner.client().await?)
    }

    async fn freezable(&self) -> anyhow::Result<FreezableClient> {
        let (client, freeze) = self.inner.freezable().await?;
        Ok((self.view(client)?, freeze))
    }

    fn fencing(&self) -> bool {
        self.inner.fencing()
    }

    fn abandon_bound(&self, ttl: Duration) -> Duration {
        self.inner.abandon_bound(ttl)
    }

    async fn holder_client(&self) -> anyhow::Result<Arc<dyn DistributedLock>> {
        self.view(self.inner.holder_client().await?)
    }

    async fn jump_clock(&self, ahead: Duration) -> anyhow::Result<()> {
        self.inner.jump_clock(ahead).await
    }

    async fn restore_clock(&self) -> anyhow::Result<()> {
        self.inner.restore_clock().await
    }

    async fn restart_without_data(&self) -> anyhow::Result<()> {
        self.inner.restart_without_data().await
    }

    async fn partition_clients(
        &self,
    ) -> anyhow::Result<(Arc<dyn DistributedLock>, Arc<dyn DistributedLock>)> {
        let (isolated, majority) = self.inner.partition_clients().await?;
        Ok((self.view(isolated)?, self.view(majority)?))
    }

    async fn isolate(&self) -> anyhow::Result<()> {
        self.inner.isolate().await
    }

    async fn rejoin(&self) -> anyhow::Result<()> {
        self.inner.rejoin().await
    }

    fn replication(&self) -> anyhow::Result<&dyn Replication> {
        Err(FaultUnavailable(format!(
            "the failover scenario's clients are the lock's; the {} is not run there",
            self.subject.title()
        ))
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_the_lock_is_always_served() {
        for s in Subject::ALL {
            assert_eq!(Subject::parse(s.name()), Some(s));
        }
        assert_eq!(Subject::parse("mutex"), None);
        assert!(Subject::Lock.served_by(&Primitives::NONE));
        assert!(!Subject::Semaphore.served_by(&Primitives::NONE));
        assert!(Subject::Election.served_by(&Primitives::ALL));
        assert!(!Subject::Semaphore.served_by(&Primitives::ALL.without_semaphore()));
    }
}
