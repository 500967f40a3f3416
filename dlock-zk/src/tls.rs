//! ZooKeeper over TLS: which files the client trusts and presents, read and checked before
//! anything is sent.
//!
//! The connection itself is zookeeper-client's (`tls` feature, rustls). dlock reads the PEM
//! files once, when the handle is built, so that a missing or malformed file is an
//! [`Error::InvalidInput`] naming the setting and the path, never a connection attempt that
//! times out. A file's contents never appear in an error or a `Debug` output: only its path.

use std::fmt;
#[cfg(feature = "tls")]
use std::path::Path;
use std::path::PathBuf;
#[cfg(feature = "tls")]
use std::time::Duration;

use dlock_core::backend::tls::TlsFiles;
use dlock_core::{Error, Result};

use crate::url::Server;

/// The checked TLS settings of a [`ZkLock`](crate::ZkLock), made from the [`TlsFiles`] given to
/// [`ZkLockBuilder::with_tls`](crate::ZkLockBuilder::with_tls): the certificate authority that
/// signed the servers' certificates and, for servers that require client certificates
/// (`ssl.clientAuth=need`), the client's certificate and private key. Every server of the
/// connection string is then reached over TLS (ZooKeeper's `secureClientPort`, 2281 by
/// convention) and checked against the authority and its host name as written.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ZkTls {
    ca: PathBuf,
    client: Option<(PathBuf, PathBuf)>,
}

/// Paths only: a key path may be shown, never what the file holds.
impl fmt::Debug for ZkTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("ZkTls");
        s.field("ca", &self.ca);
        if let Some((cert, key)) = &self.client {
            s.field("cert", cert).field("key", key);
        }
        s.finish()
    }
}

impl ZkTls {
    /// Checks what ZooKeeper's client can do with `files`: an authority is required, a client
    /// certificate comes with its key, and a server-name override is refused (the client library
    /// checks the host name as written).
    pub(crate) fn from_files(files: &TlsFiles) -> Result<ZkTls> {
        if files.server_name.is_some() {
            return Err(Error::invalid(
                "tls_server_name",
                "is not supported for ZooKeeper (the host name as written is the name verified)",
            ));
        }
        let Some(ca) = files.ca.clone() else {
            return Err(Error::invalid(
                "ca",
                "TLS needs the authority the servers' certificates are checked against",
            ));
        };
        let client = match (&files.cert, &files.key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (Some(_), None) => {
                return Err(Error::invalid("key", "a client certificate needs its key"))
            }
            (None, Some(_)) => {
                return Err(Error::invalid("cert", "a client key needs its certificate"))
            }
        };
        Ok(ZkTls { ca, client })
    }

    /// Reads and checks the files, and that every server's host can be checked against a
    /// certificate: the options the client library connects with.
    #[cfg(feature = "tls")]
    pub(crate) fn load(&self, servers: &[Server]) -> Result<Loaded> {
        use rustls::pki_types::ServerName;

        for server in servers {
            // The client library would panic on a name rustls cannot check.
            if ServerName::try_from(server.host.as_str()).is_err() {
                return Err(Error::invalid(
                    "url",
                    format!(
                        "host {:?} is not a name a TLS certificate can be checked against",
                        server.host
                    ),
                ));
            }
        }
        // dlock-core reads and checks the files; the client library wants their text.
        let pem = TlsFiles {
            ca: Some(self.ca.clone()),
            cert: self.client.as_ref().map(|(cert, _)| cert.clone()),
            key: self.client.as_ref().map(|(_, key)| key.clone()),
            server_name: None,
        }
        .load()?;
        let ca_pem = pem_text("ca", &self.ca, pem.ca.as_deref().unwrap_or_default())?;
        let store = pem
            .root_store()?
            .ok_or_else(|| not_pem("ca", &self.ca, "certificates"))?;
        let mut options = zookeeper_client::TlsOptions::new()
            .with_pem_ca(ca_pem)
            .map_err(|_| not_pem("ca", &self.ca, "certificates"))?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|_| Error::invalid("tls", "the ring provider offers no TLS version"))?
            .with_root_certificates(store);
        // The identity checked as rustls takes it (a key that does not match its certificate is
        // named here); the client library takes its text.
        let config = pem.client_config(builder)?;
        if let (Some((cert_path, key_path)), Some((cert, key))) = (&self.client, &pem.identity) {
            let cert_pem = pem_text("cert", cert_path, cert)?;
            let key_pem = pem_text("key", key_path, key)?;
            options = options
                .with_pem_identity(cert_pem, key_pem)
                .map_err(|_| not_pem("key", key_path, "private key"))?;
        }
        Ok(Loaded {
            settings: self.clone(),
            options,
            check: std::sync::Arc::new(config),
        })
    }
}

/// Checked TLS settings, ready for the client library.
#[cfg(feature = "tls")]
#[derive(Clone)]
pub(crate) struct Loaded {
    settings: ZkTls,
    pub(crate) options: zookeeper_client::TlsOptions,
    /// The same settings for a handshake of dlock's own, to tell why no session came up.
    check: std::sync::Arc<rustls::ClientConfig>,
}

#[cfg(feature = "tls")]
impl Loaded {
    /// Why no session came up, if TLS is the reason: a handshake with each server in turn (each
    /// bounded by `timeout`), and the first failure in words, such as `the TLS handshake with
    /// zk1:2281 failed: invalid peer certificate: UnknownIssuer`. `None` if no server could be
    /// reached at all or a handshake succeeded.
    pub(crate) async fn diagnose(&self, servers: &[Server], timeout: Duration) -> Option<String> {
        let config = self.check.clone();
        let servers = servers.to_vec();
        let task = tokio::task::spawn_blocking(move || {
            servers
                .iter()
                .find_map(|server| handshake(&config, server, timeout).err())
        });
        task.await.ok().flatten()
    }
}

/// One blocking TLS handshake with `server`; `Ok` also when the server cannot be reached.
#[cfg(feature = "tls")]
fn handshake(
    config: &std::sync::Arc<rustls::ClientConfig>,
    server: &Server,
    timeout: Duration,
) -> std::result::Result<(), String> {
    use std::io::ErrorKind;
    use std::net::{TcpStream, ToSocketAddrs};

    let Some(addr) = (server.host.as_str(), server.port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
    else {
        return Ok(());
    };
    let Ok(mut socket) = TcpStream::connect_timeout(&addr, timeout) else {
        return Ok(());
    };
    let _ = socket.set_read_timeout(Some(timeout));
    let _ = socket.set_write_timeout(Some(timeout));
    let Ok(name) = rustls::pki_types::ServerName::try_from(server.host.clone()) else {
        return Ok(());
    };
    let failed = |e: &dyn fmt::Display| {
        format!(
            "the TLS handshake with {}:{} failed: {e}",
            server.host, server.port
        )
    };
    let mut connection =
        rustls::ClientConnection::new(config.clone(), name).map_err(|e| failed(&e))?;
    while connection.is_handshaking() {
        match connection.complete_io(&mut socket) {
            Ok(_) => {}
            // Silence is a network problem (or a frozen server), not a TLS one.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Ok(());
            }
            // A server that does not speak TLS closes the connection on the handshake.
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
                ) =>
            {
                return Err(failed(
                    &"the server closed the connection (is it a TLS port, `secureClientPort`?)",
                ));
            }
            Err(e) => return Err(failed(&e)),
        }
    }
    Ok(())
}

#[cfg(feature = "tls")]
impl fmt::Debug for Loaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.settings, f)
    }
}

/// TLS settings without the `tls` feature: never built, since [`ZkTls`] cannot be loaded.
#[cfg(not(feature = "tls"))]
#[derive(Debug, Clone)]
pub(crate) enum Loaded {}

#[cfg(not(feature = "tls"))]
impl ZkTls {
    pub(crate) fn load(&self, _: &[Server]) -> Result<Loaded> {
        Err(Error::invalid(
            "tls",
            "ZooKeeper over TLS needs the `tls` feature of dlock-zk",
        ))
    }
}

/// A loaded file's text; an error names the setting and the path.
#[cfg(feature = "tls")]
fn pem_text<'a>(field: &'static str, path: &Path, bytes: &'a [u8]) -> Result<&'a str> {
    std::str::from_utf8(bytes).map_err(|_| not_pem(field, path, "PEM text"))
}

#[cfg(feature = "tls")]
fn not_pem(field: &'static str, path: &Path, what: &str) -> Error {
    Error::invalid(
        field,
        format!("{}: holds no PEM {what} that can be used", path.display()),
    )
}
