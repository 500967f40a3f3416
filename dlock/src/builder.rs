//! [`builder`]: a handle on the backend a URL names, with layers around it.

use std::fmt;
use std::sync::Arc;

use dlock_core::backend::url::redact_password;
use dlock_core::layer::{Metered, Traced};
use dlock_core::{DistributedLock, Locks, Result};

/// A builder for a handle on the backend `url` names, with layers around it:
/// `dlock::builder(url).with_tracing().with_metrics().connect().await`.
pub fn builder(url: &str) -> LocksBuilder {
    LocksBuilder {
        url: url.to_owned(),
        layers: Layers::default(),
    }
}

/// Which layers go around the backend.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Layers {
    pub(crate) tracing: bool,
    pub(crate) metrics: bool,
    pub(crate) metrics_keys: bool,
}

impl Layers {
    /// Every layer that either asks for.
    pub(crate) fn or(self, other: Layers) -> Layers {
        Layers {
            tracing: self.tracing || other.tracing,
            metrics: self.metrics || other.metrics || self.metrics_keys || other.metrics_keys,
            metrics_keys: self.metrics_keys || other.metrics_keys,
        }
    }

    /// `backend` inside the layers: metrics outermost, so that they count what the caller saw,
    /// and the tracing spans inside them hold the backend's own events.
    pub(crate) fn around(self, backend: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
        let backend: Arc<dyn DistributedLock> = if self.tracing {
            Arc::new(Traced::new(backend))
        } else {
            backend
        };
        match (self.metrics, self.metrics_keys) {
            (_, true) => Arc::new(Metered::new(backend).with_key_labels()),
            (true, false) => Arc::new(Metered::new(backend)),
            (false, false) => backend,
        }
    }
}

/// How [`builder`](crate::builder) connects: the URL and the layers to put around its backend. Without
/// a layer the backend is used as it is, so what is not enabled costs nothing.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::builder("memory://?ttl=10s")
///     .with_tracing() // one span per call (see dlock_core::layer::Traced)
///     .with_metrics() // counters, gauges, histograms (see dlock_core::layer::Metered)
///     .connect()
///     .await?;
/// let lease = locks.acquire("reports/daily", locks.options()).await?;
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LocksBuilder {
    url: String,
    layers: Layers,
}

impl LocksBuilder {
    /// Traces every call in a span ([`Traced`]); also `tracing=true` in the URL.
    pub fn with_tracing(mut self) -> Self {
        self.layers.tracing = true;
        self
    }

    /// Records metrics of every call on the `metrics` facade ([`Metered`]), labelled by
    /// backend; also `metrics=true` in the URL. The application installs the exporter.
    pub fn with_metrics(mut self) -> Self {
        self.layers.metrics = true;
        self
    }

    /// As [`with_metrics`](Self::with_metrics), with each lock's name as a `key` label too
    /// (`metrics_keys=true` in the URL): only for a bounded set of lock names, since every name
    /// becomes a time series.
    pub fn with_metrics_per_key(mut self) -> Self {
        self.layers.metrics = true;
        self.layers.metrics_keys = true;
        self
    }

    /// Connects as [`connect`](crate::connect) does, with the layers.
    ///
    /// # Cancel safety
    /// Cancel safe: a connection opened by a cancelled call is closed when dropped.
    pub async fn connect(self) -> Result<Locks> {
        crate::connect::connect_with(&self.url, self.layers).await
    }
}

impl fmt::Debug for LocksBuilder {
    /// The URL without its password, and the layers.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocksBuilder")
            .field("url", &redact_password(&self.url))
            .field("layers", &self.layers)
            .finish()
    }
}
