//! Leases that live in a client session rather than under a per-key TTL.
//!
//! ZooKeeper's ephemeral nodes and etcd's leases are held for as long as the client's session is
//! alive, and the client library — not dlock's renewal — keeps the session alive. Such a backend
//! attaches a [`SessionWatch`] to its [`Grant`](crate::backend::Grant); the lease then follows the session:
//! held while it is alive, uncertain while the connection is lost (the server may expire the
//! session meanwhile), lost the moment the session is known to be gone.

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::LostReason;
use crate::state::{self, Condition, StatusSender};

/// What a backend knows about the session a lease lives in.
///
/// The session's bound is kept beside the lease's own TTL deadline, and the lease is valid until
/// the earlier of the two: a backend reports only what it knows of the session and never needs to
/// fold the lease's TTL (or the caller's drift allowance) into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionState {
    /// The server confirmed the session. `until` bounds how long that confirmation is good for
    /// (e.g. the last keep-alive's TTL); `None` means until the backend reports otherwise, so
    /// the lease's own TTL deadline alone applies.
    Alive {
        /// Conservative end of the confirmed session, if known.
        until: Option<Instant>,
    },
    /// The connection is lost; the server may keep the session until `until` at the latest, and
    /// another client may hold the lock after that. The lease is uncertain meanwhile.
    Suspended {
        /// Conservative end of the session as far as the client can tell.
        until: Instant,
    },
    /// The session is gone, and every lease in it.
    Expired,
    /// The session lives on, but the lock itself is gone from the server (deleted by another
    /// client or an operator, or expired by the backend's own TTL keeper).
    TakenOver,
}

/// The receiving side of a backend's session state, attached to grants.
pub type SessionWatch = watch::Receiver<SessionState>;

/// Mirrors `session` onto a lease's status until the session ends or the task is aborted (on
/// release or drop of the lease). The session's state when the lease is granted applies at once,
/// so that the lease's first deadline already carries the session's bound.
pub(crate) fn follow(status: StatusSender, mut session: SessionWatch) -> JoinHandle<()> {
    let going_on = mirror(&status, *session.borrow_and_update());
    tokio::spawn(async move {
        if !going_on {
            return;
        }
        loop {
            if session.changed().await.is_err() {
                // The backend dropped the session without a word: nothing vouches for the lease.
                end(&status, LostReason::SessionEnded);
                return;
            }
            if !mirror(&status, *session.borrow_and_update()) {
                return;
            }
        }
    })
}

/// Applies the session's state `current` to the lease's status; false once the lease is lost
/// (nothing more to follow).
fn mirror(status: &StatusSender, current: SessionState) -> bool {
    let now = Instant::now();
    match current {
        SessionState::Alive { until } => {
            state::update(status, now, |s| {
                s.condition = Condition::Held;
                s.session_until = until;
            });
        }
        SessionState::Suspended { until } => {
            state::update(status, now, |s| {
                s.condition = Condition::Uncertain;
                s.session_until = Some(until);
            });
        }
        SessionState::Expired => {
            end(status, LostReason::SessionEnded);
            return false;
        }
        SessionState::TakenOver => {
            end(status, LostReason::TakenOver);
            return false;
        }
    }
    !status.borrow().at(Instant::now()).is_lost()
}

/// Ends the lease for `reason`, unless its validity already ran out: then it expired, and a
/// backend's later news (a keeper deleting the node at the TTL) does not rename that.
fn end(status: &StatusSender, reason: LostReason) {
    let now = Instant::now();
    if status.borrow().at(now).is_lost() {
        state::record_expiry(status, now);
    } else {
        state::mark_lost(status, reason);
    }
}
