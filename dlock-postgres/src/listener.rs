//! The second connection of a client: it listens for release announcements, and serves the
//! operator's reads (`inspect`, `list`, `evict`), so that neither waits behind the lock session.
//!
//! Every dlock release ends with `pg_notify('dlock_release', key)`; this connection `LISTEN`s on
//! that channel and wakes the client's waiters on that key. A release by another library's client
//! (`pg_advisory_unlock` in psql) is not announced, and neither is a session the server ended:
//! waiters still try again at their backoff, so those releases are found by polling. If the
//! connection breaks it is opened again, and every waiter is woken, since releases may have been
//! missed meanwhile.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use dlock_core::Result;
use futures::StreamExt;
use tokio::sync::{watch, Notify};
use tokio_postgres::AsyncMessage;

use crate::builder::Settings;
use crate::errors::BACKEND;
use crate::session::connect;
use crate::sql::CHANNEL;

/// How long to wait before opening a broken listener connection again.
const RECONNECT_AFTER: Duration = Duration::from_millis(500);

/// The waiters of each key (by notification payload) and the connection that wakes them.
#[derive(Default)]
pub(crate) struct Listener {
    keys: Mutex<HashMap<String, Weak<Notify>>>,
    /// The connection for reads, once it is up.
    client: Mutex<Option<Arc<tokio_postgres::Client>>>,
    started: std::sync::atomic::AtomicBool,
    /// Says when a connection came up (so a first read can wait for it).
    up: watch::Sender<u64>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener").finish_non_exhaustive()
    }
}

impl Listener {
    /// The wake-up of `payload`'s waiters; keep it while waiting.
    pub(crate) fn subscribe(&self, payload: &str) -> Arc<Notify> {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(notify) = keys.get(payload).and_then(Weak::upgrade) {
            return notify;
        }
        let notify = Arc::new(Notify::new());
        keys.insert(payload.to_string(), Arc::downgrade(&notify));
        notify
    }

    /// Wakes the waiters of `payload` in this client.
    pub(crate) fn wake(&self, payload: &str) {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        match keys.get(payload).and_then(Weak::upgrade) {
            Some(notify) => notify.notify_waiters(),
            None => {
                keys.remove(payload);
            }
        }
    }

    fn wake_all(&self) {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.retain(|_, notify| match notify.upgrade() {
            Some(notify) => {
                notify.notify_waiters();
                true
            }
            None => false,
        });
    }

    /// Starts the connection's task once.
    pub(crate) fn start(self: &Arc<Self>, settings: &Settings) {
        if self.started.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        let settings = settings.clone();
        tokio::spawn(run(weak, settings));
    }

    /// The read connection, waiting up to `within` for it to come up.
    pub(crate) async fn client(&self, within: Duration) -> Option<Arc<tokio_postgres::Client>> {
        let mut up = self.up.subscribe();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(client) = self
                .client
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
            {
                if !client.is_closed() {
                    return Some(client);
                }
            }
            if tokio::time::timeout_at(deadline, up.changed())
                .await
                .is_err()
            {
                return None;
            }
        }
    }
}

/// Connects, listens and dispatches until the client is dropped.
async fn run(listener: Weak<Listener>, settings: Settings) {
    let mut connections = 0u64;
    loop {
        if listener.strong_count() == 0 {
            return;
        }
        match listen(&listener, &settings, &mut connections).await {
            Ok(()) => return,
            Err(e) => {
                tracing::debug!(backend = BACKEND, error = %e, "PostgreSQL listener connection lost");
            }
        }
        if let Some(l) = listener.upgrade() {
            *l.client.lock().unwrap_or_else(|e| e.into_inner()) = None;
            l.wake_all();
        }
        tokio::time::sleep(RECONNECT_AFTER).await;
    }
}

/// One connection's life; `Ok` when the client is gone.
async fn listen(
    listener: &Weak<Listener>,
    settings: &Settings,
    connections: &mut u64,
) -> Result<()> {
    let (client, mut connection) = connect(settings, false).await?;
    let client = Arc::new(client);
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    let listen = {
        let client = client.clone();
        async move { client.batch_execute(&format!("LISTEN {CHANNEL}")).await }
    };
    // The connection is driven by polling its messages; the LISTEN completes meanwhile.
    tokio::pin!(listen);
    let mut listening = false;
    loop {
        tokio::select! {
            done = &mut listen, if !listening => {
                done.map_err(|e| crate::errors::from_driver(e, "listen for releases"))?;
                listening = true;
                let Some(l) = listener.upgrade() else { return Ok(()) };
                *l.client.lock().unwrap_or_else(|e| e.into_inner()) = Some(client.clone());
                *connections += 1;
                l.up.send_replace(*connections);
                // Releases before the LISTEN took effect were not heard.
                l.wake_all();
            }
            message = messages.next() => match message {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    let Some(l) = listener.upgrade() else { return Ok(()) };
                    l.wake(n.payload());
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(crate::errors::from_driver(e, "listen for releases")),
                None => return Err(crate::errors::session_gone("listen for releases")),
            },
            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                if listener.strong_count() == 0 {
                    return Ok(());
                }
            }
        }
    }
}
