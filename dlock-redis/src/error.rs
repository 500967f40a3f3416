//! Turning the Redis client's errors into dlock's semantic errors.
//!
//! A caller must be able to tell "the server did not answer" (try later; the outcome of the call
//! may be unknown) from "the server refused" (a configuration or data problem that retrying will
//! not fix) without knowing Redis. So: no answer, a broken connection or a refused one is
//! [`Error::Unavailable`] (0 of the 1 server needed answered); a server that is loading, busy with
//! a script, read-only after a failover or in a cluster state change is a temporary
//! [`Error::Backend`]; everything else (wrong type at the key, missing permission, failed
//! authentication, an unexpected reply) is a permanent [`Error::Backend`].

use std::time::Duration;

use dlock_core::Error;
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// The backend's name in errors and tracing.
pub(crate) const BACKEND: &str = "redis";

/// The error for a call that got no answer in time.
pub(crate) fn no_answer(op: &'static str, timeout: Duration) -> Error {
    Error::no_answer(format_args!("{op} (Redis server)"), timeout)
}

/// Classifies a Redis error from operation `op`: no answer or a broken connection is
/// [`Error::Unavailable`], a passing server condition a temporary [`Error::Backend`], anything
/// else a permanent one.
pub fn from_redis(op: &'static str, source: RedisError) -> Error {
    if unreachable(&source) {
        return Error::unreachable(format!("{op}: {source}"));
    }
    let temporary = temporary(&source);
    Error::backend(BACKEND, temporary, format!("{op}: {source}"))
}

/// The server could not be reached or stopped answering on this connection.
fn unreachable(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        // A cluster client with no connection to the node it needs (every node down).
        || error.kind() == ErrorKind::ClusterConnectionNotFound
}

/// A server-side condition that passes by itself.
fn temporary(error: &RedisError) -> bool {
    match error.kind() {
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::NoScript,
        ) => true,
        // A protocol desynchronisation: the connection is replaced.
        ErrorKind::Parse => true,
        // `BUSY` (a long script is running) has no dedicated kind.
        _ => error.code() == Some("BUSY"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_are_unavailability() {
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let err = from_redis("acquire", refused);
        assert!(matches!(
            err,
            Error::Unavailable {
                reached: 0,
                needed: 1,
                ..
            }
        ));
        assert!(err.is_temporary());
        assert!(err.to_string().contains("acquire"), "{err}");
    }

    #[test]
    fn server_conditions_are_classified() {
        let loading =
            RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "loading"));
        assert!(from_redis("acquire", loading).is_temporary());
        let config = RedisError::from((ErrorKind::InvalidClientConfig, "bad"));
        assert!(!from_redis("connect", config).is_temporary());
        let wrong_type = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "WRONGTYPE",
        ));
        let err = from_redis("acquire", wrong_type);
        assert!(matches!(
            err,
            Error::Backend {
                backend: "redis",
                temporary: false,
                ..
            }
        ));
    }

    #[test]
    fn timeouts_name_the_operation_and_the_limit() {
        let err = no_answer("release", Duration::from_secs(1));
        assert!(err.is_temporary());
        let text = format!(
            "{err} {:?}",
            std::error::Error::source(&err).map(|s| s.to_string())
        );
        assert!(text.contains("release") && text.contains("1s"), "{text}");
    }
}
