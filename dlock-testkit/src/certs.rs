//! Certificates generated at test time for servers that speak TLS: one certificate authority, a
//! server certificate for the names a client dials, and a client certificate for mutual TLS.
//!
//! Nothing is checked in: every run makes fresh keys (ECDSA P-256, which Java, Go and rustls all
//! accept), written as PEM files (PKCS#8 keys) into a directory of their own that is removed when
//! the value is dropped. The files are world-readable because the servers in the containers read
//! them under their own user; they protect nothing beyond the test.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate authority with one server and one client certificate, as PEM files.
#[derive(Debug)]
pub struct TestCerts {
    dir: PathBuf,
    /// The authority's certificate: what a client verifies the server against, and the server
    /// the client.
    pub ca: PathBuf,
    /// The server's certificate, valid for every name given to [`TestCerts::generate`].
    pub server_cert: PathBuf,
    /// The server certificate's private key.
    pub server_key: PathBuf,
    /// The client's certificate (common name as given), for servers that require one.
    pub client_cert: PathBuf,
    /// The client certificate's private key.
    pub client_key: PathBuf,
}

impl TestCerts {
    /// Makes a fresh authority, a server certificate whose subject alternative names are
    /// `server_names` (host names or IP addresses, e.g. `localhost`, `127.0.0.1` and the
    /// containers' names) and a client certificate with common name `client_name` (etcd takes
    /// it as the user name when client-certificate authentication is on).
    pub fn generate(server_names: &[&str], client_name: &str) -> anyhow::Result<Self> {
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "dlock test authority");
        ca_params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

        let leaf =
            |names: Vec<String>, common_name: String, usages: Vec<ExtendedKeyUsagePurpose>| {
                let mut params = CertificateParams::new(names)?;
                params
                    .distinguished_name
                    .push(DnType::CommonName, common_name);
                params.use_authority_key_identifier_extension = true;
                params.key_usages = vec![
                    KeyUsagePurpose::DigitalSignature,
                    KeyUsagePurpose::KeyEncipherment,
                ];
                params.extended_key_usages = usages;
                let key = KeyPair::generate()?;
                let cert = params.signed_by(&key, &ca)?;
                anyhow::Ok((cert.pem(), key.serialize_pem()))
            };
        let server_names: Vec<String> = server_names.iter().map(|n| n.to_string()).collect();
        let common = server_names.first().cloned().unwrap_or_default();
        // Servers that also dial their peers (etcd members, a ZooKeeper quorum) present the server
        // certificate as a client too, so it carries both usages.
        let (server_cert, server_key) = leaf(
            server_names,
            common,
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )?;
        let (client_cert, client_key) = leaf(
            Vec::new(),
            client_name.to_owned(),
            vec![ExtendedKeyUsagePurpose::ClientAuth],
        )?;

        let dir = std::env::temp_dir().join(format!(
            "dlock-certs-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir)?;
        let write = |name: &str, pem: &str| -> anyhow::Result<PathBuf> {
            let path = dir.join(name);
            std::fs::write(&path, pem)?;
            set_readable(&path)?;
            Ok(path)
        };
        set_readable(&dir)?;
        Ok(TestCerts {
            ca: write("ca.pem", &ca.pem())?,
            server_cert: write("server.pem", &server_cert)?,
            server_key: write("server-key.pem", &server_key)?,
            client_cert: write("client.pem", &client_cert)?,
            client_key: write("client-key.pem", &client_key)?,
            dir,
        })
    }

    /// The directory holding every file (mount it into a container read-only).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Lets a server in a container, running as its own user, read the file or enter the directory.
fn set_readable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = if path.is_dir() { 0o755 } else { 0o644 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_every_file_as_pem_and_removes_them_on_drop() {
        let certs = TestCerts::generate(&["localhost", "127.0.0.1"], "app").unwrap();
        for path in [
            &certs.ca,
            &certs.server_cert,
            &certs.server_key,
            &certs.client_cert,
            &certs.client_key,
        ] {
            let text = std::fs::read_to_string(path).unwrap();
            assert!(text.starts_with("-----BEGIN "), "{}", path.display());
        }
        assert!(std::fs::read_to_string(&certs.server_key)
            .unwrap()
            .contains("PRIVATE KEY"));
        let dir = certs.dir().to_owned();
        drop(certs);
        assert!(!dir.exists());
    }
}
