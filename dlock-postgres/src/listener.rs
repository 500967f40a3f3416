//! The second connection of a client: it listens for release announcements, and serves the
//! operator's reads (`inspect`, `list`, `evict`), so that neither waits behind the lock session.
//!
//! Every dlock release ends with a `pg_notify`: on `dlock_release` with the key as payload, heard
//! by every client, or, when the lock's queue has a head, on the head's client's wake channel
//! `dlock_release_<tag>` with the payload `<key> <waiter>`. This connection `LISTEN`s on both
//! (the tag is the client's own, random) and wakes the waiters registered for the payload: the
//! key's waiters, or the one queued waiter named. A release by another library's client
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
use crate::error::BACKEND;
use crate::session::connect;
use crate::sql::{wake_channel, CHANNEL};

/// How long to wait before opening a broken listener connection again.
const RECONNECT_AFTER: Duration = Duration::from_millis(500);

/// The waiters of each key (by notification payload) and the connection that wakes them.
pub(crate) struct Listener {
    /// This client's wake tag: 16 random lowercase hex digits, which its queue entries carry.
    tag: Arc<str>,
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
    pub(crate) fn new() -> Self {
        Listener {
            tag: format!("{:016x}", dlock_core::OwnerToken::random().as_u128() as u64).into(),
            keys: Mutex::default(),
            client: Mutex::default(),
            started: std::sync::atomic::AtomicBool::default(),
            up: watch::Sender::default(),
        }
    }

    /// This client's wake tag.
    pub(crate) fn tag(&self) -> &Arc<str> {
        &self.tag
    }

    /// Whether the connection is up and listening (releases are heard).
    pub(crate) fn listening(&self) -> bool {
        self.client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|c| !c.is_closed())
    }

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
    let Some(tag) = listener.upgrade().map(|l| l.tag.clone()) else {
        return Ok(());
    };
    let (client, mut connection) = connect(settings, false).await?;
    let client = Arc::new(client);
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    let listen = {
        let (client, wake) = (client.clone(), wake_channel(&tag));
        async move {
            client
                .batch_execute(&format!("LISTEN {CHANNEL}; LISTEN {wake}"))
                .await
        }
    };
    // The connection is driven by polling its messages; the LISTEN completes meanwhile.
    tokio::pin!(listen);
    let mut listening = false;
    loop {
        tokio::select! {
            done = &mut listen, if !listening => {
                done.map_err(|e| crate::error::from_driver(e, "listen for releases"))?;
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
                Some(Err(e)) => return Err(crate::error::from_driver(e, "listen for releases")),
                None => return Err(crate::error::session_gone("listen for releases")),
            },
            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                if listener.strong_count() == 0 {
                    return Ok(());
                }
            }
        }
    }
}
