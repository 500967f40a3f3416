//! The one command connection of a client: multiplexed, reconnecting, and bounded in time.
//!
//! Every lock operation of a [`RedisLock`](crate::RedisLock) and its clones goes over one
//! multiplexed connection (redis-rs's `ConnectionManager`): requests from many tasks are pipelined
//! on the socket and matched to their replies in order, with no client-side lock. When the
//! connection breaks, the manager replaces it in the background; the request that saw the break
//! fails, later ones wait for the new connection.
//!
//! Every request is bounded by the request timeout, which covers waiting for a reconnection too, so
//! a frozen or unreachable server yields [`Error::Unavailable`](dlock_core::Error::Unavailable) in
//! bounded time instead of a hang.
//!
//! A request that timed out also retires its connection: the client moves to a new one (opened
//! by the next request) and the old one closes once the requests still on it have ended. The
//! manager alone would keep it, since redis-rs reconnects on errors but not on timeouts, and a
//! connection whose peer stopped answering without closing it (a dropped route, a server or
//! middlebox that forgot the connection) then fails every later request: replies are matched to
//! requests in order, so one reply that never comes leaves every later request waiting for the
//! one before it. The cost of a request that was only slow is one reconnection. However many
//! requests time out together on one connection, it is replaced once.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use dlock_core::{Error, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::TcpSettings;
use redis::RedisResult;

use crate::cluster::RedisConnection;
use crate::error;
use crate::sentinel::Primary;
use crate::url::Endpoint;

/// Reconnection attempts per break before the manager gives up until the next request.
const RECONNECT_ATTEMPTS: usize = 3;
/// The first delay between reconnection attempts (then doubled, jittered).
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(50);
/// The longest delay between reconnection attempts, so a server that is back is found quickly.
const RECONNECT_MAX_DELAY: Duration = Duration::from_millis(500);
/// Below this request timeout the [`TimerKeeper`] would wake more often than it saves wake-ups.
const MIN_KEEPER_TIMEOUT: Duration = Duration::from_millis(100);

/// A Redis client library handle with this crate's settings applied.
pub(crate) fn client(endpoint: &Endpoint) -> Result<redis::Client> {
    // Nagle's algorithm would hold back pipelined requests until earlier ones are acknowledged.
    let info = endpoint
        .connection_info()
        .clone()
        .set_tcp_settings(TcpSettings::default().set_nodelay(true));
    redis::Client::open(info).map_err(|e| Error::invalid("url", e.to_string()))
}

/// Where the connections of a client go: one server, or whichever primary the sentinels of a
/// service name (see [`crate::sentinel`]).
#[derive(Clone)]
pub(crate) enum Target {
    /// One server, at the address it was given (boxed: a client is large, and the enum is
    /// cloned into every connection).
    Server(Box<redis::Client>),
    /// The current primary of a Sentinel service.
    Sentinel(Arc<Primary>),
}

impl Target {
    /// A client for the server to use now.
    pub(crate) fn client(&self) -> redis::Client {
        match self {
            Target::Server(client) => (**client).clone(),
            Target::Sentinel(primary) => primary.client(),
        }
    }

    /// Counts the moves of the server; always 0 for one server.
    pub(crate) fn generation(&self) -> u64 {
        match self {
            Target::Server(_) => 0,
            Target::Sentinel(primary) => primary.generation(),
        }
    }

    /// Completes when the server moved after `seen`; never for one server.
    pub(crate) async fn moved(&self, seen: u64) {
        match self {
            Target::Server(_) => std::future::pending().await,
            Target::Sentinel(primary) => primary.moved(seen).await,
        }
    }

    /// The server looks gone: with Sentinel, look up the primary again.
    pub(crate) fn suspect(&self) {
        if let Target::Sentinel(primary) = self {
            primary.suspect();
        }
    }
}

/// Whether `error` says the server may no longer be the one to talk to: a failed or refused
/// connection, or a replica refusing a write.
fn looks_moved(error: &redis::RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        || error.to_string().contains("READONLY")
}

/// The shared, reconnecting command connection.
#[derive(Clone)]
pub(crate) struct Connection {
    shared: Arc<Shared>,
    request_timeout: Duration,
    /// Keeps the [`TimerKeeper`] running while the connection lives.
    _alive: Arc<()>,
}

/// What the clones of a [`Connection`] share: the current link and how to open the next one.
struct Shared {
    /// `None` for a cluster connection, which reconnects to each node by itself and is not
    /// replaced on a timeout.
    target: Option<Target>,
    config: ConnectionManagerConfig,
    /// Swapped for a new link when a request on it times out; loading it takes no lock.
    current: ArcSwap<Link>,
}

/// One connection manager, until a request on it times out.
struct Link {
    manager: RedisConnection,
    /// The [`Target::generation`] it was opened for (0 for a cluster).
    generation: u64,
    /// Set by the first timed-out request, which replaces the link; later ones leave it.
    retired: AtomicBool,
}

impl Link {
    fn new(manager: RedisConnection, generation: u64) -> Arc<Self> {
        Arc::new(Link {
            manager,
            generation,
            retired: AtomicBool::new(false),
        })
    }
}

impl Shared {
    /// Replaces `link`, on which a request got no answer, with a connection that is opened by the
    /// next request (bounded by its request timeout, like any wait for a reconnection). Requests
    /// still running on `link` finish there; its socket closes when the last one ends.
    fn retire(&self, link: &Arc<Link>) {
        let Some(target) = &self.target else {
            return;
        };
        if link.retired.swap(true, Ordering::AcqRel) {
            return;
        }
        // Fails only for a configuration the first connection was already opened with.
        let generation = target.generation();
        match ConnectionManager::new_lazy_with_config(target.client(), self.config.clone()) {
            Ok(manager) => {
                let replacement = Link::new(RedisConnection::Server(manager), generation);
                self.current.compare_and_swap(link, replacement);
                tracing::debug!("redis: a request timed out; its connection is replaced");
            }
            Err(error) => {
                link.retired.store(false, Ordering::Release);
                tracing::warn!(%error, "redis: cannot replace a connection that stopped answering");
            }
        }
    }
}

/// Keeps one timer of the runtime always due within half a request timeout.
///
/// Every request arms a timer (its timeout). When tokio's time driver is parked with no timer at
/// all, arming one has to wake the driver's thread so it can shorten its sleep: one extra thread
/// wake-up per request, which on a mostly idle client costs more than the request's own work.
/// With a timer that is always due sooner than any request timeout, arming a request timer never
/// shortens the driver's sleep. The keeper wakes twice per request timeout, nothing more.
struct TimerKeeper {
    period: Duration,
    alive: Weak<()>,
}

impl TimerKeeper {
    async fn run(self) {
        loop {
            tokio::time::sleep(self.period).await;
            if self.alive.strong_count() == 0 {
                return;
            }
        }
    }
}

impl Connection {
    /// Connects, giving up after `connect_timeout`.
    pub(crate) async fn open(
        target: Target,
        connect_timeout: Duration,
        request_timeout: Duration,
    ) -> Result<Self> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            // The request timeout below bounds every call (including a wait for a reconnection);
            // a second timer per request inside the client would only cost time.
            .set_response_timeout(None)
            .set_number_of_retries(RECONNECT_ATTEMPTS)
            .set_min_delay(RECONNECT_MIN_DELAY)
            .set_max_delay(RECONNECT_MAX_DELAY);
        // A PING proves that the server accepts this client (password, ACL) before the first
        // lock operation has to find out.
        let client = target.client();
        let connected = async {
            let mut manager = client
                .get_connection_manager_with_config(config.clone())
                .await?;
            redis::cmd("PING").query_async::<()>(&mut manager).await?;
            Ok::<_, redis::RedisError>(manager)
        };
        let manager = tokio::time::timeout(connect_timeout, connected)
            .await
            .map_err(|_| error::no_answer("connect", connect_timeout))?
            .map_err(|e| error::from_redis("connect", e))?;
        Ok(Self::assemble(
            Some(target),
            config,
            RedisConnection::Server(manager),
            request_timeout,
        ))
    }

    /// Wraps an open cluster connection (see [`crate::cluster`]).
    pub(crate) fn cluster(
        connection: redis::cluster_async::ClusterConnection,
        request_timeout: Duration,
    ) -> Self {
        let config = ConnectionManagerConfig::new();
        let connection = RedisConnection::Cluster(connection);
        Self::assemble(None, config, connection, request_timeout)
    }

    fn assemble(
        target: Option<Target>,
        config: ConnectionManagerConfig,
        manager: RedisConnection,
        request_timeout: Duration,
    ) -> Self {
        let alive = Arc::new(());
        if request_timeout >= MIN_KEEPER_TIMEOUT {
            let keeper = TimerKeeper {
                period: request_timeout / 2,
                alive: Arc::downgrade(&alive),
            };
            tokio::spawn(keeper.run());
        }
        Connection {
            shared: Arc::new(Shared {
                current: ArcSwap::new(Link::new(
                    manager,
                    target.as_ref().map_or(0, Target::generation),
                )),
                target,
                config,
            }),
            request_timeout,
            _alive: alive,
        }
    }

    /// Runs `call` on the connection, bounded by the request timeout; errors name `op`. A
    /// timeout retires the connection (see the module docs).
    ///
    /// # Cancel safety
    /// Dropping it drops the request: it may or may not have reached the server.
    pub(crate) async fn run<T, F, Fut>(&self, op: &'static str, call: F) -> Result<T>
    where
        F: FnOnce(RedisConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        self.run_longer(op, Duration::ZERO, call).await
    }

    /// [`run`](Self::run) with `extra` time on top of the request timeout, for a request that
    /// may wait on the server (`WAIT`). On a target that moves (Sentinel), a link opened for an
    /// earlier primary is replaced first, and a failure that suggests the primary moved starts a
    /// lookup.
    pub(crate) async fn run_longer<T, F, Fut>(
        &self,
        op: &'static str,
        extra: Duration,
        call: F,
    ) -> Result<T>
    where
        F: FnOnce(RedisConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let target = self.shared.target.as_ref();
        let mut link = self.shared.current.load_full();
        if target.is_some_and(|t| link.generation != t.generation()) {
            self.shared.retire(&link);
            link = self.shared.current.load_full();
        }
        let bound = self.request_timeout + extra;
        match tokio::time::timeout(bound, call(link.manager.clone())).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                if looks_moved(&e) {
                    target.inspect(|t| t.suspect());
                }
                Err(error::from_redis(op, e))
            }
            Err(_) => {
                target.inspect(|t| t.suspect());
                self.shared.retire(&link);
                Err(error::no_answer(op, bound))
            }
        }
    }

    /// A handle on the current multiplexed connection; it stays on that connection when a
    /// timed-out request makes the client move to a new one.
    pub(crate) fn manager(&self) -> RedisConnection {
        self.shared.current.load().manager.clone()
    }

    /// The bound on every request.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.request_timeout
    }
}
