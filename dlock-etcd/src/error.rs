//! How etcd's errors become dlock's semantic errors.
//!
//! Callers decide by [`Error`] variant whether to retry, so the mapping matters more than the
//! message: anything that means "no member answered in time" (connection refused, a dead
//! connection, no leader, a leader change, our own deadline) is [`Error::Unavailable`]; what a
//! retry cannot fix (permission denied, a request the server rejects) is a permanent
//! [`Error::Backend`]. The one etcd error with a meaning of its own here — the session lease is
//! gone — is recognised separately ([`is_lease_not_found`]).

use std::time::Duration;

use dlock_core::Error;
use tonic::Code;

/// The backend's name in errors and tracing.
pub(crate) const BACKEND: &str = "etcd";

/// Converts an etcd client error into a dlock error.
pub(crate) fn from_client(error: etcd_client::Error) -> Error {
    if let Some(why) = tls_failure(&error) {
        return Error::backend(BACKEND, false, format!("TLS handshake failed: {why}"));
    }
    if is_temporary(&error) {
        Error::unreachable(error)
    } else {
        Error::backend(BACKEND, false, error)
    }
}

/// The error of every operation on a client after [`close`](crate::EtcdLock::close).
pub(crate) fn closed() -> Error {
    Error::backend(BACKEND, false, "the etcd lock client was closed")
}

/// The error for a request that got no answer within `after`.
pub(crate) fn timed_out(what: &'static str, after: Duration) -> Error {
    Error::no_answer(format_args!("etcd {what}"), after)
}

/// The innermost cause of a failed TLS handshake (an unknown authority, a certificate the
/// server refused, a name mismatch), if that is what `error` is.
///
/// The transport reports these as an opaque "transport error" whose cause is nested a few sources
/// deep; a retry cannot fix them, so they are told apart and reported with that cause.
pub(crate) fn tls_failure(error: &etcd_client::Error) -> Option<String> {
    let mut innermost = None;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        innermost = Some(e.to_string());
        source = e.source();
    }
    let innermost = innermost?;
    // Only what a retry cannot fix: a handshake cut short (a member restarting) is temporary.
    let tls = ["certificate", "Certificate", "fatal alert"]
        .iter()
        .any(|word| innermost.contains(word));
    tls.then_some(innermost)
}

/// Whether the server refused a watch because the auth token it was opened with expired: etcd
/// answers such a watch with a cancellation, not an error, and the stream keeps the old token.
pub(crate) fn is_token_refused(cancel_reason: &str) -> bool {
    cancel_reason.contains("invalid auth token")
}

/// Whether the etcd cluster may answer the same request later: transport failures and the status
/// codes etcd uses while it has no leader or is overloaded.
pub(crate) fn is_temporary(error: &etcd_client::Error) -> bool {
    if tls_failure(error).is_some() {
        return false;
    }
    match error {
        etcd_client::Error::GRpcStatus(status) => matches!(
            status.code(),
            Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::Aborted
                | Code::ResourceExhausted
                | Code::Unknown
                | Code::Internal
        ),
        etcd_client::Error::TransportError(_)
        | etcd_client::Error::IoError(_)
        | etcd_client::Error::WatchError(_)
        | etcd_client::Error::LeaseKeepAliveError(_)
        | etcd_client::Error::EndpointError(_) => true,
        _ => false,
    }
}

/// The message etcd answers with while its members elect a leader (`rpctypes.ErrNoLeader`).
const NO_LEADER: &str = "etcdserver: no leader";

/// Whether a member answered that the cluster has no leader: an election is under way (or the
/// cluster lost its quorum), and the same request may succeed in a moment.
pub(crate) fn is_no_leader(error: &etcd_client::Error) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(status) if status.message().contains(NO_LEADER))
}

/// Whether `error` (converted) says that the cluster has no leader.
pub(crate) fn says_no_leader(error: &Error) -> bool {
    error.to_string().contains(NO_LEADER)
}

/// Whether the server said that the lease named in the request does not exist (it expired or was
/// revoked): every key attached to it is gone, and the session must be replaced.
pub(crate) fn is_lease_not_found(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::GRpcStatus(status) => {
            status.code() == Code::NotFound && status.message().contains("lease not found")
        }
        etcd_client::Error::LeaseKeepAliveError(message) => message.contains("lease not found"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_is_unavailable_and_temporary() {
        let e = from_client(etcd_client::Error::GRpcStatus(tonic::Status::unavailable(
            "etcdserver: no leader",
        )));
        assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
        assert!(e.is_temporary());
        assert!(e.to_string().contains("no leader"), "{e}");
    }

    #[test]
    fn rejected_requests_are_permanent() {
        let e = from_client(etcd_client::Error::GRpcStatus(
            tonic::Status::permission_denied("etcdserver: permission denied"),
        ));
        assert!(
            matches!(
                e,
                Error::Backend {
                    temporary: false,
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn lease_not_found_is_recognised() {
        let gone = etcd_client::Error::GRpcStatus(tonic::Status::not_found(
            "etcdserver: requested lease not found",
        ));
        assert!(is_lease_not_found(&gone));
        let other = etcd_client::Error::GRpcStatus(tonic::Status::not_found("something else"));
        assert!(!is_lease_not_found(&other));
    }

    #[test]
    fn refused_tokens_are_recognised() {
        assert!(is_token_refused(
            "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"
        ));
        assert!(!is_token_refused("etcdserver: permission denied"));
    }

    #[test]
    fn plain_transport_errors_are_not_tls_failures() {
        let e = etcd_client::Error::GRpcStatus(tonic::Status::unavailable("connection refused"));
        assert_eq!(tls_failure(&e), None);
        assert!(is_temporary(&e));
    }

    #[test]
    fn timeouts_name_the_operation() {
        let e = timed_out("txn", Duration::from_secs(2));
        assert!(e.is_temporary());
        assert!(
            e.to_string().contains("etcd txn: no answer within 2s"),
            "{e}"
        );
    }
}
