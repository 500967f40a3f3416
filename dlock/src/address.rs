//! The parts of a `dlock::connect` URL: scheme, credentials, one or more hosts, path, query.
//!
//! One splitter serves every scheme, single-host (`redis://`) and multi-host (`zk://`, `etcd://`,
//! `redlock://`) alike, so that all of them take credentials, hosts and options the same way:
//!
//! ```text
//! scheme://[user[:password]@]host[:port][,host[:port]…][/path][?name=value&…][#fragment]
//! ```
//!
//! The cut is dlock-core's [`Parts`], the one every scheme's parser uses: the credentials end at
//! the last `@` before the first `/`, `?` or `#`; percent-encode those characters (and `@`, `:`)
//! inside a user name or password. The splitter only cuts: each backend's own parser checks
//! hosts, ports and paths.

use dlock_core::url::{redact_password, Parts};
use dlock_core::{Error, Result};

/// A URL cut into its parts; the parts borrow from the input.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Address<'a> {
    /// The scheme, lowercased.
    pub(crate) scheme: String,
    /// `user[:password]`, still percent-encoded, if given.
    pub(crate) userinfo: Option<&'a str>,
    /// The comma-separated host list as written (possibly empty, as in `redis+unix:///path`).
    pub(crate) hosts: &'a str,
    /// The path including its leading `/`, or empty.
    pub(crate) path: &'a str,
    /// The query without its `?`, if given.
    pub(crate) query: Option<&'a str>,
    /// The fragment without its `#`, if given.
    pub(crate) fragment: Option<&'a str>,
    /// The whole URL with the password hidden, to show in errors and `Debug`.
    pub(crate) shown: String,
}

impl<'a> Address<'a> {
    /// Cuts `url` into its parts. Fails only when there is no `scheme://`.
    pub(crate) fn split(url: &'a str) -> Result<Self> {
        let url = url.trim();
        let shown = redact_password(url);
        let parts = Parts::split(url);
        let Some(scheme) = parts.scheme else {
            return Err(Error::invalid(
                "url",
                format!(
                    "{shown:?} has no scheme; expected one of memory://, redis://, rediss://, \
                     redis+unix://, redlock://, zk://, etcd://"
                ),
            ));
        };
        Ok(Address {
            scheme: scheme.to_ascii_lowercase(),
            userinfo: parts.userinfo,
            hosts: parts.hosts,
            path: parts.path,
            query: parts.query,
            fragment: parts.fragment,
            shown,
        })
    }

    /// The URL as the backend's own parser takes it: everything but the query, which the facade
    /// has taken apart itself. (Unused in a build without network backends.)
    #[cfg_attr(
        not(any(feature = "redis", feature = "zk", feature = "etcd")),
        allow(dead_code)
    )]
    pub(crate) fn without_query(&self) -> String {
        let mut url = format!("{}://", self.scheme);
        if let Some(userinfo) = self.userinfo {
            url.push_str(userinfo);
            url.push('@');
        }
        url.push_str(self.hosts);
        url.push_str(self.path);
        if let Some(fragment) = self.fragment {
            url.push('#');
            url.push_str(fragment);
        }
        url
    }

    /// One single-host URL of `scheme` per host, each with the same credentials and path: how a
    /// multi-host scheme such as `redlock://h1,h2,h3/0` becomes one `redis://` URL per server.
    /// Every host must be non-empty.
    pub(crate) fn per_host(&self, scheme: &str) -> Result<Vec<String>> {
        if self.hosts.is_empty() {
            return Err(self.invalid("names no host (expected host:port[,host:port…])"));
        }
        self.hosts
            .split(',')
            .enumerate()
            .map(|(i, host)| {
                let host = host.trim();
                if host.is_empty() {
                    return Err(self.invalid(format!("host #{} is empty", i + 1)));
                }
                let mut url = format!("{scheme}://");
                if let Some(userinfo) = self.userinfo {
                    url.push_str(userinfo);
                    url.push('@');
                }
                url.push_str(host);
                url.push_str(self.path);
                Ok(url)
            })
            .collect()
    }

    /// An [`Error::InvalidInput`] for the field `url`, quoting the URL without its password.
    pub(crate) fn invalid(&self, what: impl std::fmt::Display) -> Error {
        Error::invalid("url", format!("{}: {what}", self.shown))
    }
}

impl std::fmt::Debug for Address<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_host_urls_are_cut_into_parts() {
        let a =
            Address::split("ZK://bob:s%40cret@zk1:2181,zk2:2181/app/locks?prefix=/x#frag").unwrap();
        assert_eq!(a.scheme, "zk");
        assert_eq!(a.userinfo, Some("bob:s%40cret"));
        assert_eq!(a.hosts, "zk1:2181,zk2:2181");
        assert_eq!(a.path, "/app/locks");
        assert_eq!(a.query, Some("prefix=/x"));
        assert_eq!(a.fragment, Some("frag"));
        assert_eq!(
            a.without_query(),
            "zk://bob:s%40cret@zk1:2181,zk2:2181/app/locks#frag"
        );
        assert!(!format!("{a:?}").contains("cret"));
    }

    #[test]
    fn single_host_and_socket_forms() {
        let a = Address::split("redis+unix:///run/redis.sock").unwrap();
        assert_eq!((a.hosts, a.path), ("", "/run/redis.sock"));
        assert_eq!(a.without_query(), "redis+unix:///run/redis.sock");
        let a = Address::split("  memory://  ").unwrap();
        assert_eq!((a.scheme.as_str(), a.hosts, a.path), ("memory", "", ""));
        let a = Address::split("redis://h?ttl=1s&wait=2s").unwrap();
        assert_eq!((a.hosts, a.query), ("h", Some("ttl=1s&wait=2s")));
        assert_eq!(a.without_query(), "redis://h");
    }

    #[test]
    fn per_host_urls_share_credentials_and_path() {
        let a = Address::split("redlock://:pw@h1:6379, h2:6380 ,h3/2?ttl=5s").unwrap();
        assert_eq!(
            a.per_host("redis").unwrap(),
            [
                "redis://:pw@h1:6379/2",
                "redis://:pw@h2:6380/2",
                "redis://:pw@h3/2"
            ]
        );
        let a = Address::split("redlock://h1:6379").unwrap();
        assert_eq!(a.per_host("redis").unwrap(), ["redis://h1:6379"]);
    }

    #[test]
    fn empty_hosts_are_named_and_passwords_hidden() {
        for (url, says) in [
            ("redlock://u:hunter2@h1,,h3", "host #2 is empty"),
            ("redlock://u:hunter2@h1,", "host #2 is empty"),
            ("redlock://u:hunter2@", "names no host"),
            ("redlock:///0", "names no host"),
        ] {
            let a = Address::split(url).unwrap();
            let message = a.per_host("redis").unwrap_err().to_string();
            assert!(message.contains(says), "{url}: {message}");
            assert!(!message.contains("hunter2"), "{message}");
        }
    }

    #[test]
    fn a_missing_scheme_is_an_error_that_hides_the_password() {
        let err = Address::split("u:hunter2@localhost:6379").unwrap_err();
        let message = err.to_string();
        assert!(message.contains("has no scheme"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
    }
}
