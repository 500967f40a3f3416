//! Building a [`ZkLock`]: the connection string and the few timeouts that matter, validated
//! before anything is sent.

use std::fmt;
use std::time::Duration;

use dlock_core::backend::check_within;
use dlock_core::{Error, Owner, Result};

use crate::acl::NodeAcl;
use crate::naming::Naming;
use crate::url::{check_path, ConnectString};
use dlock_core::backend::tls::TlsFiles;

use crate::tls::{Loaded, ZkTls};
use crate::ZkLock;

/// The environment variable [`ZkLockBuilder::from_env`] reads the connection string from.
pub const URL_ENV: &str = "DLOCK_ZK_URL";

/// The session timeout asked for unless set: 10 s (kazoo's default). The server clamps it to
/// between 2 and 20 of its ticks (4 s to 40 s with the default `tickTime` of 2 s).
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// The base path unless set: every lock key is a child of it (under the chroot, if any).
pub const DEFAULT_ROOT: &str = "/dlock";

/// The shortest session timeout (or connect or operation timeout) accepted.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(100);

/// The longest session timeout (or connect or operation timeout) accepted.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// Validated settings of one backend.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) connect: ConnectString,
    /// Chroot plus root: the parent of every lock key's node.
    pub(crate) base: String,
    pub(crate) session_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) operation_timeout: Duration,
    /// Who takes locks through this client: every contender node's data is a fresh record of it.
    pub(crate) owner: Owner,
    pub(crate) naming: Naming,
    /// The ACL of every node the backend creates (see the `acl` module).
    pub(crate) acl: NodeAcl,
    /// TLS to every server, if set.
    pub(crate) tls: Option<Loaded>,
}

/// Builds a [`ZkLock`]; see [`ZkLock::builder`].
///
/// ```no_run
/// # async fn demo() -> dlock_core::Result<()> {
/// use std::time::Duration;
/// use dlock_zk::ZkLock;
///
/// let locks = ZkLock::builder("zk://zk1:2181,zk2:2181,zk3:2181/billing")
///     .with_session_timeout(Duration::from_secs(15))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
pub struct ZkLockBuilder {
    url: Result<ConnectString>,
    session_timeout: Duration,
    connect_timeout: Option<Duration>,
    operation_timeout: Option<Duration>,
    root: String,
    label: Option<String>,
    naming: Naming,
    tls: Option<TlsFiles>,
}

impl fmt::Debug for ZkLockBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("ZkLockBuilder");
        match &self.url {
            Ok(url) => s.field("url", url),
            Err(_) => s.field("url", &"<invalid>"),
        };
        s.field("session_timeout", &self.session_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.operation_timeout)
            .field("prefix", &self.root)
            .field("owner", &self.label)
            .field("naming", &self.naming)
            .field("tls", &self.tls)
            .finish()
    }
}

dlock_core::backend::setters! {
    ZkLockBuilder {
        /// The session timeout to ask the server for (default 10 s).
        ///
        /// It is the server-side bound of every lock this client holds: if the process dies or is
        /// cut off, the server ends the session this long after it last heard from it, and the
        /// lock nodes vanish. It also bounds how long a disconnected holder's lease stays
        /// [uncertain](dlock_core::LeaseState::Uncertain) before it counts as lost. The server
        /// clamps it to between 2 and 20 ticks; the negotiated value is the one used.
        with_session_timeout(timeout: Duration) => session_timeout = timeout;
        /// How long opening a session, or waiting for a lost connection to come back, may take
        /// before the call fails with [`Error::Unavailable`] (default: the session timeout). A
        /// waiting acquire whose connection stays down this long fails too, rather than waiting
        /// on.
        with_connect_timeout(timeout: Duration) => connect_timeout = Some(timeout);
        /// How long one call waits for a connection and an answer before it fails with
        /// [`Error::Unavailable`] (default: the session timeout, after which a disconnected
        /// session has expired anyway).
        with_request_timeout(timeout: Duration) => operation_timeout = Some(timeout);
        /// The node under which lock keys live (default `/dlock`), below the chroot if the URL has
        /// one. Created on first use.
        with_prefix(root: impl Into<String>) => root = root.into();
        /// The application label of the [owner record](dlock_core::OwnerRecord) this client
        /// writes as the data of every lock node it creates (1 to
        /// [`MAX_LABEL_LEN`](dlock_core::limits::MAX_LABEL_LEN) printable bytes; checked by
        /// [`connect`](Self::connect)), so that operators — `dlock status`, `zkCli get`, kazoo's
        /// `Lock.contenders()` — can tell services apart on a shared host. Without it the
        /// record still names the host and process id.
        with_owner(label: impl Into<String>) => label = Some(label.into());
        /// The earlier name of [`with_owner`](Self::with_owner) (and `identifier=` of `owner=`),
        /// kept so that existing code and URLs work: the identifier is now the owner record's
        /// label, not the whole node data. kazoo's `Lock.contenders()` shows the record's JSON
        /// line, which contains it.
        with_identifier(identifier: impl Into<String>) => label = Some(identifier.into());
        /// How dlock names its own lock nodes (default [`Naming::Kazoo`]), which decides whether
        /// kazoo's `Lock` or Curator's `InterProcessMutex` on the same path waits behind a dlock
        /// holder. dlock waits behind both under either naming; see [`Naming`].
        with_naming(naming: Naming) => naming = naming;
        /// Connects to every server over TLS ([`TlsFiles`]: the certificate authority, and a client
        /// certificate for servers that require one). Needs the `tls` feature; the files are read
        /// and checked by [`connect`](Self::connect), once.
        with_tls(tls: TlsFiles) => tls = Some(tls);
    }
}

impl ZkLockBuilder {
    /// A builder for the ensemble at `url` (`zk://host:port[,host:port…][/chroot]`; see
    /// [`ConnectString::parse`]). A malformed URL is reported by [`connect`](Self::connect).
    pub fn new(url: &str) -> Self {
        ZkLockBuilder {
            url: ConnectString::parse(url),
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            connect_timeout: None,
            operation_timeout: None,
            root: DEFAULT_ROOT.to_owned(),
            label: None,
            naming: Naming::default(),
            tls: None,
        }
    }

    /// A builder for an ensemble already parsed from a URL.
    pub(crate) fn for_ensemble(ensemble: ConnectString) -> Self {
        ZkLockBuilder {
            url: Ok(ensemble),
            ..ZkLockBuilder::new("zk://localhost")
        }
    }

    /// A builder for the connection string `url` with `?parameters` (see the table in `docs/urls.md`),
    /// checked before anything is sent.
    pub fn from_url(url: &str) -> Result<Self> {
        <Self as dlock_core::backend::url::FromUrl>::from_url(url)
    }

    /// A builder for the URL in the environment variable [`URL_ENV`] (`DLOCK_ZK_URL`).
    pub fn from_env() -> Self {
        match std::env::var(URL_ENV) {
            Ok(url) => ZkLockBuilder::new(&url),
            Err(_) => ZkLockBuilder {
                url: Err(Error::invalid(
                    "url",
                    format!("the environment variable {URL_ENV} is not set"),
                )),
                ..ZkLockBuilder::new("zk://localhost")
            },
        }
    }

    /// Checks every setting (an [`Error::InvalidInput`] names the first one at fault) without
    /// connecting.
    pub(crate) fn config(self) -> Result<Config> {
        let connect = self.url?;
        check_timeout("session_timeout", self.session_timeout)?;
        let connect_timeout = self.connect_timeout.unwrap_or(self.session_timeout);
        check_timeout("connect_timeout", connect_timeout)?;
        let operation_timeout = self.operation_timeout.unwrap_or(self.session_timeout);
        check_timeout("request_timeout", operation_timeout)?;
        check_path(&self.root, "prefix")?;
        if self.root == "/" || self.root == "/zookeeper" || self.root.starts_with("/zookeeper/") {
            return Err(Error::invalid(
                "prefix",
                format!(
                    "{:?} is reserved; use a node of its own such as {DEFAULT_ROOT:?}",
                    self.root
                ),
            ));
        }
        let owner = Owner::labelled(self.label)?;
        let base = format!("{}{}", connect.chroot(), self.root);
        let tls = match &self.tls {
            Some(files) => Some(ZkTls::from_files(files)?.load(connect.servers())?),
            None => None,
        };
        let acl = NodeAcl::for_credentials(connect.credentials());
        Ok(Config {
            connect,
            base,
            session_timeout: self.session_timeout,
            connect_timeout,
            operation_timeout,
            owner,
            naming: self.naming,
            acl,
            tls,
        })
    }

    /// Validates the settings and opens the first session.
    ///
    /// Fails with [`Error::InvalidInput`] (naming the field) on bad settings, before any
    /// connection is attempted, and with [`Error::Unavailable`] if no server accepts a session
    /// within the connect timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: a session opened by a cancelled connect is closed when dropped.
    pub async fn connect(self) -> Result<ZkLock> {
        ZkLock::start(self.config()?).await
    }
}

fn check_timeout(field: &'static str, timeout: Duration) -> Result<()> {
    check_within(field, timeout, MIN_TIMEOUT..=MAX_TIMEOUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(builder: ZkLockBuilder) -> &'static str {
        match builder.config() {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    #[test]
    fn defaults_and_base_path() {
        let config = ZkLockBuilder::new("zk://a:1,b:2/app").config().unwrap();
        assert_eq!(config.base, "/app/dlock");
        assert_eq!(config.session_timeout, DEFAULT_SESSION_TIMEOUT);
        assert_eq!(config.operation_timeout, DEFAULT_SESSION_TIMEOUT);
        let config = ZkLockBuilder::new("a:1")
            .with_prefix("/locks/prod")
            .config()
            .unwrap();
        assert_eq!(config.base, "/locks/prod");
    }

    #[test]
    fn every_bad_setting_is_named() {
        assert_eq!(field_of(ZkLockBuilder::new("http://x")), "url");
        let ok = || ZkLockBuilder::new("zk://a:1");
        assert_eq!(
            field_of(ok().with_session_timeout(Duration::ZERO)),
            "session_timeout"
        );
        assert_eq!(
            field_of(ok().with_session_timeout(Duration::MAX)),
            "session_timeout"
        );
        assert_eq!(
            field_of(ok().with_connect_timeout(Duration::from_millis(1))),
            "connect_timeout"
        );
        assert_eq!(
            field_of(ok().with_request_timeout(Duration::from_secs(7200))),
            "request_timeout"
        );
        assert_eq!(field_of(ok().with_prefix("dlock")), "prefix");
        assert_eq!(field_of(ok().with_prefix("/")), "prefix");
        assert_eq!(field_of(ok().with_prefix("/zookeeper/x")), "prefix");
        assert_eq!(field_of(ok().with_prefix("/a//b")), "prefix");
        assert_eq!(field_of(ok().with_owner("x".repeat(200))), "owner");
        assert_eq!(field_of(ok().with_owner("a\nb")), "owner");
        assert_eq!(field_of(ok().with_identifier("")), "owner");
    }

    #[test]
    fn the_label_goes_into_the_owner_record() {
        let config = ZkLockBuilder::new("zk://a:1").config().unwrap();
        assert_eq!(config.owner.label(), None);
        let config = ZkLockBuilder::new("zk://a:1")
            .with_owner("billing")
            .config()
            .unwrap();
        assert_eq!(config.owner.record().label.as_deref(), Some("billing"));
        assert_eq!(config.owner.record().pid, std::process::id());
    }

    #[test]
    fn tls_files_are_checked_before_connecting_and_named_by_path() {
        let b = ZkLockBuilder::new("zk://bob:topsecret@a:2281")
            .with_tls(TlsFiles::new("/nonexistent/ca.pem").with_client_cert("/c.pem", "/k.pem"));
        let shown = format!("{b:?}");
        assert!(
            shown.contains("/k.pem") && !shown.contains("topsecret"),
            "{shown}"
        );
        match b.config() {
            Err(Error::InvalidInput { field, message }) => {
                let expected = if cfg!(feature = "tls") { "ca" } else { "tls" };
                assert_eq!(field, expected, "{message}");
                assert!(!message.contains("topsecret"), "{message}");
            }
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    #[test]
    fn debug_hides_the_password() {
        let b = ZkLockBuilder::new("zk://bob:topsecret@a:1/x");
        let shown = format!("{b:?}");
        assert!(!shown.contains("topsecret"), "{shown}");
    }
}
