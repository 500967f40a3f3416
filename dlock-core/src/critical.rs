//! Running work under a lock: cancelled when the lease is lost, released afterwards.

use std::future::Future;

use crate::backend::Released;
use crate::error::Error;
use crate::error::LostReason;
use crate::lease::Lease;
use crate::state::LeaseState;

/// How a lease ended after guarded work.
#[derive(Debug)]
#[non_exhaustive]
pub enum LeaseEnd {
    /// The work finished while the lease was held; then the lock was released with this outcome.
    Released(Released),
    /// The lease was lost (the work was cancelled if it had not finished yet).
    Lost(LostReason),
    /// The work finished while the lease was held, but the release failed; the lock is freed by
    /// its TTL (a background release is also attempted).
    ReleaseFailed(Error),
}

/// The result of [`Lease::run`] or [`with_lock`](crate::DistributedLockExt::with_lock).
#[derive(Debug)]
pub struct CriticalSection<T> {
    /// The work's output, or `None` if it was cancelled because the lease was lost first.
    pub output: Option<T>,
    /// How the lease ended.
    pub end: LeaseEnd,
}

impl<T> CriticalSection<T> {
    /// Whether the work completed while the lease was held throughout.
    pub fn completed_under_lock(&self) -> bool {
        self.output.is_some() && matches!(self.end, LeaseEnd::Released(_))
    }
}

impl Lease {
    /// Runs `work` while holding this lease, then releases it.
    ///
    /// If the lease is lost first, `work` is dropped at its next await point (cancelled) and the
    /// result says why. If `work` finishes but the lease turns out to have been lost meanwhile,
    /// the output is returned together with [`LeaseEnd::Lost`], so the caller can tell that its
    /// effects may have overlapped another holder's (which fencing tokens exist to reject).
    ///
    /// # Cancel safety
    /// Dropping the returned future drops `work` and the lease, which spawns a best-effort
    /// release.
    pub async fn run<F>(self, work: F) -> CriticalSection<F::Output>
    where
        F: Future,
    {
        let lost = self.lost();
        let output = tokio::select! {
            biased;
            output = work => Some(output),
            _ = lost => None,
        };
        let state = self.state();
        let release = self.release().await;
        let end = match (state, release) {
            (LeaseState::Lost(reason), _) => LeaseEnd::Lost(reason),
            (_, Ok(Released::Released)) => LeaseEnd::Released(Released::Released),
            // The server disagreed with our clock: the lease was gone although still valid here.
            (_, Ok(Released::Expired)) => LeaseEnd::Lost(LostReason::Expired),
            (_, Ok(Released::TakenOver)) => LeaseEnd::Lost(LostReason::TakenOver),
            (_, Err(error)) => LeaseEnd::ReleaseFailed(error),
        };
        CriticalSection { output, end }
    }
}
