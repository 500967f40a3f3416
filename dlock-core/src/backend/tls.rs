//! TLS settings in one shape for every backend: the files a client needs (the authority it
//! verifies the server against, and optionally its own certificate and key) and a server-name
//! override, read from a connection string's `ca`, `cert`, `key` and `tls_server_name`
//! parameters or set on a builder.
//!
//! Only paths are kept until the client connects; then [`TlsFiles::load`] reads and checks the
//! files. A failure names the setting and the path, never what a file holds (it may be a private
//! key), and no `Debug` output shows the contents either.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::backend::url::ConnectUrl;
use crate::{Error, Result};

/// The URL parameters [`TlsFiles::from_url`] takes.
pub const TLS_PARAMETERS: &[&str] = &["ca", "cert", "key", "tls_server_name"];

/// Paths of a client's TLS files and an optional server name to verify instead of the host's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// The authority (PEM certificates) the server's certificate must chain to; without it, the
    /// backend's default trust applies where it has one.
    pub ca: Option<PathBuf>,
    /// The client's certificate (PEM), for servers that require one; needs [`TlsFiles::key`].
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM); needs [`TlsFiles::cert`].
    pub key: Option<PathBuf>,
    /// The name the server's certificate must carry, when it differs from the host dialled.
    pub server_name: Option<String>,
}

/// The loaded files: PEM bytes, ready for a client library, or parsed for rustls
/// ([`TlsPem::root_store`], [`TlsPem::client_config`], feature `rustls`). `Debug` never shows
/// the key.
#[derive(Clone)]
pub struct TlsPem {
    /// The authority's certificates, if given.
    pub ca: Option<Vec<u8>>,
    /// The client's certificate and private key, if given.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The server-name override, if given.
    pub server_name: Option<String>,
    /// Where they were read from, for the errors of parsing them.
    #[cfg(feature = "rustls")]
    files: TlsFiles,
}

impl fmt::Debug for TlsPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsPem")
            .field("ca", &self.ca.as_ref().map(|_| "<PEM>"))
            .field(
                "identity",
                &self.identity.as_ref().map(|_| "<PEM, key hidden>"),
            )
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl TlsFiles {
    /// TLS whose server is verified against the authority (PEM certificates) in the file `ca`.
    ///
    /// ```
    /// use dlock_core::backend::tls::TlsFiles;
    ///
    /// let tls = TlsFiles::new("/etc/dlock/ca.pem")
    ///     .with_client_cert("/etc/dlock/app.pem", "/etc/dlock/app-key.pem")
    ///     .with_server_name("locks.internal");
    /// assert_eq!(tls.cert.as_deref(), Some(std::path::Path::new("/etc/dlock/app.pem")));
    /// ```
    pub fn new(ca: impl Into<PathBuf>) -> Self {
        TlsFiles {
            ca: Some(ca.into()),
            ..TlsFiles::default()
        }
    }

    /// Presents the certificate in the PEM file `cert`, with its private key in `key`, to servers
    /// that require one (mutual TLS).
    pub fn with_client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.cert = Some(cert.into());
        self.key = Some(key.into());
        self
    }

    /// Verifies that the server's certificate carries `name` rather than the host dialled (where
    /// the backend's client supports it; the others refuse it).
    pub fn with_server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// Takes `ca`, `cert`, `key` and `tls_server_name` from `url`: `None` when none is given.
    pub fn from_url(url: &mut ConnectUrl) -> Result<Option<TlsFiles>> {
        let files = TlsFiles {
            ca: url.take_path("ca")?,
            cert: url.take_path("cert")?,
            key: url.take_path("key")?,
            server_name: url.take("tls_server_name"),
        };
        Ok((files != TlsFiles::default()).then_some(files))
    }

    /// Reads and checks every file: each must exist and hold what its setting names (a PEM
    /// certificate, or a PEM private key); `cert` and `key` come together; a server name is a
    /// host name. Files are read in that order (`ca`, `cert`, `key`), so the first bad one is
    /// named. Errors name the setting (`ca`, `cert`, `key`, `tls_server_name`) and the path.
    pub fn load(&self) -> Result<TlsPem> {
        let ca = self
            .ca
            .as_deref()
            .map(|ca| read_pem("ca", ca, Pem::Certificate))
            .transpose()?;
        let identity = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some((
                read_pem("cert", cert, Pem::Certificate)?,
                read_pem("key", key, Pem::PrivateKey)?,
            )),
            (None, None) => None,
            (Some(_), None) => {
                return Err(Error::invalid("key", "a client certificate needs its key"))
            }
            (None, Some(_)) => {
                return Err(Error::invalid("cert", "a client key needs its certificate"))
            }
        };
        if let Some(name) = &self.server_name {
            let host_name = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
            if !host_name {
                return Err(Error::invalid(
                    "tls_server_name",
                    format!("{name:?} is not a host name"),
                ));
            }
        }
        Ok(TlsPem {
            ca,
            identity,
            server_name: self.server_name.clone(),
            #[cfg(feature = "rustls")]
            files: self.clone(),
        })
    }
}

/// The files parsed as rustls takes them, for the backends whose TLS is rustls. Errors name the
/// setting (`ca`, `cert`, `key`) and the path, never the parser's own words, which may quote the
/// file.
#[cfg(feature = "rustls")]
#[cfg_attr(docsrs, doc(cfg(feature = "rustls")))]
impl TlsPem {
    /// The authority's certificates as a root store; `None` without `ca`. An error if the file
    /// holds no certificate rustls can use.
    pub fn root_store(&self) -> Result<Option<rustls::RootCertStore>> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::CertificateDer;

        let Some(ca) = &self.ca else {
            return Ok(None);
        };
        let unusable = || not_pem("ca", self.files.ca.as_deref(), "certificates");
        let certs = CertificateDer::pem_slice_iter(ca)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| unusable())?;
        let mut roots = rustls::RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(unusable());
        }
        Ok(Some(roots))
    }

    /// Finishes a rustls client configuration: with the client's certificate chain and private
    /// key, which must belong together, or without client authentication if none was given.
    pub fn client_config(
        &self,
        builder: rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>,
    ) -> Result<rustls::ClientConfig> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};

        let Some((cert, key)) = &self.identity else {
            return Ok(builder.with_no_client_auth());
        };
        let (cert_path, key_path) = (self.files.cert.as_deref(), self.files.key.as_deref());
        let chain = CertificateDer::pem_slice_iter(cert)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| not_pem("cert", cert_path, "certificates"))?;
        if chain.is_empty() {
            return Err(not_pem("cert", cert_path, "certificates"));
        }
        let key = PrivateKeyDer::from_pem_slice(key)
            .map_err(|_| not_pem("key", key_path, "private key"))?;
        builder.with_client_auth_cert(chain, key).map_err(|e| {
            let problem = match e {
                rustls::Error::InconsistentKeys(_) => "it does not match the certificate",
                _ => "unsupported key type or malformed key",
            };
            Error::invalid(
                "key",
                format!(
                    "{}: not a usable private key for the certificate in {}: {problem}",
                    shown(key_path),
                    shown(cert_path)
                ),
            )
        })
    }
}

/// The error of a file for `field` that holds no usable PEM `what`.
#[cfg(feature = "rustls")]
fn not_pem(field: &'static str, path: Option<&Path>, what: &str) -> Error {
    Error::invalid(
        field,
        format!("{}: holds no PEM {what} that can be used", shown(path)),
    )
}

/// A path as errors show it.
#[cfg(feature = "rustls")]
fn shown(path: Option<&Path>) -> String {
    path.map(|p| p.display().to_string()).unwrap_or_default()
}

/// Installs rustls's `ring` crypto provider as the process's default, unless the application
/// installed one already (then that one is used); repeated calls do nothing. Every backend whose
/// TLS is rustls calls it before its first handshake: without a default, a build in which rustls
/// has more than one provider compiled in (another dependency bringing `aws-lc-rs`) panics there.
#[cfg(feature = "rustls")]
#[cfg_attr(docsrs, doc(cfg(feature = "rustls")))]
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// What a PEM file must hold.
#[derive(Clone, Copy)]
enum Pem {
    Certificate,
    PrivateKey,
}

/// Reads a PEM file for setting `field`. A failure names the setting and the path, never what
/// the file holds.
fn read_pem(field: &'static str, path: &Path, kind: Pem) -> Result<Vec<u8>> {
    let bytes = std::fs::read(path).map_err(|e| {
        Error::invalid(
            field,
            format!("cannot read {}: {}", path.display(), e.kind()),
        )
    })?;
    let text = String::from_utf8_lossy(&bytes);
    let found = text.lines().any(|line| {
        let line = line.trim();
        match kind {
            Pem::Certificate => line == "-----BEGIN CERTIFICATE-----",
            Pem::PrivateKey => {
                line.starts_with("-----BEGIN ") && line.ends_with("PRIVATE KEY-----")
            }
        }
    });
    if !found {
        let what = match kind {
            Pem::Certificate => "a PEM certificate (-----BEGIN CERTIFICATE-----)",
            Pem::PrivateKey => "a PEM private key (-----BEGIN … PRIVATE KEY-----)",
        };
        return Err(Error::invalid(
            field,
            format!("{} does not hold {what}", path.display()),
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str =
        "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n-----END PRIVATE KEY-----\n";
    const CERT: &str = "-----BEGIN CERTIFICATE-----\nY2VydA==\n-----END CERTIFICATE-----\n";

    fn files(test: &str) -> (PathBuf, PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("dlock-tls-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert, CERT).expect("write");
        std::fs::write(&key, KEY).expect("write");
        (dir, cert, key)
    }

    #[test]
    fn url_parameters_become_files_and_are_loaded() {
        let (_dir, cert, key) = files("url");
        let mut url = ConnectUrl::parse(&format!(
            "x://h?ca={0}&cert={0}&key={1}&tls_server_name=db.internal",
            cert.display(),
            key.display()
        ))
        .expect("url");
        let tls = TlsFiles::from_url(&mut url).expect("ok").expect("some");
        url.finish(&[]).expect("every TLS parameter taken");
        let pem = tls.load().expect("loads");
        assert_eq!(pem.ca.as_deref(), Some(CERT.as_bytes()));
        assert_eq!(pem.server_name.as_deref(), Some("db.internal"));
        let shown = format!("{pem:?} {tls:?}");
        assert!(!shown.contains("c2VjcmV0"), "{shown}");
        let mut plain = ConnectUrl::parse("x://h").expect("url");
        assert_eq!(TlsFiles::from_url(&mut plain).expect("ok"), None);
    }

    #[test]
    fn bad_files_name_the_setting_and_path_but_never_the_contents() {
        let (dir, cert, key) = files("bad");
        let cases = [
            (
                TlsFiles {
                    ca: Some(dir.join("missing.pem")),
                    ..TlsFiles::default()
                },
                "ca",
            ),
            (
                TlsFiles {
                    ca: Some(key.clone()),
                    ..TlsFiles::default()
                },
                "ca",
            ),
            (
                TlsFiles {
                    cert: Some(cert.clone()),
                    ..TlsFiles::default()
                },
                "key",
            ),
            (
                TlsFiles {
                    key: Some(key.clone()),
                    ..TlsFiles::default()
                },
                "cert",
            ),
            (
                TlsFiles {
                    cert: Some(cert.clone()),
                    key: Some(cert.clone()),
                    ..TlsFiles::default()
                },
                "key",
            ),
            (
                TlsFiles {
                    server_name: Some("a b".into()),
                    ..TlsFiles::default()
                },
                "tls_server_name",
            ),
        ];
        for (files, setting) in cases {
            match files.load() {
                Err(Error::InvalidInput { field, message }) => {
                    assert_eq!(field, setting, "{message}");
                    assert!(!message.contains("c2VjcmV0"), "{message}");
                }
                other => panic!("{files:?}: {other:?}"),
            }
        }
    }
}
