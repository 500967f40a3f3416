//! What the suite runs against: a way to make independent clients of one lock service, and what
//! the service declares about itself.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::Capabilities;
use dlock_core::DistributedLock;
use dlock_testkit::{DroppingProxies, Freeze, ServerControl};

/// A boxed future returning a new client.
pub type ClientFuture =
    Pin<Box<dyn Future<Output = anyhow::Result<Arc<dyn DistributedLock>>> + Send>>;

/// Makes a new, independent client of the service under test (its own connection or session).
pub type Connect = Arc<dyn Fn() -> ClientFuture + Send + Sync>;

/// A boxed future returning a new client and the switch that freezes it.
pub type FreezableFuture = Pin<
    Box<dyn Future<Output = anyhow::Result<(Arc<dyn DistributedLock>, Arc<dyn Freeze>)>> + Send>,
>;

/// Makes a new client of the service that reaches it at the given addresses (proxies) instead of
/// its own, in the order of the targets given to [`Subject::with_proxied`].
pub type ConnectVia = Arc<dyn Fn(Vec<SocketAddr>) -> ClientFuture + Send + Sync>;

/// The addresses of a service and how to make clients that reach them through proxies.
#[derive(Clone)]
pub(crate) struct Proxied {
    targets: Vec<SocketAddr>,
    connect: ConnectVia,
}

/// Counts what the service stores, to check that rejected input left nothing behind.
#[async_trait]
pub trait Inspect: Send + Sync {
    /// How many entries the service stores for lock keys starting with `namespace`.
    async fn stored(&self, namespace: &str) -> anyhow::Result<u64>;
}

/// A dedicated instance of the service that the outage case may stop and start.
///
/// It must not be the instance the other cases use: they run in parallel and would fail with it.
#[derive(Clone)]
pub struct Outage {
    pub(crate) control: Arc<dyn ServerControl>,
    pub(crate) connect: Connect,
}

impl Outage {
    /// An outage target: `control` stops and starts it, `connect` makes clients of it.
    pub fn new<F, Fut>(control: Arc<dyn ServerControl>, connect: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = anyhow::Result<Arc<dyn DistributedLock>>> + Send + 'static,
    {
        Outage {
            control,
            connect: Arc::new(move || Box::pin(connect())),
        }
    }

    /// A new client of the dedicated instance.
    pub async fn client(&self) -> anyhow::Result<Arc<dyn DistributedLock>> {
        (self.connect)().await
    }
}

/// Time scale of the cases. Leases in the cases last a few `ttl`s; assertions on timing allow
/// `slack` on top of what the algorithm promises (these machines are noisy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// The short TTL used where a case waits for expiry.
    pub ttl: Duration,
    /// Extra time allowed beyond every promised bound.
    pub slack: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            ttl: Duration::from_millis(1_000),
            slack: Duration::from_secs(3),
        }
    }
}

/// A lock service under test.
#[derive(Clone)]
pub struct Subject {
    pub(crate) name: String,
    pub(crate) connect: Connect,
    pub(crate) capabilities: Capabilities,
    pub(crate) timing: Timing,
    pub(crate) outage: Option<Outage>,
    pub(crate) inspect: Option<Arc<dyn Inspect>>,
    pub(crate) freezable: Option<Arc<dyn Fn() -> FreezableFuture + Send + Sync>>,
    pub(crate) proxied: Option<Proxied>,
}

impl fmt::Debug for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subject")
            .field("name", &self.name)
            .field("capabilities", &self.capabilities)
            .field("timing", &self.timing)
            .field("outage", &self.outage.is_some())
            .field("inspect", &self.inspect.is_some())
            .field("proxied", &self.proxied.is_some())
            .finish()
    }
}

dlock_core::backend::setters! {
    Subject {
        /// Sets the time scale.
        with_timing(timing: Timing) => timing = timing;
        /// Enables the outage case on a dedicated instance of the service.
        with_outage(outage: Outage) => outage = Some(outage);
        /// Enables the "no state left behind" check of the invalid-input case.
        with_inspect(inspect: Arc<dyn Inspect>) => inspect = Some(inspect);
    }
}

impl Subject {
    /// A subject named `name` (used as the test-name prefix) whose clients come from `connect`,
    /// declaring `capabilities` (normally the backend's own [`DistributedLock::capabilities`]).
    pub fn new<F, Fut>(name: impl Into<String>, capabilities: Capabilities, connect: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = anyhow::Result<Arc<dyn DistributedLock>>> + Send + 'static,
    {
        Subject {
            name: name.into(),
            connect: Arc::new(move || Box::pin(connect())),
            capabilities,
            timing: Timing::default(),
            outage: None,
            inspect: None,
            freezable: None,
            proxied: None,
        }
    }

    /// Makes freezable clients with `connect` instead of the default, which holds back the
    /// client's extend calls ([`Freezable`](dlock_testkit::Freezable)). Session-based backends, whose
    /// client library keeps the session alive by itself, freeze the connection instead (see
    /// [`FreezeProxy`](dlock_testkit::FreezeProxy)).
    pub fn with_freezable<F, Fut>(mut self, connect: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = anyhow::Result<(Arc<dyn DistributedLock>, Arc<dyn Freeze>)>>
            + Send
            + 'static,
    {
        self.freezable = Some(Arc::new(move || Box::pin(connect())));
        self
    }

    /// A new client whose link to the service a case can freeze.
    pub async fn freezable_client(
        &self,
    ) -> anyhow::Result<(Arc<dyn DistributedLock>, Arc<dyn Freeze>)> {
        match &self.freezable {
            Some(connect) => connect().await,
            None => {
                let freezable = dlock_testkit::Freezable::new(self.client().await?);
                let client: Arc<dyn DistributedLock> = Arc::new(freezable.clone());
                Ok((client, Arc::new(freezable)))
            }
        }
    }

    /// Enables the silent-link case. `targets` are the addresses of every server a client talks
    /// to (every member, every master); `connect` makes a client that reaches them at the
    /// addresses it is given instead, in the same order.
    pub fn with_proxied<F, Fut>(mut self, targets: Vec<SocketAddr>, connect: F) -> Self
    where
        F: Fn(Vec<SocketAddr>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = anyhow::Result<Arc<dyn DistributedLock>>> + Send + 'static,
    {
        self.proxied = Some(Proxied {
            targets,
            connect: Arc::new(move |addrs| Box::pin(connect(addrs))),
        });
        self
    }

    /// A new client whose every link to the service goes through a proxy that, frozen, discards
    /// the bytes both ways and keeps the connections open ([`FreezeProxy::start_dropping`]), and
    /// that can silence the links open at one moment for good while new ones pass. The proxies
    /// stop when they are dropped. `None` if the subject has no
    /// [`with_proxied`](Self::with_proxied) hook.
    ///
    /// [`FreezeProxy::start_dropping`]: dlock_testkit::FreezeProxy::start_dropping
    pub async fn proxied_client(
        &self,
    ) -> anyhow::Result<Option<(Arc<dyn DistributedLock>, Arc<DroppingProxies>)>> {
        let Some(proxied) = &self.proxied else {
            return Ok(None);
        };
        let proxies = DroppingProxies::start(&proxied.targets).await?;
        let client = (proxied.connect)(proxies.addrs()).await?;
        Ok(Some((client, Arc::new(proxies))))
    }

    /// The subject's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the subject declares.
    pub fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    /// A new independent client.
    pub async fn client(&self) -> anyhow::Result<Arc<dyn DistributedLock>> {
        (self.connect)().await
    }
}
