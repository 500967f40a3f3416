//! `sslmode`, as libpq users know it, on rustls.
//!
//! | `sslmode` | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (the default, as in libpq) | if the server offers it, else plaintext | not checked, even with `sslrootcert` |
//! | `require` | always | not checked, unless `sslrootcert` is given: then as `verify-ca` (libpq does the same) |
//! | `verify-ca` | always | chains to `sslrootcert` |
//! | `verify-full` | always | chains to `sslrootcert` and names the host |
//!
//! `sslcert` and `sslkey` present a client certificate (for `hostssl … cert` lines). Files are
//! read when the client connects; an error names the setting and the path, never the contents.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use dlock_core::backend::tls::TlsFiles;
use dlock_core::{Error, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

/// libpq's `sslmode`, without `allow` (plaintext first, TLS as a fallback), which no secured
/// deployment wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plaintext only.
    Disable,
    /// TLS when the server offers it, unchecked; plaintext otherwise.
    #[default]
    Prefer,
    /// TLS, unchecked (checked as [`SslMode::VerifyCa`] when a root certificate is given).
    Require,
    /// TLS; the certificate must chain to the root certificate.
    VerifyCa,
    /// TLS; the certificate must chain to the root certificate and name the host.
    VerifyFull,
}

impl FromStr for SslMode {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        Ok(match text {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            "allow" => return Err("`allow` is not supported: use `prefer` or stricter".into()),
            other => {
                return Err(format!(
                    "{other:?} is not an sslmode (disable, prefer, require, verify-ca, verify-full)"
                ))
            }
        })
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        })
    }
}

/// The mode and files of a client's TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PgTls {
    pub(crate) mode: SslMode,
    /// `sslrootcert`, `sslcert` and `sslkey` (and a server-name override, unused here).
    pub(crate) files: TlsFiles,
}

impl PgTls {
    /// Checks the combination before anything is read.
    pub(crate) fn validate(&self) -> Result<()> {
        let verifies = matches!(self.mode, SslMode::VerifyCa | SslMode::VerifyFull);
        if verifies && self.files.ca.is_none() {
            return Err(Error::invalid(
                "sslrootcert",
                format!(
                    "sslmode={} needs sslrootcert, the authority to check the server against",
                    self.mode
                ),
            ));
        }
        if self.mode == SslMode::Disable
            && (self.files.ca.is_some() || self.files.cert.is_some() || self.files.key.is_some())
        {
            return Err(Error::invalid(
                "sslmode",
                "sslmode=disable is plaintext: sslrootcert, sslcert and sslkey would be ignored",
            ));
        }
        match (&self.files.cert, &self.files.key) {
            (Some(_), None) => Err(Error::invalid(
                "sslkey",
                "a client certificate needs its key",
            )),
            (None, Some(_)) => Err(Error::invalid(
                "sslcert",
                "a client key needs its certificate",
            )),
            _ => Ok(()),
        }
    }

    /// The driver's mode and, unless TLS is off, the rustls configuration to connect with.
    /// (With `disable` the configuration is never used, and no file is read.)
    pub(crate) fn load(&self) -> Result<(tokio_postgres::config::SslMode, rustls::ClientConfig)> {
        use tokio_postgres::config::SslMode as Driver;
        let driver = match self.mode {
            SslMode::Disable => Driver::Disable,
            SslMode::Prefer => Driver::Prefer,
            _ => Driver::Require,
        };
        let pem = self.files.load().map_err(libpq_names)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|_| Error::invalid("sslmode", "the ring provider offers no TLS version"))?;
        // `prefer` checks no certificate, even with `sslrootcert` (as libpq).
        let roots = match self.mode {
            SslMode::Prefer => None,
            _ => pem.root_store().map_err(libpq_names)?,
        };
        let chain = roots
            .map(|roots| {
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|_| {
                        let path = self.files.ca.as_ref().map(|p| p.display().to_string());
                        Error::invalid(
                            "sslrootcert",
                            format!("{}: no usable certificate", path.unwrap_or_default()),
                        )
                    })
            })
            .transpose()?;
        let verifier = Arc::new(Verifier {
            provider,
            chain,
            names: self.mode == SslMode::VerifyFull,
        });
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = pem.client_config(builder).map_err(libpq_names)?;
        Ok((driver, config))
    }
}

/// The error of reading the files, naming the settings as libpq (and the URL) calls them.
fn libpq_names(error: Error) -> Error {
    match error {
        Error::InvalidInput { field, message } => Error::InvalidInput {
            field: match field {
                "ca" => "sslrootcert",
                "cert" => "sslcert",
                "key" => "sslkey",
                other => other,
            },
            message,
        },
        other => other,
    }
}

/// The check of the server's certificate: none without a root certificate (`prefer`, and
/// `require` without `sslrootcert`: encryption without authentication, as libpq does), else the
/// chain (`verify-ca`) and also the host's name (`verify-full`). Handshake signatures are checked
/// either way, so the session key is the server's.
#[derive(Debug)]
struct Verifier {
    provider: Arc<rustls::crypto::CryptoProvider>,
    chain: Option<Arc<WebPkiServerVerifier>>,
    names: bool,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.names => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_as_libpq_names_them() {
        assert_eq!("verify-full".parse::<SslMode>(), Ok(SslMode::VerifyFull));
        assert!("allow".parse::<SslMode>().unwrap_err().contains("prefer"));
        assert!("VERIFY".parse::<SslMode>().is_err());
    }

    #[test]
    fn verifying_modes_need_a_root_certificate() {
        let tls = PgTls {
            mode: SslMode::VerifyCa,
            files: TlsFiles::default(),
        };
        assert!(matches!(
            tls.validate(),
            Err(Error::InvalidInput {
                field: "sslrootcert",
                ..
            })
        ));
    }
}
