//! The lease: proof of holding a lock, with its tokens, its deadline and its state.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::backend::{DistributedLock, Extension, LeaseRef, Released};
use crate::error::{Error, LostReason, Result};
use crate::key::LockKey;
use crate::options::{validate_ttl, AutoRenew, Drift};
use crate::state::{
    self, Condition, Expiring, LeaseState, LeaseWatch, Status, StatusCell, StatusSender,
};
use crate::token::{FencingToken, OwnerToken};

mod renew;

use renew::Scheduled;

/// A held lock.
///
/// Obtained from [`acquire`](crate::DistributedLockExt::acquire) or
/// [`try_acquire`](crate::DistributedLockExt::try_acquire). It carries the key, a random owner
/// token, a [`FencingToken`] to present to fenced resources, the TTL, and a conservative validity
/// deadline on the client's monotonic clock, measured from before the granting request was sent
/// and shortened by the drift allowance.
///
/// # Releasing
/// Call [`release`](Lease::release) and await it: that is the only way to know the lock was freed.
/// Dropping an unreleased lease never blocks: if a tokio runtime is running, a best-effort release
/// is spawned on it; otherwise the server frees the lock when its TTL runs out. Either way the
/// lease's watchers see it [lost](LeaseState::Lost) at once.
pub struct Lease {
    backend: Arc<dyn DistributedLock>,
    key: LockKey,
    owner: OwnerToken,
    fencing: FencingToken,
    ttl: Duration,
    drift: Drift,
    acquired_at: Instant,
    status: StatusCell,
    /// Session-following tasks, aborted when the lease ends.
    tasks: Vec<JoinHandle<()>>,
    /// The lease's place on its backend's renewal schedule, left when the lease ends.
    renewal: Option<Scheduled>,
    finished: bool,
}

/// What [`Lease::new`] needs; kept together so the constructor stays readable.
pub(crate) struct LeaseParts {
    pub(crate) backend: Arc<dyn DistributedLock>,
    pub(crate) key: LockKey,
    pub(crate) owner: OwnerToken,
    pub(crate) fencing: FencingToken,
    pub(crate) ttl: Duration,
    pub(crate) drift: Drift,
    pub(crate) sent_at: Instant,
}

impl Lease {
    pub(crate) fn new(parts: LeaseParts) -> Self {
        let deadline = parts.sent_at + parts.drift.validity(parts.ttl);
        let status = StatusCell::new(Status::held(deadline));
        Lease {
            backend: parts.backend,
            key: parts.key,
            owner: parts.owner,
            fencing: parts.fencing,
            ttl: parts.ttl,
            drift: parts.drift,
            acquired_at: parts.sent_at,
            status,
            tasks: Vec::new(),
            renewal: None,
            finished: false,
        }
    }

    /// Ties a background task (session following) to the lease's life.
    pub(crate) fn attach(&mut self, task: JoinHandle<()>) {
        self.tasks.push(task);
    }

    /// Renews the lease as `config` says, on its backend's renewal schedule, for as long as it
    /// lives.
    pub(crate) fn start_renewal(&mut self, config: AutoRenew) {
        self.renewal = Some(renew::schedule(self, config));
    }

    pub(crate) fn backend(&self) -> &Arc<dyn DistributedLock> {
        &self.backend
    }

    pub(crate) fn status_sender(&self) -> StatusSender {
        self.status.sender().clone()
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        self.key.as_str()
    }

    /// The validated key, for the renewal schedule.
    pub(crate) fn lock_key(&self) -> &LockKey {
        &self.key
    }

    /// The random owner token this lease holds the lock with.
    pub fn owner(&self) -> OwnerToken {
        self.owner
    }

    /// The fencing token: strictly greater for every later holder of this key.
    pub fn fencing_token(&self) -> FencingToken {
        self.fencing
    }

    /// The TTL of the last acquire or extend.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The drift allowance the lease was taken with.
    pub fn drift(&self) -> Drift {
        self.drift
    }

    /// When the granting request was sent (the start of the first validity window).
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// The current validity deadline: the lease must not be relied on at or after it.
    pub fn valid_until(&self) -> Instant {
        self.status.current().until()
    }

    /// Time left before [`valid_until`](Lease::valid_until), zero once past.
    pub fn remaining(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// The state now: held, uncertain or lost.
    pub fn state(&self) -> LeaseState {
        self.status.current().at(Instant::now())
    }

    /// Whether the lease is held now (neither uncertain nor lost).
    pub fn is_held(&self) -> bool {
        self.state().is_held()
    }

    /// A cloneable view of this lease's state for the tasks doing the guarded work.
    pub fn watch(&self) -> LeaseWatch {
        LeaseWatch {
            key: self.key.clone(),
            fencing: self.fencing,
            rx: self.status.sender().subscribe(),
        }
    }

    /// Completes when the lease is lost, with the reason. Owns what it needs, so it can be moved
    /// into `tokio::select!` beside the work it should cancel.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        let watch = self.watch();
        async move { watch.lost().await }
    }

    /// Completes when the lease is lost, or when its validity deadline is `margin` away or less
    /// and no renewal has moved it: the moment to begin stopping work that must be done before
    /// another client can be granted the lock. See [`LeaseWatch::expiring`]. Owns what it needs,
    /// like [`lost`](Lease::lost).
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub fn expiring(
        &self,
        margin: Duration,
    ) -> impl std::future::Future<Output = Expiring> + Send + 'static {
        let watch = self.watch();
        async move { watch.expiring(margin).await }
    }

    fn lease_ref(&self) -> LeaseRef<'_> {
        LeaseRef {
            key: &self.key,
            owner: self.owner,
            fencing: Some(self.fencing),
        }
    }

    /// Re-arms the lease for `ttl` from now, if this owner still holds it.
    ///
    /// On success the validity deadline becomes `sent + ttl − drift allowance`, where `sent` is
    /// taken before the request. If the lease is already lost (on the client's clock or on the
    /// server) it fails with [`Error::Lost`], or [`Error::NotOwner`] when another owner holds the
    /// lock, and the lease becomes lost. A temporary failure marks it uncertain.
    ///
    /// # Cancel safety
    /// If cancelled, the server may or may not have extended the lock; the client keeps the old,
    /// shorter deadline, which is the safe side.
    pub async fn extend(&mut self, ttl: Duration) -> Result<()> {
        validate_ttl(ttl)?;
        self.drift.validate(ttl)?;
        if let LeaseState::Lost(reason) = self.state() {
            return Err(self.lost_error(reason));
        }
        let sent = Instant::now();
        let result = self.backend.as_ref().extend(&self.lease_ref(), ttl).await;
        let outcome = apply_extension(
            self.status.sender(),
            &self.key,
            sent,
            self.drift.validity(ttl),
            result,
        );
        if outcome.is_ok() {
            self.ttl = ttl;
        }
        outcome
    }

    /// Releases the lock and says what happened: released, already expired, or taken over (in
    /// which case the new owner's lock was left untouched).
    ///
    /// Stops auto-renew first. The lease is lost from now on whatever the outcome. If the backend
    /// cannot be reached the error is returned and a best-effort release is retried in the
    /// background when the lease is dropped; the TTL bounds the hold in any case.
    ///
    /// # Cancel safety
    /// If cancelled, the release may or may not have reached the server; the lease is then dropped,
    /// which spawns a best-effort release.
    pub async fn release(mut self) -> Result<Released> {
        self.stop_tasks();
        self.status.mark_lost(LostReason::Released);
        let result = self.backend.as_ref().release(&self.lease_ref()).await;
        if result.is_ok() {
            self.finished = true;
        }
        result
    }

    fn stop_tasks(&mut self) {
        self.renewal = None;
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }

    fn lost_error(&self, reason: LostReason) -> Error {
        Error::Lost {
            key: self.key.to_string(),
            reason,
        }
    }
}

/// Turns an extend's result into the lease's new status and the caller's result. Shared by
/// [`Lease::extend`] and the auto-renew task so both treat every outcome alike.
pub(crate) fn apply_extension(
    status: &StatusSender,
    key: &LockKey,
    sent: Instant,
    validity: Duration,
    result: Result<Extension>,
) -> Result<()> {
    let lost = |reason| Error::Lost {
        key: key.to_string(),
        reason,
    };
    match result {
        Ok(extended @ (Extension::Extended | Extension::ClockAhead(_))) => {
            let ahead = match extended {
                Extension::ClockAhead(by) => by,
                _ => Duration::ZERO,
            };
            let applied = state::update(status, Instant::now(), |s| {
                // Not `max`: a shorter TTL shortens the server's hold, so the deadline follows.
                s.deadline = sent + validity.saturating_sub(ahead);
                s.condition = Condition::Held;
            });
            if applied {
                Ok(())
            } else {
                Err(lost(current_reason(status)))
            }
        }
        Ok(Extension::Expired) => {
            state::mark_lost(status, LostReason::Expired);
            Err(lost(current_reason(status)))
        }
        Ok(Extension::TakenOver) => {
            state::mark_lost(status, LostReason::TakenOver);
            Err(Error::NotOwner {
                key: key.to_string(),
            })
        }
        Err(e) => {
            if e.is_temporary() {
                state::update(status, Instant::now(), |s| {
                    s.condition = Condition::Uncertain
                });
            }
            Err(e)
        }
    }
}

fn current_reason(status: &StatusSender) -> LostReason {
    match status.borrow().at(Instant::now()) {
        LeaseState::Lost(reason) => reason,
        _ => LostReason::Expired,
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("backend", &self.backend.backend_name())
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("fencing", &self.fencing)
            .field("ttl", &self.ttl)
            .field("state", &self.state())
            .finish()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.stop_tasks();
        self.status.mark_lost(LostReason::Released);
        release_in_background(
            self.backend.clone(),
            self.key.clone(),
            self.owner,
            Some(self.fencing),
        );
    }
}

/// Spawns an ownership-checked release on the current tokio runtime, if there is one; without a
/// runtime the server's TTL frees the lock. Never blocks.
pub(crate) fn release_in_background(
    backend: Arc<dyn DistributedLock>,
    key: LockKey,
    owner: OwnerToken,
    fencing: Option<FencingToken>,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(key = %key, "no tokio runtime: the lock is freed by its TTL");
        return;
    };
    runtime.spawn(async move {
        let lease = LeaseRef {
            key: &key,
            owner,
            fencing,
        };
        match backend.as_ref().release(&lease).await {
            Ok(outcome) => tracing::debug!(key = %key, ?outcome, "background release"),
            Err(error) => tracing::debug!(key = %key, %error, "background release failed; the TTL frees the lock"),
        }
    });
}
