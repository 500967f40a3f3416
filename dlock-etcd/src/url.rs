//! Connection strings: `etcd://[user[:password]@]host:port[,host:port…][/prefix][?parameters]`,
//! and over TLS `etcd+https://…?ca=PATH[&cert=PATH&key=PATH][&tls_server_name=NAME]`.
//!
//! Parameters: `prefix` (the key namespace, also given as the path), `session_timeout` (the
//! session lease's TTL), `request_timeout` and `connect_timeout`, durations such as `10s` or
//! `1500ms`, and `owner` (the application label of the owner records, see
//! [`EtcdLockBuilder::with_owner`]). The path, percent-decoded, is the prefix; without a path (or with `/` alone) the
//! default prefix is used. With `etcd+https`, `ca` (required: the authority the servers are
//! verified against), `cert` and `key` (a client certificate, together) and `tls_server_name`
//! (the name to verify instead of each host) are PEM file paths and a name, as
//! [`dlock_core::backend::tls::TlsFiles`] reads them; on `etcd://`, which is plaintext, they are refused.

use dlock_core::backend::tls::TlsFiles;
use dlock_core::backend::url::{ConnectUrl, FromUrl};
use dlock_core::Result;

use crate::builder::EtcdLockBuilder;

/// The scheme of an etcd connection string.
pub const SCHEME: &str = "etcd";
/// The scheme of an etcd connection string over TLS.
pub const TLS_SCHEME: &str = "etcd+https";

impl FromUrl for EtcdLockBuilder {
    const SCHEMES: &'static [&'static str] = &[SCHEME, TLS_SCHEME];
    const PARAMETERS: &'static [&'static str] = &[
        "prefix",
        "session_timeout",
        "request_timeout",
        "connect_timeout",
        "ca",
        "cert",
        "key",
        "tls_server_name",
        "owner",
    ];

    fn from_connect_url(url: &mut ConnectUrl) -> Result<Self> {
        if url.fragment().is_some() {
            return Err(url.invalid("fragments are not supported"));
        }
        let mut builder = EtcdLockBuilder::new();
        if let Some(credentials) = url.credentials() {
            if credentials.user.is_empty() {
                return Err(url.invalid("the user name is empty"));
            }
            builder = builder.with_credentials(
                credentials.user.clone(),
                credentials.password.clone().unwrap_or_default(),
            );
        }
        match (url.scheme() == TLS_SCHEME, TlsFiles::from_url(url)?) {
            (true, Some(tls)) if tls.ca.is_some() => builder = builder.with_tls(tls),
            (true, _) => {
                return Err(url.invalid(
                    "etcd+https:// needs `ca`, the authority to verify the servers against",
                ))
            }
            (false, Some(_)) => {
                return Err(url.invalid(
                    "`ca`, `cert`, `key` and `tls_server_name` are for etcd+https://; etcd:// \
                     is plaintext",
                ))
            }
            (false, None) => {}
        }
        builder = builder.with_endpoints(url.hosts()?);
        let path = url.path_decoded()?;
        match url.take("prefix") {
            Some(_) if !path.is_empty() => {
                return Err(
                    url.invalid("the prefix is given twice: as the path and as `prefix`; keep one")
                )
            }
            Some(prefix) => builder = builder.with_prefix(prefix),
            None if !path.is_empty() => builder = builder.with_prefix(path),
            None => {}
        }
        if let Some(label) = url.take("owner") {
            builder = builder.with_owner(label);
        }
        let builder = dlock_core::backend::apply_parameters!(url, builder, {
            "session_timeout" => take_duration => Self::with_session_timeout,
            "request_timeout" => take_duration => Self::with_request_timeout,
            "connect_timeout" => take_duration => Self::with_connect_timeout,
        });
        Ok(builder)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use dlock_core::Error;
    use std::time::Duration;

    fn field(url: &str) -> (&'static str, String) {
        match EtcdLockBuilder::from_url(url).and_then(|b| b.validate().map(|_| ())) {
            Err(Error::InvalidInput { field, message }) => (field, message),
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn full_url_is_understood() {
        let b = EtcdLockBuilder::from_url(
            "etcd://app:s%40cret@10.0.0.1:2379,10.0.0.2:2379/services/billing/?session_timeout=15s&request_timeout=1500ms",
        )
        .unwrap();
        let shown = format!("{b:?}");
        assert!(
            !shown.contains("s@cret") && !shown.contains("s%40cret"),
            "{shown}"
        );
        let settings = b.validate().unwrap();
        assert_eq!(
            settings.endpoints,
            ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
        );
        assert_eq!(settings.layout.namespace(), "services/billing/");
        assert_eq!(settings.session_ttl, Duration::from_secs(15));
        assert_eq!(settings.request_timeout, Duration::from_millis(1500));
        let (user, password) = settings.credentials.unwrap();
        assert_eq!((user.as_str(), password.expose()), ("app", "s@cret"));
    }

    #[test]
    fn defaults_apply_without_path_and_options() {
        let settings = EtcdLockBuilder::from_url("etcd://localhost:2379")
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(
            settings.layout.namespace(),
            crate::layout::DEFAULT_NAMESPACE
        );
        assert_eq!(settings.endpoints, ["http://localhost:2379"]);
        let settings = EtcdLockBuilder::from_url("ETCD://[::1]:2379/")
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(settings.endpoints, ["http://[::1]:2379"]);
    }

    #[test]
    fn tls_urls_take_the_files_and_dial_https() {
        let dir = std::env::temp_dir().join(format!("dlock-etcd-url-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = dir.join("cert.pem");
        let key = dir.join("key.pem");
        std::fs::write(
            &cert,
            "-----BEGIN CERTIFICATE-----\nY2VydA==\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let url = format!(
            "etcd+https://app:pw@10.0.0.1:2379,10.0.0.2:2379/billing?ca={0}&cert={0}&key={1}&tls_server_name=etcd.internal",
            cert.display(),
            key.display()
        );
        let settings = EtcdLockBuilder::from_url(&url).unwrap().validate().unwrap();
        assert_eq!(
            settings.endpoints,
            ["https://10.0.0.1:2379", "https://10.0.0.2:2379"]
        );
        let shown = format!("{settings:?}");
        assert!(
            shown.contains("key.pem") && !shown.contains("c2VjcmV0"),
            "{shown}"
        );
        // No CA, TLS files on plaintext, a missing file.
        assert_eq!(field("etcd+https://h:2379").0, "url");
        assert_eq!(
            field(&format!("etcd://h:2379?ca={}", cert.display())).0,
            "url"
        );
        assert_eq!(field("etcd+https://h:2379?ca=/nonexistent/ca.pem").0, "ca");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn malformed_urls_name_the_url_and_hide_the_password() {
        for url in [
            "localhost:2379",
            "redis://h:1",
            "etcd://",
            "etcd://a:1,,b:2",
            "etcd://:pw@h:1",
            "etcd://u:p%zz@h:1",
            "etcd://h:1?session_timeout=ten",
            "etcd://h:1?colour=red",
            "etcd://u:hunter2@h:1?bogus=1",
        ] {
            let (name, message) = field(url);
            assert_eq!(name, "url", "{url}: {message}");
            assert!(!message.contains("hunter2"), "{message}");
        }
        let (name, message) = field("etcd://u:hunter2@h:notaport");
        assert_eq!(name, "endpoints");
        assert!(!message.contains("hunter2"), "{message}");
        assert_eq!(field("etcd://h:1?session_timeout=0").0, "session_timeout");
        assert_eq!(field("etcd://h:1?owner=").0, "owner");
        assert_eq!(field("etcd://h:1?owner=a%0Ab").0, "owner");
    }

    #[test]
    fn a_renamed_parameter_is_refused_with_its_new_name() {
        let (name, message) = field("etcd://u:hunter2@h:1?session_ttl=10s");
        assert_eq!(name, "url");
        assert!(
            message.contains("parameter `session_ttl` was renamed `session_timeout` for etcd://"),
            "{message}"
        );
        assert!(!message.contains("hunter2"), "{message}");
    }

    #[test]
    fn owner_labels_the_records() {
        let settings = EtcdLockBuilder::from_url("etcd://h:1?owner=billing%20jobs")
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(settings.owner.label(), Some("billing jobs"));
        let settings = EtcdLockBuilder::from_url("etcd://h:1")
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(settings.owner.label(), None);
    }
}
