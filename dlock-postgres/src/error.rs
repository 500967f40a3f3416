//! How the driver's errors become dlock's semantic errors.
//!
//! Callers decide by [`Error`] variant whether to retry: a server that cannot be reached, a broken
//! connection or a session the server ended is [`Error::Unavailable`]; what a retry cannot fix (a
//! refused login, a missing privilege, a failed TLS handshake) is a permanent [`Error::Backend`].
//! Server messages never carry a password, and the driver's never do either.

use dlock_core::Error;

/// The backend's name in errors and tracing.
pub(crate) const BACKEND: &str = "postgres";

/// Converts a driver error from `what` into a dlock error.
pub(crate) fn from_driver(error: tokio_postgres::Error, what: &str) -> Error {
    if let Some(db) = error.as_db_error() {
        let code = db.code().code();
        let message = format!("{what}: {} (SQLSTATE {code})", db.message());
        // Class 57: the server ended the session (shutdown, administrator, idle timeout); 08:
        // connection exceptions; 53: out of resources (too many connections). Class 40: the
        // server rolled the statement back (a deadlock, as an upgrade of the tables racing
        // running grants can cause; a serialization failure): nothing changed, and the same
        // statement may be sent again.
        return if ["57", "08", "53"]
            .iter()
            .any(|class| code.starts_with(class))
        {
            Error::unreachable(message)
        } else {
            Error::backend(BACKEND, code.starts_with("40"), message)
        };
    }
    let text = chain(&error);
    if ["certificate", "Certificate", "fatal alert", "TLS", "tls"]
        .iter()
        .any(|word| text.contains(word))
    {
        return Error::backend(BACKEND, false, format!("{what}: {text}"));
    }
    Error::unreachable(format!("{what}: {text}"))
}

/// The error and its causes, innermost last.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// The error of a request the session could not send because the session had ended.
pub(crate) fn session_gone(what: &str) -> Error {
    Error::unreachable(format!("{what}: the PostgreSQL session ended"))
}
