//! One task per held lock: it gives the lease its state and ends the lock at the end of its TTL.
//!
//! A lease follows a [`SessionState`] channel (see `dlock_core::SessionState`), and a held lock
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

use std::sync::Weak;
use std::time::Duration;

use dlock_core::{LockKey, SessionState};
use tokio::sync::watch;
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
    pub(crate) async fn run(mut self) {
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
            tokio::select! {
                _ = tokio::time::sleep_until(watch_at.unwrap_or(wake)), if watch_at.is_some() => {
                    self.watch_at = None;
                    if let Some(keys) = self.keys.upgrade() {
                        self.subscription = Some(keys.subscribe(self.contender.clone()));
                    }
                }
                alarm = alarm => match alarm {
                    Some(alarm) => {
                        if let Verdict::Lost = self.on_alarm(alarm).await {
                            publish(&self.view, SessionState::TakenOver);
                            tracing::debug!(key = %self.key, outcome = "key_deleted", "etcd lock lost");
                            self.forget();
                            return;
                        }
                    }
                    // The watch ended (after a final alarm) or the client is closing.
                    None => self.subscription = None,
                },
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
        self.delete_key().await;
        self.forget();
    }

    /// Decides what a watch alarm means: a deletion loses the lock; a (re)armed or cancelled
    /// watch leads to one check of the key, from the member and, if that says it is gone, from
    /// the cluster (a lagging member may not have our key yet).
    async fn on_alarm(&mut self, alarm: Alarm) -> Verdict {
        if alarm == Alarm::Deleted {
            return Verdict::Lost;
        }
        let check = |read| {
            confirm_own(
                &self.requests,
                &self.prefix,
                &self.contender,
                self.revision,
                self.lease,
                read,
            )
        };
        let owner = match check(Read::Local).await {
            Ok(Owner::Us) => Ok(Owner::Us),
            _ => check(Read::Fresh).await,
        };
        match owner {
            Ok(Owner::Us) => {}
            Ok(_) => return Verdict::Lost,
            // Unknown: keep-alives and the TTL still guard; the watch is armed again below.
            Err(_) => {}
        }
        if alarm == Alarm::Unsure {
            self.subscription = None;
            if let Some(keys) = self.keys.upgrade() {
                self.subscription = Some(keys.subscribe(self.contender.clone()));
            }
        }
        Verdict::Held
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
        let mut pause = Duration::from_millis(50);
        loop {
            match delete_own(
                &self.requests,
                &self.prefix,
                &self.contender,
                self.revision,
                self.lease,
            )
            .await
            {
                Ok(Owner::Us | Owner::Other | Owner::Nobody) => return,
                Err(error) => {
                    let session = session::current(&self.session.borrow(), Instant::now());
                    if matches!(session, SessionState::Expired) {
                        return;
                    }
                    tracing::debug!(key = %self.key, ?error, "deleting an expired lock's key failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    /// Removes the lock's record, passing the local turn on.
    fn forget(&self) {
        if let Some(local_queue) = self.local_queue.upgrade() {
            local_queue.discard(&self.key, self.revision);
        }
    }
}
