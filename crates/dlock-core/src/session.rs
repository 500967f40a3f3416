//! Leases that live in a client session rather than under a per-key TTL.
//!
//! ZooKeeper's ephemeral nodes and etcd's leases are held for as long as the client's session is
//! alive, and the client library — not dlock's renewal — keeps the session alive. Such a backend
//! attaches a [`SessionWatch`] to its [`Grant`](crate::Grant); the lease then follows the session:
//! held while it is alive, uncertain while the connection is lost (the server may expire the
//! session meanwhile), lost the moment the session is known to be gone.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::state::{self, Condition, LostReason, StatusSender};

/// What a backend knows about the session a lease lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionState {
    /// The server confirmed the session. `until` bounds how long that confirmation is good for
    /// (e.g. the last keep-alive's TTL); `None` means until the backend reports otherwise.
    Alive {
        /// Conservative end of the confirmed session, if known.
        until: Option<Instant>,
    },
    /// The connection is lost; the server may keep the session until `until` at the latest, and
    /// another client may hold the lock after that.
    Suspended {
        /// Conservative end of the session as far as the client can tell.
        until: Instant,
    },
    /// The session is gone, and every lease in it.
    Expired,
}

/// The receiving side of a backend's session state, attached to grants.
pub type SessionWatch = watch::Receiver<SessionState>;

/// A deadline far enough away to mean "until told otherwise" (about 30 years).
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(30 * 365 * 24 * 3600)
}

/// Mirrors `session` onto a lease's status until the session ends or the task is aborted (on
/// release or drop of the lease).
pub(crate) fn follow(status: StatusSender, mut session: SessionWatch) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let now = Instant::now();
            let current = *session.borrow_and_update();
            match current {
                SessionState::Alive { until } => {
                    let deadline = until.unwrap_or_else(far_future);
                    state::update(&status, now, |s| {
                        s.condition = Condition::Held;
                        s.deadline = deadline;
                    });
                }
                SessionState::Suspended { until } => {
                    state::update(&status, now, |s| {
                        s.condition = Condition::Uncertain;
                        s.deadline = s.deadline.min(until);
                    });
                }
                SessionState::Expired => {
                    state::mark_lost(&status, LostReason::SessionEnded);
                    return;
                }
            }
            if status.borrow().at(Instant::now()).is_lost() {
                return;
            }
            if session.changed().await.is_err() {
                // The backend dropped the session without a word: nothing vouches for the lease.
                state::mark_lost(&status, LostReason::SessionEnded);
                return;
            }
        }
    })
}
