//! Taking one lock: one attempt, or attempts until the wait runs out. Every way to take a lock
//! comes here (the extension trait, the primitives, multi-key), so that none returns a lease whose
//! validity is over, and a dropped or cut attempt always withdraws what it may have queued.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Attempt, DistributedLock, Grant, LeaseRef, LockRequest};
use crate::error::{Error, LostReason, Result};
use crate::key::LockKey;
use crate::lease::{Lease, LeaseParts};
use crate::options::LockOptions;
use crate::pending::PendingAcquire;
use crate::token::OwnerToken;
use crate::waiting::withdraw;

/// One attempt: `Some(lease)` if the lock was free, `None` if it is busy
/// ([`DistributedLockExt::try_acquire`](crate::DistributedLockExt::try_acquire)).
///
/// `key` comes validated, or as the error its validation gave: a caller with a name and one
/// with a key kept from before (a primitive's handle) then share this one future, with no
/// wrapper around it to move on every call.
pub(crate) async fn try_acquire(
    backend: Arc<dyn DistributedLock>,
    key: Result<LockKey>,
    opts: &LockOptions,
) -> Result<Option<Lease>> {
    attempt(backend, key?, opts, Mode::Once).await
}

/// Waits until the lock is held, or until `opts.wait` has passed ([`Error::Timeout`])
/// ([`DistributedLockExt::acquire`](crate::DistributedLockExt::acquire)); `key` as for
/// [`try_acquire`].
pub(crate) async fn acquire(
    backend: Arc<dyn DistributedLock>,
    key: Result<LockKey>,
    opts: &LockOptions,
) -> Result<Lease> {
    let key = key?;
    match attempt(backend, key.clone(), opts, Mode::Wait).await? {
        Some(lease) => Ok(lease),
        None => Err(Error::Timeout {
            key: key.to_string(),
            waited: opts.wait.unwrap_or_default(),
        }),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Once,
    Wait,
}

async fn attempt(
    backend: Arc<dyn DistributedLock>,
    key: LockKey,
    opts: &LockOptions,
    mode: Mode,
) -> Result<Option<Lease>> {
    opts.validate()?;
    // An answer that comes at once (the in-process lock, a free key) must not let a loop of
    // acquires keep its thread from the runtime's other tasks: as tokio's own locks do, an
    // acquire spends a unit of the task's cooperative budget, and yields once it is spent.
    tokio::task::coop::consume_budget().await;
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
