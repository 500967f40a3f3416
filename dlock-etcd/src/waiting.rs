//! Waiting for a key to be deleted: one watch, armed before it is relied on.
//!
//! A watch could start from the revision at which the key was read, so that a deletion in
//! between is not lost — but etcd serves a watch whose start revision is already in the past
//! from its "unsynced" group, which it catches up only every 100 ms: the wake-up would come up to
//! 100 ms late whenever anything was written in between, which on a busy lock is most of the
//! time. So the watch starts from "now", which etcd serves at once ("synced"), and reports the
//! store revision it was created at ([`Armed::at`]); it reports every deletion after that. If
//! the store moved on since the key was read, the caller reads again before relying on the
//! watch, which closes the gap.
//!
//! Only delete events are sent (`NoPut`), so a holder that rewrites its key does not wake its
//! successor. No polling: a waiter sleeps until a deletion, the end of its session, its
//! deadline, or the client moving to another member.

use dlock_core::backend::SessionState;
use dlock_core::Error;
use etcd_client::{EventType, WatchFilterType, WatchOptions, WatchStream};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{from_client, is_token_refused};
use crate::requests::{RequestError, Requests};
use crate::session;

/// Why a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woken {
    /// A watched key was deleted, the watch was cancelled by the server, or the client moved to
    /// another member: look again.
    Deleted,
    /// The session the waiter's own key lives in ended.
    SessionEnded,
    /// The deadline passed.
    Deadline,
}

/// Why a wait failed.
#[derive(Debug)]
pub(crate) enum WaitError {
    /// The watch could not be created.
    Request(RequestError),
    /// The watch broke.
    Broken(Error),
}

impl From<WaitError> for Error {
    fn from(error: WaitError) -> Self {
        match error {
            WaitError::Request(e) => e.into(),
            WaitError::Broken(e) => e,
        }
    }
}

/// A watch that reports every deletion of its keys after revision [`at`](Armed::at).
pub(crate) struct Armed {
    stream: WatchStream,
    generation: watch::Receiver<u64>,
    /// The store revision after which every deletion is reported.
    pub(crate) at: i64,
    /// A deletion (or a cancellation) already arrived while the watches were being created.
    fired: bool,
}

/// Whether a watch response means "look again": a deletion, or a watch the server cancelled.
fn wakes(response: &etcd_client::WatchResponse) -> bool {
    response.canceled()
        || response
            .events()
            .iter()
            .any(|event| event.event_type() == EventType::Delete)
}

fn broken(what: &str) -> WaitError {
    WaitError::Broken(Error::unreachable(format!("etcd watch: {what}")))
}

/// Watches `keys` (each a single key, or with `prefix` every key under it) for deletions from
/// now on, and returns once the server has created every watch.
///
/// A watch refused because the client's auth token expired is armed once more after a fresh
/// authentication: etcd refuses it with a cancellation rather than an error, so etcd-client's
/// own token refresh does not see it.
pub(crate) async fn arm(
    requests: &Requests,
    keys: Vec<Vec<u8>>,
    prefix: bool,
) -> Result<Armed, WaitError> {
    match arm_once(requests, keys.clone(), prefix).await {
        Err(Refusal::Token) => {
            tracing::debug!("etcd watch: the auth token expired; authenticating again");
            requests.refresh_token().await.map_err(WaitError::Request)?;
            arm_once(requests, keys, prefix).await.map_err(|e| match e {
                Refusal::Token => broken("the auth token was refused right after authenticating"),
                Refusal::Wait(e) => e,
            })
        }
        Err(Refusal::Wait(e)) => Err(e),
        Ok(armed) => Ok(armed),
    }
}

/// Why arming failed: an expired token, or anything else.
enum Refusal {
    Token,
    Wait(WaitError),
}

impl From<WaitError> for Refusal {
    fn from(e: WaitError) -> Self {
        Refusal::Wait(e)
    }
}

async fn arm_once(requests: &Requests, keys: Vec<Vec<u8>>, prefix: bool) -> Result<Armed, Refusal> {
    let options = || {
        let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        if prefix {
            options.with_prefix()
        } else {
            options
        }
    };
    let mut generation = requests.generation();
    generation.borrow_and_update();
    let mut keys = keys.into_iter();
    let first = keys
        .next()
        .ok_or_else(|| Refusal::Wait(broken("nothing to watch")))?;
    let mut stream = requests
        .watch(first, options())
        .await
        .map_err(WaitError::Request)?;
    let mut expected = 1;
    for key in keys {
        stream
            .watch(key, Some(options()))
            .await
            .map_err(|e| WaitError::Request(RequestError::Client(e)))?;
        expected += 1;
    }
    let timeout = requests.timeout();
    let mut at = 0;
    let mut fired = false;
    let created = async {
        while expected > 0 {
            match stream.message().await {
                Ok(Some(response))
                    if response.created()
                        && response.canceled()
                        && is_token_refused(response.cancel_reason()) =>
                {
                    return Err(Refusal::Token)
                }
                Ok(Some(response)) if response.created() && response.canceled() => {
                    return Err(Refusal::Wait(broken(&format!(
                        "cancelled on creation: {}",
                        response.cancel_reason()
                    ))))
                }
                Ok(Some(response)) if response.created() => {
                    expected -= 1;
                    at = at.max(response.header().map_or(0, |h| h.revision()));
                }
                // A watch created earlier already reports: keep it for `wait`.
                Ok(Some(response)) => fired |= wakes(&response),
                Ok(None) => return Err(Refusal::Wait(broken("the stream ended"))),
                Err(e) => return Err(Refusal::Wait(WaitError::Broken(from_client(e)))),
            }
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, created).await {
        Ok(Ok(())) => Ok(Armed {
            stream,
            generation,
            at,
            fired,
        }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Refusal::Wait(WaitError::Request(RequestError::Timeout {
            what: "watch",
            after: timeout,
        }))),
    }
}

impl Armed {
    /// Waits until a watched key is deleted, the session ends (if one is given) or `until`
    /// passes.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping it cancels the watch.
    pub(crate) async fn wait(
        mut self,
        mut session: Option<watch::Receiver<SessionState>>,
        until: Option<Instant>,
    ) -> Result<Woken, WaitError> {
        if self.fired {
            return Ok(Woken::Deleted);
        }
        loop {
            if let Some(rx) = &session {
                if matches!(
                    session::current(&rx.borrow(), Instant::now()),
                    SessionState::Expired
                ) {
                    return Ok(Woken::SessionEnded);
                }
            }
            let session_changed = async {
                match session.as_mut() {
                    Some(rx) => rx.changed().await.is_err(),
                    None => std::future::pending().await,
                }
            };
            let deadline = async {
                match until {
                    Some(until) => tokio::time::sleep_until(until).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                message = self.stream.message() => match message {
                    Ok(Some(response)) => {
                        if wakes(&response) {
                            return Ok(Woken::Deleted);
                        }
                    }
                    Ok(None) => return Err(broken("the stream ended")),
                    Err(error) => return Err(WaitError::Broken(from_client(error))),
                },
                closed = session_changed => {
                    if closed {
                        return Ok(Woken::SessionEnded);
                    }
                }
                () = deadline => return Ok(Woken::Deadline),
                // The client moved to another member: look again, and watch there.
                _ = self.generation.changed() => return Ok(Woken::Deleted),
            }
        }
    }
}
