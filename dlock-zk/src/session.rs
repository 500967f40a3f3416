//! One ZooKeeper session: the client that carries it, its link state, and how long the server is
//! known to keep it.
//!
//! Every lock node is ephemeral, so it lives exactly as long as the session that created it.
//! What the client knows about that life is:
//!
//! * the negotiated session timeout `T`: the server ends the session `T` after it last heard from
//!   the client (ZooKeeper rounds expiry up to its next tick, never down);
//! * the last instant `c` before a request that the server then answered: the server heard from
//!   the session after `c`, so it keeps it at least until `c + T`.
//!
//! [`Session::vouched_until`] is that bound minus an allowance, and every lease in the session
//! is valid no longer than it. Requests confirm it as they succeed; while leases are held, the
//! session watchdog sends a cheap read every `T/4` so that it keeps moving.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::builder::Config;
use crate::error::Failure;

/// The state of the session's connection, as the backend sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Link {
    /// Connected to a server that serves the session.
    Connected,
    /// Connection lost; the client library is reconnecting. The session may be alive or may have
    /// expired on the server already.
    Disconnected,
    /// The session expired or was closed: its ephemeral nodes are gone.
    Ended,
}

/// A live ZooKeeper session.
pub(crate) struct Session {
    pub(crate) client: zk::Client,
    /// Counts sessions of one backend; leases remember the one they live in.
    pub(crate) generation: u64,
    /// The server's session id, as ephemeral nodes record it in `ephemeralOwner`.
    pub(crate) id: i64,
    /// The negotiated session timeout.
    pub(crate) timeout: Duration,
    link: watch::Sender<Link>,
    confirmed: Mutex<Confirmed>,
}

#[derive(Debug, Clone, Copy)]
struct Confirmed {
    /// The latest instant before a request the server answered.
    at: Instant,
    /// The `at` last announced to the leases (see [`Session::confirm`]).
    announced: Instant,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("generation", &self.generation)
            .field("id", &format_args!("{:#x}", self.id))
            .field("timeout", &self.timeout)
            .field("link", &*self.link.borrow())
            .finish()
    }
}

impl Session {
    /// Opens a session with the configured servers and credentials.
    ///
    /// Bounded by the library's own deadline (the session timeout); the caller adds its connect
    /// timeout on top.
    pub(crate) async fn open(config: &Config, generation: u64) -> Result<Session, zk::Error> {
        let mut connector = zk::Client::connector()
            .with_session_timeout(config.session_timeout)
            .with_connection_timeout(connection_timeout(config.session_timeout));
        if let Some(credentials) = config.connect.credentials() {
            let password = credentials.password.as_deref().unwrap_or_default();
            let secret = format!("{}:{password}", credentials.user);
            connector = connector.with_auth("digest", secret.as_bytes());
        }
        let asked = Instant::now();
        let client = match &config.tls {
            None => connector.connect(&config.connect.hosts()).await?,
            Some(tls) => secure_connect(connector, tls, &config.connect.hosts()).await?,
        };
        let id = client.session_id().0;
        let timeout = client.session_timeout();
        Ok(Session {
            client,
            generation,
            id,
            timeout,
            link: watch::channel(Link::Connected).0,
            confirmed: Mutex::new(Confirmed {
                // The server created the session after the connect request left.
                at: asked,
                announced: asked,
            }),
        })
    }

    /// The current link state.
    pub(crate) fn link(&self) -> Link {
        *self.link.borrow()
    }

    /// Whether the session is over, as the library knows it (the watchdog's
    /// [`link`](Self::link) follows a moment later).
    pub(crate) fn is_ended(&self) -> bool {
        self.link() == Link::Ended || link_of(self.client.state()) == Link::Ended
    }

    /// Records a new link state; returns whether it changed. `Ended` is final.
    pub(crate) fn set_link(&self, link: Link) -> bool {
        self.link.send_if_modified(|current| {
            if *current == link || *current == Link::Ended {
                false
            } else {
                *current = link;
                true
            }
        })
    }

    /// Waits until the session is connected, up to `until`. Sends nothing.
    ///
    /// Reads the library's own state rather than [`link`](Self::link), which the watchdog
    /// updates a moment later.
    pub(crate) async fn connected(&self, until: Instant) -> Result<(), Failure> {
        let started = Instant::now();
        let mut states = self.client.state_watcher();
        loop {
            match link_of(self.client.state()) {
                Link::Connected => return Ok(()),
                Link::Ended => return Err(Failure::SessionEnded),
                Link::Disconnected => {}
            }
            if tokio::time::timeout_at(until, states.changed())
                .await
                .is_err()
            {
                return Err(Failure::NotConnected(started.elapsed()));
            }
        }
    }

    /// Records that the server answered a request sent at `sent`. Returns whether the leases
    /// should hear about it: only when the bound moved by a noticeable step (an eighth of the
    /// timeout), so that a busy client does not wake every lease on every request.
    pub(crate) fn confirm(&self, sent: Instant) -> bool {
        let mut confirmed = self
            .confirmed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if sent > confirmed.at {
            confirmed.at = sent;
        }
        if confirmed.at >= confirmed.announced + self.timeout / 8 {
            confirmed.announced = confirmed.at;
            true
        } else {
            false
        }
    }

    /// How long the server is known to keep the session: the last confirmation plus the
    /// timeout, minus an allowance for clock rate differences (1 % + 2 ms, as dlock's default
    /// drift) and for a follower that answers reads while its leader is already gone (a tenth of
    /// the timeout: ZooKeeper followers stop serving after `syncLimit` ticks, 2 by default, and
    /// the timeout is at most 20 ticks).
    pub(crate) fn vouched_until(&self) -> Instant {
        let confirmed = self
            .confirmed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let allowance = self.timeout / 100 + Duration::from_millis(2) + self.timeout / 10;
        confirmed.at + self.timeout.saturating_sub(allowance)
    }

    /// A watcher of the client library's session states.
    pub(crate) fn states(&self) -> zk::StateWatcher {
        self.client.state_watcher()
    }
}

/// Connects to every server of `hosts` over TLS.
#[cfg(feature = "tls")]
async fn secure_connect(
    connector: zk::Connector,
    tls: &crate::tls::Loaded,
    hosts: &str,
) -> Result<zk::Client, zk::Error> {
    dlock_core::backend::tls::install_crypto_provider();
    connector
        .with_tls(tls.options.clone())
        .secure_connect(hosts)
        .await
}

/// Without the `tls` feature no TLS settings can be loaded.
#[cfg(not(feature = "tls"))]
async fn secure_connect(
    _: zk::Connector,
    tls: &crate::tls::Loaded,
    _: &str,
) -> Result<zk::Client, zk::Error> {
    match *tls {}
}

/// How long the client library waits for any answer on a connection before it gives the
/// connection up and tries another server: 2/5 of the session timeout, the library's default,
/// which leaves time for a second server before the session expires.
fn connection_timeout(session_timeout: Duration) -> Duration {
    session_timeout * 2 / 5
}

/// Maps the library's state onto [`Link`].
pub(crate) fn link_of(state: zk::SessionState) -> Link {
    match state {
        zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => Link::Connected,
        zk::SessionState::Disconnected => Link::Disconnected,
        zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed => {
            Link::Ended
        }
    }
}
