//! Helpers for connection strings, shared by the backends and the `dlock` facade so that every
//! scheme decodes and hides credentials the same way.
//!
//! Connection strings end up in logs, error messages and `Debug` output, and they often carry a
//! password; [`redact_password`] is the one way dlock shows them. Credentials inside them are
//! percent-encoded when they contain `@`, `:` or `/`; [`percent_decode`] undoes that strictly, so
//! a typo such as `%zz` is an error rather than a silently different password.

/// A connection string cut into its parts, the same way for every scheme:
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
    /// use dlock_core::url::Parts;
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
    /// The user name, never empty.
    pub user: String,
    /// The password, if the credentials have a `:`.
    pub password: Option<String>,
}

impl Credentials {
    /// Decodes `user[:password]`, each part percent-decoded strictly ([`percent_decode`]).
    /// Fails with what is wrong, to be put in the caller's error (it never quotes the password).
    ///
    /// ```
    /// use dlock_core::url::Credentials;
    ///
    /// let c = Credentials::decode("app:s%40cret").unwrap();
    /// assert_eq!((c.user.as_str(), c.password.as_deref()), ("app", Some("s@cret")));
    /// assert!(Credentials::decode(":secret").is_err());
    /// ```
    pub fn decode(userinfo: &str) -> Result<Self, &'static str> {
        let (user, password) = match userinfo.split_once(':') {
            Some((user, password)) => (user, Some(password)),
            None => (userinfo, None),
        };
        let user =
            percent_decode(user).ok_or("the user name is not valid percent-encoded UTF-8")?;
        if user.is_empty() {
            return Err("the user name is empty");
        }
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
/// use dlock_core::url::percent_decode;
///
/// assert_eq!(percent_decode("s%40cret").as_deref(), Some("s@cret"));
/// assert_eq!(percent_decode("%zz"), None);
/// ```
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
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
/// use dlock_core::url::redact_password;
///
/// assert_eq!(redact_password("redis://app:hunter2@h:6379/1"), "redis://app:***@h:6379/1");
/// assert_eq!(redact_password("zk://h1:2181,h2:2181/app"), "zk://h1:2181,h2:2181/app");
/// ```
pub fn redact_password(url: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
