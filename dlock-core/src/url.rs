//! Helpers for connection strings, shared by the backends and the `dlock` facade so that every
//! scheme decodes and hides credentials the same way.
//!
//! Connection strings end up in logs, error messages and `Debug` output, and they often carry a
//! password; [`redact_password`] is the one way dlock shows them. Credentials inside them are
//! percent-encoded when they contain `@`, `:` or `/`; [`percent_decode`] undoes that strictly, so
//! a typo such as `%zz` is an error rather than a silently different password.

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
