//! The one error type of dlock.
//!
//! Every backend converts its private errors into [`Error`], so a caller can tell "try again later"
//! from "this lease is gone" from "you passed nonsense" without knowing which backend is behind the
//! trait object. "Busy" is deliberately not here: a lock held by someone else is the normal answer of
//! [`try_acquire`](crate::DistributedLockExt::try_acquire), not a failure.

use std::fmt;
use std::time::Duration;

/// A boxed error from a backend's client library, kept as the `source` of [`Error::Backend`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with dlock's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong with a lock operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock could not be acquired before the caller's deadline.
    #[error("timed out after {waited:?} waiting for lock {key:?}")]
    Timeout {
        /// The lock key.
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// The lease is no longer held: it expired, was taken over, or its session ended.
    #[error("lease on {key:?} is lost: {reason}")]
    Lost {
        /// The lock key.
        key: String,
        /// Why the lease ended.
        reason: LostReason,
    },

    /// Another owner holds the lock now; this lease may not extend or release it.
    #[error("lock {key:?} is held by another owner")]
    NotOwner {
        /// The lock key.
        key: String,
    },

    /// Too few servers answered for the operation to be decided.
    #[error("backend unavailable: {reached} of the {needed} node(s) needed answered{}", detail_suffix(.source))]
    Unavailable {
        /// How many nodes answered in time.
        reached: usize,
        /// How many answers the operation needed.
        needed: usize,
        /// The last error seen from a node, if any.
        #[source]
        source: Option<BoxError>,
    },

    /// The caller passed a value outside the documented limits. Nothing was sent to a server.
    #[error("invalid {field}: {message}")]
    InvalidInput {
        /// The option or argument at fault, e.g. `"ttl"` or `"key"`.
        field: &'static str,
        /// What is wrong and what the limit is.
        message: String,
    },

    /// The name is in use with other settings: a semaphore with another number of permits, or a
    /// name that another kind of primitive or a peer library's client holds in an incompatible
    /// layout. Nothing was changed on the server.
    #[error("{key:?} is in use with other settings: {message}")]
    Mismatch {
        /// The name.
        key: String,
        /// What differs.
        message: String,
    },

    /// The backend's client or server failed in a way not covered above.
    #[error("{backend} backend error: {source}")]
    Backend {
        /// The backend's name, e.g. `"redis"`.
        backend: &'static str,
        /// Whether retrying the same operation later may succeed.
        temporary: bool,
        /// The underlying error.
        #[source]
        source: BoxError,
    },

    /// The backend cannot do what was asked.
    #[error("unsupported by the {backend} backend: {what}")]
    Unsupported {
        /// The backend's name.
        backend: &'static str,
        /// What it cannot do.
        what: &'static str,
    },
}

fn detail_suffix(source: &Option<BoxError>) -> String {
    match source {
        Some(e) => format!(" (last error: {e})"),
        None => String::new(),
    }
}

impl Error {
    /// Whether the same operation may succeed if retried later.
    ///
    /// Timeouts and unavailability are temporary; lost leases, ownership conflicts, invalid input
    /// and unsupported operations are not. A backend error says so itself. Note that "temporary" is
    /// not "safe to repeat blindly": an operation whose outcome is unknown (a lost reply) must be
    /// followed by a check, which is what the lease's uncertain state is for.
    pub fn is_temporary(&self) -> bool {
        match self {
            Error::Timeout { .. } | Error::Unavailable { .. } => true,
            Error::Backend { temporary, .. } => *temporary,
            Error::Lost { .. }
            | Error::NotOwner { .. }
            | Error::InvalidInput { .. }
            | Error::Mismatch { .. }
            | Error::Unsupported { .. } => false,
        }
    }

    /// Builds an [`Error::Mismatch`].
    pub fn mismatch(key: impl fmt::Display, message: impl Into<String>) -> Self {
        Error::Mismatch {
            key: key.to_string(),
            message: message.into(),
        }
    }

    /// Builds an [`Error::InvalidInput`].
    pub fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidInput {
            field,
            message: message.into(),
        }
    }

    /// Builds the [`Error::Unavailable`] of a backend that talks to one server and could not
    /// reach it (none reached of the one needed), for the reason `source`.
    pub fn unreachable(source: impl Into<BoxError>) -> Self {
        Error::Unavailable {
            reached: 0,
            needed: 1,
            source: Some(source.into()),
        }
    }

    /// Builds the [`Error::Unavailable`] of a request `what` that got no answer within `after`:
    /// the one way every backend reports a request timeout.
    pub fn no_answer(what: impl fmt::Display, after: Duration) -> Self {
        Error::unreachable(format!("{what}: no answer within {after:?}"))
    }

    /// Builds an [`Error::Backend`] from a client library's error.
    pub fn backend(backend: &'static str, temporary: bool, source: impl Into<BoxError>) -> Self {
        Error::Backend {
            backend,
            temporary,
            source: source.into(),
        }
    }
}

/// Why a lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// Its validity ran out before it was renewed (or renewal was stopped).
    Expired,
    /// The backend reports another owner (or no owner) where this lease should be.
    TakenOver,
    /// The session the lease lived in ended (ZooKeeper session, etcd lease).
    SessionEnded,
    /// The holder released or dropped it.
    Released,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "its validity expired",
            LostReason::TakenOver => "it was taken over or deleted on the server",
            LostReason::SessionEnded => "its session ended",
            LostReason::Released => "it was released",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_classification() {
        let timeout = Error::Timeout {
            key: "k".into(),
            waited: Duration::from_secs(1),
        };
        assert!(timeout.is_temporary());
        let unavailable = Error::Unavailable {
            reached: 1,
            needed: 3,
            source: None,
        };
        assert!(unavailable.is_temporary());
        assert_eq!(
            unavailable.to_string(),
            "backend unavailable: 1 of the 3 node(s) needed answered"
        );
        assert!(!Error::invalid("ttl", "must be positive").is_temporary());
        assert!(!Error::NotOwner { key: "k".into() }.is_temporary());
        assert!(Error::backend("redis", true, "connection reset").is_temporary());
        assert!(!Error::backend("redis", false, "WRONGTYPE").is_temporary());
        let lost = Error::Lost {
            key: "k".into(),
            reason: LostReason::Expired,
        };
        assert!(!lost.is_temporary());
    }

    #[test]
    fn unavailable_names_the_last_error() {
        let e = Error::Unavailable {
            reached: 2,
            needed: 3,
            source: Some("connection refused".into()),
        };
        assert_eq!(
            e.to_string(),
            "backend unavailable: 2 of the 3 node(s) needed answered (last error: connection refused)"
        );
    }
}
