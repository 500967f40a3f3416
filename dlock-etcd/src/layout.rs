//! Where locks live in etcd: the key layout of etcd's own `concurrency.Mutex`.
//!
//! etcd's Go recipe (`concurrency.NewMutex(session, name)`, also behind `etcdctl lock name`) keeps
//! one key per contender at `<name>/<lease id in hex>`, attached to the contender's session lease,
//! and orders contenders by the keys' create revisions. We use that layout, so Go services and
//! `etcdctl lock` exclude each other with dlock clients on the same lock name. A dlock
//! contender's key also names its acquire: `<name>/<lease id in hex>_<owner token in hex>` (see
//! [`contender_key`]). Go's recipe only reads the keys under `<name>/` in create order, so the
//! longer name changes nothing for it.
//!
//! A dlock key becomes the lock name `<namespace><escaped key>`, where escaping turns `%` into `%25`
//! and `/` into `%2F`. Without it, the contenders of key `a` (prefix `a/`) would include those of
//! key `a/b` (prefix `a/b/`); with it, no lock name's prefix contains another's. Use
//! [`KeyLayout::lock_name`] to find the name a Go service or `etcdctl lock` must use.

use std::fmt;
use std::io::Write;

use dlock_core::backend::{check_len, LockKey};
use dlock_core::{OwnerToken, Result};

/// The namespace used when none is configured.
pub const DEFAULT_NAMESPACE: &str = "dlock/";

/// The longest namespace accepted, in bytes. etcd keys can be much longer; this only keeps a
/// mistaken value (a whole document pasted into the setting) from reaching the server.
pub const MAX_NAMESPACE_LEN: usize = 512;

/// Maps lock keys to etcd lock names and contender keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLayout {
    namespace: String,
}

impl Default for KeyLayout {
    fn default() -> Self {
        KeyLayout {
            namespace: DEFAULT_NAMESPACE.to_owned(),
        }
    }
}

impl KeyLayout {
    /// A layout that puts every lock name under `namespace` (any UTF-8 string, may be empty).
    pub fn new(namespace: impl Into<String>) -> Result<Self> {
        let namespace = namespace.into();
        check_len("prefix", &namespace, MAX_NAMESPACE_LEN)?;
        Ok(KeyLayout { namespace })
    }

    /// The namespace every lock name starts with.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The lock name of `key` as etcd's `concurrency.NewMutex` and `etcdctl lock` take it:
    /// `<namespace><key with % and / escaped>`. Contenders' keys live under `<name>/`.
    pub fn lock_name(&self, key: &LockKey) -> String {
        let mut name = String::with_capacity(self.namespace.len() + key.as_str().len() + 8);
        name.push_str(&self.namespace);
        escape_into(key.as_str(), &mut name);
        name
    }

    /// The name of `key` in a family of primitives (`election`, `semaphore`, `rw`):
    /// `<namespace>%<family>/<key with % and / escaped>`. No lock name reaches into it, since an
    /// escaped key's `%` is always followed by `25` or `2F`.
    pub fn family_name(&self, family: &str, key: &LockKey) -> String {
        let mut name = format!("{}%{family}/", self.namespace);
        escape_into(key.as_str(), &mut name);
        name
    }

    /// The prefix of every lock name whose key starts with `key_prefix` (for counting what a
    /// group of keys left on the server).
    pub fn name_prefix(&self, key_prefix: &str) -> String {
        let mut name = self.namespace.clone();
        escape_into(key_prefix, &mut name);
        name
    }

    /// The range every contender of `key` lives in: `<lock name>/`.
    pub(crate) fn prefix(&self, key: &LockKey) -> Vec<u8> {
        let mut prefix = self.lock_name(key).into_bytes();
        prefix.push(b'/');
        prefix
    }

    /// The lock key whose contender key is `contender` (`<lock name>/<lease hex>`, with
    /// `_<owner token hex>` for a dlock client's), or `None` for
    /// a key that no lock key maps to (other data under the namespace, a name escaped otherwise
    /// than [`lock_name`](Self::lock_name) escapes).
    pub(crate) fn key_of(&self, contender: &[u8]) -> Option<LockKey> {
        let contender = std::str::from_utf8(contender).ok()?;
        let (name, lease) = contender.rsplit_once('/')?;
        let escaped = name.strip_prefix(self.namespace.as_str())?;
        let hex_or = |b: u8| b.is_ascii_hexdigit() || b == b'-' || b == b'_';
        if lease.is_empty() || !lease.bytes().all(hex_or) {
            return None;
        }
        let key = LockKey::new(&unescape(escaped)?).ok()?;
        // Only the one spelling `lock_name` writes: `%2f` or a bare `/` is not a dlock name.
        (self.lock_name(&key) == name).then_some(key)
    }
}

/// The start and the end (exclusive) of the range of keys beginning with `prefix`, as etcd
/// takes them; an empty prefix is every key.
pub(crate) fn range_of(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    if prefix.is_empty() {
        return (vec![0], vec![0]);
    }
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return (prefix.to_vec(), end);
        }
    }
    // Only 0xff bytes: every key from the prefix on.
    (prefix.to_vec(), vec![0])
}

/// The key of session lease `lease` under `prefix` as Go's recipe names it: the lease id as
/// Go's `%x` formats it. An election's candidates use it, one per client and election.
pub(crate) fn session_key(prefix: &[u8], lease: i64) -> Vec<u8> {
    lease_key(prefix, lease, format_args!(""))
}

/// The contender key of one acquire: `<prefix><lease hex>_<owner token hex>`, as the
/// semaphore's and the read-write lock's keys are named.
///
/// Go's recipe names a lock's key after the session lease alone, so every acquire of one client
/// would write the same key. Naming it after the acquire's owner token as well means that no key
/// is ever written by two acquires: a late delete of an earlier holding's key (a release whose
/// answer was lost, or that waited at a member cut off from its leader) finds nothing to delete,
/// rather than the key of a later holding. That is what lets a release be a plain delete.
pub(crate) fn contender_key(prefix: &[u8], lease: i64, owner: OwnerToken) -> Vec<u8> {
    lease_key(prefix, lease, format_args!("_{:032x}", owner.as_u128()))
}

/// The start of every contender key session lease `lease` writes under `prefix` (see
/// [`contender_key`]); no other lease's key, nor a Go contender's, starts with it.
pub(crate) fn lease_keys(prefix: &[u8], lease: i64) -> Vec<u8> {
    lease_key(prefix, lease, format_args!("_"))
}

/// `<prefix><lease hex><rest>`, written into one buffer (an acquire makes two such keys).
fn lease_key(prefix: &[u8], lease: i64, rest: fmt::Arguments<'_>) -> Vec<u8> {
    let mut key = Vec::with_capacity(prefix.len() + 52);
    key.extend_from_slice(prefix);
    // Writing into a Vec cannot fail.
    let _ = write!(key, "{}{rest}", LeaseHex(lease));
    key
}

/// A lease id in Go's `%x` form: lowercase hex without padding (a `-` sign for negative ids, which
/// etcd never hands out).
pub(crate) fn lease_hex(lease: i64) -> String {
    LeaseHex(lease).to_string()
}

/// [`lease_hex`] as it is written.
struct LeaseHex(i64);

impl fmt::Display for LeaseHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 < 0 {
            write!(f, "-{:x}", self.0.unsigned_abs())
        } else {
            write!(f, "{:x}", self.0)
        }
    }
}

/// The inverse of [`escape_into`]: `None` where a `%` starts anything but `%25` or `%2F`.
fn unescape(escaped: &str) -> Option<String> {
    let mut key = String::with_capacity(escaped.len());
    let mut rest = escaped;
    while let Some(at) = rest.find('%') {
        key.push_str(&rest[..at]);
        let code = rest.get(at..at + 3)?;
        key.push(match code {
            "%25" => '%',
            "%2F" => '/',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    key.push_str(rest);
    Some(key)
}

fn escape_into(key: &str, out: &mut String) {
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use dlock_core::Error;

    fn key(k: &str) -> LockKey {
        LockKey::new(k).unwrap()
    }

    #[test]
    fn names_follow_the_go_recipe() {
        let layout = KeyLayout::default();
        assert_eq!(layout.lock_name(&key("jobs")), "dlock/jobs");
        assert_eq!(layout.prefix(&key("jobs")), b"dlock/jobs/");
        assert_eq!(
            session_key(&layout.prefix(&key("jobs")), 0x694d_8a6b_13c2_1f04),
            b"dlock/jobs/694d8a6b13c21f04"
        );
        assert_eq!(
            contender_key(
                &layout.prefix(&key("jobs")),
                0x694d_8a6b_13c2_1f04,
                OwnerToken::from_u128(0x2a)
            ),
            b"dlock/jobs/694d8a6b13c21f04_0000000000000000000000000000002a"
        );
        assert_eq!(lease_hex(255), "ff");
        assert_eq!(lease_hex(-255), "-ff");
    }

    #[test]
    fn a_leases_keys_are_its_own() {
        let prefix = b"dlock/jobs/";
        let mine = lease_keys(prefix, 0x69);
        let (one, another) = (OwnerToken::random(), OwnerToken::random());
        assert!(contender_key(prefix, 0x69, one).starts_with(&mine));
        assert!(contender_key(prefix, 0x69, another).starts_with(&mine));
        assert_ne!(
            contender_key(prefix, 0x69, one),
            contender_key(prefix, 0x69, another)
        );
        for other in [
            contender_key(prefix, 0x694d, one),
            contender_key(prefix, -0x69, one),
            session_key(prefix, 0x69),
            session_key(prefix, 0x694d),
        ] {
            assert!(!other.starts_with(&mine), "{other:?}");
        }
    }

    #[test]
    fn no_prefix_contains_another() {
        let layout = KeyLayout::new("ns/").unwrap();
        let keys = ["a", "a/b", "a%2Fb", "a%2fb", "a/", "/", "//", "%", "a b"];
        let prefixes: Vec<Vec<u8>> = keys.iter().map(|k| layout.prefix(&key(k))).collect();
        for (i, p) in prefixes.iter().enumerate() {
            for (j, q) in prefixes.iter().enumerate() {
                if i != j {
                    assert!(!q.starts_with(p), "{:?} contains {:?}", keys[j], keys[i]);
                }
            }
        }
    }

    #[test]
    fn name_prefix_is_a_prefix_of_every_name_under_it() {
        let layout = KeyLayout::default();
        let group = "suite/1234/";
        for k in ["suite/1234/x", "suite/1234/a/b", "suite/1234/%"] {
            assert!(layout
                .lock_name(&key(k))
                .starts_with(&layout.name_prefix(group)));
        }
        assert!(!layout
            .lock_name(&key("suite/12345/x"))
            .starts_with(&layout.name_prefix(group)));
    }

    #[test]
    fn contender_keys_map_back_to_their_lock_keys() {
        let layout = KeyLayout::new("ns/").unwrap();
        for k in ["a", "a/b", "a%2Fb", "%", "/", "a b", "100%/"] {
            let contender = contender_key(&layout.prefix(&key(k)), 0x694d, OwnerToken::random());
            assert_eq!(layout.key_of(&contender), Some(key(k)), "{k}");
            // A Go contender's key maps back too.
            let go = session_key(&layout.prefix(&key(k)), 0x694d);
            assert_eq!(layout.key_of(&go), Some(key(k)), "{k}");
        }
        for other in [
            &b"ns/a"[..],
            b"ns/a/",
            b"ns/a/b/694d",
            b"ns/a%2fb/694d",
            b"ns/a%zz/694d",
            b"ns/a%2/694d",
            b"other/a/694d",
            b"ns/a/not-hex",
            b"ns/\xff/694d",
        ] {
            assert_eq!(
                layout.key_of(other),
                None,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }

    #[test]
    fn primitive_names_are_apart_from_lock_names() {
        let layout = KeyLayout::new("ns/").unwrap();
        let keys = ["a", "a/b", "%election", "election", "%", "/", "a%2Fb"];
        for family in ["election", "semaphore", "rw"] {
            for k in keys {
                let name = layout.family_name(family, &key(k));
                assert!(name.starts_with(&format!("ns/%{family}/")), "{name}");
                let contender = session_key(format!("{name}/").as_bytes(), 0x694d);
                // Not a lock's contender (so never listed as one), and no lock's range holds it.
                assert_eq!(layout.key_of(&contender), None, "{name}");
                for other in keys {
                    assert!(
                        !contender.starts_with(&layout.prefix(&key(other))),
                        "{name}"
                    );
                }
            }
        }
        assert_ne!(
            layout.family_name("election", &key("a")),
            layout.family_name("election", &key("a/b"))
        );
    }

    #[test]
    fn ranges_cover_their_prefix() {
        assert_eq!(range_of(b"ab"), (b"ab".to_vec(), b"ac".to_vec()));
        assert_eq!(range_of(b"a\xff"), (b"a\xff".to_vec(), b"b".to_vec()));
        assert_eq!(range_of(b"\xff"), (b"\xff".to_vec(), vec![0]));
        assert_eq!(range_of(b""), (vec![0], vec![0]));
    }

    #[test]
    fn oversized_namespace_is_rejected_by_name() {
        let err = KeyLayout::new("x".repeat(MAX_NAMESPACE_LEN + 1)).unwrap_err();
        assert!(matches!(
            err,
            Error::InvalidInput {
                field: "prefix",
                ..
            }
        ));
        assert!(KeyLayout::new("").is_ok());
    }
}
