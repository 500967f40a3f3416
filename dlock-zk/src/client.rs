//! The backend handle: its settings, its current session, the locks it holds, and its background
//! tasks.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use dlock_core::backend::{Capabilities, LockKey, Primitives};
use dlock_core::layer::Layer;
use dlock_core::{DistributedLock, Result};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::builder::{Config, ZkLockBuilder};
use crate::error::Failure;
use crate::naming::encode_key;
use crate::queue::Queue;
use crate::recipe::KnownParents;
use crate::registry::Registry;
use crate::session::Session;
use crate::stats::{Counters, ZkStats};

/// A ZooKeeper lock service: one session shared by every lock taken through this handle.
///
/// Clones share the session. Use it through
/// [`DistributedLockExt`](dlock_core::DistributedLockExt), usually as
/// `Arc<dyn DistributedLock>`; see the [crate documentation](crate) for the recipe, the fencing
/// token and how leases follow the session. Dropping the last clone (and every lease taken
/// through it) closes the session, which deletes its lock nodes at once.
#[derive(Clone)]
pub struct ZkLock {
    service: Queue,
}

/// What every clone of a [`ZkLock`] shares.
pub(crate) struct Inner {
    pub(crate) config: Config,
    current: Mutex<Option<Arc<Session>>>,
    /// Held while a session is being opened, so that concurrent calls open only one.
    opening: tokio::sync::Mutex<()>,
    generations: AtomicU64,
    registry: Mutex<Registry>,
    /// Wakes the keeper when a TTL deadline was added or moved.
    pub(crate) keeper: Arc<Notify>,
    pub(crate) counters: Counters,
    /// Whether the server accepts container nodes (3.5.3 and later); cleared on `Unimplemented`.
    pub(crate) containers: AtomicBool,
    /// The lock parents this client created or used (see [`KnownParents`]).
    pub(crate) parents: KnownParents,
    /// The keeper task; restarted if the runtime it ran on went away.
    keeper_task: Mutex<Option<JoinHandle<()>>>,
    /// The session watchdogs, stopped when the handle goes away.
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl fmt::Debug for ZkLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.shared();
        f.debug_struct("ZkLock")
            .field("connect", &inner.config.connect)
            .field("base", &inner.config.base)
            .field("session", &inner.current())
            .field("held", &inner.registry().len())
            .finish()
    }
}

/// Every lock call goes to the recipe on the shared state.
impl Layer for ZkLock {
    fn inner(&self) -> &dyn DistributedLock {
        &self.service
    }
}

impl ZkLock {
    /// What a ZooKeeper client declares about itself ([`DistributedLock::capabilities`]):
    /// tokens (creation zxids) that only grow, waiters woken by watches in arrival order, leases
    /// in the ZooKeeper session, every primitive.
    pub const CAPABILITIES: Capabilities =
        Capabilities::session_queue().with_primitives(Primitives::ALL);

    /// A builder for the ensemble at `url`: `zk://host1:2181,host2:2181[/chroot]`.
    pub fn builder(url: &str) -> ZkLockBuilder {
        ZkLockBuilder::new(url)
    }

    /// Connects to the ensemble at `url` with default settings.
    ///
    /// # Cancel safety
    /// Cancel safe: a session opened by a cancelled call is closed when dropped.
    pub async fn connect(url: &str) -> Result<ZkLock> {
        ZkLockBuilder::new(url).connect().await
    }

    pub(crate) async fn start(config: Config) -> Result<ZkLock> {
        let connect_timeout = config.connect_timeout;
        let inner = Arc::new(Inner {
            config,
            current: Mutex::new(None),
            opening: tokio::sync::Mutex::new(()),
            generations: AtomicU64::new(0),
            registry: Mutex::new(Registry::default()),
            keeper: Arc::new(Notify::new()),
            counters: Counters::default(),
            containers: AtomicBool::new(true),
            parents: KnownParents::default(),
            keeper_task: Mutex::new(None),
            tasks: Mutex::new(Vec::new()),
        });
        inner.ensure_keeper()?;
        inner.open_session(Instant::now() + connect_timeout).await?;
        Ok(ZkLock {
            service: Queue(inner),
        })
    }

    /// What every clone shares.
    fn shared(&self) -> &Inner {
        &self.service.0
    }

    /// The path of `key`'s lock node: the children of this node are the contenders. Point
    /// another client's lock recipe here to share the lock — kazoo's `Lock(client, path)` queues
    /// together with dlock (see the [crate documentation](crate#interoperability)).
    ///
    /// The path includes the chroot of the connection string, so use it with a client that
    /// connects without one.
    pub fn lock_path(&self, key: &str) -> Result<String> {
        let key = LockKey::new(key)?;
        Ok(self.shared().parent_path(&key))
    }

    /// The path where `primitive` of `key` lives, in kazoo's layout: point kazoo's `ReadLock` /
    /// `WriteLock` ([`Primitive::Read`], [`Primitive::Write`]), `Semaphore`
    /// ([`Primitive::Semaphore`], with the same `max_leases`) or `Election`
    /// ([`Primitive::Election`]) here to share it with dlock. It is the lock's path plus `%rw`,
    /// `%semaphore` or `%election`, so the lock and the primitives of one name never meet.
    ///
    /// Like [`lock_path`](Self::lock_path), it includes the chroot.
    ///
    /// [`Primitive::Read`]: dlock_core::backend::Primitive::Read
    /// [`Primitive::Write`]: dlock_core::backend::Primitive::Write
    /// [`Primitive::Semaphore`]: dlock_core::backend::Primitive::Semaphore
    /// [`Primitive::Election`]: dlock_core::backend::Primitive::Election
    pub fn primitive_path(
        &self,
        key: &str,
        primitive: &dlock_core::backend::Primitive,
    ) -> Result<String> {
        let key = LockKey::new(key)?;
        Ok(crate::primitives::path_of(self.shared(), &key, primitive))
    }

    /// The node every lock key's node is a child of (chroot plus root).
    pub fn base_path(&self) -> &str {
        &self.shared().config.base
    }

    /// The negotiated timeout of the current session, if one is open.
    pub fn session_timeout(&self) -> Option<Duration> {
        self.shared().current().map(|s| s.timeout)
    }

    /// The id of the current session, if one is open (as ZooKeeper's `ephemeralOwner` shows it).
    pub fn session_id(&self) -> Option<i64> {
        self.shared().current().map(|s| s.id)
    }

    /// Counters since the handle was built.
    pub fn stats(&self) -> ZkStats {
        self.shared().counters.snapshot()
    }
}

impl Inner {
    /// The held locks.
    pub(crate) fn registry(&self) -> MutexGuard<'_, Registry> {
        // Every mutation leaves the registry consistent before anything can panic.
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current session, whatever its state.
    pub(crate) fn current(&self) -> Option<Arc<Session>> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Makes sure the keeper runs: started with the handle, and again on the caller's runtime if
    /// the runtime it ran on has shut down (a handle can outlive the runtime that built it).
    pub(crate) fn ensure_keeper(self: &Arc<Self>) -> Result<()> {
        let mut keeper = self
            .keeper_task
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if keeper.as_ref().is_some_and(|task| !task.is_finished()) {
            return Ok(());
        }
        let task = spawn(crate::keeper::run(
            Arc::downgrade(self),
            self.keeper.clone(),
        ))?;
        *keeper = Some(task);
        Ok(())
    }

    fn track(&self, task: JoinHandle<()>) {
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
    }

    /// [`session`](Self::session) for a call that reports its failure as the caller's error.
    pub(crate) async fn open_session(self: &Arc<Self>, until: Instant) -> Result<Arc<Session>> {
        self.session(until)
            .await
            .map_err(|f| f.into_error("open a ZooKeeper session"))
    }

    /// A session that has not ended, opening a new one (at most `until`) if needed.
    pub(crate) async fn session(self: &Arc<Self>, until: Instant) -> Result<Arc<Session>, Failure> {
        if let Some(session) = self.current().filter(|s| !s.is_ended()) {
            return Ok(session);
        }
        let started = Instant::now();
        let _opening = tokio::time::timeout_at(until, self.opening.lock())
            .await
            .map_err(|_| Failure::NotConnected(started.elapsed()))?;
        if let Some(session) = self.current().filter(|s| !s.is_ended()) {
            return Ok(session);
        }
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let limit = until.min(Instant::now() + self.config.connect_timeout);
        let opened = tokio::time::timeout_at(limit, Session::open(&self.config, generation)).await;
        let session = match opened {
            Ok(Ok(session)) => Arc::new(session),
            Ok(Err(zk::Error::Timeout | zk::Error::NoHosts | zk::Error::ConnectionLoss))
            | Err(_) => return Err(self.not_connected(started).await),
            Ok(Err(error)) => return Err(Failure::Zk(error)),
        };
        Counters::bump(&self.counters.sessions_opened);
        tracing::debug!(
            backend = crate::error::BACKEND,
            generation,
            session = %format_args!("{:#x}", session.id),
            timeout = ?session.timeout,
            "opened ZooKeeper session"
        );
        let watchdog = spawn(crate::watchdog::run(
            Arc::downgrade(self),
            Arc::downgrade(&session),
            session.states(),
        ))
        .map_err(|_| Failure::NoRuntime)?;
        self.track(watchdog);
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(session.clone());
        Ok(session)
    }

    /// Why no session came up: over TLS, a failed handshake says why in words (checked with one
    /// handshake per server, each bounded by a second or the connect timeout if shorter);
    /// otherwise no server answered in time.
    async fn not_connected(&self, started: Instant) -> Failure {
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.config.tls {
            let timeout = self.config.connect_timeout.min(Duration::from_secs(1));
            if let Some(reason) = tls.diagnose(self.config.connect.servers(), timeout).await {
                return Failure::Tls(reason);
            }
        }
        Failure::NotConnected(started.elapsed())
    }

    /// The node whose children contend for `key`.
    pub(crate) fn parent_path(&self, key: &LockKey) -> String {
        format!("{}/{}", self.config.base, encode_key(key.as_str()))
    }

    /// Records that the server answered a request of `session` sent at `sent`.
    pub(crate) fn confirmed(&self, session: &Session, sent: Instant) {
        if session.confirm(sent) {
            self.announce(session);
        }
    }

    /// Tells every lease of `session` its current state.
    pub(crate) fn announce(&self, session: &Session) {
        let link = session.link();
        let vouched = session.vouched_until();
        for held in self.registry().of_generation(session.generation) {
            held.publish(link, vouched);
        }
    }

    /// The session ended: every lease in it is lost.
    pub(crate) fn end_session(&self, session: &Session) {
        let ended = self.registry().take_generation(session.generation);
        if !ended.is_empty() {
            tracing::warn!(
                backend = crate::error::BACKEND,
                session = %format_args!("{:#x}", session.id),
                leases = ended.len(),
                "ZooKeeper session ended: its locks are lost"
            );
        }
        for held in ended {
            held.end();
        }
    }

    /// Whether any lock of session `generation` is held.
    pub(crate) fn holds_in(&self, generation: u64) -> bool {
        self.registry().of_generation(generation).next().is_some()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let keeper = self
            .keeper_task
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(task) = keeper.take() {
            task.abort();
        }
        let tasks = self.tasks.get_mut().unwrap_or_else(PoisonError::into_inner);
        for task in tasks.drain(..) {
            task.abort();
        }
    }
}

/// Spawns a background task on the current tokio runtime; an error (instead of tokio's panic)
/// when called outside one.
fn spawn(task: impl std::future::Future<Output = ()> + Send + 'static) -> Result<JoinHandle<()>> {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => Ok(runtime.spawn(task)),
        Err(_) => Err(Failure::NoRuntime.into_error("start the backend's background tasks")),
    }
}

/// Lets background tasks hold the handle weakly.
pub(crate) type WeakInner = Weak<Inner>;
