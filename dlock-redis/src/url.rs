//! Which server to talk to: a Redis URL, checked before anything is sent, and shown without its
//! password.
//!
//! Accepted forms:
//!
//! * `redis://[user[:password]@]host[:port][/db]` (port 6379 and database 0 by default);
//! * `rediss://…` for TLS, with the `tls` feature (`#insecure` at the end skips certificate checks);
//! * `redis+unix:///path/to/socket` or `unix:///path/to/socket` for a Unix socket (database 0).
//!
//! A `rediss://` URL may name its TLS files: `?ca=PATH` (the authority the server's certificate
//! must chain to, instead of the system's roots) and `&cert=PATH&key=PATH` (a client certificate,
//! for servers started with `--tls-auth-clients yes`). Every other query parameter is refused
//! rather than silently ignored (the client's `protocol=resp3` would change how release
//! notifications arrive).
//!
//! Public so that clients of several servers (the Redlock backend) parse and show each server's
//! URL the same way.

use std::fmt;

use dlock_core::backend::tls::TlsFiles;
use dlock_core::backend::url::{percent_encode, ConnectUrl, FromUrl};
use dlock_core::{Error, Result};
use redis::IntoConnectionInfo;
use url::Url;

use crate::RedisLockBuilder;

/// A validated Redis server address and its credentials; its `Debug` shows the URL without the
/// password.
#[derive(Clone)]
pub struct Endpoint {
    info: redis::ConnectionInfo,
    redacted: String,
    tls: Option<TlsFiles>,
}

impl Endpoint {
    /// Checks `raw` and builds the connection settings; every problem is an
    /// [`Error::InvalidInput`] for the field `url` whose message never repeats the password.
    pub fn parse(raw: &str) -> Result<Self> {
        let invalid = |message: String| Error::invalid("url", message);
        let url = Url::parse(raw.trim()).map_err(|e| invalid(format!("not a URL: {e}")))?;
        let redacted = redact(&url);
        let tcp = match url.scheme() {
            "redis" => true,
            "rediss" => {
                if !cfg!(feature = "tls") {
                    return Err(invalid(format!(
                        "{redacted}: rediss:// (TLS) needs the `tls` feature of dlock-redis"
                    )));
                }
                true
            }
            "redis+unix" | "unix" => false,
            other => {
                return Err(invalid(format!(
                    "{redacted}: unsupported scheme {other:?}; use redis://, rediss:// or redis+unix://"
                )))
            }
        };
        let tls = match url.query() {
            None => None,
            Some(_) => {
                let mut parsed = ConnectUrl::parse(raw)?;
                let tls = TlsFiles::from_url(&mut parsed)?;
                parsed.finish(&["ca", "cert", "key"])?;
                if tls.as_ref().is_some_and(|t| t.server_name.is_some()) {
                    return Err(invalid(format!(
                        "{redacted}: tls_server_name is not supported for Redis (the host name \
                         is the name verified)"
                    )));
                }
                if tls.is_some() && url.scheme() != "rediss" {
                    return Err(invalid(format!(
                        "{redacted}: ca, cert and key need a rediss:// (TLS) URL"
                    )));
                }
                tls
            }
        };
        let mut url = url;
        url.set_query(None);
        let redacted = redact(&url);
        if tcp {
            if url.host_str().is_none_or(str::is_empty) {
                return Err(invalid(format!("{redacted}: no host")));
            }
            let db = url.path().trim_matches('/');
            if !db.is_empty() && db.parse::<u32>().is_err() {
                return Err(invalid(format!(
                    "{redacted}: database {db:?} is not a non-negative number"
                )));
            }
            match url.fragment() {
                None => {}
                Some("insecure") if url.scheme() == "rediss" => {}
                Some(other) => {
                    return Err(invalid(format!(
                        "{redacted}: unsupported fragment #{other} (only rediss://…#insecure)"
                    )))
                }
            }
        } else if url.path().is_empty() || url.path() == "/" {
            return Err(invalid(format!("{redacted}: no socket path")));
        }
        let info = url
            .into_connection_info()
            .map_err(|e| invalid(format!("{redacted}: {e}")))?;
        Ok(Endpoint {
            info,
            redacted,
            tls,
        })
    }

    /// The settings for the client library.
    pub fn connection_info(&self) -> &redis::ConnectionInfo {
        &self.info
    }

    /// A client library handle for this server with the settings every dlock connection uses
    /// (`TCP_NODELAY`, so pipelined requests are not held back).
    /// Over TLS with files of its own, the client trusts the given authority and presents the
    /// given certificate; the files are read here, and an error names the setting and path only.
    pub fn client(&self) -> Result<redis::Client> {
        match &self.tls {
            None => crate::connection::client(self),
            Some(tls) => self.tls_client(tls),
        }
    }

    #[cfg(feature = "tls")]
    fn tls_client(&self, tls: &TlsFiles) -> Result<redis::Client> {
        // Clients of several servers (Redlock) build theirs here, not through the builder.
        dlock_core::backend::tls::install_crypto_provider();
        let certificates = certificates(tls)?;
        let info = self
            .info
            .clone()
            .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        redis::Client::build_with_tls(info, certificates)
            .map_err(|e| Error::invalid("url", format!("{}: {e}", self.redacted)))
    }

    /// Unreachable in practice: without the `tls` feature a `rediss://` URL is refused first.
    #[cfg(not(feature = "tls"))]
    fn tls_client(&self, _: &TlsFiles) -> Result<redis::Client> {
        Err(Error::invalid(
            "url",
            format!(
                "{}: TLS needs the `tls` feature of dlock-redis",
                self.redacted
            ),
        ))
    }

    /// The URL with its password replaced by `***`, for errors, logs and `Debug`.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }
}

/// The client library's TLS settings from `files`, read and checked now (see
/// [`TlsFiles::load`]): errors name the setting and the path, never the contents. One server,
/// Sentinel and Cluster all build theirs here.
#[cfg(feature = "tls")]
pub(crate) fn certificates(files: &TlsFiles) -> Result<redis::TlsCertificates> {
    let pem = files.load()?;
    Ok(redis::TlsCertificates {
        client_tls: pem
            .identity
            .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                client_cert,
                client_key,
            }),
        root_cert: pem.ca,
    })
}

/// The user part of a redacted URL, `user:***@` (or `user@`, `:***@`, nothing): a password
/// shows as `***`.
pub(crate) fn redacted_userinfo(username: Option<&str>, password: Option<&str>) -> String {
    match (username, password) {
        (Some(user), Some(_)) => format!("{user}:***@"),
        (Some(user), None) => format!("{user}@"),
        (None, Some(_)) => ":***@".to_owned(),
        (None, None) => String::new(),
    }
}

fn redact(url: &Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        // Only fails for URLs that cannot have credentials, which then have no password either.
        let _ = shown.set_password(Some("***"));
    }
    shown.to_string()
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

/// `redis://`, `rediss://` and `redis+unix://` with `?parameters`: the server address as the
/// client library takes it, then the builder's settings by name. `redis+sentinel://` and
/// `rediss+sentinel://` name a Sentinel service instead (see
/// [`SentinelSettings`](crate::SentinelSettings)).
/// `redis+cluster://` and `rediss+cluster://` name a Redis Cluster's seed nodes (see [the crate
/// docs](crate#redis-cluster)).
impl FromUrl for RedisLockBuilder {
    const SCHEMES: &'static [&'static str] = &[
        "redis",
        "rediss",
        "redis+unix",
        "unix",
        "redis+sentinel",
        "rediss+sentinel",
        "redis+cluster",
        "rediss+cluster",
    ];
    const PARAMETERS: &'static [&'static str] = &[
        "prefix",
        "request_timeout",
        "connect_timeout",
        "fence_ttl",
        "ca",
        "cert",
        "key",
        "min_replicas",
        "replica_timeout",
        "sentinel_password",
        "owner",
    ];

    fn from_connect_url(url: &mut ConnectUrl) -> Result<Self> {
        if crate::cluster::is_cluster_scheme(url.scheme()) {
            return crate::cluster::from_connect_url(url);
        }
        if matches!(url.scheme(), "redis+sentinel" | "rediss+sentinel") {
            let settings = crate::sentinel::SentinelSettings::from_url(url)?;
            return Self::apply_url_parameters(url, RedisLockBuilder::sentinel(settings));
        }
        if url.take("sentinel_password").is_some() {
            return Err(url.invalid(
                "parameter `sentinel_password` is only for redis+sentinel:// and rediss+sentinel://",
            ));
        }
        // The server's TLS files travel in its URL, as they do for each Redlock master.
        let mut address = url.without_query();
        if let Some(tls) = TlsFiles::from_url(url)? {
            let pairs = [("ca", &tls.ca), ("cert", &tls.cert), ("key", &tls.key)];
            let query: Vec<String> = pairs
                .iter()
                .filter_map(|(name, path)| {
                    let path = path.as_ref()?.to_string_lossy();
                    Some(format!("{name}={}", percent_encode(&path)))
                })
                .collect();
            address = format!("{address}?{}", query.join("&"));
            if let Some(name) = tls.server_name {
                address = format!("{address}&tls_server_name={}", percent_encode(&name));
            }
        }
        Self::apply_url_parameters(url, RedisLockBuilder::new(address))
    }
}

impl RedisLockBuilder {
    /// The settings every Redis scheme takes, applied by name.
    fn apply_url_parameters(url: &mut ConnectUrl, builder: Self) -> Result<Self> {
        Ok(dlock_core::backend::apply_parameters!(url, builder, {
            "prefix" => take_text => Self::with_prefix,
            "request_timeout" => take_duration => Self::with_request_timeout,
            "connect_timeout" => take_duration => Self::with_connect_timeout,
            "fence_ttl" => take_duration => Self::with_fence_ttl,
            "min_replicas" => take_replicas => Self::with_min_replicas,
            "replica_timeout" => take_duration => Self::with_replica_timeout,
            "owner" => take_text => Self::with_owner,
        }))
    }
}

/// Reads `min_replicas`-like counts for [`dlock_core::backend::apply_parameters!`].
pub(crate) trait TakeReplicas {
    fn take_replicas(&mut self, name: &str) -> Result<Option<u32>>;
}

impl TakeReplicas for ConnectUrl {
    fn take_replicas(&mut self, name: &str) -> Result<Option<u32>> {
        self.take_parsed(name, "a whole number of replicas")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(raw: &str) -> String {
        match Endpoint::parse(raw) {
            Err(Error::InvalidInput {
                field: "url",
                message,
            }) => message,
            Err(other) => panic!("{raw}: expected InvalidInput(url), got {other}"),
            Ok(endpoint) => panic!("{raw}: accepted as {endpoint:?}"),
        }
    }

    #[test]
    fn good_urls_are_accepted() {
        for raw in [
            "redis://127.0.0.1",
            "redis://127.0.0.1:6380/3",
            "redis://user:secret@localhost:6379/0",
            "redis://:secret@localhost",
            "redis+unix:///run/redis.sock",
            "unix:///run/redis.sock",
        ] {
            assert!(Endpoint::parse(raw).is_ok(), "{raw}");
        }
        let e = Endpoint::parse("redis://u:p@h:1/2").unwrap();
        assert_eq!(e.connection_info().redis_settings().db(), 2);
    }

    #[test]
    fn bad_urls_are_invalid_input_naming_the_url() {
        assert!(message("").contains("not a URL"));
        assert!(message("localhost:6379").contains("scheme"));
        assert!(message("http://localhost").contains("unsupported scheme"));
        assert!(message("redis://").contains("no host"));
        assert!(message("redis://host:99999").contains("not a URL"));
        assert!(message("redis://host/abc").contains("database"));
        assert!(message("redis://host/-1").contains("database"));
        assert!(message("redis://host/?protocol=resp3").contains("unknown parameter `protocol`"));
        assert!(message("redis://host#frag").contains("fragment"));
        assert!(message("redis+unix://").contains("socket path"));
        assert!(message("redis://host?ca=/ca.pem").contains("need a rediss://"));
        assert!(message("redis://u:hunter2@host?colour=red").contains("unknown parameter"));
        assert!(!message("redis://u:hunter2@host?colour=red").contains("hunter2"));
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_files_travel_in_the_url_and_are_read_at_connect() {
        let e = Endpoint::parse("rediss://u:hunter2@h:1?ca=/nonexistent/ca.pem").unwrap();
        assert!(!format!("{e:?}").contains("hunter2"));
        assert!(!format!("{e:?}").contains("ca.pem"), "{e:?}");
        match e.client() {
            Err(Error::InvalidInput { field, message }) => {
                assert_eq!(field, "ca");
                assert!(message.contains("/nonexistent/ca.pem"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert!(message("rediss://h?ca=/c.pem&tls_server_name=x").contains("tls_server_name"));
        let half = Endpoint::parse("rediss://h?cert=/c.pem").unwrap().client();
        assert!(
            matches!(half, Err(Error::InvalidInput { field: "key", .. })),
            "{half:?}"
        );
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn tls_without_the_feature_names_the_feature() {
        assert!(message("rediss://host").contains("`tls` feature"));
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_with_the_feature_is_accepted() {
        assert!(Endpoint::parse("rediss://host").is_ok());
        assert!(Endpoint::parse("rediss://host#insecure").is_ok());
    }

    #[test]
    fn passwords_never_show() {
        let e = Endpoint::parse("redis://user:hunter2@localhost:6379/1").unwrap();
        let shown = format!("{e:?} {}", e.redacted());
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("user:***@localhost"), "{shown}");
        let err = message("redis://user:hunter2@localhost/abc");
        assert!(!err.contains("hunter2"), "{err}");
    }
}
