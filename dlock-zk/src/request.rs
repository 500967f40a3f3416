//! Sending one request: wait for a connection first, bound the wait for the answer, and let every
//! answer vouch for the session.
//!
//! Waiting for the connection *before* sending matters: the client library queues requests made
//! while it reconnects and sends them later, so a create given up on during an outage could still
//! land after its caller returned. Requests are therefore only issued on a connected session, and
//! a call that cannot get one fails with [`Failure::NotConnected`] having sent nothing.

use std::future::Future;

use tokio::time::Instant;
use zookeeper_client as zk;

use crate::client::Inner;
use crate::error::{is_server_answer, Failure};
use crate::session::Session;

/// Sends one request made by `send` on `session` and waits for its answer, both no later than
/// `until`. A disconnected session is waited for at most the connect timeout: with the servers
/// down, a call fails with [`Failure::NotConnected`] (read as unavailable) as soon as a new
/// connection could have come up, not when the caller's time runs out.
pub(crate) async fn call<'a, T, F, Fut>(
    inner: &Inner,
    session: &'a Session,
    until: Instant,
    send: F,
) -> Result<T, Failure>
where
    F: FnOnce(&'a zk::Client) -> Fut,
    Fut: Future<Output = Result<T, zk::Error>> + 'a,
{
    if Instant::now() >= until {
        return Err(Failure::OutOfTime);
    }
    session
        .connected(until.min(Instant::now() + inner.config.connect_timeout))
        .await?;
    let sent = Instant::now();
    // The library sends the request here, when the future is made, not when it is polled.
    let answer = send(&session.client);
    match tokio::time::timeout_at(until, answer).await {
        Ok(Ok(value)) => {
            inner.confirmed(session, sent);
            Ok(value)
        }
        Ok(Err(error)) => {
            if is_server_answer(&error) {
                inner.confirmed(session, sent);
            }
            Err(Failure::Zk(error))
        }
        Err(_) => Err(Failure::NoAnswer(sent.elapsed())),
    }
}

/// Like [`call`] for requests that change nothing: repeated after a lost connection until they
/// are answered or `until` passes.
pub(crate) async fn read<'a, T, F, Fut>(
    inner: &Inner,
    session: &'a Session,
    until: Instant,
    send: F,
) -> Result<T, Failure>
where
    F: Fn(&'a zk::Client) -> Fut,
    Fut: Future<Output = Result<T, zk::Error>> + 'a,
{
    loop {
        match call(inner, session, until, &send).await {
            Err(f) if f.connection_failed() => continue,
            other => return other,
        }
    }
}
