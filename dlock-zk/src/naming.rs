//! Node names: lock keys as single ZooKeeper path segments, and the contenders' nodes inside them.
//!
//! Every lock key gets one parent node directly under the backend's base path, named by
//! [`encode_key`]. Inside it each contender creates an ephemeral sequential node; the server
//! appends a 10-digit sequence number to the name. Two peer recipes name and order those nodes,
//! and no single name satisfies both (see [`Naming`]):
//!
//! * Python kazoo's `Lock` names its node `<uuid4 hex>__lock__<sequence>` and waits only behind
//!   children matching `(__lock__|__rlock__)(-?\d{10})$`;
//! * Apache Curator's `InterProcessMutex` names its node `_c_<uuid>-lock-<sequence>` (protected
//!   mode) and orders *every* child by the text after its last `lock-`.
//!
//! dlock itself waits behind every child whose name ends in a sequence number, whatever its prefix,
//! so it queues behind kazoo's and Curator's contenders (and their read-write locks' nodes) alike.
//!
//! The owner prefix is what makes a lost create reply recoverable: after reconnecting, the
//! contender lists the parent and finds its own node by the prefix, instead of creating a second
//! one and leaving the first as an orphan that blocks everyone until the session ends.

use std::fmt;
use std::str::FromStr;

use dlock_core::{Error, OwnerToken};

/// How dlock names its own contender nodes, so that a peer recipe on the same lock path sees
/// dlock's holder and waits behind it.
///
/// dlock waits behind every peer under either naming; the setting decides which peer waits
/// behind dlock:
///
/// | naming | node name | kazoo `Lock` waits behind dlock | Curator `InterProcessMutex` waits behind dlock |
/// |---|---|---|---|
/// | [`Kazoo`](Naming::Kazoo) (default) | `<owner hex>__lock__<sequence>` | yes | no: it orders the name wrongly |
/// | [`Curator`](Naming::Curator) | `_c_<owner as uuid>-lock-<sequence>` | no: it ignores the name | yes |
///
/// The default stays kazoo's, the naming of earlier dlock releases, so that a fleet upgraded one
/// process at a time never has old and new dlock clients ignore each other's nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Naming {
    /// `<32 hex digits>__lock__<sequence>`, as kazoo's `Lock` names its nodes.
    #[default]
    Kazoo,
    /// `_c_<8-4-4-4-12 hex>-lock-<sequence>`, as Curator's `InterProcessMutex` names its nodes in
    /// protected mode.
    Curator,
}

impl Naming {
    /// The name of the setting in URLs (`naming=kazoo|curator`).
    pub fn as_str(self) -> &'static str {
        match self {
            Naming::Kazoo => "kazoo",
            Naming::Curator => "curator",
        }
    }
}

impl fmt::Display for Naming {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Naming {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        match text {
            "kazoo" => Ok(Naming::Kazoo),
            "curator" => Ok(Naming::Curator),
            other => Err(Error::invalid(
                "naming",
                format!("{other:?} is not a naming; use kazoo or curator"),
            )),
        }
    }
}

/// The marker between the owner prefix and the sequence number (kazoo's `Lock._NODE_NAME`).
const KAZOO_MARKER: &str = "__lock__";

/// The start of a Curator protected-mode name (`ProtectedUtils.PROTECTED_PREFIX`).
const CURATOR_PROTECTED: &str = "_c_";

/// The node name Curator's `InterProcessMutex` gives its contenders, after the protected prefix.
const CURATOR_LOCK_NAME: &str = "-lock-";

/// The digits the server appends to a sequential node's name.
const SEQUENCE_DIGITS: usize = 10;

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

/// The name prefix of `owner`'s node under `naming`; the server appends the sequence.
pub(crate) fn owner_prefix(naming: Naming, owner: OwnerToken) -> String {
    let hex = owner.to_hex();
    match naming {
        Naming::Kazoo => format!("{hex}{KAZOO_MARKER}"),
        Naming::Curator => format!(
            "{CURATOR_PROTECTED}{}-{}-{}-{}-{}{CURATOR_LOCK_NAME}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        ),
    }
}

/// One contender's node in a lock's parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Contender<'a> {
    /// The node name.
    pub(crate) name: &'a str,
    /// The sequence number the server gave it.
    pub(crate) sequence: i64,
}

/// The sequence number of a contender node: the 10 digits the server appended to its name,
/// whatever the name before them. `None` for a child that is not sequential, which is no
/// contender. (A parent's counter would overflow into negative numbers only after 2³¹ contenders;
/// lock parents are containers, deleted and restarted at zero whenever their queue empties.)
pub(crate) fn sequence_of(name: &str) -> Option<i64> {
    let digits = name.get(name.len().checked_sub(SEQUENCE_DIGITS)?..)?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The contenders among `children`, in queue order: every sequential child, by sequence number,
/// whichever recipe created it.
pub(crate) fn queue(children: &[String]) -> Vec<Contender<'_>> {
    in_sequence(children.iter())
}

/// The sequential ones among `names`, by sequence number.
fn in_sequence<'a>(names: impl Iterator<Item = &'a String>) -> Vec<Contender<'a>> {
    let mut contenders: Vec<Contender<'a>> = names
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

/// The marker of kazoo's `ReadLock` nodes (`ReadLock._NODE_NAME`).
pub(crate) const KAZOO_READ_MARKER: &str = "__rlock__";

/// The marker of kazoo's `Lock`, `WriteLock` and `Election` nodes (`Lock._NODE_NAME`).
pub(crate) const KAZOO_WRITE_MARKER: &str = KAZOO_MARKER;

/// The name prefix of `owner`'s node in a kazoo queue, before the sequence: the owner token in
/// hex (where kazoo puts a random uuid in hex) and `marker`.
pub(crate) fn kazoo_prefix(owner: OwnerToken, marker: &str) -> String {
    format!("{}{marker}", owner.to_hex())
}

/// What sits between the owner prefix and the sequence of a contender's name: the text before
/// the 10 digits.
fn head(name: &str) -> &str {
    &name[..name.len().saturating_sub(SEQUENCE_DIGITS)]
}

/// Whether a contender's node is a kazoo writer's (`Lock`, `WriteLock`, `Election`:
/// `…__lock__<sequence>`).
pub(crate) fn is_kazoo_writer(name: &str) -> bool {
    sequence_of(name).is_some() && head(name).ends_with(KAZOO_WRITE_MARKER)
}

/// Whether a contender's node is a kazoo reader's (`ReadLock`: `…__rlock__<sequence>`).
pub(crate) fn is_kazoo_reader(name: &str) -> bool {
    sequence_of(name).is_some() && head(name).ends_with(KAZOO_READ_MARKER)
}

/// The contenders among `children` as kazoo sees them, in sequence order: the writers'
/// `__lock__` nodes, and with `readers` also the readers' `__rlock__` nodes (kazoo's regex
/// `(__lock__|__rlock__)(\d{10})$`); every other child is ignored, as kazoo ignores it.
pub(crate) fn kazoo_queue(children: &[String], readers: bool) -> Vec<Contender<'_>> {
    in_sequence(
        children
            .iter()
            .filter(|name| is_kazoo_writer(name) || (readers && is_kazoo_reader(name))),
    )
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
    fn every_sequential_child_is_a_contender() {
        let owner = "0123456789abcdef0123456789abcdef";
        assert_eq!(sequence_of(&format!("{owner}__lock__0000000042")), Some(42));
        assert_eq!(
            sequence_of("_c_1b4e28ba-2fa1-11d2-883f-0016d3cca427-lock-0000000007"),
            Some(7)
        );
        assert_eq!(sequence_of("x__rlock__0000000003"), Some(3));
        assert_eq!(sequence_of("_c_u-__WRIT__0000000011"), Some(11));
        assert_eq!(sequence_of("x__lock__42"), None);
        assert_eq!(sequence_of("x__lock__00000000x1"), None);
        assert_eq!(sequence_of("lease_holder"), None);
        assert_eq!(sequence_of("ß0000000001"), Some(1));
        assert_eq!(sequence_of("000000001"), None);
    }

    #[test]
    fn queue_orders_every_recipe_by_sequence() {
        let children: Vec<String> = [
            "b__lock__0000000003",
            "other",
            "_c_1b4e28ba-2fa1-11d2-883f-0016d3cca427-lock-0000000000",
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
                "_c_1b4e28ba-2fa1-11d2-883f-0016d3cca427-lock-0000000000",
                "a__lock__0000000001",
                "c__lock__0000000002",
                "b__lock__0000000003"
            ]
        );
    }

    #[test]
    fn owner_prefixes_have_each_recipes_shape() {
        let owner = OwnerToken::from_u128(0x1b4e28ba_2fa1_11d2_883f_0016d3cca427);
        assert_eq!(
            owner_prefix(Naming::Kazoo, owner),
            "1b4e28ba2fa111d2883f0016d3cca427__lock__"
        );
        assert_eq!(
            owner_prefix(Naming::Curator, owner),
            "_c_1b4e28ba-2fa1-11d2-883f-0016d3cca427-lock-"
        );
    }

    #[test]
    fn kazoo_queues_keep_kazoo_names_only() {
        let children: Vec<String> = [
            "b__rlock__0000000003",
            "_c_1b4e28ba-2fa1-11d2-883f-0016d3cca427-lock-0000000000",
            "a__lock__0000000001",
            "c__lock__0000000004",
            "0123abcd",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let names = |readers| -> Vec<&str> {
            kazoo_queue(&children, readers)
                .iter()
                .map(|c| c.name)
                .collect()
        };
        assert_eq!(
            names(true),
            [
                "a__lock__0000000001",
                "b__rlock__0000000003",
                "c__lock__0000000004"
            ]
        );
        assert_eq!(names(false), ["a__lock__0000000001", "c__lock__0000000004"]);
        assert!(is_kazoo_writer("a__lock__0000000001"));
        assert!(!is_kazoo_writer("a__rlock__0000000001"));
        assert!(is_kazoo_reader("a__rlock__0000000001"));
        assert!(!is_kazoo_reader("a__lock__0000000001"));
    }

    #[test]
    fn naming_parses_its_names_only() {
        for naming in [Naming::Kazoo, Naming::Curator] {
            assert_eq!(naming.as_str().parse::<Naming>().ok(), Some(naming));
        }
        assert!(matches!(
            "Curator".parse::<Naming>(),
            Err(Error::InvalidInput {
                field: "naming",
                ..
            })
        ));
        assert_eq!(Naming::default(), Naming::Kazoo);
    }
}
