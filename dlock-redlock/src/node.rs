//! One master: its connection, replaced when it breaks, and its restart history.
//!
//! Each master has one multiplexed connection that all requests of the client share (redis-rs's
//! `MultiplexedConnection`: requests from many tasks are pipelined, no client-side lock). When it
//! breaks, the next request fails for this master at once and starts one reconnection in a
//! background task; requests made once it is up use the new connection. A request never waits
//! for a connection, so requests reach a master in the order they were made, and a master that is
//! down costs nothing; one that hangs costs a request its per-node timeout, never a TCP timeout.
//! A request that gets no answer in time retires its connection too, once however many requests
//! time out on it: replies are matched to requests in order, so on a connection whose peer lost a
//! request or a reply (a dropped route, a peer that forgot the connection) every later request
//! would wait for the reply before its own, or take it for its own. A paused master is reached
//! again through a new connection once it runs. The connection is replaced here rather than
//! inside redis-rs's `ConnectionManager` because every new connection must be checked with
//! `INFO server` before it is used (see [`crate::restart`]): a restarted master is only ever
//! reached through a new connection. Every script is loaded on it then too
//! (`dlock_redis::protocol::scripts::load_all`), so a restarted master, which forgot them, does
//! not answer `NOSCRIPT` to each request of the first burst.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use dlock_core::Error;
use dlock_redis::protocol::scripts;
use dlock_redis::{Endpoint, Wakeups};
use futures::future::{BoxFuture, FutureExt, Shared};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisResult};
use tokio::time::Instant;

use crate::restart::{RestartWatch, Seen, ServerInfo};

/// Why a master gave no usable answer; shown in quorum errors after the master's URL.
#[derive(Debug, Clone)]
pub(crate) struct NodeFailure {
    /// The master's URL, password hidden.
    pub(crate) endpoint: String,
    /// What happened.
    pub(crate) error: Arc<Error>,
}

impl NodeFailure {
    /// Whether trying again later may help (false for a refused password, a missing permission).
    pub(crate) fn is_temporary(&self) -> bool {
        self.error.is_temporary()
    }
}

impl std::fmt::Display for NodeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.endpoint, self.error)
    }
}

type Reconnecting = Shared<BoxFuture<'static, Result<Link, Arc<Error>>>>;

/// A usable connection and its number (counting from 1 per master).
#[derive(Clone)]
pub(crate) struct Link {
    connection: MultiplexedConnection,
    generation: u64,
}

enum LinkState {
    Up(Link),
    Connecting(Reconnecting),
    Down,
}

/// One Redis master.
pub(crate) struct Node {
    endpoint: Endpoint,
    client: redis::Client,
    connect_timeout: Duration,
    /// The delayed-restart window, if the rule is on.
    restart_window: Option<Duration>,
    state: Mutex<LinkState>,
    generations: Mutex<u64>,
    restarts: Mutex<RestartWatch>,
    /// The master's release notifications, which wake this client's waiters when the master
    /// names them the head of a lock's queue (one subscriber connection, opened on first need).
    wakeups: Wakeups,
}

impl Node {
    /// A master at `endpoint`, not yet connected; `request_timeout` bounds each request of its
    /// release notifications' connection, which listens for the client's `wake_tag`. Starts the
    /// (idle) listener of those on the current tokio runtime.
    pub(crate) fn new(
        endpoint: Endpoint,
        connect_timeout: Duration,
        request_timeout: Duration,
        restart_window: Option<Duration>,
        wake_tag: Arc<str>,
    ) -> Result<Arc<Self>, Error> {
        let client = endpoint.client()?;
        let wakeups = Wakeups::for_server(&endpoint, connect_timeout, request_timeout, wake_tag)?;
        Ok(Arc::new(Node {
            endpoint,
            client,
            connect_timeout,
            restart_window,
            state: Mutex::new(LinkState::Down),
            generations: Mutex::new(0),
            restarts: Mutex::new(RestartWatch::default()),
            wakeups,
        }))
    }

    /// The master's release notifications.
    pub(crate) fn wakeups(&self) -> &Wakeups {
        &self.wakeups
    }

    /// The master's URL with its password hidden.
    pub(crate) fn endpoint(&self) -> &str {
        self.endpoint.redacted()
    }

    /// Whether the master may count towards a quorum now (see [`crate::restart`]).
    pub(crate) fn counts(&self) -> bool {
        lock(&self.restarts).counts_at(Instant::now())
    }

    /// When the master's delayed-restart exclusion ends, if it is excluded now.
    pub(crate) fn excluded_until(&self) -> Option<Instant> {
        lock(&self.restarts).excluded_until(Instant::now())
    }

    /// The number of the connection a request made now is sent on, if there is one: what the
    /// caller of [`run`](Self::run) passes to [`timed_out`](Self::timed_out).
    pub(crate) fn generation(&self) -> Option<u64> {
        match &*lock(&self.state) {
            LinkState::Up(link) => Some(link.generation),
            LinkState::Connecting(_) | LinkState::Down => None,
        }
    }

    /// Runs `call` on the master's connection; fails at once without one. `op` names the
    /// operation in errors. The caller bounds it in time and reports a timeout with
    /// [`timed_out`](Self::timed_out).
    ///
    /// # Cancel safety
    /// Dropping it drops the request, which may or may not have reached the master.
    pub(crate) async fn run<T, F, Fut>(
        self: &Arc<Self>,
        op: &'static str,
        call: F,
    ) -> Result<T, NodeFailure>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let link = self.ready_link().map_err(|e| self.failure(e))?;
        match call(link.connection.clone()).await {
            Ok(value) => Ok(value),
            Err(e) => {
                if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
                    self.broken(link.generation);
                }
                Err(self.failure(Arc::new(dlock_redis::protocol::error_from_redis(op, e))))
            }
        }
    }

    /// The failure of a request of `op` that got no answer within `timeout`; the connection it
    /// was sent on (`generation`, as [`generation`](Self::generation) told before the request)
    /// is replaced.
    pub(crate) fn timed_out(
        &self,
        op: &'static str,
        timeout: Duration,
        generation: Option<u64>,
    ) -> NodeFailure {
        if let Some(generation) = generation {
            self.broken(generation);
        }
        self.failure(Arc::new(Error::no_answer(op, timeout)))
    }

    /// Connects now (bounded by the connect timeout), for [`connect`](crate::RedlockBuilder::connect).
    pub(crate) async fn connect(self: &Arc<Self>) -> Result<(), NodeFailure> {
        let link = self.link();
        match tokio::time::timeout(self.connect_timeout, link).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(self.failure(e)),
            Err(_) => {
                Err(self.failure(Arc::new(Error::no_answer("connect", self.connect_timeout))))
            }
        }
    }

    fn failure(&self, error: Arc<Error>) -> NodeFailure {
        NodeFailure {
            endpoint: self.endpoint().to_owned(),
            error,
        }
    }

    /// The current connection; without one, a request fails at once (and starts a reconnection
    /// if none is under way) rather than waiting, so that requests are sent in the order they
    /// were made — never a request made later on a connection that was ready earlier.
    fn ready_link(self: &Arc<Self>) -> Result<Link, Arc<Error>> {
        if let LinkState::Up(link) = &*lock(&self.state) {
            return Ok(link.clone());
        }
        // Start a reconnection if there is none; this request does not wait for it.
        drop(self.link());
        Err(Arc::new(Error::unreachable("not connected; reconnecting")))
    }

    /// The current connection, or the shared reconnection in progress.
    fn link(self: &Arc<Self>) -> impl Future<Output = Result<Link, Arc<Error>>> + 'static {
        let pending = {
            let mut state = lock(&self.state);
            match &*state {
                LinkState::Up(link) => {
                    let link = link.clone();
                    return futures::future::ready(Ok(link)).boxed().shared();
                }
                LinkState::Connecting(pending) => pending.clone(),
                LinkState::Down => {
                    let task = tokio::spawn(reconnect(Arc::downgrade(self)));
                    let pending = async move {
                        task.await.unwrap_or_else(|e| {
                            Err(Arc::new(Error::backend(
                                crate::client::BACKEND,
                                true,
                                format!("reconnection task ended: {e}"),
                            )))
                        })
                    }
                    .boxed()
                    .shared();
                    *state = LinkState::Connecting(pending.clone());
                    pending
                }
            }
        };
        pending
    }

    /// The connection broke or stopped answering: the next request reconnects.
    fn broken(&self, generation: u64) {
        let mut state = lock(&self.state);
        if matches!(&*state, LinkState::Up(link) if link.generation == generation) {
            *state = LinkState::Down;
        }
    }
}

/// Opens a connection, checks the server process behind it, and makes it the master's link.
async fn reconnect(node: Weak<Node>) -> Result<Link, Arc<Error>> {
    let Some(node) = node.upgrade() else {
        return Err(Arc::new(Error::backend(
            crate::client::BACKEND,
            false,
            "the client was dropped",
        )));
    };
    let result = tokio::time::timeout(node.connect_timeout, open(&node)).await;
    let result = match result {
        Ok(result) => result,
        Err(_) => Err(Arc::new(Error::no_answer("connect", node.connect_timeout))),
    };
    let mut state = lock(&node.state);
    match &result {
        Ok(link) => *state = LinkState::Up(link.clone()),
        Err(_) => *state = LinkState::Down,
    }
    result
}

async fn open(node: &Node) -> Result<Link, Arc<Error>> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(node.connect_timeout))
        // Every request is bounded by its caller's per-node timeout instead.
        .set_response_timeout(None);
    let fail = |op, e| Arc::new(dlock_redis::protocol::error_from_redis(op, e));
    let mut connection = node
        .client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| fail("connect", e))?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut connection)
        .await
        .map_err(|e| fail("INFO server", e))?;
    let Some(info) = ServerInfo::parse(&info) else {
        return Err(Arc::new(Error::backend(
            crate::client::BACKEND,
            false,
            format!(
                "{}: INFO server has no run_id or uptime_in_seconds",
                node.endpoint()
            ),
        )));
    };
    // Best effort: on a server that refuses it, each script still runs from its source once.
    if let Err(error) = scripts::load_all().query_async::<()>(&mut connection).await {
        tracing::debug!(endpoint = node.endpoint(), %error, "Redlock master: SCRIPT LOAD refused");
    }
    let seen = lock(&node.restarts).saw(&info, Instant::now(), node.restart_window);
    if seen == Seen::Restarted {
        tracing::info!(
            endpoint = node.endpoint(),
            uptime = ?info.uptime,
            "Redlock master restarted"
        );
    }
    if let Some(until) = node.excluded_until() {
        tracing::info!(
            endpoint = node.endpoint(),
            excluded_for = ?until.saturating_duration_since(Instant::now()),
            "Redlock master started recently: left out of quorums (delayed restart)"
        );
    }
    let generation = {
        let mut generations = lock(&node.generations);
        *generations += 1;
        *generations
    };
    Ok(Link {
        connection,
        generation,
    })
}

/// Locks a mutex; a panic elsewhere while holding it leaves plain data that is still usable.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
