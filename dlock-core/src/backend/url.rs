//! Connection strings: one type, [`ConnectUrl`], that every backend reads its schemes and
//! parameters from, so that all of them cut, decode, check and hide the same way.
//!
//! ```text
//! scheme://[user[:password]@]host[:port][,host[:port]…][/path][?name=value&…][#fragment]
//! ```
//!
//! Connection strings end up in logs, error messages and `Debug` output, and they often carry a
//! password; [`redact_password`] is the one way dlock shows them. Credentials inside them are
//! percent-encoded when they contain `@`, `:` or `/`; [`percent_decode`] undoes that strictly, so
//! a typo such as `%zz` is an error rather than a silently different password. Durations in
//! parameters have one grammar, [`parse_duration`].

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::{Error, Result};

/// A connection string, checked and decoded: the scheme, the credentials, the hosts, the path and
/// the query parameters, which its backend takes one by one ([`ConnectUrl::take`] and friends)
/// before [`ConnectUrl::finish`] refuses whatever it did not take.
///
/// Every error is an [`Error::InvalidInput`] for the field `url` that quotes the string without
/// its password and says which part is at fault; `Debug` shows the same redacted string.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::backend::url::ConnectUrl;
///
/// let mut url = ConnectUrl::parse("etcd+https://app:s%40cret@h1:2379,h2:2379/ns?request_timeout=2s")?;
/// assert_eq!(url.scheme(), "etcd+https");
/// assert_eq!(url.hosts()?, ["h1:2379", "h2:2379"]);
/// assert_eq!(url.credentials().map(|c| c.user.as_str()), Some("app"));
/// assert_eq!(url.take_duration("request_timeout")?, Some(Duration::from_secs(2)));
/// url.finish(&["request_timeout"])?;
/// assert!(!format!("{url:?}").contains("cret"));
/// # Ok::<(), dlock_core::Error>(())
/// ```
pub struct ConnectUrl {
    scheme: String,
    credentials: Option<Credentials>,
    userinfo: Option<String>,
    hosts: String,
    path: String,
    fragment: Option<String>,
    /// Decoded `(name, value)` pairs not taken yet, in the order written.
    params: Vec<(String, String)>,
    shown: String,
}

impl ConnectUrl {
    /// Cuts and decodes `url`: a scheme is required (lowercased here); credentials and parameters
    /// are percent-decoded strictly; a parameter given twice is refused.
    pub fn parse(url: &str) -> Result<Self> {
        let url = url.trim();
        let shown = redact_password(url);
        let invalid = |what: String| Error::invalid("url", format!("{shown}: {what}"));
        let parts = Parts::split(url);
        let scheme = parts
            .scheme
            .filter(|s| !s.is_empty())
            .ok_or_else(|| invalid("has no scheme (expected scheme://…)".into()))?
            .to_ascii_lowercase();
        let credentials = parts
            .userinfo
            .map(|info| Credentials::decode(info).map_err(|e| invalid(e.into())))
            .transpose()?;
        let mut params: Vec<(String, String)> = Vec::new();
        for pair in parts.query.unwrap_or("").split('&') {
            if pair.is_empty() {
                continue;
            }
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let name = percent_decode(name)
                .ok_or_else(|| invalid("a parameter name is not valid percent-encoding".into()))?;
            let value = percent_decode(value).ok_or_else(|| {
                invalid(format!(
                    "parameter `{name}`: the value is not valid percent-encoding"
                ))
            })?;
            if params.iter().any(|(seen, _)| *seen == name) {
                return Err(invalid(format!("parameter `{name}` is given twice")));
            }
            params.push((name, value));
        }
        Ok(ConnectUrl {
            scheme,
            credentials,
            userinfo: parts.userinfo.map(str::to_owned),
            hosts: parts.hosts.to_owned(),
            path: parts.path.to_owned(),
            fragment: parts.fragment.map(str::to_owned),
            params,
            shown,
        })
    }

    /// The scheme, lowercased (`redis`, `etcd+https`, …).
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The decoded user name and password, if the string has `user[:password]@`.
    pub fn credentials(&self) -> Option<&Credentials> {
        self.credentials.as_ref()
    }

    /// The hosts as written (`host[:port]`, trimmed), at least one and none empty.
    pub fn hosts(&self) -> Result<Vec<&str>> {
        if self.hosts.trim().is_empty() {
            return Err(self.invalid("names no host (expected host:port[,host:port…])"));
        }
        self.hosts
            .split(',')
            .enumerate()
            .map(|(i, host)| match host.trim() {
                "" => Err(self.invalid(format!("host #{} is empty", i + 1))),
                host => Ok(host),
            })
            .collect()
    }

    /// Whether the string names any host (`redis+unix:///path` names none).
    pub fn has_hosts(&self) -> bool {
        !self.hosts.is_empty()
    }

    /// The path as written, including its leading `/`, or empty.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The path without its leading `/`, percent-decoded (empty when there is none).
    pub fn path_decoded(&self) -> Result<String> {
        percent_decode(self.path.strip_prefix('/').unwrap_or(&self.path))
            .ok_or_else(|| self.invalid("the path is not valid percent-encoding"))
    }

    /// The fragment without its `#`, if given.
    pub fn fragment(&self) -> Option<&str> {
        self.fragment.as_deref()
    }

    /// The string without its query, credentials still encoded: for a client library that takes
    /// the address part as a URL of its own.
    pub fn without_query(&self) -> String {
        let mut url = format!("{}://", self.scheme);
        if let Some(userinfo) = &self.userinfo {
            url.push_str(userinfo);
            url.push('@');
        }
        url.push_str(&self.hosts);
        url.push_str(&self.path);
        if let Some(fragment) = &self.fragment {
            url.push('#');
            url.push_str(fragment);
        }
        url
    }

    /// One single-host URL of `scheme` per host, each with the same credentials and path: how a
    /// multi-host string such as `redlock://h1,h2,h3/0` becomes one `redis://` URL per server.
    pub fn per_host(&self, scheme: &str) -> Result<Vec<String>> {
        Ok(self
            .hosts()?
            .into_iter()
            .map(|host| {
                let mut url = format!("{scheme}://");
                if let Some(userinfo) = &self.userinfo {
                    url.push_str(userinfo);
                    url.push('@');
                }
                url.push_str(host);
                url.push_str(&self.path);
                url
            })
            .collect())
    }

    /// Takes the parameter `name`'s decoded value, if given.
    pub fn take(&mut self, name: &str) -> Option<String> {
        let i = self.params.iter().position(|(n, _)| n == name)?;
        Some(self.params.remove(i).1)
    }

    /// Takes `name` as a duration in the one grammar of [`parse_duration`].
    pub fn take_duration(&mut self, name: &str) -> Result<Option<Duration>> {
        self.take(name)
            .map(|v| {
                parse_duration(&v).map_err(|e| self.invalid(format!("parameter `{name}`: {e}")))
            })
            .transpose()
    }

    /// Takes `name` parsed as a `T`; `expected` says what a valid value looks like, for the error.
    pub fn take_parsed<T: FromStr>(&mut self, name: &str, expected: &str) -> Result<Option<T>> {
        self.take(name)
            .map(|v| {
                v.trim().parse().map_err(|_| {
                    self.invalid(format!("parameter `{name}`: {v:?} is not {expected}"))
                })
            })
            .transpose()
    }

    /// Takes `name` as a whole number (a count such as a quorum or a number of replicas).
    pub fn take_count(&mut self, name: &str) -> Result<Option<usize>> {
        self.take_parsed(name, "a whole number")
    }

    /// Takes `name` as `true`/`false` (also `on`/`off`, `1`/`0`).
    pub fn take_bool(&mut self, name: &str) -> Result<Option<bool>> {
        self.take(name)
            .map(|v| match v.trim() {
                "true" | "on" | "1" => Ok(true),
                "false" | "off" | "0" => Ok(false),
                other => Err(self.invalid(format!(
                    "parameter `{name}`: {other:?} is not one of true, false, on, off"
                ))),
            })
            .transpose()
    }

    /// Takes `name` as a file path, which must not be empty (whether the file exists and what it
    /// holds is the backend's to check, without ever quoting its contents).
    pub fn take_path(&mut self, name: &str) -> Result<Option<PathBuf>> {
        match self.take(name) {
            Some(v) if v.trim().is_empty() => {
                Err(self.invalid(format!("parameter `{name}`: the path is empty")))
            }
            v => Ok(v.map(PathBuf::from)),
        }
    }

    /// Reads parameter `name` with `read` (one of the `take_*` methods) and, if it was given,
    /// applies it to `builder` with `set`. Backends list theirs with [`apply_parameters!`](crate::apply_parameters).
    pub fn apply<B, T>(
        &mut self,
        builder: B,
        name: &str,
        read: fn(&mut Self, &str) -> Result<Option<T>>,
        set: fn(B, T) -> B,
    ) -> Result<B> {
        Ok(match read(self, name)? {
            Some(value) => set(builder, value),
            None => builder,
        })
    }

    /// Takes `name` as text (for [`ConnectUrl::apply`]; never fails).
    pub fn take_text(&mut self, name: &str) -> Result<Option<String>> {
        Ok(self.take(name))
    }

    /// Checks that every parameter was taken: one left over is unknown to this scheme, and the
    /// error lists the `known` ones, or names the new name of a [renamed](RENAMED) one.
    pub fn finish(&self, known: &[&str]) -> Result<()> {
        let Some((name, _)) = self.params.first() else {
            return Ok(());
        };
        let renamed = RENAMED
            .iter()
            .find(|(old, new)| old == name && known.contains(new));
        Err(self.invalid(match renamed {
            Some((old, new)) => format!(
                "parameter `{old}` was renamed `{new}` for {}:// (see the changelog)",
                self.scheme
            ),
            None => format!(
                "unknown parameter `{name}` for {}:// (known: {})",
                self.scheme,
                known.join(", ")
            ),
        }))
    }

    /// Fails unless the scheme is one of `schemes`, naming them.
    pub fn expect_scheme(&self, schemes: &[&str]) -> Result<()> {
        if schemes.contains(&self.scheme.as_str()) {
            return Ok(());
        }
        let expected: Vec<String> = schemes.iter().map(|s| format!("{s}://")).collect();
        Err(self.invalid(format!(
            "unsupported scheme {:?}; expected {}",
            self.scheme,
            expected.join(", ")
        )))
    }

    /// The string with its password hidden: what errors, logs and `Debug` show.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// An [`Error::InvalidInput`] for the field `url`, quoting the string without its password.
    pub fn invalid(&self, what: impl std::fmt::Display) -> Error {
        Error::invalid("url", format!("{}: {what}", self.shown))
    }
}

/// Shows the string with its password hidden.
impl std::fmt::Debug for ConnectUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

/// A backend's builder made from a connection string. Each backend owns its schemes and
/// parameters (as sqlx's drivers do); the `dlock` facade only maps a scheme to the backend that
/// serves it, takes the per-acquire parameters itself, and passes the rest on.
pub trait FromUrl: Sized {
    /// The schemes this backend serves, lowercase (`etcd`, `etcd+https`, …).
    const SCHEMES: &'static [&'static str];
    /// The parameters it takes, in the order the table in `docs/urls.md` lists them.
    const PARAMETERS: &'static [&'static str];

    /// Makes the builder from `url`, whose scheme is one of [`FromUrl::SCHEMES`], taking the
    /// parameters it knows and leaving any other for [`ConnectUrl::finish`]. Nothing is sent.
    fn from_connect_url(url: &mut ConnectUrl) -> Result<Self>;

    /// Parses `url`, refuses a scheme that is not this backend's and a parameter it does not
    /// know, and makes the builder.
    fn from_url(url: &str) -> Result<Self> {
        let mut url = ConnectUrl::parse(url)?;
        url.expect_scheme(Self::SCHEMES)?;
        let builder = Self::from_connect_url(&mut url)?;
        url.finish(Self::PARAMETERS)?;
        Ok(builder)
    }
}

/// Applies a backend's URL parameters to its builder, one line each: the name, how to read the
/// value (a `take_*` method of [`ConnectUrl`]) and the builder's setter. Evaluates to the builder;
/// returns early with the first bad value's error.
///
/// ```text
/// let builder = dlock_core::backend::apply_parameters!(url, RedisLockBuilder::new(address), {
///     "prefix" => take_text => Self::with_prefix,
///     "request_timeout" => take_duration => Self::with_request_timeout,
/// });
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! apply_parameters {
    ($url:expr, $builder:expr, { $($name:literal => $read:ident => $set:path),* $(,)? }) => {{
        let builder = $builder;
        $( let builder = $url.apply(builder, $name, $crate::backend::url::ConnectUrl::$read, $set)?; )*
        builder
    }};
}

/// Query parameters renamed since the first release, as (old, new): an old name is refused with
/// an error that names the new one, wherever the scheme knows the new one. CHANGELOG.md lists
/// them with the release that renamed them.
pub const RENAMED: &[(&str, &str)] = &[
    ("session_ttl", "session_timeout"),
    ("node_timeout", "request_timeout"),
    ("operation_timeout", "request_timeout"),
];

/// Parses a duration such as `500ms`, `30s`, `2m` or `1h 30m`: the one grammar of every
/// duration in a connection string and on the command line. Units are required, except for a
/// plain `0`.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::backend::url::parse_duration;
///
/// assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
/// assert!(parse_duration("10").is_err());
/// ```
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration such as 500ms, 30s or 2m ({e})"))
}

/// A connection string cut into its parts (not yet decoded), the same way for every scheme:
///
/// ```text
/// [scheme://][user[:password]@]host[:port][,host[:port]…][/path][?query][#fragment]
/// ```
///
/// Following RFC 3986, the credentials end at the last `@` before the first `/`, `?` or `#`. The
/// cut only cuts: each scheme's parser checks the parts it takes and refuses the others.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Parts<'a> {
    /// The scheme as written, if the string has a `://`.
    pub scheme: Option<&'a str>,
    /// `user[:password]`, still percent-encoded, if given.
    pub userinfo: Option<&'a str>,
    /// The comma-separated host list as written (possibly empty).
    pub hosts: &'a str,
    /// The path including its leading `/`, or empty.
    pub path: &'a str,
    /// The query without its `?`, if given.
    pub query: Option<&'a str>,
    /// The fragment without its `#`, if given.
    pub fragment: Option<&'a str>,
}

impl<'a> Parts<'a> {
    /// Cuts `url` into its parts.
    ///
    /// ```
    /// use dlock_core::backend::url::Parts;
    ///
    /// let parts = Parts::split("etcd://u:p@h1:2379,h2:2379/ns/?session_ttl=5s");
    /// assert_eq!(parts.scheme, Some("etcd"));
    /// assert_eq!(parts.userinfo, Some("u:p"));
    /// assert_eq!(parts.hosts, "h1:2379,h2:2379");
    /// assert_eq!(parts.path, "/ns/");
    /// assert_eq!(parts.query, Some("session_ttl=5s"));
    /// ```
    pub fn split(url: &'a str) -> Self {
        let (scheme, rest) = match url.split_once("://") {
            Some((scheme, rest)) => (Some(scheme), rest),
            None => (None, url),
        };
        let (rest, fragment) = match rest.split_once('#') {
            Some((rest, fragment)) => (rest, Some(fragment)),
            None => (rest, None),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        Parts {
            scheme,
            userinfo,
            hosts,
            path,
            query,
            fragment,
        }
    }
}

/// A user name and, if one was given, a password, decoded from `user[:password]`.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name; empty in `:password@`, Redis's form for a password without a user (a
    /// backend that needs a user checks it).
    pub user: String,
    /// The password, if the credentials have a `:`.
    pub password: Option<String>,
}

impl Credentials {
    /// Decodes `user[:password]`, each part percent-decoded strictly ([`percent_decode`]).
    /// Fails with what is wrong, to be put in the caller's error (it never quotes the password).
    ///
    /// ```
    /// use dlock_core::backend::url::Credentials;
    ///
    /// let c = Credentials::decode("app:s%40cret").unwrap();
    /// assert_eq!((c.user.as_str(), c.password.as_deref()), ("app", Some("s@cret")));
    /// assert_eq!(Credentials::decode(":secret").unwrap().user, "");
    /// assert!(Credentials::decode("app:%zz").is_err());
    /// ```
    pub fn decode(userinfo: &str) -> Result<Self, &'static str> {
        let (user, password) = match userinfo.split_once(':') {
            Some((user, password)) => (user, Some(password)),
            None => (userinfo, None),
        };
        let user =
            percent_decode(user).ok_or("the user name is not valid percent-encoded UTF-8")?;
        let password = password
            .map(|p| percent_decode(p).ok_or("the password is not valid percent-encoded UTF-8"))
            .transpose()?;
        Ok(Credentials { user, password })
    }
}

/// Never shows the password: the user info keeps only its user name.
impl std::fmt::Debug for Parts<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let userinfo = self.userinfo.map(|info| match info.split_once(':') {
            Some((user, _)) => format!("{user}:***"),
            None => info.to_owned(),
        });
        f.debug_struct("Parts")
            .field("scheme", &self.scheme)
            .field("userinfo", &userinfo)
            .field("hosts", &self.hosts)
            .field("path", &self.path)
            .field("query", &self.query)
            .field("fragment", &self.fragment)
            .finish()
    }
}

/// Never shows the password.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// Percent-decodes `s` strictly: `None` if an escape is not `%` followed by two hex digits, or if
/// the decoded bytes are not UTF-8. A `+` stays a `+` (this is not form encoding).
///
/// ```
/// use dlock_core::backend::url::percent_decode;
///
/// assert_eq!(percent_decode("s%40cret").as_deref(), Some("s@cret"));
/// assert_eq!(percent_decode("%zz"), None);
/// ```
pub fn percent_decode(s: &str) -> Option<String> {
    // percent-encoding passes a malformed escape through as it is; dlock refuses it instead.
    let mut escapes = s.split('%').skip(1);
    if !escapes.all(|after| {
        after
            .get(..2)
            .is_some_and(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
    }) {
        return None;
    }
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|decoded| decoded.into_owned())
}

/// Percent-encodes what would end or change a query value (`%`, `&`, `#`, `=`, `+`, space and
/// control characters) and every byte outside ASCII, so that [`percent_decode`] gives `s` back.
///
/// ```
/// use dlock_core::backend::url::{percent_decode, percent_encode};
///
/// let path = "/etc/certs/a&b #1.pem";
/// assert_eq!(percent_decode(&percent_encode(path)).as_deref(), Some(path));
/// ```
pub fn percent_encode(s: &str) -> String {
    /// What would end or change a query value; bytes outside ASCII are always encoded.
    const QUERY_VALUE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
        .add(b'%')
        .add(b'&')
        .add(b'#')
        .add(b'=')
        .add(b'+')
        .add(b' ');
    percent_encoding::utf8_percent_encode(s, QUERY_VALUE).to_string()
}

/// The connection string `url` with the password of its `user:password@` part replaced by
/// `***`, for errors, logs and `Debug`.
///
/// It errs on the side of hiding: everything up to the **last** `@` counts as credentials (a
/// password may contain unencoded `/`, `?` or `#` when typed by hand), so an `@` later in a path
/// or a query hides the hosts too, but a password never shows. A string without `@` is returned
/// unchanged; one without `://` is treated as starting with its credentials.
///
/// ```
/// use dlock_core::backend::url::redact_password;
///
/// assert_eq!(redact_password("redis://app:hunter2@h:6379/1"), "redis://app:***@h:6379/1");
/// assert_eq!(redact_password("zk://h1:2181,h2:2181/app"), "zk://h1:2181,h2:2181/app");
/// ```
pub fn redact_password(url: &str) -> String {
    hide_password_parameters(&redact_userinfo(url))
}

fn redact_userinfo(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let Some((userinfo, after)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}{user}:***@{after}"),
        None => format!("{scheme}{userinfo}@{after}"),
    }
}

/// Replaces the value of every query parameter whose name ends in `password` (such as Redis
/// Sentinel's `sentinel_password`) with `***`.
fn hide_password_parameters(url: &str) -> String {
    let Some((head, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let (query, fragment) = match query.split_once('#') {
        Some((query, fragment)) => (query, Some(fragment)),
        None => (query, None),
    };
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((name, _)) if name.to_ascii_lowercase().ends_with("password") => {
                format!("{name}=***")
            }
            _ => param.to_owned(),
        })
        .collect();
    let fragment = fragment.map_or(String::new(), |f| format!("#{f}"));
    format!("{head}?{}{fragment}", params.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Whatever a value holds (a path, a password, non-ASCII), encoding then decoding gives
        /// it back, and the encoded form holds nothing that would end or change a query value.
        #[test]
        fn encoding_round_trips(s in "\\PC*|[%&#=+ \u{0}-\u{1f}é€]*") {
            let encoded = percent_encode(&s);
            proptest::prop_assert!(!encoded.contains(['&', '#', '=', '+', ' ']), "{}", encoded);
            proptest::prop_assert_eq!(percent_decode(&encoded), Some(s));
        }
    }

    #[test]
    fn decoding_refuses_malformed_escapes_and_bytes_that_are_not_utf8() {
        assert_eq!(percent_decode("s%40cret%2Fx").as_deref(), Some("s@cret/x"));
        assert_eq!(percent_decode("a+b").as_deref(), Some("a+b"));
        for bad in ["%", "%4", "%zz", "a%%41", "%4g", "50%", "%ff"] {
            assert_eq!(percent_decode(bad), None, "{bad:?}");
        }
    }

    fn message(url: &str) -> String {
        let result = ConnectUrl::parse(url).and_then(|mut u| {
            u.take_duration("ttl")?;
            u.take_parsed::<f64>("factor", "a number")?;
            u.take_bool("fencing")?;
            u.take_path("ca")?;
            u.finish(&["ttl", "factor", "fencing", "ca"])
        });
        match result {
            Err(Error::InvalidInput {
                field: "url",
                message,
            }) => message,
            other => panic!("{url}: expected InvalidInput(url), got {other:?}"),
        }
    }

    #[test]
    fn urls_are_cut_decoded_and_shown_without_the_password() {
        let mut u =
            ConnectUrl::parse(" ZK://bob:s%40cret@zk1:2181, zk2:2181 /app/locks?prefix=%2Fx#frag ")
                .unwrap();
        assert_eq!(u.scheme(), "zk");
        let credentials = u.credentials().unwrap();
        assert_eq!(credentials.user, "bob");
        assert_eq!(credentials.password.as_deref(), Some("s@cret"));
        assert_eq!(u.hosts().unwrap(), ["zk1:2181", "zk2:2181"]);
        assert_eq!(u.path(), "/app/locks");
        assert_eq!(u.fragment(), Some("frag"));
        assert_eq!(u.take("prefix").as_deref(), Some("/x"));
        assert_eq!(u.take("prefix"), None);
        u.finish(&[]).unwrap();
        assert_eq!(
            u.without_query(),
            "zk://bob:s%40cret@zk1:2181, zk2:2181 /app/locks#frag"
        );
        let shown = format!("{u:?}");
        assert!(!shown.contains("cret"), "{shown}");
        assert_eq!(u.shown(), shown);
        let u = ConnectUrl::parse("redis+unix:///run/redis.sock").unwrap();
        assert!(!u.has_hosts());
        assert_eq!(u.path(), "/run/redis.sock");
    }

    #[test]
    fn a_renamed_parameter_names_its_new_name_where_the_scheme_knows_it() {
        let u = ConnectUrl::parse("zk://h?operation_timeout=1s").unwrap();
        let message = u
            .finish(&["request_timeout", "session_timeout"])
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("parameter `operation_timeout` was renamed `request_timeout`"),
            "{message}"
        );
        // A scheme without the new name treats the old one as any unknown parameter.
        let message = u.finish(&["ttl"]).unwrap_err().to_string();
        assert!(
            message.contains("unknown parameter `operation_timeout`"),
            "{message}"
        );
    }

    #[test]
    fn per_host_urls_share_credentials_and_path() {
        let u = ConnectUrl::parse("redlock://:pw@h1:6379, h2:6380 ,h3/2?ttl=5s").unwrap();
        assert_eq!(
            u.per_host("redis").unwrap(),
            [
                "redis://:pw@h1:6379/2",
                "redis://:pw@h2:6380/2",
                "redis://:pw@h3/2"
            ]
        );
    }

    #[test]
    fn every_fault_is_named_and_the_password_hidden() {
        let cases = [
            (
                "redis://u:hunter2@h?colour=red",
                "unknown parameter `colour` for redis://",
            ),
            (
                "redis://u:hunter2@h?colour=red",
                "known: ttl, factor, fencing, ca",
            ),
            ("redis://u:hunter2@h?ttl=1s&ttl=2s", "`ttl` is given twice"),
            (
                "redis://u:hunter2@h?ttl=10",
                "parameter `ttl`: \"10\" is not a duration",
            ),
            (
                "redis://u:hunter2@h?ttl=%zz",
                "parameter `ttl`: the value is not valid",
            ),
            ("redis://u:hunter2@h?%zz=1", "a parameter name is not valid"),
            (
                "redis://u:hunter2@h?factor=x",
                "parameter `factor`: \"x\" is not a number",
            ),
            ("redis://u:hunter2@h?fencing=maybe", "parameter `fencing`"),
            (
                "redis://u:hunter2@h?ca=",
                "parameter `ca`: the path is empty",
            ),
        ];
        for (url, says) in cases {
            let message = message(url);
            assert!(message.contains(says), "{url}: {message}");
            assert!(!message.contains("hunter2"), "{message}");
            assert!(message.starts_with("redis://u:***@h?"), "{message}");
        }
        for (url, says) in [
            ("u:hunter2@localhost:6379", "has no scheme"),
            ("redis://u:hunter2%zz@h", "the password is not valid"),
        ] {
            let message = ConnectUrl::parse(url).unwrap_err().to_string();
            assert!(message.contains(says), "{url}: {message}");
            assert!(!message.contains("hunter2"), "{message}");
        }
        for (url, says) in [
            ("redlock://u:hunter2@h1,,h3", "host #2 is empty"),
            ("redlock://u:hunter2@h1,", "host #2 is empty"),
            ("redlock://u:hunter2@", "names no host"),
            ("redlock:///0", "names no host"),
        ] {
            let message = ConnectUrl::parse(url)
                .unwrap()
                .hosts()
                .unwrap_err()
                .to_string();
            assert!(message.contains(says), "{url}: {message}");
            assert!(!message.contains("hunter2"), "{message}");
        }
        let u = ConnectUrl::parse("etcd://u:hunter2@h").unwrap();
        let message = u.expect_scheme(&["zk"]).unwrap_err().to_string();
        assert!(message.contains("expected zk://"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
    }

    #[test]
    fn durations_have_one_grammar() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "10", "ten", "-1s", "1x", "s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn debug_never_shows_the_password() {
        let parts = Parts::split("etcd://app:s%40cret@h1:2379/ns");
        let shown = format!("{parts:?}");
        assert!(!shown.contains("s%40cret"), "{shown}");
        assert!(shown.contains("app:***"), "{shown}");
        let credentials = Credentials::decode("app:s%40cret").expect("valid credentials");
        assert!(!format!("{credentials:?}").contains("s@cret"));
    }

    #[test]
    fn decoding_is_strict() {
        assert_eq!(percent_decode("").as_deref(), Some(""));
        assert_eq!(percent_decode("plain").as_deref(), Some("plain"));
        assert_eq!(percent_decode("a%2Fb%3a").as_deref(), Some("a/b:"));
        assert_eq!(percent_decode("%C3%A9").as_deref(), Some("é"));
        assert_eq!(percent_decode("a+b").as_deref(), Some("a+b"));
        for bad in ["%zz", "%", "%4", "abc%", "%+1", "%-1", "%C3"] {
            assert_eq!(percent_decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn passwords_are_hidden() {
        let cases = [
            ("redis://u:hunter2@h:1/2", "redis://u:***@h:1/2"),
            ("redis://:hunter2@h", "redis://:***@h"),
            ("etcd://u:hun/ter2@a:1,b:2/ns", "etcd://u:***@a:1,b:2/ns"),
            ("u:hunter2@h:2379", "u:***@h:2379"),
            ("zk://a:1,b:2/x?y=1", "zk://a:1,b:2/x?y=1"),
            ("redis://user@h", "redis://user@h"),
            ("memory://", "memory://"),
        ];
        for (raw, shown) in cases {
            assert_eq!(redact_password(raw), shown, "{raw}");
        }
        // An '@' after the credentials hides more than needed, never less.
        let shown = redact_password("etcd://u:hunter2@h:1/?identifier=me@host");
        assert!(!shown.contains("hunter2"), "{shown}");
        let shown = redact_password("redis+sentinel://h/m?sentinel_password=hunter2&ttl=1s#x");
        assert_eq!(shown, "redis+sentinel://h/m?sentinel_password=***&ttl=1s#x");
    }
}
