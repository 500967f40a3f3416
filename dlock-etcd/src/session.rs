//! The session: one etcd lease per client, granted once, kept alive by one stream, revoked on close.
//!
//! Every contender key a client writes is attached to its session lease, as etcd's
//! `concurrency.Session` does, so a client that dies or is cut off loses all its locks when the
//! lease runs out on the server, and a client that closes frees them at once by revoking it.
//!
//! The client's view of the lease is a [`SessionState`], published on a watch channel:
//!
//! * **Alive** `until` the last confirmed keep-alive's send time plus the lease's TTL, minus a
//!   small margin. The server renews a lease when the keep-alive *arrives*, which is after it was
//!   sent, so the server keeps the lease at least that long.
//! * **Suspended** when a keep-alive goes unanswered or the stream breaks: the lease may live on,
//!   but nothing confirms it. The keeper reopens the stream (on any endpoint) meanwhile.
//! * **Expired** when the server answers that the lease is gone (TTL 0, "lease not found"), or
//!   when `until` passes without a confirmation. Terminal: a lease the client gave up on is never
//!   revived, even if the server still had it (it is revoked instead, so that its keys go too).
//!
//! A client whose session expired grants a new one for its next acquire.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::SessionState;
use dlock_core::{Error, Result};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::from_client;
use crate::requests::{RequestError, Requests};
use crate::watchdog::{start_deferred, Deferred};

/// The shortest pause between attempts to reopen a broken keep-alive stream.
const REOPEN_BACKOFF: Duration = Duration::from_millis(50);

/// One session lease and its keeper.
pub(crate) struct Session {
    id: i64,
    ttl: Duration,
    state: watch::Sender<SessionState>,
    keeper: JoinHandle<()>,
    requests: Requests,
    /// The watchdogs of this session's locks that need not run yet, and the task that starts
    /// them.
    pub(crate) watchdogs: Arc<Deferred>,
    starter: JoinHandle<()>,
    /// Set once the server is known not to have the lease any more (revoked, or answered that
    /// it is gone).
    gone: Arc<AtomicBool>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("lease", &crate::layout::lease_hex(self.id))
            .field("ttl", &self.ttl)
            .field("state", &*self.state.borrow())
            .finish()
    }
}

/// How much earlier than `sent + TTL` the client stops trusting a keep-alive: 1 % of the TTL for
/// clock-rate differences plus 10 ms.
fn margin(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(10)
}

/// The longest TTL the client believes from a server answer; a larger one is treated as this.
const MAX_BELIEVED_TTL: Duration = Duration::from_secs(24 * 3600);

/// Until when a keep-alive sent at `sent` and answered with `ttl` vouches for the lease.
fn vouched_until(sent: Instant, ttl: Duration) -> Instant {
    let ttl = ttl.min(MAX_BELIEVED_TTL);
    sent + ttl.saturating_sub(margin(ttl))
}

impl Session {
    /// Grants a lease of `ttl` (whole seconds, rounded up; etcd may raise it to its minimum) and
    /// starts keeping it alive.
    pub(crate) async fn grant(
        requests: &Requests,
        ttl: Duration,
        budget: Duration,
    ) -> Result<Self> {
        let seconds = i64::try_from(ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0))
            .map_err(|_| Error::invalid("session_timeout", "too large"))?;
        let sent = Instant::now();
        let granted = requests
            .lease_grant(seconds, budget)
            .await
            .map_err(Error::from)?;
        if !granted.error().is_empty() {
            return Err(Error::backend(
                crate::error::BACKEND,
                true,
                format!("lease grant refused: {}", granted.error()),
            ));
        }
        let id = granted.id();
        let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0).max(1))
            .min(MAX_BELIEVED_TTL);
        let until = vouched_until(sent, ttl);
        let (state, _) = watch::channel(SessionState::Alive { until: Some(until) });
        let gone = Arc::new(AtomicBool::new(false));
        let keeper = tokio::spawn(keep_alive(
            requests.clone(),
            id,
            ttl,
            state.clone(),
            until,
            gone.clone(),
        ));
        let watchdogs = Arc::new(Deferred::default());
        let starter = tokio::spawn(start_deferred(watchdogs.clone(), state.subscribe()));
        tracing::debug!(lease = %crate::layout::lease_hex(id), ?ttl, "etcd session granted");
        Ok(Session {
            id,
            ttl,
            state,
            keeper,
            requests: requests.clone(),
            watchdogs,
            starter,
            gone,
        })
    }

    /// The lease id.
    pub(crate) fn id(&self) -> i64 {
        self.id
    }

    /// The lease's TTL as granted by the server.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A receiver of the session's state.
    pub(crate) fn watch(&self) -> watch::Receiver<SessionState> {
        self.state.subscribe()
    }

    /// The state now, with the clock applied: past its `until` a session is expired whatever was
    /// last published.
    pub(crate) fn state(&self) -> SessionState {
        current(&self.state.borrow(), Instant::now())
    }

    /// Whether new locks may still be attached to this session.
    pub(crate) fn is_usable(&self) -> bool {
        !matches!(self.state(), SessionState::Expired)
    }

    /// Records that the server no longer has the lease (learned from a request that named it).
    pub(crate) fn mark_expired(&self) {
        expire(&self.state, "the server no longer has the lease");
        self.gone.store(true, Ordering::SeqCst);
        self.keeper.abort();
    }

    /// Revokes a lease the client gave up on while the server may still have it (its keep-alives
    /// went unanswered): a key written by a request whose answer was lost would otherwise stand in
    /// every contender's way until the server expires the lease. One attempt within the request
    /// timeout; called before a new session is granted, so the first acquire after a partition
    /// heals does not find this client's own old key in its way.
    pub(crate) async fn revoke_if_left(&self) {
        // Only a session the keeper gave up on: one merely past its last confirmation may
        // still be renewed by an answer on its way, with its locks.
        let given_up = matches!(*self.state.borrow(), SessionState::Expired);
        if self.gone.load(Ordering::SeqCst) || !given_up {
            return;
        }
        match self
            .requests
            .lease_revoke(self.id, self.requests.timeout())
            .await
        {
            Ok(()) => self.gone.store(true, Ordering::SeqCst),
            Err(e) if e.is_lease_not_found() => self.gone.store(true, Ordering::SeqCst),
            Err(e) => tracing::debug!(error = %e, "revoking a session given up on failed"),
        }
    }

    /// Waits until the session is confirmed alive, and returns until when; fails at once with
    /// [`Error::Lost`] for `key` if it expires, and with [`Error::Timeout`] at `deadline`.
    ///
    /// This is the check etcd's own mutex lacked before 3.5 (etcd issue #11456): a waiter must
    /// not be told it holds a lock whose session lease has run out meanwhile.
    pub(crate) async fn wait_alive(&self, key: &str, deadline: Option<Instant>) -> Result<Instant> {
        let started = Instant::now();
        let mut rx = self.state.subscribe();
        loop {
            let state = current(&rx.borrow_and_update(), Instant::now());
            let until = match state {
                SessionState::Alive { until } => return Ok(until.unwrap_or_else(far_future)),
                SessionState::Expired => {
                    return Err(Error::Lost {
                        key: key.to_owned(),
                        reason: dlock_core::LostReason::SessionEnded,
                    })
                }
                SessionState::Suspended { until } => until,
                _ => far_future(),
            };
            let wake = deadline.map_or(until, |d| d.min(until));
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        return Err(Error::Lost {
                            key: key.to_owned(),
                            reason: dlock_core::LostReason::SessionEnded,
                        });
                    }
                }
                _ = tokio::time::sleep_until(wake) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(Error::Timeout { key: key.to_owned(), waited: started.elapsed() });
                    }
                }
            }
        }
    }

    /// Revokes the lease now: every key attached to it is deleted by the server. The session is
    /// expired afterwards whatever the outcome.
    pub(crate) async fn revoke(&self) -> Result<()> {
        self.keeper.abort();
        expire(&self.state, "revoked by the client");
        match self
            .requests
            .lease_revoke(self.id, self.requests.timeout())
            .await
        {
            Ok(_) => {
                self.gone.store(true, Ordering::SeqCst);
                Ok(())
            }
            Err(e) if e.is_lease_not_found() => {
                self.gone.store(true, Ordering::SeqCst);
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.keeper.abort();
        self.starter.abort();
        let was_usable = self.is_usable();
        expire(&self.state, "the client dropped the session");
        if !was_usable {
            return;
        }
        // Nobody uses the session any more: free its keys now rather than after its TTL.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (requests, id) = (self.requests.clone(), self.id);
            runtime.spawn(async move {
                let _ = requests.lease_revoke(id, requests.timeout()).await;
            });
        }
    }
}

/// The state `published` stands for at `now`.
pub(crate) fn current(published: &SessionState, now: Instant) -> SessionState {
    match *published {
        SessionState::Alive { until: Some(until) } | SessionState::Suspended { until }
            if now >= until =>
        {
            SessionState::Expired
        }
        other => other,
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(30 * 365 * 24 * 3600)
}

fn alive(state: &watch::Sender<SessionState>, until: Instant) {
    state.send_if_modified(|s| {
        if matches!(s, SessionState::Expired) {
            return false;
        }
        *s = SessionState::Alive { until: Some(until) };
        true
    });
}

fn suspend(state: &watch::Sender<SessionState>, until: Instant, why: &dyn std::fmt::Display) {
    state.send_if_modified(|s| match s {
        SessionState::Alive { .. } => {
            tracing::debug!(%why, "etcd session suspended: keep-alive unanswered");
            *s = SessionState::Suspended { until };
            true
        }
        _ => false,
    });
}

fn expire(state: &watch::Sender<SessionState>, why: &str) {
    state.send_if_modified(|s| {
        if matches!(s, SessionState::Expired) {
            return false;
        }
        tracing::debug!(why, "etcd session expired");
        *s = SessionState::Expired;
        true
    });
}

/// Keeps lease `id` alive through one keep-alive stream, reopened whenever it breaks, until the
/// lease is gone or the client can no longer vouch for it.
async fn keep_alive(
    requests: Requests,
    id: i64,
    ttl: Duration,
    state: watch::Sender<SessionState>,
    mut until: Instant,
    gone: Arc<AtomicBool>,
) {
    // etcd's own session sends a keep-alive every third of the TTL; an answer that has not come
    // by the next one counts as missing.
    let interval = (ttl / 3).max(Duration::from_millis(100));
    let mut reopen_delay = REOPEN_BACKOFF;
    let mut generation = requests.generation();
    loop {
        let sent = Instant::now();
        if sent >= until {
            expire(
                &state,
                "no keep-alive was confirmed before the lease could end",
            );
            // The server may still have it (e.g. it was extended by a leader change): make sure
            // its keys do not outlive the client's belief.
            if requests.lease_revoke(id, interval).await.is_ok() {
                gone.store(true, Ordering::SeqCst);
            }
            return;
        }
        // Opening the stream sends the first keep-alive and waits for its answer.
        let budget = interval.min(until - sent);
        generation.borrow_and_update();
        let opened = requests.lease_keep_alive(id, budget).await;
        let (mut keeper, mut stream) = match opened {
            Ok(pair) => pair,
            Err(e) if e.is_lease_not_found() => {
                expire(&state, "the server no longer has the lease");
                return;
            }
            Err(e) => {
                let why = Error::from(e);
                suspend(&state, until, &why);
                let wait = reopen_delay.min(until.saturating_duration_since(Instant::now()));
                tokio::time::sleep(wait).await;
                reopen_delay = (reopen_delay * 2).min(interval);
                continue;
            }
        };
        reopen_delay = REOPEN_BACKOFF;
        // The opening keep-alive renewed the lease to its full TTL.
        until = vouched_until(sent, ttl);
        alive(&state, until);
        let mut next = sent + interval;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                // Requests moved to another member: prefer the leader, and move the stream too.
                _ = generation.changed() => {
                    requests.endpoints().pin_leader().await;
                    break;
                }
            }
            let sent = Instant::now();
            if let Err(e) = keeper.keep_alive().await {
                suspend(&state, until, &from_client(e));
                break;
            }
            // An answer due by the next keep-alive that has not come makes the session
            // suspended; a late one still vouches for the lease from `sent`, so it is waited
            // for on the same stream until the lease could end (a new stream would need a new
            // connection, and its first answer, in what is left of that time).
            let answer =
                match tokio::time::timeout_at((sent + interval).min(until), stream.message()).await
                {
                    Ok(answer) => Ok(answer),
                    Err(_) => {
                        suspend(&state, until, &"no keep-alive answer in time");
                        tokio::time::timeout_at(until, stream.message()).await
                    }
                };
            match answer {
                Ok(Ok(Some(answer))) if answer.ttl() > 0 => {
                    let granted = Duration::from_secs(answer.ttl().unsigned_abs());
                    until = vouched_until(sent, granted);
                    alive(&state, until);
                    next = sent + interval;
                }
                Ok(Ok(Some(_))) => {
                    expire(&state, "the server answered the keep-alive with TTL 0");
                    return;
                }
                Ok(Ok(None)) => {
                    suspend(&state, until, &"the keep-alive stream ended");
                    break;
                }
                Ok(Err(e)) => {
                    let error = RequestError::Client(e);
                    if error.is_lease_not_found() {
                        expire(&state, "the server no longer has the lease");
                        return;
                    }
                    suspend(&state, until, &Error::from(error));
                    break;
                }
                Err(_) => {
                    suspend(
                        &state,
                        until,
                        &"no keep-alive answer before the lease could end",
                    );
                    break;
                }
            }
        }
    }
}

/// A shared, replaceable session: the one new locks attach to.
#[derive(Debug, Default)]
pub(crate) struct SessionSlot {
    current: std::sync::Mutex<Option<Arc<Session>>>,
    granting: tokio::sync::Mutex<()>,
    /// The last sessions replaced while the server may still have had them (their revocation
    /// could not be confirmed), newest last.
    abandoned: std::sync::Mutex<Vec<i64>>,
}

/// How many abandoned sessions a client remembers.
const ABANDONED_KEPT: usize = 8;

impl SessionSlot {
    /// The current session if it is still usable.
    pub(crate) fn usable(&self) -> Option<Arc<Session>> {
        self.lock().as_ref().filter(|s| s.is_usable()).cloned()
    }

    /// The current session, or a newly granted one if the last has expired. Grants are
    /// serialised, so concurrent acquires share one new session.
    pub(crate) async fn get_or_grant(
        &self,
        requests: &Requests,
        ttl: Duration,
        budget: Duration,
    ) -> Result<Arc<Session>> {
        if let Some(session) = self.usable() {
            return Ok(session);
        }
        let _granting = self.granting.lock().await;
        if let Some(session) = self.usable() {
            return Ok(session);
        }
        let previous = self.lock().clone();
        if let Some(previous) = previous {
            previous.revoke_if_left().await;
            let given_up = matches!(*previous.state.borrow(), SessionState::Expired);
            if given_up && !previous.gone.load(Ordering::SeqCst) {
                let mut abandoned = self
                    .abandoned
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                abandoned.push(previous.id());
                let excess = abandoned.len().saturating_sub(ABANDONED_KEPT);
                abandoned.drain(..excess);
            }
        }
        let session = Arc::new(Session::grant(requests, ttl, budget).await?);
        *self.lock() = Some(session.clone());
        Ok(session)
    }

    /// Whether `lease` is a session this client gave up on without a confirmed revocation.
    pub(crate) fn is_abandoned(&self, lease: i64) -> bool {
        lease != 0
            && self
                .abandoned
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .contains(&lease)
    }

    /// Removes the current session (for closing).
    pub(crate) fn take(&self) -> Option<Arc<Session>> {
        self.lock().take()
    }

    /// The id of the current session, if any (usable or not).
    pub(crate) fn current_id(&self) -> Option<i64> {
        self.lock().as_ref().map(|s| s.id())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<Session>>> {
        // Only an `Option<Arc<_>>` is behind this lock, never left half-written.
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
