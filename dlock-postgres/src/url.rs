//! The connection string of a PostgreSQL lock client, validated before anything is sent:
//! `postgres://[user[:password]@]host[:port][,host[:port]…][/database][?parameters]` (also
//! `postgresql://`), with the parameters listed in [the builder's module](crate::builder).

use dlock_core::backend::url::{ConnectUrl, FromUrl};
use dlock_core::Result;

use crate::builder::{PgLockBuilder, DEFAULT_PORT, SCHEMES};
use crate::tls::SslMode;

impl FromUrl for PgLockBuilder {
    const SCHEMES: &'static [&'static str] = SCHEMES;
    const PARAMETERS: &'static [&'static str] = &[
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "session_timeout",
        "request_timeout",
        "connect_timeout",
        "application_name",
        "owner",
        "waiting_connections",
    ];

    fn from_connect_url(url: &mut ConnectUrl) -> Result<Self> {
        if url.fragment().is_some() {
            return Err(url.invalid("fragments are not supported"));
        }
        let mut builder = PgLockBuilder::new();
        if let Some(credentials) = url.credentials() {
            if credentials.user.is_empty() {
                return Err(url.invalid("the user name is empty"));
            }
            builder =
                builder.with_credentials(credentials.user.clone(), credentials.password.clone());
        }
        for host in url.hosts()? {
            let (name, port) = split_host(host).map_err(|m| url.invalid(m))?;
            builder = builder.with_host(name, port);
        }
        let database = url.path_decoded()?;
        if database.contains('/') {
            return Err(url.invalid("the path is one database name"));
        }
        if !database.is_empty() {
            builder = builder.with_database(database);
        }
        if let Some(mode) = url.take_parsed::<SslModeText>("sslmode", "an sslmode")? {
            builder = builder.with_ssl_mode(mode.0);
        }
        builder.tls.files.ca = url.take_path("sslrootcert")?;
        builder.tls.files.cert = url.take_path("sslcert")?;
        builder.tls.files.key = url.take_path("sslkey")?;
        let builder = dlock_core::backend::apply_parameters!(url, builder, {
            "session_timeout" => take_duration => Self::with_session_timeout,
            "request_timeout" => take_duration => Self::with_request_timeout,
            "connect_timeout" => take_duration => Self::with_connect_timeout,
            "application_name" => take_text => Self::with_application_name,
            "owner" => take_text => Self::with_owner,
            "waiting_connections" => take_count => Self::with_waiting_connections,
        });
        Ok(builder)
    }
}

/// `sslmode` through `take_parsed`, whose error names the expected form.
struct SslModeText(SslMode);

impl std::str::FromStr for SslModeText {
    type Err = String;
    fn from_str(text: &str) -> std::result::Result<Self, String> {
        text.parse().map(SslModeText)
    }
}

/// `host`, `host:port` or `[v6]:port`.
fn split_host(host: &str) -> std::result::Result<(String, u16), String> {
    let (name, port) = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((name, "")) => (name, None),
            Some((name, port)) => match port.strip_prefix(':') {
                Some(port) => (name, Some(port)),
                None => return Err(format!("{host:?} is not host[:port]")),
            },
            None => return Err(format!("{host:?} is not host[:port]")),
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        },
    };
    let port = match port {
        None => DEFAULT_PORT,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{port:?} is not a port"))?,
    };
    if name.is_empty() {
        return Err(format!("{host:?} names no host"));
    }
    Ok((name.to_string(), port))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use dlock_core::Error;

    use super::*;
    use crate::builder::DEFAULT_WAITING_CONNECTIONS;

    fn field(url: &str) -> &'static str {
        match PgLockBuilder::from_url(url).and_then(|b| b.validate().map(|_| ())) {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn a_full_url_is_understood_and_hides_its_password() {
        let b = PgLockBuilder::from_url(
            "postgresql://app:s%40cret@db1:6543,db2/billing?sslmode=require&session_timeout=3s&owner=billing&waiting_connections=0",
        )
        .unwrap();
        let shown = format!("{b:?}");
        assert!(
            !shown.contains("s@cret") && !shown.contains("s%40cret"),
            "{shown}"
        );
        let s = b.validate().unwrap();
        assert_eq!(
            s.hosts,
            [("db1".to_string(), 6543), ("db2".to_string(), 5432)]
        );
        assert_eq!((s.user.as_str(), s.database.as_str()), ("app", "billing"));
        assert_eq!(s.password.unwrap().0, "s@cret");
        assert_eq!(s.tls.mode, SslMode::Require);
        assert_eq!(s.session_timeout, Duration::from_secs(3));
        assert_eq!(s.owner.label(), Some("billing"));
        assert_eq!(s.waiting_connections, 0);
    }

    #[test]
    fn bad_urls_name_the_setting() {
        assert_eq!(field("postgres://h?sslmode=verify-full"), "sslrootcert");
        assert_eq!(
            field("postgres://h?sslmode=disable&sslrootcert=/ca.pem"),
            "sslmode"
        );
        assert_eq!(field("postgres://h?sslcert=/c.pem"), "sslkey");
        assert_eq!(
            field("postgres://h?session_timeout=100ms"),
            "session_timeout"
        );
        assert_eq!(
            field("postgres://h?waiting_connections=65"),
            "waiting_connections"
        );
        assert_eq!(field("postgres://h?waiting_connections=-1"), "url");
        assert_eq!(field("postgres://h?sslmode=allow"), "url");
        assert_eq!(field("postgres://h:0"), "url");
        assert_eq!(field("postgres://h?statement_timeout=1s"), "url");
        assert_eq!(field("postgres://h/a/b"), "url");
    }

    #[test]
    fn defaults_follow_libpq() {
        let s = PgLockBuilder::from_url("postgres://").err();
        assert!(s.is_some(), "a URL without a host is refused");
        let s = PgLockBuilder::from_url("postgres://[::1]")
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(s.hosts, [("::1".to_string(), 5432)]);
        assert_eq!(
            (s.user.as_str(), s.database.as_str()),
            ("postgres", "postgres")
        );
        assert_eq!(s.tls.mode, SslMode::Prefer);
        assert_eq!(s.waiting_connections, DEFAULT_WAITING_CONNECTIONS);
    }
}
