//! What users call: `try_acquire`, `acquire`, `with_lock`, on any shared backend handle.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Attempt, DistributedLock, Grant, LeaseRef, LockRequest};
use crate::critical::CriticalSection;
use crate::election::Election;
use crate::error::{Error, Result};
use crate::inspect::Holding;
use crate::key::LockKey;
use crate::lease::{Lease, LeaseParts};
use crate::multi::MultiLease;
use crate::options::LockOptions;
use crate::pending::PendingAcquire;
use crate::rwlock::RwLock;
use crate::semaphore::Semaphore;
use crate::state::{LeaseWatch, LostReason};
use crate::token::OwnerToken;
use crate::waiting::withdraw;

/// A handle that can be shared with the leases it grants: `Arc<dyn DistributedLock>` or
/// `Arc<B>` for a concrete backend `B`.
pub trait LockHandle: Send + Sync {
    /// The handle as the trait object that leases keep (a reference-count increment).
    fn shared(&self) -> Arc<dyn DistributedLock>;
}

impl<T: DistributedLock> LockHandle for Arc<T> {
    fn shared(&self) -> Arc<dyn DistributedLock> {
        self.clone()
    }
}

impl LockHandle for Arc<dyn DistributedLock> {
    fn shared(&self) -> Arc<dyn DistributedLock> {
        self.clone()
    }
}

/// The user-facing lock operations, for every [`LockHandle`] handle. Do not implement it: the
/// blanket implementation covers every backend.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock_core::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use dlock_core::{DistributedLock, DistributedLockExt, InMemoryLock, LockOptions};
///
/// let locks: Arc<dyn DistributedLock> = Arc::new(InMemoryLock::new());
/// let opts = LockOptions::new(Duration::from_secs(5)).with_wait(Duration::from_secs(1));
///
/// let lease = locks.acquire("invoices/42", &opts).await?;
/// assert!(locks.try_acquire("invoices/42", &opts).await?.is_none()); // busy
/// println!("writing with fencing token {}", lease.fencing_token());
/// lease.release().await?;
/// # Ok(()) }
/// ```
pub trait DistributedLockExt: LockHandle {
    /// One attempt: `Some(lease)` if the lock was free, `None` if it is busy.
    ///
    /// Answers after one round trip. `opts.wait` is ignored; the attempt gives up (with
    /// [`Error::Timeout`]) if the answer takes longer than the lease's validity, since such a lease
    /// would be useless.
    ///
    /// # Cancel safety
    /// Cancel safe in effect: if dropped after the request was sent, whatever it may have taken
    /// is released in the background by owner token.
    fn try_acquire(
        &self,
        key: &str,
        opts: &LockOptions,
    ) -> impl Future<Output = Result<Option<Lease>>> + Send {
        acquire(self.shared(), key, opts, Mode::Once)
    }

    /// Waits until the lock is held, or until `opts.wait` has passed ([`Error::Timeout`]).
    ///
    /// Never returns a lease whose validity is already over: a grant that arrives too late is
    /// released and the acquire tries again while time is left. Errors from the backend are
    /// returned at once rather than retried.
    ///
    /// # Cancel safety
    /// Cancel safe in effect: if dropped while a request is in flight, whatever it may have taken
    /// is released in the background by owner token, so nothing stays held until its TTL.
    fn acquire(&self, key: &str, opts: &LockOptions) -> impl Future<Output = Result<Lease>> + Send {
        let handle = self.shared();
        async move {
            match acquire(handle, key, opts, Mode::Wait).await? {
                Some(lease) => Ok(lease),
                None => Err(Error::Timeout {
                    key: key.to_string(),
                    waited: opts.wait.unwrap_or_default(),
                }),
            }
        }
    }

    /// Whether `key` is held right now, and by which fencing token where the backend can tell,
    /// without taking it ([`DistributedLock::inspect`]).
    ///
    /// Fails with [`Error::InvalidInput`] for a bad key (nothing is sent) and with
    /// [`Error::Unsupported`] where the backend cannot look without taking the lock.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    fn holding(&self, key: &str) -> impl Future<Output = Result<Holding>> + Send {
        let handle = self.shared();
        let key = LockKey::new(key);
        async move { handle.inspect(&key?).await }
    }

    /// Takes every key in `keys`, or none: waits up to `opts.wait` in all, and on a timeout or
    /// error gives back the keys it took before returning. Each key gets a lease with its own
    /// fencing token ([`MultiLease`]).
    ///
    /// Keys are taken one at a time in one global order (byte order), whatever order they are
    /// named in, so clients naming overlapping sets cannot deadlock. A key taken early is held
    /// while later ones are awaited: take them with
    /// [`auto-renew`](LockOptions::with_auto_renew) when the wait may outlast the TTL. An empty
    /// list, a key named twice or more than [`MAX_KEYS`](crate::limits::MAX_KEYS) keys is
    /// [`Error::InvalidInput`], and nothing is sent.
    ///
    /// # Cancel safety
    /// Cancel safe in effect: keys a dropped call took are released in the background.
    fn acquire_all(
        &self,
        keys: &[&str],
        opts: &LockOptions,
    ) -> impl Future<Output = Result<MultiLease>> + Send {
        let handle = self.shared();
        async move {
            match crate::multi::acquire_all(handle, keys, opts, true).await? {
                Some(all) => Ok(all),
                None => Err(Error::Timeout {
                    key: keys.join(", "),
                    waited: opts.wait.unwrap_or_default(),
                }),
            }
        }
    }

    /// One attempt at every key in `keys`: all of them, or `None` (with nothing held) if any is
    /// busy.
    fn try_acquire_all(
        &self,
        keys: &[&str],
        opts: &LockOptions,
    ) -> impl Future<Output = Result<Option<MultiLease>>> + Send {
        crate::multi::acquire_all(self.shared(), keys, opts, false)
    }

    /// The semaphore `name` of `permits` permits ([`Semaphore`]). Fails with
    /// [`Error::InvalidInput`] for a bad name or permits and [`Error::Unsupported`] where the
    /// backend has no semaphore; nothing is sent.
    fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        Semaphore::new(self.shared().as_ref(), name, permits)
    }

    /// The read-write lock `name` ([`RwLock`]).
    fn rw(&self, name: &str) -> Result<RwLock> {
        RwLock::new(self.shared().as_ref(), name)
    }

    /// The election `name` ([`Election`]).
    fn election(&self, name: &str) -> Result<Election> {
        Election::new(self.shared(), name)
    }

    /// Acquires `key`, runs `work` with a view of the lease, and releases.
    ///
    /// `work` is cancelled (dropped) if the lease is lost first; see [`Lease::run`]. Returns the
    /// output (if the work finished) and how the lease ended.
    ///
    /// # Cancel safety
    /// Dropping the returned future cancels the work and releases the lock in the background.
    fn with_lock<F, Fut>(
        &self,
        key: &str,
        opts: &LockOptions,
        work: F,
    ) -> impl Future<Output = Result<CriticalSection<Fut::Output>>> + Send
    where
        F: FnOnce(LeaseWatch) -> Fut + Send,
        Fut: Future + Send,
        Fut::Output: Send,
    {
        async move {
            let lease = self.acquire(key, opts).await?;
            let watch = lease.watch();
            Ok(lease.run(work(watch)).await)
        }
    }
}

impl<S: LockHandle + ?Sized> DistributedLockExt for S {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Once,
    Wait,
}

async fn acquire(
    backend: Arc<dyn DistributedLock>,
    key: &str,
    opts: &LockOptions,
    mode: Mode,
) -> Result<Option<Lease>> {
    let key = LockKey::new(key)?;
    opts.validate()?;
    let started = Instant::now();
    let deadline = match (mode, opts.wait) {
        (Mode::Wait, Some(wait)) => Some(
            started
                .checked_add(wait)
                .ok_or_else(|| Error::invalid("wait", format!("{wait:?} overflows the clock")))?,
        ),
        _ => None,
    };
    take(&backend, &key, opts, mode, started, deadline).await
}

async fn take(
    backend: &Arc<dyn DistributedLock>,
    key: &LockKey,
    opts: &LockOptions,
    mode: Mode,
    started: Instant,
    deadline: Option<Instant>,
) -> Result<Option<Lease>> {
    let mut owner = OwnerToken::random();
    let mut failures = 0;
    // The failure that made this acquire try again, if any: what an attempt cut at the deadline
    // reports, since the service failing is then the truer answer than a busy lock.
    let mut last_failure: Option<Error> = None;
    let validity = opts.drift.validity(opts.ttl);
    let timeout = |waited| Error::Timeout {
        key: key.to_string(),
        waited,
    };
    // The caller's deadline is checked between attempts (by the backend's `lock`), never used to
    // cut the first attempt short: a free key is taken even with a zero wait. The first answer is
    // bounded by the lease's validity instead, since a later grant would be useless.
    let first_answer_by = started + validity;
    loop {
        let request = LockRequest {
            key,
            owner,
            ttl: opts.ttl,
        };
        let pending = PendingAcquire::arm(backend, key, owner);
        let grant: Grant = match mode {
            Mode::Once => {
                let sent = Instant::now();
                let answer =
                    tokio::time::timeout_at(sent + validity, backend.as_ref().try_lock(&request));
                match answer.await {
                    Ok(Ok(Attempt::Acquired(grant))) => grant.sent_no_later_than(sent),
                    Ok(Ok(Attempt::Busy { .. })) => {
                        pending.disarm();
                        return Ok(None);
                    }
                    // The pending guard withdraws in the background: a server that did not
                    // answer the attempt is unlikely to answer the withdrawal any sooner.
                    Ok(Err(error)) => return Err(error),
                    Err(_) => return Err(no_answer(validity)),
                }
            }
            Mode::Wait => {
                let attempt = backend.as_ref().lock(&request, deadline, &opts.retry);
                let answer = match deadline {
                    // Only a backend that overruns the deadline meets this bound; one that gives
                    // up at the deadline with an error of its own (the server is unavailable)
                    // has the grace to say so.
                    Some(d) => {
                        let bound = d.max(first_answer_by) + OVERRUN_GRACE;
                        tokio::time::timeout_at(bound, attempt).await
                    }
                    None => Ok(attempt.await),
                };
                match answer {
                    Ok(Ok(grant)) => grant,
                    // The backend has withdrawn whatever it queued (the `lock` contract).
                    Ok(Err(error @ Error::Timeout { .. })) => {
                        pending.disarm();
                        return Err(error);
                    }
                    // A waiting acquire tries again after a temporary failure, a few times and
                    // within its wait: a request that found its connection dead has it replaced
                    // (or a reconnection started), and a later attempt goes out on the new one.
                    // A service that is down stays down, and the caller hears so after a few
                    // quick tries rather than at the end of its wait. The abandoned attempt is
                    // withdrawn in the background under its own owner token; the next one takes
                    // a new token, so that withdrawal cannot touch it.
                    Ok(Err(error)) if error.is_temporary() && failures + 1 < FAILED_ATTEMPTS => {
                        let now = Instant::now();
                        let left = deadline.and_then(|d| d.checked_duration_since(now));
                        let Some(left) = left.filter(|left| !left.is_zero()) else {
                            return Err(error);
                        };
                        tracing::debug!(key = %key, %error, "acquire: a failed attempt is tried again within the wait");
                        last_failure = Some(error);
                        drop(pending);
                        tokio::time::sleep(opts.retry.delay(failures).min(left)).await;
                        failures = failures.saturating_add(1);
                        owner = OwnerToken::random();
                        continue;
                    }
                    Ok(Err(error)) => return Err(error),
                    // The backend overran and was cut mid-way: nothing it queued was withdrawn.
                    Err(_) if deadline.is_some_and(|d| d >= first_answer_by) => {
                        let lease = LeaseRef {
                            key,
                            owner,
                            fencing: None,
                        };
                        if withdraw(key, backend.as_ref().release(&lease)).await {
                            pending.disarm();
                        }
                        return Err(last_failure.unwrap_or_else(|| timeout(started.elapsed())));
                    }
                    Err(_) => return Err(no_answer(validity)),
                }
            }
        };
        if Instant::now() < grant.sent_at + validity {
            pending.disarm();
            let mut lease = Lease::new(LeaseParts {
                backend: backend.clone(),
                key: key.clone(),
                owner,
                fencing: grant.fencing,
                ttl: opts.ttl,
                drift: opts.drift,
                sent_at: grant.sent_at,
            });
            if let Some(config) = opts.auto_renew {
                lease.start_renewal(config);
            }
            if let Some(session) = grant.session {
                lease.attach(crate::session::follow(lease.status_sender(), session));
            }
            return Ok(Some(lease));
        }
        // Granted too late to be of use: give it back and, if waiting, try again.
        tracing::debug!(key = %key, "grant arrived after its validity ended; releasing it");
        let lease = LeaseRef {
            key,
            owner,
            fencing: Some(grant.fencing),
        };
        if backend.as_ref().release(&lease).await.is_ok() {
            pending.disarm();
        }
        let out_of_time = deadline.is_some_and(|d| Instant::now() >= d);
        if mode == Mode::Once {
            return Err(Error::Lost {
                key: key.to_string(),
                reason: LostReason::Expired,
            });
        }
        if out_of_time {
            return Err(timeout(started.elapsed()));
        }
    }
}

/// How many attempts in a row a waiting acquire makes while they fail temporarily, before it
/// returns the failure.
const FAILED_ATTEMPTS: u32 = 4;

/// How long past the caller's deadline a backend's waiting loop may take to give its own answer
/// before the acquire ends it.
const OVERRUN_GRACE: Duration = Duration::from_millis(500);

/// The error of a first attempt that got no answer within the lease's validity.
fn no_answer(validity: Duration) -> Error {
    Error::unreachable(format!(
        "no answer within the lease's validity ({validity:?})"
    ))
}
