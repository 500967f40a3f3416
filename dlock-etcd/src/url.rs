//! Connection strings: `etcd://[user[:password]@]host:port[,host:port…][/namespace][?options]`.
//!
//! Options: `session_ttl`, `request_timeout` and `connect_timeout`, each a number of seconds or a
//! number with `s` or `ms` (`session_ttl=10`, `request_timeout=1500ms`). The path, percent-decoded,
//! is the namespace; without a path (or with `/` alone) the default namespace is used.
//!
//! Errors name the `url` field and the part at fault but never repeat the string itself, which
//! may carry a password.

use std::time::Duration;

use dlock_core::url::{percent_decode, Credentials, Parts};
use dlock_core::{Error, Result};

use crate::builder::EtcdLockBuilder;

/// The scheme of an etcd connection string.
pub const SCHEME: &str = "etcd";

fn invalid(message: impl Into<String>) -> Error {
    Error::invalid("url", message)
}

/// Parses a connection string into a builder (nothing is validated against a server).
pub(crate) fn parse(url: &str) -> Result<EtcdLockBuilder> {
    let parts = Parts::split(url);
    let scheme = parts
        .scheme
        .ok_or_else(|| invalid(format!("must start with {SCHEME}://")))?;
    if !scheme.eq_ignore_ascii_case(SCHEME) {
        return Err(invalid(format!(
            "scheme must be {SCHEME}:// (TLS endpoints are not supported by this build)"
        )));
    }
    if parts.fragment.is_some() {
        return Err(invalid("fragments are not supported"));
    }
    let mut builder = EtcdLockBuilder::new();
    if let Some(userinfo) = parts.userinfo {
        let credentials = Credentials::decode(userinfo).map_err(invalid)?;
        builder =
            builder.with_credentials(credentials.user, credentials.password.unwrap_or_default());
    }
    let hosts = parts.hosts;
    if hosts.is_empty() {
        return Err(invalid("names no host (expected host:port[,host:port…])"));
    }
    for host in hosts.split(',') {
        if host.is_empty() {
            return Err(invalid("has an empty host between commas"));
        }
        builder = builder.with_endpoint(host);
    }
    if let Some(path) = parts.path.strip_prefix('/').filter(|p| !p.is_empty()) {
        let namespace =
            percent_decode(path).ok_or_else(|| invalid("invalid percent-encoding in the path"))?;
        builder = builder.with_namespace(namespace);
    }
    for pair in parts
        .query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        builder = match name {
            "session_ttl" => builder.with_session_ttl(duration(name, value)?),
            "request_timeout" => builder.with_request_timeout(duration(name, value)?),
            "connect_timeout" => builder.with_connect_timeout(duration(name, value)?),
            other => {
                return Err(invalid(format!(
                "unknown option {other:?} (known: session_ttl, request_timeout, connect_timeout)"
            )))
            }
        };
    }
    Ok(builder)
}

/// `10`, `10s` or `1500ms`.
fn duration(name: &str, value: &str) -> Result<Duration> {
    let bad = || {
        invalid(format!(
            "option {name} must be a number of seconds, or end in s or ms"
        ))
    };
    let (digits, unit) = if let Some(ms) = value.strip_suffix("ms") {
        (ms, Duration::from_millis(1))
    } else if let Some(s) = value.strip_suffix('s') {
        (s, Duration::from_secs(1))
    } else {
        (value, Duration::from_secs(1))
    };
    let count: u32 = digits.parse().map_err(|_| bad())?;
    unit.checked_mul(count).ok_or_else(bad)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn field(url: &str) -> (&'static str, String) {
        match parse(url).and_then(|b| b.validate().map(|_| ())) {
            Err(Error::InvalidInput { field, message }) => (field, message),
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn full_url_is_understood() {
        let b = parse(
            "etcd://app:s%40cret@10.0.0.1:2379,10.0.0.2:2379/services/billing/?session_ttl=15&request_timeout=1500ms",
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
        let settings = parse("etcd://localhost:2379").unwrap().validate().unwrap();
        assert_eq!(
            settings.layout.namespace(),
            crate::layout::DEFAULT_NAMESPACE
        );
        assert_eq!(settings.endpoints, ["http://localhost:2379"]);
        let settings = parse("ETCD://[::1]:2379/").unwrap().validate().unwrap();
        assert_eq!(settings.endpoints, ["http://[::1]:2379"]);
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
            "etcd://h:1?session_ttl=ten",
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
        assert_eq!(field("etcd://h:1?session_ttl=0").0, "session_ttl");
    }
}
