//! Node names: lock keys as single ZooKeeper path segments, and the contenders' nodes inside them.
//!
//! Every lock key gets one parent node directly under the backend's base path, named by
//! [`encode_key`]. Inside it each contender creates an ephemeral sequential node named
//! `<owner>__lock__<sequence>`: the owner token as 32 hex digits, the marker, and the 10-digit
//! sequence number the server appends. That is exactly the shape of Python kazoo's `Lock` recipe
//! (`uuid4().hex + "__lock__"`), so kazoo and dlock contenders on the same path queue together.
//!
//! The owner prefix is what makes a lost create reply recoverable: after reconnecting, the
//! contender lists the parent and finds its own node by the prefix, instead of creating a second
//! one and leaving the first as an orphan that blocks everyone until the session ends.

use dlock_core::OwnerToken;

/// The marker between the owner prefix and the sequence number (kazoo's `Lock._NODE_NAME`).
pub(crate) const LOCK_MARKER: &str = "__lock__";

/// Bytes kept as they are in an encoded key: ASCII letters, digits, `-`, `_` and `.`.
fn is_kept(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.')
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Encodes a lock key as one valid ZooKeeper node name, injectively.
///
/// ASCII letters, digits, `-`, `_` and `.` are kept; every other byte of the key's UTF-8 form
/// (including `/` and `%`) becomes `%XX` with uppercase hex. The two names ZooKeeper forbids as
/// path segments, `.` and `..`, become `%2E` and `%2E%2E` — which no other key produces, since the
/// general rule never escapes a dot. So `a/b` is `a%2Fb`, while the key `a%2Fb` is `a%252Fb`.
///
/// Use it to point another ZooKeeper client (kazoo's `Lock`) at the same lock: its path is the
/// backend's base path, `/`, and this name (see [`ZkLock::lock_path`](crate::ZkLock::lock_path)).
pub fn encode_key(key: &str) -> String {
    if key == "." || key == ".." {
        return "%2E".repeat(key.len());
    }
    let mut name = String::with_capacity(key.len());
    for &byte in key.as_bytes() {
        if is_kept(byte) {
            name.push(char::from(byte));
        } else {
            name.push('%');
            name.push(char::from(HEX[usize::from(byte >> 4)]));
            name.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
    }
    name
}

/// Decodes a node name made by [`encode_key`]; `None` if it is not one.
pub fn decode_key(name: &str) -> Option<String> {
    let bytes = name.as_bytes();
    let mut key = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        if byte == b'%' {
            let hex = name.get(i + 1..i + 3)?;
            if hex.bytes().any(|b| b.is_ascii_lowercase()) {
                return None;
            }
            key.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else if is_kept(byte) {
            key.push(byte);
            i += 1;
        } else {
            return None;
        }
    }
    let key = String::from_utf8(key).ok()?;
    (encode_key(&key) == name).then_some(key)
}

/// The name prefix of `owner`'s node: `<32 hex digits>__lock__`.
pub(crate) fn owner_prefix(owner: OwnerToken) -> String {
    let mut prefix = owner.to_hex();
    prefix.push_str(LOCK_MARKER);
    prefix
}

/// One contender's node in a lock's parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Contender<'a> {
    /// The node name.
    pub(crate) name: &'a str,
    /// The sequence number the server gave it.
    pub(crate) sequence: i64,
}

/// The sequence number of a contender node: the digits after the last `__lock__`, as kazoo
/// matches them (`__lock__(-?\d{10})$`). `None` for any other child.
pub(crate) fn sequence_of(name: &str) -> Option<i64> {
    let (_, digits) = name.rsplit_once(LOCK_MARKER)?;
    let unsigned = digits.strip_prefix('-').unwrap_or(digits);
    if unsigned.len() != 10 || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The contenders among `children`, in queue order (by sequence number; other children, such as
/// a foreign recipe's nodes, are ignored).
pub(crate) fn queue(children: &[String]) -> Vec<Contender<'_>> {
    let mut contenders: Vec<Contender<'_>> = children
        .iter()
        .filter_map(|name| {
            sequence_of(name).map(|sequence| Contender {
                name: name.as_str(),
                sequence,
            })
        })
        .collect();
    contenders.sort_unstable_by_key(|c| c.sequence);
    contenders
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_keys_stay_readable() {
        assert_eq!(encode_key("invoices-2024_q1.v2"), "invoices-2024_q1.v2");
        assert_eq!(encode_key("a/b"), "a%2Fb");
        assert_eq!(encode_key("a%2Fb"), "a%252Fb");
        assert_eq!(encode_key("a b"), "a%20b");
        assert_eq!(encode_key("ключ"), "%D0%BA%D0%BB%D1%8E%D1%87");
    }

    #[test]
    fn dot_names_are_escaped() {
        assert_eq!(encode_key("."), "%2E");
        assert_eq!(encode_key(".."), "%2E%2E");
        assert_eq!(encode_key("..."), "...");
        assert_eq!(decode_key("%2E").as_deref(), Some("."));
        assert_eq!(decode_key("%2E%2E").as_deref(), Some(".."));
        // Never produced by the encoder, so never decoded.
        assert_eq!(decode_key("a%2Eb"), None);
    }

    #[test]
    fn encoding_is_injective_on_look_alikes() {
        let keys = [
            "a/b", "a%2Fb", "a%2fb", "a_b", "a b", "a+b", "a:b", "a.b", "a\\b", "{a}b", "..", ".",
            "/", "//", "a\nb", "A/B", "%", "%25", "%2E", "-", "_", "\0",
        ];
        let mut names = std::collections::HashSet::new();
        for key in keys {
            let name = encode_key(key);
            assert!(!name.contains('/'), "{key:?} -> {name}");
            assert_ne!(name, ".");
            assert_ne!(name, "..");
            assert_eq!(decode_key(&name).as_deref(), Some(key), "{name}");
            assert!(names.insert(name), "{key:?} collides");
        }
    }

    #[test]
    fn foreign_names_do_not_decode() {
        for name in ["a/b", "a b", "%2", "%zz", "%2f", "é"] {
            assert_eq!(decode_key(name), None, "{name}");
        }
    }

    #[test]
    fn sequence_follows_kazoo() {
        let owner = "0123456789abcdef0123456789abcdef";
        assert_eq!(sequence_of(&format!("{owner}__lock__0000000042")), Some(42));
        assert_eq!(sequence_of("x__lock__-2147483648"), Some(-2147483648));
        assert_eq!(sequence_of("x__lock__42"), None);
        assert_eq!(sequence_of("_c_1234-lock-0000000001"), None);
        assert_eq!(sequence_of("x__lock__00000000x1"), None);
    }

    #[test]
    fn queue_orders_by_sequence_and_skips_strangers() {
        let children: Vec<String> = [
            "b__lock__0000000003",
            "other",
            "a__lock__0000000001",
            "c__lock__0000000002",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let names: Vec<&str> = queue(&children).iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "a__lock__0000000001",
                "c__lock__0000000002",
                "b__lock__0000000003"
            ]
        );
    }

    #[test]
    fn owner_prefix_has_kazoo_shape() {
        let owner = OwnerToken::from_u128(0xabc);
        let prefix = owner_prefix(owner);
        assert_eq!(prefix.len(), 32 + LOCK_MARKER.len());
        assert!(prefix.ends_with("__lock__"));
    }
}
