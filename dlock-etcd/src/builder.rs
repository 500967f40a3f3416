//! Configuration of an etcd lock client, validated before anything is sent.

use std::fmt;
use std::time::Duration;

use dlock_core::url::redact_password;
use dlock_core::{check_within, Error, Result};

use crate::client::EtcdLock;
use crate::layout::{KeyLayout, DEFAULT_NAMESPACE};

/// The session lease's TTL when none is set: how long the locks of a client that died or was cut
/// off stay held. etcd's Go session uses 60 s; a shorter default frees the locks of a crashed
/// process sooner, at the price of a keep-alive every few seconds.
pub const DEFAULT_SESSION_TTL: Duration = Duration::from_secs(10);
/// The shortest session TTL accepted. etcd raises shorter leases to its own minimum (about 1.5 ×
/// its election timeout, 2 s with the defaults); the client uses the TTL the server grants.
pub const MIN_SESSION_TTL: Duration = Duration::from_secs(1);
/// The longest session TTL accepted (one hour): a crashed client must not block locks for longer.
pub const MAX_SESSION_TTL: Duration = Duration::from_secs(3600);
/// How long one request may wait for an answer when none is set.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting (and granting the first session) may take when none is set.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest request or connect timeout accepted.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(120);

/// A password that never shows in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(String);

impl Secret {
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Builds an [`EtcdLock`]: endpoints, namespace, session TTL, timeouts, credentials.
///
/// ```no_run
/// # async fn demo() -> dlock_core::Result<()> {
/// use std::time::Duration;
/// use dlock_etcd::EtcdLock;
///
/// let locks = EtcdLock::builder()
///     .with_endpoints(["http://10.0.0.1:2379", "http://10.0.0.2:2379", "http://10.0.0.3:2379"])
///     .with_prefix("billing/locks/")
///     .with_session_timeout(Duration::from_secs(15))
///     .connect()
///     .await?;
/// # drop(locks); Ok(()) }
/// ```
///
/// `Debug` shows every setting but the password, which it holds as a `Secret` that hides it.
#[derive(Clone, Debug)]
pub struct EtcdLockBuilder {
    endpoints: Vec<String>,
    namespace: String,
    session_ttl: Duration,
    request_timeout: Duration,
    connect_timeout: Duration,
    credentials: Option<(String, Secret)>,
}

dlock_core::setters! {
    EtcdLockBuilder {
        /// Sets the namespace every lock name starts with (default `dlock/`); see
        /// [`KeyLayout`](crate::KeyLayout).
        with_prefix(namespace: impl Into<String>) => namespace = namespace.into();
        /// Sets the TTL of the client's session lease (whole seconds, rounded up). It bounds how
        /// long a client that dies or is cut off keeps its locks; a live client keeps the lease
        /// alive.
        with_session_timeout(ttl: Duration) => session_ttl = ttl;
        /// Sets how long one request may wait for an answer before it fails as unavailable.
        with_request_timeout(timeout: Duration) => request_timeout = timeout;
        /// Sets how long [`connect`](Self::connect) may take in total.
        with_connect_timeout(timeout: Duration) => connect_timeout = timeout;
    }
}

impl Default for EtcdLockBuilder {
    fn default() -> Self {
        EtcdLockBuilder {
            endpoints: Vec::new(),
            namespace: DEFAULT_NAMESPACE.to_owned(),
            session_ttl: DEFAULT_SESSION_TTL,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            credentials: None,
        }
    }
}

/// Validated settings.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) endpoints: Vec<String>,
    pub(crate) layout: KeyLayout,
    pub(crate) session_ttl: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) credentials: Option<(String, Secret)>,
}

impl EtcdLockBuilder {
    /// A builder with no endpoints and the defaults.
    pub fn new() -> Self {
        EtcdLockBuilder::default()
    }

    /// Parses a connection string `etcd://[user[:password]@]host:port[,host:port…][/prefix]`
    /// with optional `?prefix=…&session_timeout=…&request_timeout=…&connect_timeout=…`
    /// (durations such as `10s` or `1500ms`). A malformed string is an [`Error::InvalidInput`]
    /// for field `url` that never repeats the password.
    pub fn from_url(url: &str) -> Result<Self> {
        <Self as dlock_core::url::FromUrl>::from_url(url)
    }

    /// Adds an endpoint: `host:port` or `http://host:port`. The client spreads requests over all
    /// endpoints and moves to another when one fails.
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoints.push(endpoint.into());
        self
    }

    /// Adds endpoints.
    pub fn with_endpoints<I, S>(mut self, endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.endpoints.extend(endpoints.into_iter().map(Into::into));
        self
    }

    /// Authenticates as `user` (etcd's user/password authentication).
    pub fn with_credentials(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.credentials = Some((user.into(), Secret(password.into())));
        self
    }

    /// Checks every setting, naming the first one at fault.
    pub(crate) fn validate(&self) -> Result<Settings> {
        if self.endpoints.is_empty() {
            return Err(Error::invalid(
                "endpoints",
                "at least one endpoint is needed",
            ));
        }
        let endpoints = self
            .endpoints
            .iter()
            .map(|e| normalize_endpoint(e))
            .collect::<Result<Vec<_>>>()?;
        let layout = KeyLayout::new(self.namespace.clone())?;
        check_within(
            "session_timeout",
            self.session_ttl,
            MIN_SESSION_TTL..=MAX_SESSION_TTL,
        )?;
        // Any time above zero, up to the maximum.
        let timeouts = Duration::from_nanos(1)..=MAX_TIMEOUT;
        check_within("request_timeout", self.request_timeout, timeouts.clone())?;
        check_within("connect_timeout", self.connect_timeout, timeouts)?;
        if let Some((user, _)) = &self.credentials {
            if user.is_empty() {
                return Err(Error::invalid("credentials", "the user name is empty"));
            }
        }
        Ok(Settings {
            endpoints,
            layout,
            session_ttl: self.session_ttl,
            request_timeout: self.request_timeout,
            connect_timeout: self.connect_timeout,
            credentials: self.credentials.clone(),
        })
    }

    /// Validates the settings, connects, and grants the client's session lease.
    ///
    /// Fails with [`Error::InvalidInput`] naming the setting at fault before anything is sent,
    /// and with [`Error::Unavailable`] if no endpoint answers within the connect timeout.
    ///
    /// # Cancel safety
    /// If cancelled after the session lease was granted, the lease is not revoked; it expires
    /// after its TTL.
    pub async fn connect(self) -> Result<EtcdLock> {
        let settings = self.validate()?;
        EtcdLock::from_settings(settings).await
    }
}

/// Checks `host:port` or `http://host:port` and returns the `http://` form.
fn normalize_endpoint(endpoint: &str) -> Result<String> {
    let bad = |why: &str| {
        Error::invalid(
            "endpoints",
            format!(
                "{:?} {why} (expected host:port or http://host:port)",
                redact_password(endpoint)
            ),
        )
    };
    if endpoint.starts_with("https://") {
        return Err(bad("uses https, which this build does not support"));
    }
    let address = endpoint.strip_prefix("http://").unwrap_or(endpoint);
    if address.contains('@') {
        return Err(bad("carries credentials; set them with credentials()"));
    }
    if address.contains(['/', '?', '#', ' ']) || address.contains("://") {
        return Err(bad("is not a host and port"));
    }
    let (host, port) = address.rsplit_once(':').ok_or_else(|| bad("has no port"))?;
    let host_ok = if let Some(inner) = host.strip_prefix('[') {
        inner
            .strip_suffix(']')
            .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
    } else {
        !host.is_empty() && !host.contains(':')
    };
    if !host_ok {
        return Err(bad("has no valid host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(format!("http://{host}:{p}")),
        _ => Err(bad("has no valid port")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn field_of(builder: EtcdLockBuilder) -> &'static str {
        match builder.validate() {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn endpoints_are_normalized() {
        let s = EtcdLockBuilder::new()
            .with_endpoints(["127.0.0.1:2379", "http://etcd-1:2379", "[::1]:2379"])
            .validate()
            .unwrap();
        assert_eq!(
            s.endpoints,
            [
                "http://127.0.0.1:2379",
                "http://etcd-1:2379",
                "http://[::1]:2379"
            ]
        );
    }

    #[test]
    fn every_bad_setting_names_its_field() {
        let ok = EtcdLockBuilder::new().with_endpoint("localhost:2379");
        assert_eq!(field_of(EtcdLockBuilder::new()), "endpoints");
        for endpoint in [
            "localhost",
            "localhost:0",
            "localhost:99999",
            "https://localhost:2379",
            "http://localhost:2379/v3",
            "user:pw@localhost:2379",
            ":2379",
            "[::1:2379",
        ] {
            assert_eq!(
                field_of(ok.clone().with_endpoint(endpoint)),
                "endpoints",
                "{endpoint}"
            );
        }
        assert_eq!(
            field_of(ok.clone().with_session_timeout(Duration::ZERO)),
            "session_timeout"
        );
        assert_eq!(
            field_of(ok.clone().with_session_timeout(MAX_SESSION_TTL * 2)),
            "session_timeout"
        );
        assert_eq!(
            field_of(ok.clone().with_request_timeout(Duration::ZERO)),
            "request_timeout"
        );
        assert_eq!(
            field_of(ok.clone().with_connect_timeout(Duration::from_secs(3600))),
            "connect_timeout"
        );
        assert_eq!(field_of(ok.clone().with_prefix("n".repeat(4096))), "prefix");
        assert_eq!(
            field_of(ok.clone().with_credentials("", "pw")),
            "credentials"
        );
        assert!(ok.validate().is_ok());
    }

    #[test]
    fn debug_and_errors_hide_the_password() {
        let b = EtcdLockBuilder::new()
            .with_endpoint("h:2379")
            .with_credentials("app", "hunter2");
        let shown = format!("{b:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("app"),
            "{shown}"
        );
        let err = EtcdLockBuilder::new()
            .with_endpoint("app:hunter2@h:2379")
            .validate()
            .unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
}
