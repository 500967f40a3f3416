//! Configuration of an etcd lock client, validated before anything is sent.

use std::fmt;
use std::time::Duration;

use etcd_client::{Certificate, Identity, TlsOptions};

use dlock_core::backend::check_within;
use dlock_core::backend::tls::TlsFiles;
use dlock_core::backend::url::redact_password;
use dlock_core::{Error, Owner, Result};

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

/// The loaded TLS configuration, whose `Debug` names the files but never shows the key.
#[derive(Clone)]
pub(crate) struct TlsConfig {
    files: TlsFiles,
    pub(crate) options: TlsOptions,
}

impl TlsConfig {
    /// Reads the files (errors name the setting and the path, never the contents) into
    /// etcd-client's options. `ca` is required: this build has no default trust store.
    fn load(files: &TlsFiles) -> Result<TlsConfig> {
        let pem = files.load()?;
        let ca = pem.ca.ok_or_else(|| {
            Error::invalid(
                "ca",
                "TLS needs the authority to verify the server against (with_tls, or ca=PATH)",
            )
        })?;
        let mut options = TlsOptions::new().ca_certificate(Certificate::from_pem(ca));
        if let Some((cert, key)) = pem.identity {
            options = options.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = pem.server_name {
            options = options.domain_name(name);
        }
        Ok(TlsConfig {
            files: files.clone(),
            options,
        })
    }

    /// Whether a client certificate is presented.
    pub(crate) fn has_client_cert(&self) -> bool {
        self.files.cert.is_some()
    }
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("ca", &self.files.ca)
            .field("cert", &self.files.cert)
            .field("key", &self.files.key)
            .field("tls_server_name", &self.files.server_name)
            .finish()
    }
}

/// Builds an [`EtcdLock`]: endpoints, namespace, session TTL, timeouts, credentials, TLS.
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
/// Over TLS, with a client certificate and a user (the endpoints are dialled as `https://`):
///
/// ```no_run
/// # async fn demo() -> dlock_core::Result<()> {
/// use dlock_core::backend::tls::TlsFiles;
/// use dlock_etcd::EtcdLock;
///
/// let locks = EtcdLock::builder()
///     .with_endpoints(["etcd-1.internal:2379", "etcd-2.internal:2379", "etcd-3.internal:2379"])
///     .with_tls(
///         TlsFiles::new("/etc/dlock/etcd-ca.pem")
///             .with_client_cert("/etc/dlock/client.pem", "/etc/dlock/client-key.pem"),
///     )
///     .with_credentials("billing", "s3cret")
///     .connect()
///     .await?;
/// # drop(locks); Ok(()) }
/// ```
///
/// `Debug` shows every setting but the password, which it holds as a `Secret` that hides it;
/// of the TLS files it shows the paths only.
#[derive(Clone, Debug)]
pub struct EtcdLockBuilder {
    endpoints: Vec<String>,
    namespace: String,
    session_ttl: Duration,
    request_timeout: Duration,
    connect_timeout: Duration,
    credentials: Option<(String, Secret)>,
    /// Paths only; TLS is on when any is set (and then needs `ca`).
    tls: TlsFiles,
    /// The application label of the owner records, checked by `validate`.
    label: Option<String>,
}

dlock_core::backend::setters! {
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
            tls: TlsFiles::default(),
            label: None,
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
    pub(crate) tls: Option<TlsConfig>,
    /// Who takes the locks: written as the owner record of every contender key.
    pub(crate) owner: Owner,
}

impl EtcdLockBuilder {
    /// A builder with no endpoints and the defaults.
    pub fn new() -> Self {
        EtcdLockBuilder::default()
    }

    /// Parses a connection string `etcd://[user[:password]@]host:port[,host:port…][/prefix]`
    /// with optional `?prefix=…&session_timeout=…&request_timeout=…&connect_timeout=…&owner=…`
    /// (durations such as `10s` or `1500ms`; `owner` as [`with_owner`](Self::with_owner)), or
    /// over TLS
    /// `etcd+https://…?ca=PATH[&cert=PATH&key=PATH][&tls_server_name=NAME]` (see
    /// [`with_tls`](Self::with_tls)). A malformed string is an [`Error::InvalidInput`] for field
    /// `url` that never repeats the password.
    pub fn from_url(url: &str) -> Result<Self> {
        <Self as dlock_core::backend::url::FromUrl>::from_url(url)
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

    /// Connects over TLS with `files` ([`TlsFiles`]): the server's certificate is verified
    /// against the authority `ca` (required; etcd's `--trusted-ca-file` side of the client), for
    /// the name `server_name` if given instead of the endpoint's host; a client certificate and
    /// key are presented to servers that require one (`--client-cert-auth`). With auth enabled and
    /// no [`with_credentials`](Self::with_credentials), etcd takes the certificate's common name
    /// as the user. Endpoints are then dialled as `https://`; a `http://` endpoint is refused. The
    /// files are read when the builder is validated: a missing or non-PEM file is an
    /// [`Error::InvalidInput`] for the setting at fault naming the path.
    pub fn with_tls(mut self, files: TlsFiles) -> Self {
        self.tls = files;
        self
    }

    /// Records `label` as the application label in the owner record of every lock this client
    /// takes (the value of its contender key; see the crate docs), so that an operator can tell
    /// services apart on a shared host. 1 to
    /// [`MAX_LABEL_LEN`](dlock_core::limits::MAX_LABEL_LEN) bytes without control characters; a bad
    /// label fails [`connect`](Self::connect) as an [`Error::InvalidInput`] for `owner` before
    /// anything is sent.
    pub fn with_owner(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// The TLS files, if TLS is on; a certificate or server name without the CA is refused.
    fn tls_files(&self) -> Result<Option<&TlsFiles>> {
        let tls = &self.tls;
        match (&tls.ca, &tls.cert, &tls.key, &tls.server_name) {
            (None, None, None, None) => Ok(None),
            (None, Some(_), _, _) | (None, _, Some(_), _) => Err(Error::invalid(
                "cert",
                "a client certificate needs TLS: set the server's CA with with_tls (ca=PATH)",
            )),
            (None, None, None, Some(_)) => Err(Error::invalid(
                "tls_server_name",
                "a TLS server name needs TLS: set the server's CA with with_tls (ca=PATH)",
            )),
            (Some(ca), ..) if ca.as_os_str().is_empty() => {
                Err(Error::invalid("ca", "the CA file's path is empty"))
            }
            (Some(_), ..) => Ok(Some(tls)),
        }
    }

    /// Checks every setting, naming the first one at fault.
    pub(crate) fn validate(&self) -> Result<Settings> {
        if self.endpoints.is_empty() {
            return Err(Error::invalid(
                "endpoints",
                "at least one endpoint is needed",
            ));
        }
        let tls_files = self.tls_files()?;
        let endpoints = self
            .endpoints
            .iter()
            .map(|e| normalize_endpoint(e, tls_files.is_some()))
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
        let owner = Owner::labelled(self.label.clone())?;
        // Read last: every cheaper check comes first.
        let tls = tls_files.map(TlsConfig::load).transpose()?;
        Ok(Settings {
            endpoints,
            layout,
            session_ttl: self.session_ttl,
            request_timeout: self.request_timeout,
            connect_timeout: self.connect_timeout,
            credentials: self.credentials.clone(),
            tls,
            owner,
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

/// Checks `host:port`, `http://host:port` or (with TLS) `https://host:port` and returns the form
/// with the scheme: `https://` with TLS, `http://` without.
fn normalize_endpoint(endpoint: &str, tls: bool) -> Result<String> {
    let (scheme, expected) = if tls {
        ("https", "host:port or https://host:port")
    } else {
        ("http", "host:port or http://host:port")
    };
    let bad = |why: &str| {
        Error::invalid(
            "endpoints",
            format!(
                "{:?} {why} (expected {expected})",
                redact_password(endpoint)
            ),
        )
    };
    let address = match (
        endpoint.strip_prefix("https://"),
        endpoint.strip_prefix("http://"),
    ) {
        (Some(_), _) if !tls => {
            return Err(bad("uses https: set the server's CA with with_tls"));
        }
        (_, Some(_)) if tls => {
            return Err(bad("uses plaintext http while TLS is set"));
        }
        (Some(address), _) | (_, Some(address)) => address,
        (None, None) => endpoint,
    };
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
        Ok(p) if p > 0 => Ok(format!("{scheme}://{host}:{p}")),
        _ => Err(bad("has no valid port")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::path::PathBuf;

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

    /// A directory of its own with `files` written into it, removed on drop.
    struct Files(PathBuf);

    impl Files {
        fn new(files: &[(&str, &str)]) -> Files {
            let dir = std::env::temp_dir().join(format!(
                "dlock-etcd-builder-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            for (name, text) in files {
                std::fs::write(dir.join(name), text).unwrap();
            }
            Files(dir)
        }

        fn path(&self, name: &str) -> PathBuf {
            self.0.join(name)
        }
    }

    impl Drop for Files {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    const KEY: &str =
        "-----BEGIN PRIVATE KEY-----\nsecret-key-material\n-----END PRIVATE KEY-----\n";

    #[test]
    fn tls_dials_https_and_names_the_file_at_fault() {
        let files = Files::new(&[
            ("ca.pem", CERT),
            ("client.pem", CERT),
            ("client-key.pem", KEY),
            ("garbage.pem", "secret-key-material, not PEM"),
        ]);
        let tls = EtcdLockBuilder::new()
            .with_endpoints(["h1:2379", "https://h2:2379"])
            .with_tls(
                TlsFiles::new(files.path("ca.pem"))
                    .with_client_cert(files.path("client.pem"), files.path("client-key.pem"))
                    .with_server_name("etcd.internal"),
            );
        let good = TlsFiles::new(files.path("ca.pem"))
            .with_client_cert(files.path("client.pem"), files.path("client-key.pem"));
        let settings = tls.validate().unwrap();
        assert_eq!(settings.endpoints, ["https://h1:2379", "https://h2:2379"]);
        let shown = format!("{tls:?} {settings:?}");
        assert!(shown.contains("client-key.pem"), "{shown}");
        assert!(!shown.contains("secret-key-material"), "{shown}");

        let fails = |builder: EtcdLockBuilder, field: &str, path: &str| match builder.validate() {
            Err(Error::InvalidInput { field: f, message }) => {
                assert_eq!(f, field, "{message}");
                assert!(message.contains(path), "{message}");
                assert!(!message.contains("secret-key-material"), "{message}");
            }
            other => panic!("{other:?}"),
        };
        fails(
            tls.clone().with_tls(TlsFiles {
                ca: Some(files.path("missing.pem")),
                ..good.clone()
            }),
            "ca",
            "missing.pem",
        );
        fails(
            tls.clone().with_tls(TlsFiles {
                ca: Some(files.path("garbage.pem")),
                ..good.clone()
            }),
            "ca",
            "garbage.pem",
        );
        fails(
            tls.clone().with_tls(
                good.clone()
                    .with_client_cert(files.path("client.pem"), files.path("garbage.pem")),
            ),
            "key",
            "garbage.pem",
        );
        fails(
            tls.clone().with_tls(
                good.clone()
                    .with_client_cert(files.path("client-key.pem"), files.path("client-key.pem")),
            ),
            "cert",
            "client-key.pem",
        );
        fails(
            tls.clone().with_endpoint("http://h3:2379"),
            "endpoints",
            "h3",
        );
        fails(
            tls.clone().with_tls(good.clone().with_server_name("a b")),
            "tls_server_name",
            "a b",
        );
        let plain = EtcdLockBuilder::new().with_endpoint("h:2379");
        assert_eq!(
            field_of(plain.clone().with_tls(TlsFiles {
                ca: None,
                ..TlsFiles::default().with_client_cert("c.pem", "k.pem")
            })),
            "cert"
        );
        assert_eq!(
            field_of(
                plain
                    .clone()
                    .with_tls(TlsFiles::default().with_server_name("etcd"))
            ),
            "tls_server_name"
        );
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
