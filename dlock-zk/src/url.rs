//! Connection strings: `zk://[user:password@]host1:2181,host2:2181[/chroot]`.
//!
//! Parsed once, before anything is sent, so that a typo is an [`Error::InvalidInput`] naming the
//! field `url` instead of a connection attempt that times out. Credentials are kept out of every
//! `Debug` output and every error message: connection strings end up in logs.

use std::fmt;

use dlock_core::backend::tls::TlsFiles;
use dlock_core::backend::url::{ConnectUrl, Credentials, FromUrl};
use dlock_core::{Error, Result};

use crate::ZkLockBuilder;

/// The scheme of a ZooKeeper connection string.
pub const SCHEME: &str = "zk";

/// The scheme of a ZooKeeper connection string over TLS (the servers' `secureClientPort`).
pub const TLS_SCHEME: &str = "zk+tls";

/// The client port ZooKeeper listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 2181;

/// The secure client port `zk+tls://` assumes unless told otherwise (ZooKeeper's convention for
/// `secureClientPort`).
pub const DEFAULT_TLS_PORT: u16 = 2281;

/// A parsed connection string.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectString {
    servers: Vec<Server>,
    chroot: String,
    credentials: Option<Credentials>,
}

/// One server of the ensemble.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// Client port.
    pub port: u16,
}

impl ConnectString {
    /// Parses `zk://host1:2181,host2:2181/chroot` (the `zk://` is optional, ports default to
    /// 2181, the chroot is optional; `user:password@` before the hosts adds digest credentials,
    /// percent-encoded where they contain `@`, `:` or `/`). Parameters belong on the builder.
    pub fn parse(url: &str) -> Result<Self> {
        let url = url.trim();
        if url.is_empty() {
            return Err(invalid(
                "is empty; expected zk://host:port[,host:port…][/chroot]",
            ));
        }
        let url = if url.contains("://") {
            ConnectUrl::parse(url)?
        } else {
            ConnectUrl::parse(&format!("zk://{url}"))?
        };
        if url.scheme() == TLS_SCHEME {
            return Err(url.invalid(
                "zk+tls:// names its TLS files as parameters: use ZkLockBuilder::from_url, or \
                 zk:// with ZkLockBuilder::with_tls",
            ));
        }
        url.expect_scheme(&[SCHEME])?;
        url.finish(&[])?;
        ConnectString::from_url(&url)
    }

    /// The ensemble an already parsed URL names: its hosts, chroot and digest credentials.
    pub(crate) fn from_url(url: &ConnectUrl) -> Result<Self> {
        if url.fragment().is_some() {
            return Err(url.invalid("fragments are not supported"));
        }
        let credentials = url.credentials().cloned();
        if credentials
            .as_ref()
            .is_some_and(|c| c.user.is_empty() || c.password.is_none())
        {
            return Err(
                url.invalid("credentials before '@' must be user:password (digest authentication)")
            );
        }
        let default_port = if url.scheme() == TLS_SCHEME {
            DEFAULT_TLS_PORT
        } else {
            DEFAULT_PORT
        };
        let servers = url
            .hosts()?
            .into_iter()
            .map(|entry| parse_server(entry, default_port))
            .collect::<Result<Vec<Server>>>()?;
        let chroot = parse_chroot(url.path())?;
        Ok(ConnectString {
            servers,
            chroot,
            credentials,
        })
    }

    /// The servers, in the order given.
    pub fn servers(&self) -> &[Server] {
        &self.servers
    }

    /// The chroot path (`""` for none, otherwise `/a/b`); every node of the backend lives under it.
    pub fn chroot(&self) -> &str {
        &self.chroot
    }

    /// Whether credentials were given.
    pub fn has_credentials(&self) -> bool {
        self.credentials.is_some()
    }

    pub(crate) fn credentials(&self) -> Option<&Credentials> {
        self.credentials.as_ref()
    }

    /// `host:port,host:port` as the client library takes it (without the chroot, which the
    /// backend applies itself so that it can create it).
    pub(crate) fn hosts(&self) -> String {
        self.servers
            .iter()
            .map(|s| {
                if s.host.contains(':') {
                    format!("[{}]:{}", s.host, s.port)
                } else {
                    format!("{}:{}", s.host, s.port)
                }
            })
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl fmt::Debug for ConnectString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectString")
            .field("servers", &self.hosts())
            .field("chroot", &self.chroot)
            .field(
                "credentials",
                &self.credentials.as_ref().map(|c| format!("{}:***", c.user)),
            )
            .finish()
    }
}

fn invalid(message: impl Into<String>) -> Error {
    Error::invalid("url", message)
}

/// A fragment of the input safe to quote in an error: never credentials, never control bytes.
fn printable(fragment: &str) -> String {
    fragment
        .chars()
        .filter(|c| !c.is_control())
        .take(64)
        .collect()
}

fn parse_server(entry: &str, default_port: u16) -> Result<Server> {
    let entry = entry.trim();
    if entry.is_empty() {
        return Err(invalid(
            "a server entry is empty; expected host:port separated by commas",
        ));
    }
    let bracketed = entry.starts_with('[');
    let (host, port) = if let Some(bracketed) = entry.strip_prefix('[') {
        let Some((host, after)) = bracketed.split_once(']') else {
            return Err(invalid(format!(
                "IPv6 address in {:?} lacks its closing ']'",
                printable(entry)
            )));
        };
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or_else(|| {
                invalid(format!(
                    "expected ':port' after the IPv6 address in {:?}",
                    printable(entry)
                ))
            })?),
        };
        if host.is_empty()
            || !host
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return Err(invalid(format!(
                "{:?} is not an IPv6 address",
                printable(host)
            )));
        }
        (host, port)
    } else {
        match entry.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (entry, None),
        }
    };
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && (bracketed
            || host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')));
    if !host_ok {
        return Err(invalid(format!(
            "{:?} is not a host name or IP address",
            printable(host)
        )));
    }
    let port = match port {
        None => default_port,
        Some(p) => match p.parse::<u16>() {
            Ok(port) if port > 0 => port,
            _ => {
                return Err(invalid(format!(
                    "port {:?} of {:?} is not a number from 1 to 65535",
                    printable(p),
                    printable(host)
                )))
            }
        },
    };
    Ok(Server {
        host: host.to_owned(),
        port,
    })
}

/// Checks an absolute ZooKeeper path; `field` names it in errors.
pub(crate) fn check_path(path: &str, field: &'static str) -> Result<()> {
    if !path.starts_with('/') {
        return Err(Error::invalid(
            field,
            format!("{:?} must start with '/'", printable(path)),
        ));
    }
    if path == "/" {
        return Ok(());
    }
    if path.ends_with('/') {
        return Err(Error::invalid(
            field,
            format!("{:?} must not end with '/'", printable(path)),
        ));
    }
    for segment in path.split('/').skip(1) {
        if segment.is_empty() {
            return Err(Error::invalid(
                field,
                format!("{:?} contains an empty segment ('//')", printable(path)),
            ));
        }
        if segment == "." || segment == ".." {
            return Err(Error::invalid(
                field,
                format!("{:?} contains a relative segment", printable(path)),
            ));
        }
        if segment.chars().any(forbidden_in_path) {
            return Err(Error::invalid(
                field,
                format!(
                    "{:?} contains a character ZooKeeper does not allow in paths",
                    printable(path)
                ),
            ));
        }
    }
    Ok(())
}

/// The characters ZooKeeper's `PathUtils.validatePath` rejects (surrogates, which it rejects too,
/// cannot occur in a Rust string).
fn forbidden_in_path(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..='\u{ffff}')
}

fn parse_chroot(path: &str) -> Result<String> {
    if path.is_empty() || path == "/" {
        return Ok(String::new());
    }
    check_path(path, "url")?;
    Ok(path.to_owned())
}

/// `zk://[user:password@]host[:port][,…][/chroot][?parameters]`: the ensemble, then the
/// builder's settings by name; `zk+tls://…?ca=PATH[&cert=PATH&key=PATH]` reaches every server
/// over TLS ([`TlsFiles`]; ports default to 2281).
impl FromUrl for ZkLockBuilder {
    const SCHEMES: &'static [&'static str] = &[SCHEME, TLS_SCHEME];
    const PARAMETERS: &'static [&'static str] = &[
        "prefix",
        "session_timeout",
        "request_timeout",
        "connect_timeout",
        "owner",
        "identifier",
        "naming",
        "ca",
        "cert",
        "key",
    ];

    fn from_connect_url(url: &mut ConnectUrl) -> Result<Self> {
        let builder = ZkLockBuilder::for_ensemble(ConnectString::from_url(url)?);
        let builder = dlock_core::backend::apply_parameters!(url, builder, {
            "prefix" => take_text => Self::with_prefix,
            "session_timeout" => take_duration => Self::with_session_timeout,
            "request_timeout" => take_duration => Self::with_request_timeout,
            "connect_timeout" => take_duration => Self::with_connect_timeout,
            // The earlier name first, so that `owner=` wins where a URL has both.
            "identifier" => take_text => Self::with_identifier,
            "owner" => take_text => Self::with_owner,
        });
        let builder = match url.take("naming") {
            Some(naming) => builder.with_naming(naming.parse()?),
            None => builder,
        };
        let tls = tls_of(url)?;
        Ok(match tls {
            Some(tls) => builder.with_tls(tls),
            None => builder,
        })
    }
}

/// The TLS settings of `zk+tls://`, from the parameters every backend names alike
/// ([`TlsFiles::from_url`]; the builder checks them). They are refused on `zk://` rather than
/// ignored, since the connection would be plaintext; `zk+tls://` needs at least `ca`.
fn tls_of(url: &mut ConnectUrl) -> Result<Option<TlsFiles>> {
    let files = TlsFiles::from_url(url)?;
    if url.scheme() != TLS_SCHEME {
        return match files {
            None => Ok(None),
            Some(_) => Err(url.invalid(
                "`ca`, `cert` and `key` are TLS settings: use zk+tls://host:2281 for TLS",
            )),
        };
    }
    match files {
        Some(files) if files.ca.is_some() => Ok(Some(files)),
        _ => Err(url.invalid(
            "zk+tls:// needs `ca=PATH`, the authority the servers' certificates are checked against",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(result: Result<ConnectString>) -> (&'static str, String) {
        match result {
            Err(Error::InvalidInput { field, message }) => (field, message),
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    #[test]
    fn full_form() {
        let cs = ConnectString::parse("zk://zk1:2181,zk2:2182,10.0.0.3/app/locks").unwrap();
        assert_eq!(cs.hosts(), "zk1:2181,zk2:2182,10.0.0.3:2181");
        assert_eq!(cs.chroot(), "/app/locks");
        assert!(!cs.has_credentials());
    }

    #[test]
    fn bare_form_and_defaults() {
        let cs = ConnectString::parse("127.0.0.1:2181").unwrap();
        assert_eq!(cs.hosts(), "127.0.0.1:2181");
        assert_eq!(cs.chroot(), "");
        let cs = ConnectString::parse("ZK://localhost/").unwrap();
        assert_eq!(cs.hosts(), "localhost:2181");
        assert_eq!(cs.chroot(), "");
        let cs = ConnectString::parse("zk://[::1]:2181,[fe80::1]").unwrap();
        assert_eq!(cs.hosts(), "[::1]:2181,[fe80::1]:2181");
    }

    #[test]
    fn credentials_never_show() {
        let cs = ConnectString::parse("zk://alice:s%40cret@zk1:2181/x").unwrap();
        let creds = cs.credentials().unwrap();
        assert_eq!(creds.user, "alice");
        assert_eq!(creds.password.as_deref(), Some("s@cret"));
        let shown = format!("{cs:?}");
        assert!(
            !shown.contains("s@cret") && !shown.contains("s%40cret"),
            "{shown}"
        );
        assert!(shown.contains("alice:***"), "{shown}");
    }

    #[test]
    fn errors_name_the_url_and_hide_secrets() {
        let cases = [
            "",
            "http://zk1:2181",
            "zk://",
            "zk://zk1:2181,",
            "zk://zk1:0",
            "zk://zk1:65536",
            "zk://zk1:port",
            "zk://zk 1:2181",
            "zk://zk1:2181//a",
            "zk://zk1:2181/a/",
            "zk://zk1:2181/a/../b",
            "zk://zk1:2181/a?session=1",
            "zk://[::1:2181",
            "zk://nopassword@zk1",
            "zk://:secret@zk1",
            "zk://user:hunter2@zk1:99999",
        ];
        for url in cases {
            let (f, message) = field(ConnectString::parse(url));
            assert_eq!(f, "url", "{url}");
            assert!(!message.contains("hunter2"), "{message}");
            assert!(!message.contains("secret"), "{message}");
        }
    }

    #[test]
    fn the_plain_parser_points_tls_urls_to_from_url() {
        let (f, message) = field(ConnectString::parse("zk+tls://zk1:2281?ca=/ca.pem"));
        assert_eq!(f, "url");
        assert!(message.contains("ZkLockBuilder::from_url"), "{message}");
    }

    #[test]
    fn owner_and_its_earlier_name_set_the_records_label() {
        let label = |url: &str| {
            let config = ZkLockBuilder::from_url(url).unwrap().config().unwrap();
            config.owner.label().map(str::to_owned)
        };
        assert_eq!(label("zk://zk1"), None);
        assert_eq!(label("zk://zk1?owner=billing").as_deref(), Some("billing"));
        assert_eq!(
            label("zk://zk1?identifier=me%40host").as_deref(),
            Some("me@host")
        );
        assert_eq!(
            label("zk://zk1?identifier=old&owner=new").as_deref(),
            Some("new")
        );
        match ZkLockBuilder::from_url("zk://zk1?owner=").map(ZkLockBuilder::config) {
            Ok(Err(Error::InvalidInput { field, .. })) | Err(Error::InvalidInput { field, .. }) => {
                assert_eq!(field, "owner")
            }
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    #[test]
    fn tls_urls_take_their_files_and_default_to_port_2281() {
        let b = ZkLockBuilder::from_url(
            "zk+tls://app:hunter2@zk1,zk2:3281/app?ca=/etc/zk/ca.pem&cert=/etc/zk/c.pem&key=/etc/zk/k.pem",
        )
        .unwrap();
        let shown = format!("{b:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        for part in [
            "zk1:2281",
            "zk2:3281",
            "/etc/zk/ca.pem",
            "/etc/zk/c.pem",
            "/etc/zk/k.pem",
        ] {
            assert!(shown.contains(part), "{part}: {shown}");
        }
        let b = ZkLockBuilder::from_url("zk+tls://zk1?ca=/ca.pem").unwrap();
        assert!(format!("{b:?}").contains("/ca.pem"));
        let b = ZkLockBuilder::from_url("zk://zk1").unwrap();
        assert!(format!("{b:?}").contains("zk1:2181"));

        for (url, says) in [
            ("zk+tls://u:hunter2@zk1", "needs `ca=PATH`"),
            ("zk://u:hunter2@zk1?ca=/a", "use zk+tls://"),
            ("zk+tls://u:hunter2@zk1?ca=", "the path is empty"),
        ] {
            match ZkLockBuilder::from_url(url) {
                Err(Error::InvalidInput { field, message }) => {
                    assert_eq!(field, "url", "{url}");
                    assert!(message.contains(says), "{url}: {message}");
                    assert!(!message.contains("hunter2"), "{message}");
                }
                other => panic!("{url}: expected InvalidInput, got {other:?}"),
            }
        }
        // What the client can do with the files is checked before connecting.
        for (url, setting) in [
            ("zk+tls://u:hunter2@zk1?ca=/a&cert=/c", "key"),
            ("zk+tls://u:hunter2@zk1?ca=/a&key=/k", "cert"),
            (
                "zk+tls://u:hunter2@zk1?ca=/a&tls_server_name=x",
                "tls_server_name",
            ),
        ] {
            match ZkLockBuilder::from_url(url).and_then(|b| b.config().map(drop)) {
                Err(Error::InvalidInput { field, message }) => {
                    assert_eq!(field, setting, "{url}: {message}");
                    assert!(!message.contains("hunter2"), "{message}");
                }
                other => panic!("{url}: expected InvalidInput, got {other:?}"),
            }
        }
    }

    #[test]
    fn paths_follow_zookeeper_rules() {
        assert!(check_path("/dlock", "prefix").is_ok());
        assert!(check_path("/a/b-c/d.e", "prefix").is_ok());
        for bad in ["dlock", "/a/", "//", "/a//b", "/a/./b", "/a\u{1}b"] {
            assert!(check_path(bad, "prefix").is_err(), "{bad:?}");
        }
    }
}
