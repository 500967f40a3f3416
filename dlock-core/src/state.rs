//! The three-state view of a lease: held, uncertain, lost.
//!
//! Silent loss is the most common complaint against lock libraries: a holder keeps working after
//! its lock expired or was taken over. Every lease therefore publishes its state on a watch channel
//! that the holder can query ([`LeaseWatch::state`]) or await ([`LeaseWatch::lost`]), and that
//! moves to *lost* on its own when the client-side validity deadline passes, without any server
//! round trip.

use std::fmt;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::LostReason;
use crate::key::LockKey;
use crate::token::FencingToken;

/// What the holder can currently assume about its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Held, and confirmed by the backend, until `until` at the latest.
    Held {
        /// Client-side validity deadline.
        until: Instant,
    },
    /// The backend cannot currently confirm the lease (connection lost, renewal failing). It may
    /// still be held, but another client may already hold it once `until` passes: stop starting
    /// new work that needs the lock.
    Uncertain {
        /// Client-side validity deadline; at this instant the lease becomes lost.
        until: Instant,
    },
    /// Not held. Terminal: a lost lease never becomes held again.
    Lost(LostReason),
}

impl LeaseState {
    /// Whether the lease may be relied on (held, not uncertain, not lost).
    pub fn is_held(&self) -> bool {
        matches!(self, LeaseState::Held { .. })
    }

    /// Whether the lease is lost.
    pub fn is_lost(&self) -> bool {
        matches!(self, LeaseState::Lost(_))
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let left = |until: &Instant| until.saturating_duration_since(Instant::now());
        match self {
            LeaseState::Held { until } => write!(f, "held ({:?} left)", left(until)),
            LeaseState::Uncertain { until } => {
                write!(f, "uncertain (lost in {:?} unless confirmed)", left(until))
            }
            LeaseState::Lost(reason) => write!(f, "lost: {reason}"),
        }
    }
}

/// What the backend or renewal last said about the lease, before the clock is taken into account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Condition {
    Held,
    Uncertain,
    Lost(LostReason),
}

/// The value published on a lease's watch channel.
///
/// A lease has two independent bounds, and is valid until the earlier of them: its own TTL
/// (moved by every extension or renewal, computed with the caller's drift allowance) and, for
/// session-based backends, how long the session is vouched for. They are kept apart so that
/// neither overwrites the other: a session confirmation never stretches a TTL that was not
/// renewed, and an extension never outlives a session that is in doubt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Status {
    /// The end of the lease's own validity: grant or last extension, plus TTL, minus drift.
    pub(crate) deadline: Instant,
    /// The end of the session's confirmation; `None` when the lease lives in no session or
    /// the session sets no bound.
    pub(crate) session_until: Option<Instant>,
    pub(crate) condition: Condition,
}

impl Status {
    /// A held lease valid until `deadline`, in no session yet.
    pub(crate) fn held(deadline: Instant) -> Self {
        Status {
            deadline,
            session_until: None,
            condition: Condition::Held,
        }
    }

    /// The instant the lease stops being valid: the earlier of its two bounds.
    pub(crate) fn until(&self) -> Instant {
        match self.session_until {
            Some(session) => self.deadline.min(session),
            None => self.deadline,
        }
    }

    /// The state at `now`: past its deadline a lease is lost whatever was last said.
    pub(crate) fn at(&self, now: Instant) -> LeaseState {
        let until = self.until();
        match self.condition {
            Condition::Lost(reason) => LeaseState::Lost(reason),
            _ if now >= until => LeaseState::Lost(LostReason::Expired),
            Condition::Held => LeaseState::Held { until },
            Condition::Uncertain => LeaseState::Uncertain { until },
        }
    }
}

/// Sender side of a lease's state, shared by the lease and its renewal task.
pub(crate) type StatusSender = watch::Sender<Status>;

/// A lease's status, kept as a plain value until someone wants to watch it.
///
/// Most leases are acquired, used and released without anyone awaiting their loss; creating the
/// watch channel only when a watcher, a renewal task or a session asks for it keeps the plain
/// acquire–release cycle free of its allocation and wake-up bookkeeping. Once the channel exists
/// it is the only truth; before that, the value can only change through `&mut self`.
#[derive(Debug)]
pub(crate) struct StatusCell {
    local: Status,
    shared: std::sync::OnceLock<StatusSender>,
}

impl StatusCell {
    pub(crate) fn new(status: Status) -> Self {
        StatusCell {
            local: status,
            shared: std::sync::OnceLock::new(),
        }
    }

    /// The current status.
    pub(crate) fn current(&self) -> Status {
        match self.shared.get() {
            Some(tx) => *tx.borrow(),
            None => self.local,
        }
    }

    /// The channel, created on first use.
    pub(crate) fn sender(&self) -> &StatusSender {
        self.shared.get_or_init(|| watch::channel(self.local).0)
    }

    /// Marks the lease lost for `reason` unless it is lost already.
    pub(crate) fn mark_lost(&mut self, reason: LostReason) {
        match self.shared.get() {
            Some(tx) => {
                mark_lost(tx, reason);
            }
            None => {
                if !matches!(self.local.condition, Condition::Lost(_)) {
                    self.local.condition = Condition::Lost(reason);
                }
            }
        }
    }
}

/// Applies `change` unless the lease is already lost at `now`; returns whether it applied.
///
/// Lost is terminal: a renewal acknowledged after the deadline passed does not resurrect the lease,
/// because work may already have been cancelled on the strength of the loss.
pub(crate) fn update(tx: &StatusSender, now: Instant, change: impl FnOnce(&mut Status)) -> bool {
    let mut applied = false;
    tx.send_if_modified(|status| match status.at(now) {
        LeaseState::Lost(reason) => {
            // Record an expiry so that watchers parked on the deadline see a terminal value.
            let newly = !matches!(status.condition, Condition::Lost(_));
            status.condition = Condition::Lost(reason);
            newly
        }
        _ => {
            let before = *status;
            change(status);
            applied = true;
            *status != before
        }
    });
    applied
}

/// Publishes the expiry of a lease whose deadline has passed, so that watchers see a terminal value.
pub(crate) fn record_expiry(tx: &StatusSender, now: Instant) {
    update(tx, now, |_| ());
}

/// Marks the lease lost for `reason` unless it is lost already; returns whether it changed.
pub(crate) fn mark_lost(tx: &StatusSender, reason: LostReason) -> bool {
    tx.send_if_modified(|status| {
        if matches!(status.condition, Condition::Lost(_)) {
            false
        } else {
            status.condition = Condition::Lost(reason);
            true
        }
    })
}

/// Why [`LeaseWatch::expiring`] completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Expiring {
    /// The lease is still valid, but only until `until`, which is no further away than the
    /// margin asked for: no renewal (or session keep-alive) has moved it since. Work that needs
    /// the lock must be finished by `until`, when another client may be granted it.
    Soon {
        /// The validity deadline, on the client's monotonic clock.
        until: Instant,
    },
    /// The lease is lost.
    Lost(LostReason),
}

/// A read-only, cloneable view of one lease's state, to hand to the tasks doing the guarded work.
#[derive(Clone)]
pub struct LeaseWatch {
    pub(crate) key: LockKey,
    pub(crate) fencing: FencingToken,
    pub(crate) rx: watch::Receiver<Status>,
}

impl fmt::Debug for LeaseWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseWatch")
            .field("key", &self.key)
            .field("fencing", &self.fencing)
            .field("state", &self.state())
            .finish()
    }
}

impl LeaseWatch {
    /// The lock key.
    pub fn key(&self) -> &str {
        self.key.as_str()
    }

    /// The lease's fencing token, to present to fenced resources.
    pub fn fencing_token(&self) -> FencingToken {
        self.fencing
    }

    /// The state now.
    pub fn state(&self) -> LeaseState {
        self.rx.borrow().at(Instant::now())
    }

    /// Whether the lease is held now (neither uncertain nor lost).
    pub fn is_held(&self) -> bool {
        self.state().is_held()
    }

    /// The validity deadline as last known: the lease must not be relied on at or after it. A
    /// lost lease keeps the deadline it had when it was lost, which may still lie ahead when it
    /// was taken over or released.
    pub fn valid_until(&self) -> Instant {
        self.rx.borrow().until()
    }

    /// Completes when the lease is lost, with the reason.
    ///
    /// It wakes at the validity deadline by itself (no server round trip), and at once when the
    /// backend, the renewal task, a release or a drop ends the lease.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn lost(&self) -> LostReason {
        // With no margin, the deadline itself is the loss: `Soon` cannot come first.
        loop {
            if let Expiring::Lost(reason) = self.expiring(Duration::ZERO).await {
                return reason;
            }
        }
    }

    /// Completes when the lease is lost, or when its validity deadline is `margin` away or less
    /// and no renewal has moved it, whichever comes first.
    ///
    /// A lease that is renewed in time never comes within the margin: each renewal moves the
    /// deadline out again. So this is the signal to begin stopping work that must be done by the
    /// time another client can be granted the lock: start the shutdown when it completes, and
    /// give the shutdown at most `margin` (minus what stopping itself takes). Waiting for
    /// [`lost`](Self::lost) instead leaves no time at all: by then the lock may have passed.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn expiring(&self, margin: Duration) -> Expiring {
        let mut rx = self.rx.clone();
        loop {
            let status = *rx.borrow_and_update();
            let now = Instant::now();
            let until = match status.at(now) {
                LeaseState::Lost(reason) => return Expiring::Lost(reason),
                LeaseState::Held { until } | LeaseState::Uncertain { until } => until,
            };
            // The moment the deadline comes within the margin (now, if it already has).
            let alarm = until.checked_sub(margin).unwrap_or(now);
            if now >= alarm {
                return Expiring::Soon { until };
            }
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        // The lease and its renewal are gone without saying why: treat as released.
                        return Expiring::Lost(match rx.borrow().condition {
                            Condition::Lost(reason) => reason,
                            _ => LostReason::Released,
                        });
                    }
                }
                _ = tokio::time::sleep_until(alarm) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn status(deadline: Instant) -> Status {
        Status::held(deadline)
    }

    /// A held lease valid until `deadline`: its watch, and the sender that moves it.
    fn held_until(deadline: Instant) -> (watch::Sender<Status>, LeaseWatch) {
        let (tx, rx) = watch::channel(status(deadline));
        let w = LeaseWatch {
            key: LockKey::new("k").unwrap(),
            fencing: FencingToken(1),
            rx,
        };
        (tx, w)
    }

    #[tokio::test(start_paused = true)]
    async fn held_until_deadline_then_expired() {
        let now = Instant::now();
        let s = status(now + Duration::from_secs(1));
        assert!(s.at(now).is_held());
        assert_eq!(
            s.at(now + Duration::from_secs(1)),
            LeaseState::Lost(LostReason::Expired)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn states_read_well() {
        let until = Instant::now() + Duration::from_millis(1500);
        assert_eq!(LeaseState::Held { until }.to_string(), "held (1.5s left)");
        assert_eq!(
            LeaseState::Uncertain { until }.to_string(),
            "uncertain (lost in 1.5s unless confirmed)"
        );
        assert_eq!(
            LeaseState::Lost(LostReason::Released).to_string(),
            "lost: it was released"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn lost_is_terminal() {
        let now = Instant::now();
        let (tx, _rx) = watch::channel(status(now + Duration::from_secs(1)));
        assert!(mark_lost(&tx, LostReason::TakenOver));
        assert!(!mark_lost(&tx, LostReason::Released));
        let applied = update(&tx, now, |s| {
            s.condition = Condition::Held;
            s.deadline = now + Duration::from_secs(10);
        });
        assert!(!applied);
        assert_eq!(tx.borrow().at(now), LeaseState::Lost(LostReason::TakenOver));
    }

    #[tokio::test(start_paused = true)]
    async fn late_renewal_does_not_resurrect() {
        let now = Instant::now();
        let (tx, _rx) = watch::channel(status(now + Duration::from_secs(1)));
        let later = now + Duration::from_secs(2);
        let applied = update(&tx, later, |s| s.deadline = later + Duration::from_secs(10));
        assert!(!applied);
        assert_eq!(tx.borrow().condition, Condition::Lost(LostReason::Expired));
    }

    #[tokio::test(start_paused = true)]
    async fn lost_future_wakes_at_deadline_without_a_message() {
        let start = Instant::now();
        let (tx, w) = held_until(start + Duration::from_secs(5));
        assert_eq!(w.lost().await, LostReason::Expired);
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn lost_future_follows_extensions_and_wakes_on_signal() {
        let start = Instant::now();
        let (tx, w) = held_until(start + Duration::from_secs(5));
        let waiter = tokio::spawn(async move { w.lost().await });
        tokio::time::sleep(Duration::from_secs(4)).await;
        update(&tx, Instant::now(), |s| {
            s.deadline = start + Duration::from_secs(20)
        });
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(!waiter.is_finished());
        mark_lost(&tx, LostReason::TakenOver);
        assert_eq!(waiter.await.unwrap(), LostReason::TakenOver);
        assert_eq!(start.elapsed(), Duration::from_secs(8));
    }

    #[tokio::test(start_paused = true)]
    async fn expiring_wakes_the_margin_before_the_deadline() {
        let start = Instant::now();
        let until = start + Duration::from_secs(5);
        let (tx, w) = held_until(until);
        assert_eq!(
            w.expiring(Duration::from_secs(2)).await,
            Expiring::Soon { until }
        );
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        // Already within the margin: at once.
        assert_eq!(
            w.expiring(Duration::from_secs(2)).await,
            Expiring::Soon { until }
        );
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        // A margin longer than the whole validity: at once too.
        assert_eq!(
            w.expiring(Duration::from_secs(60)).await,
            Expiring::Soon { until }
        );
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn expiring_follows_renewals_and_reports_a_loss() {
        let start = Instant::now();
        let (tx, w) = held_until(start + Duration::from_secs(5));
        let waiter = tokio::spawn({
            let w = w.clone();
            async move { w.expiring(Duration::from_secs(2)).await }
        });
        // Renewed at 2 s, before the alarm at 3 s: the alarm moves to 8 s.
        tokio::time::sleep(Duration::from_secs(2)).await;
        update(&tx, Instant::now(), |s| {
            s.deadline = start + Duration::from_secs(10)
        });
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(
            !waiter.is_finished(),
            "woke although a renewal moved the deadline"
        );
        // An uncertain lease is still valid until its deadline: it does not wake the watcher.
        update(&tx, Instant::now(), |s| s.condition = Condition::Uncertain);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            !waiter.is_finished(),
            "woke on an uncertain lease before the margin"
        );
        assert_eq!(
            waiter.await.unwrap(),
            Expiring::Soon {
                until: start + Duration::from_secs(10)
            }
        );
        assert_eq!(start.elapsed(), Duration::from_secs(8));
        mark_lost(&tx, LostReason::TakenOver);
        assert_eq!(
            w.expiring(Duration::from_secs(2)).await,
            Expiring::Lost(LostReason::TakenOver)
        );
        assert_eq!(w.valid_until(), start + Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn dropped_sender_reads_as_released() {
        let (tx, w) = held_until(Instant::now() + Duration::from_secs(5));
        drop(tx);
        assert_eq!(w.lost().await, LostReason::Released);
    }
}
