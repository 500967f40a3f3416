//! Why a ZooKeeper request failed, and how that reads as a dlock [`Error`].
//!
//! The distinction that matters to the recipe is whether the server may have applied a request:
//! a refused or unanswered connection applied nothing ([`Failure::NotConnected`]), a lost reply
//! may have applied it ([`Failure::NoAnswer`], `ConnectionLoss`), and an answer from the server
//! says exactly what happened. Callers repair the uncertain cases (a create is looked up by owner
//! prefix, a delete is repeated); what is left is converted here.

use std::fmt;
use std::time::Duration;

use dlock_core::Error;
use zookeeper_client as zk;

/// The backend's name in errors and tracing.
pub(crate) const BACKEND: &str = "zookeeper";

/// A failed request.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    /// The server answered with an error, or the client library failed the request.
    Zk(zk::Error),
    /// No connection came up within the time allowed; nothing was sent.
    NotConnected(Duration),
    /// The session ended (expired or closed); ephemeral nodes of it are gone.
    SessionEnded,
    /// The request was sent but no answer came in time; it may or may not have been applied.
    NoAnswer(Duration),
    /// The time allowed was over before the request could be sent; nothing was sent.
    OutOfTime,
    /// Called outside a tokio runtime, which the client library and the backend's tasks need.
    NoRuntime,
    /// No session came up because the TLS handshake failed, as said (a certificate the other
    /// side does not accept, or a server that does not speak TLS); nothing was sent.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    Tls(String),
}

impl Failure {
    /// Whether the request may have been applied although no answer says so.
    pub(crate) fn outcome_unknown(&self) -> bool {
        match self {
            Failure::NoAnswer(_) => true,
            Failure::Zk(error) => connection_failed(error),
            _ => false,
        }
    }

    /// Whether the connection failed under the request (its outcome is unknown, and a request
    /// that changes nothing can simply be sent again).
    pub(crate) fn connection_failed(&self) -> bool {
        matches!(self, Failure::Zk(error) if connection_failed(error))
    }

    /// Whether the session this request ran in is gone.
    pub(crate) fn session_ended(&self) -> bool {
        matches!(
            self,
            Failure::SessionEnded
                | Failure::Zk(
                    zk::Error::SessionExpired
                        | zk::Error::ClientClosed
                        | zk::Error::AuthFailed
                        | zk::Error::SessionMoved
                )
        )
    }

    /// The dlock error for a failed `op` (a short verb phrase such as `"create the lock node"`).
    pub(crate) fn into_error(self, op: &'static str) -> Error {
        match self {
            Failure::NotConnected(waited) => Error::unreachable(context(
                op,
                format!("no connection to any ZooKeeper server within {waited:?}"),
            )),
            Failure::NoAnswer(waited) => {
                Error::unreachable(context(op, format!("no answer within {waited:?}")))
            }
            Failure::OutOfTime => Error::unreachable(context(
                op,
                "the time allowed ran out before the request could be sent",
            )),
            // Not temporary: another attempt with the same certificates fails the same way.
            Failure::Tls(reason) => Error::backend(BACKEND, false, context(op, reason)),
            Failure::NoRuntime => Error::backend(
                BACKEND,
                false,
                context(op, "dlock-zk must be used inside a tokio runtime"),
            ),
            Failure::SessionEnded => Error::backend(
                BACKEND,
                true,
                context(
                    op,
                    "the ZooKeeper session ended (its ephemeral nodes are gone); the next \
                             call opens a new session",
                ),
            ),
            Failure::Zk(error) => {
                let temporary = is_temporary(&error);
                Error::backend(BACKEND, temporary, context(op, error))
            }
        }
    }
}

/// Whether the client library failed a request because its connection broke: it reports a
/// closed connection as `ConnectionLoss` and a silent one or an I/O error as a custom error, and
/// fails every request in flight on that connection with it.
fn connection_failed(error: &zk::Error) -> bool {
    matches!(
        error,
        zk::Error::ConnectionLoss
            | zk::Error::Custom(_)
            | zk::Error::UnexpectedError(_)
            | zk::Error::UnmarshalError { .. }
    )
}

/// Whether a ZooKeeper error may go away by itself.
fn is_temporary(error: &zk::Error) -> bool {
    connection_failed(error)
        || matches!(
            error,
            zk::Error::Timeout
                | zk::Error::NoHosts
                | zk::Error::Throttled
                | zk::Error::SessionExpired
                | zk::Error::SessionMoved
                | zk::Error::NotReadOnly
        )
}

/// Whether an error is the server's answer (so the server saw the request and the session).
pub(crate) fn is_server_answer(error: &zk::Error) -> bool {
    matches!(
        error,
        zk::Error::NoNode
            | zk::Error::NodeExists
            | zk::Error::NotEmpty
            | zk::Error::BadVersion
            | zk::Error::NoAuth
            | zk::Error::InvalidAcl
            | zk::Error::NoChildrenForEphemerals
            | zk::Error::Unimplemented
            | zk::Error::QuotaExceeded
    )
}

/// The source of a converted error: what was attempted and what went wrong. It never contains a
/// node path, since lock node names embed owner tokens.
fn context(op: &'static str, detail: impl fmt::Display) -> String {
    format!("could not {op}: {detail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        let e = Failure::NotConnected(Duration::from_secs(1)).into_error("list the queue");
        assert!(matches!(
            e,
            Error::Unavailable {
                reached: 0,
                needed: 1,
                ..
            }
        ));
        assert!(e.is_temporary());
        let e = Failure::Zk(zk::Error::NoAuth).into_error("create the lock node");
        assert!(!e.is_temporary());
        assert!(
            e.to_string().contains("could not create the lock node"),
            "{e}"
        );
        assert!(Failure::Zk(zk::Error::ConnectionLoss).outcome_unknown());
        assert!(!Failure::NotConnected(Duration::ZERO).outcome_unknown());
        assert!(Failure::Zk(zk::Error::SessionExpired).session_ended());
        let e = Failure::SessionEnded.into_error("wait for the predecessor");
        assert!(e.is_temporary());
    }
}
