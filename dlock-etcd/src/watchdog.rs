//! One task per held lock: it gives the lease its state and ends the lock at the end of its TTL.
//!
//! A lease follows a [`SessionState`] channel (see `dlock_core::backend::SessionState`), and a held lock
//! has two clocks: its session lease, which the server enforces, and the per-acquire TTL, which
//! this client enforces by deleting its own key (see the crate docs). The watchdog publishes the
//! session's part on the channel the lease follows; dlock-core keeps the TTL's validity beside it
//! and holds the lease until the earlier of the two:
//!
//! * held until the session's confirmed end;
//! * uncertain while the session's keep-alives go unanswered;
//! * lost at once when the session expires or the key is deleted behind the holder's back, and
//!   at the end of the TTL without an extension — then it deletes the key (ownership-checked),
//!   which is what lets the next contender in.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use dlock_core::backend::LockKey;
use dlock_core::backend::SessionState;
use tokio::sync::{watch, Notify};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::contention::{confirm_own, delete_own, Owner, Read};
use crate::keywatch::{Alarm, KeyWatch, Subscription};
use crate::local_queue::{LocalExpiry, LocalQueue};
use crate::requests::Requests;
use crate::session;

/// What the watchdog of one lock needs.
pub(crate) struct Watchdog {
    pub(crate) local_queue: Weak<LocalQueue>,
    pub(crate) requests: Requests,
    pub(crate) key: LockKey,
    pub(crate) prefix: Vec<u8>,
    pub(crate) contender: Vec<u8>,
    pub(crate) revision: i64,
    pub(crate) lease: i64,
    pub(crate) session: watch::Receiver<SessionState>,
    pub(crate) expiry: watch::Receiver<LocalExpiry>,
    /// What the lease follows.
    pub(crate) view: watch::Sender<SessionState>,
    /// The client's watch on held keys.
    pub(crate) keys: Weak<KeyWatch>,
    /// The watch on this lock's key, once it is watched.
    pub(crate) subscription: Option<Subscription>,
    /// When to start watching the key (see [`WATCH_AFTER`]); `None` once started.
    pub(crate) watch_at: Option<Instant>,
}

/// How long a lock is held before its key is watched. Most critical sections are shorter, and
/// they are spared a watch's creation and cancellation on the server. Nothing is missed: once
/// the watch exists the key is checked, so a deletion before it is found then.
pub(crate) const WATCH_AFTER: Duration = Duration::from_millis(50);

/// A check of a held key after a watch alarm, and what it found.
type Check = Pin<Box<dyn Future<Output = (Alarm, Verdict)> + Send>>;

/// What a key watch's alarm means for the lock.
enum Verdict {
    Held,
    Lost,
}

/// The lease's state given the session's and the lock's expiry: expired once the expiry ended,
/// otherwise the session's.
pub(crate) fn merge(session: SessionState, expiry: LocalExpiry, now: Instant) -> SessionState {
    if now >= expiry.delete_at {
        return SessionState::Expired;
    }
    match session::current(&session, now) {
        alive @ SessionState::Alive { .. } => alive,
        suspended @ SessionState::Suspended { .. } => suspended,
        _ => SessionState::Expired,
    }
}

fn publish(view: &watch::Sender<SessionState>, state: SessionState) {
    view.send_if_modified(|current| {
        if *current == state || matches!(current, SessionState::Expired | SessionState::TakenOver) {
            return false;
        }
        *current = state;
        true
    });
}

impl Watchdog {
    /// When this watchdog has to run at the latest: when the key is to be watched, or at the end
    /// of the TTL if that comes first.
    fn due(&self) -> Instant {
        let end = self.expiry.borrow().delete_at;
        self.watch_at.map_or(end, |at| at.min(end))
    }

    /// Starts the watchdog if its lock is still held and it does not run yet.
    fn start(self) {
        let Some(local_queue) = self.local_queue.upgrade() else {
            return;
        };
        let (key, revision) = (self.key.clone(), self.revision);
        local_queue.with_held(&key, move |held| {
            if held.revision == revision && !matches!(held.watchdog, Started::Running(_)) {
                held.watchdog = Started::Running(tokio::spawn(self.run()).abort_handle());
            }
        });
    }

    /// The requests it may make (a check of the key after a watch alarm, the deletion at the end
    /// of the TTL) are boxed: they are rare, and held inline they would make every held lock's
    /// task the size of the largest request future (7.8 KB against 0.9 KB, measured).
    pub(crate) async fn run(mut self) {
        let mut checking: Option<Check> = None;
        loop {
            let expiry = *self.expiry.borrow_and_update();
            let session = *self.session.borrow_and_update();
            let now = Instant::now();
            let state = merge(session, expiry, now);
            if now >= expiry.delete_at {
                if self.begin_expiry(now) {
                    break;
                }
                continue;
            }
            publish(&self.view, state);
            if matches!(state, SessionState::Expired) {
                // The session ended: the server deletes the key with the lease.
                tracing::debug!(key = %self.key, outcome = "session_ended", "etcd lock lost");
                self.forget();
                return;
            }
            let wake = match session {
                SessionState::Suspended { until } => until.min(expiry.delete_at),
                SessionState::Alive { until: Some(until) } => until.min(expiry.delete_at),
                _ => expiry.delete_at,
            };
            let alarm = async {
                match self.subscription.as_mut() {
                    Some(subscription) => subscription.alarms.recv().await,
                    None => std::future::pending().await,
                }
            };
            let watch_at = self.watch_at;
            let idle = checking.is_none();
            let checked = async {
                match checking.as_mut() {
                    Some(check) => check.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::time::sleep_until(watch_at.unwrap_or(wake)), if watch_at.is_some() => {
                    self.watch_at = None;
                    if let Some(keys) = self.keys.upgrade() {
                        self.subscription = Some(keys.subscribe(self.contender.clone()));
                    }
                }
                alarm = alarm, if idle => match alarm {
                    Some(alarm) => checking = Some(self.check(alarm)),
                    // The watch ended (after a final alarm) or the client is closing.
                    None => self.subscription = None,
                },
                (alarm, verdict) = checked => {
                    checking = None;
                    match verdict {
                        Verdict::Lost => {
                            publish(&self.view, SessionState::TakenOver);
                            tracing::debug!(key = %self.key, outcome = "key_deleted", "etcd lock lost");
                            self.forget();
                            return;
                        }
                        // The server cancelled the watch: watch the key again.
                        Verdict::Held if alarm == Alarm::Unsure => {
                            self.subscription = None;
                            if let Some(keys) = self.keys.upgrade() {
                                self.subscription = Some(keys.subscribe(self.contender.clone()));
                            }
                        }
                        Verdict::Held => {}
                    }
                }
                _ = tokio::time::sleep_until(wake) => {}
                changed = self.session.changed() => {
                    if changed.is_err() {
                        publish(&self.view, SessionState::Expired);
                        self.forget();
                        return;
                    }
                }
                changed = self.expiry.changed() => {
                    if changed.is_err() {
                        // The record is gone: released.
                        return;
                    }
                }
            }
        }
        // The TTL ended without an extension.
        publish(&self.view, SessionState::Expired);
        tracing::debug!(key = %self.key, outcome = "ttl_ended", "etcd lock expired; deleting its key");
        Box::pin(self.delete_key()).await;
        self.forget();
    }

    /// Decides what a watch alarm means: a deletion loses the lock; a (re)armed or cancelled
    /// watch leads to one check of the key, from the member and, if that says it is gone, from
    /// the cluster (a lagging member may not have our key yet). The check runs beside the
    /// watchdog's loop, which meanwhile goes on following the session: a slow answer must not
    /// hold back the session's renewals, which the lease's validity follows.
    fn check(&self, alarm: Alarm) -> Check {
        let requests = self.requests.clone();
        let (prefix, contender) = (self.prefix.clone(), self.contender.clone());
        let (revision, lease) = (self.revision, self.lease);
        Box::pin(async move {
            if alarm == Alarm::Deleted {
                return (alarm, Verdict::Lost);
            }
            let check = |read| confirm_own(&requests, &prefix, &contender, revision, lease, read);
            let owner = match check(Read::Local).await {
                Ok(Owner::Us) => Ok(Owner::Us),
                _ => check(Read::Fresh).await,
            };
            let verdict = match owner {
                Ok(Owner::Us) => Verdict::Held,
                Ok(_) => Verdict::Lost,
                // Unknown: keep-alives and the TTL still guard; an unsure watch is armed again.
                Err(_) => Verdict::Held,
            };
            (alarm, verdict)
        })
    }

    /// Marks the record as expiring unless an extension moved its expiry meanwhile; returns
    /// whether it did.
    fn begin_expiry(&self, now: Instant) -> bool {
        let Some(local_queue) = self.local_queue.upgrade() else {
            return true;
        };
        local_queue
            .with_held(&self.key, |held| {
                if held.revision != self.revision || held.expiry.borrow().delete_at > now {
                    return false;
                }
                held.expiring = true;
                true
            })
            .unwrap_or(true)
    }

    /// Deletes the key if it is still ours; retried while the session may still hold it.
    async fn delete_key(&self) {
        delete_while_alive(
            &self.requests,
            &self.prefix,
            &self.contender,
            self.revision,
            self.lease,
            &self.session,
        )
        .await;
    }

    /// Removes the lock's record, passing the local turn on.
    fn forget(&self) {
        if let Some(local_queue) = self.local_queue.upgrade() {
            local_queue.discard(&self.key, self.revision);
        }
    }
}

/// Deletes `key` of `prefix` if it is still the one created at `revision` on `lease`; retried
/// while the session may still hold it (once it has ended, the server deleted the key with it).
pub(crate) async fn delete_while_alive(
    requests: &Requests,
    prefix: &[u8],
    key: &[u8],
    revision: i64,
    lease: i64,
    session: &watch::Receiver<SessionState>,
) {
    let mut pause = Duration::from_millis(50);
    loop {
        match delete_own(requests, prefix, key, revision, lease).await {
            Ok(Owner::Us | Owner::Other | Owner::Nobody) => return,
            Err(error) => {
                let state = session::current(&session.borrow(), Instant::now());
                if matches!(state, SessionState::Expired) {
                    return;
                }
                tracing::debug!(?error, "deleting an expired grant's key failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// Whether a held lock's watchdog runs.
pub(crate) enum Started {
    /// Not registered yet (the lock is being recorded).
    No,
    /// Waiting in its session's [`Deferred`] under this entry.
    Deferred(Weak<Deferred>, DeferredId),
    /// Running, as this task.
    Running(AbortHandle),
}

impl Started {
    /// Stops the watchdog, or takes it out of its session's waiting list (the lock is gone).
    pub(crate) fn stop(&mut self) {
        match std::mem::replace(self, Started::No) {
            Started::No => {}
            Started::Deferred(deferred, id) => {
                if let Some(deferred) = deferred.upgrade() {
                    deferred.cancel(id);
                }
            }
            Started::Running(task) => task.abort(),
        }
    }
}

/// An entry of a [`Deferred`].
pub(crate) type DeferredId = (Instant, u64);

/// The watchdogs of one session's locks that need not run yet.
///
/// Most locks are released within [`WATCH_AFTER`], long before their TTL ends, and while the
/// session stays alive a watchdog has nothing to do until then: the lease was given the
/// session's state when it was granted. So a watchdog is not a task of its own from the start
/// (a spawn, two timers and an abort per lock); it waits here, and one task per session starts
/// it when it is due, or at once when the session's state changes other than by a renewal.
#[derive(Default)]
pub(crate) struct Deferred {
    inner: Mutex<Waiting>,
    wake: Notify,
}

#[derive(Default)]
struct Waiting {
    next_id: u64,
    due: BTreeMap<DeferredId, Watchdog>,
    /// What the session's task sleeps until (`None`: until it is woken).
    armed_for: Option<Instant>,
}

impl Deferred {
    fn inner(&self) -> MutexGuard<'_, Waiting> {
        // Each change below completes before anything can panic.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `watchdog` until it is due; the id takes it out again.
    pub(crate) fn add(&self, watchdog: Watchdog) -> DeferredId {
        let due = watchdog.due();
        let mut inner = self.inner();
        inner.next_id += 1;
        let id = (due, inner.next_id);
        inner.due.insert(id, watchdog);
        if inner.armed_for.is_none_or(|armed| due < armed) {
            inner.armed_for = Some(due);
            self.wake.notify_one();
        }
        id
    }

    fn cancel(&self, id: DeferredId) {
        let removed = self.inner().due.remove(&id);
        drop(removed);
    }

    /// Takes out the watchdogs due by `now` (all of them with `None`), and records what the
    /// session's task sleeps until next.
    fn take_due(&self, now: Option<Instant>) -> Vec<Watchdog> {
        let mut inner = self.inner();
        let taken = match now {
            None => std::mem::take(&mut inner.due),
            Some(now) => {
                let later = inner.due.split_off(&(now, u64::MAX));
                std::mem::replace(&mut inner.due, later)
            }
        };
        inner.armed_for = inner.due.keys().next().map(|(due, _)| *due);
        taken.into_values().collect()
    }
}

/// The task of one session that starts its locks' watchdogs when they are due, and all of them
/// when the session's state changes other than by a renewal (suspended, expired, gone).
pub(crate) async fn start_deferred(
    deferred: Arc<Deferred>,
    mut session: watch::Receiver<SessionState>,
) {
    let mut last = *session.borrow_and_update();
    let mut next = None;
    loop {
        tokio::select! {
            () = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {}
            () = deferred.wake.notified() => {}
            changed = session.changed() => {
                let now = *session.borrow_and_update();
                let renewed = matches!(
                    (last, now),
                    (SessionState::Alive { .. }, SessionState::Alive { .. })
                );
                last = now;
                if changed.is_err() || !renewed {
                    deferred.take_due(None).into_iter().for_each(Watchdog::start);
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
        deferred
            .take_due(Some(Instant::now()))
            .into_iter()
            .for_each(Watchdog::start);
        next = deferred.inner().armed_for;
    }
}
