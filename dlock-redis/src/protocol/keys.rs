//! Where a lock lives in Redis: the lock key, its owner record, its fencing counter, and its
//! release channel.
//!
//! | what | name | value | expiry |
//! |---|---|---|---|
//! | lock | `PREFIX` + name, verbatim | the owner token (32 hex digits) | the lease's TTL (`PX`) |
//! | owner record | see [`owner_key`] | a hash: `token` (the owner token), `fencing` (the holder's fencing token), `record` (the [`OwnerRecord`](dlock_core::OwnerRecord) JSON) | the lease's TTL, re-armed with it |
//! | fencing counter | see [`fence_key`] | an integer, incremented per grant | never, or the fence TTL after the last grant |
//! | release channel | `dlock:released:` + lock key | (pub/sub channel, not a key) | — |
//! | wake channel | see [`wake_channel`]: the release channel + `:` + a client's wake tag | (pub/sub channel) | — |
//! | waiters | see [`queue_key`] | a sorted set: member the owner token of a waiting `lock()` + `:` + its client's wake tag, score its arrival order | none; emptied by grants, withdrawals and lapses |
//! | waiter lapses | see [`lapse_key`] | a sorted set: member as in the waiters, score the server time (ms) at which its entry lapses | as the waiters |
//!
//! The lock key is the plain name so that the common single-instance convention interoperates:
//! redis-py's `Lock(name)`, redsync and similar clients `SET name <random> NX PX <ttl>` and release
//! by compare-and-delete, so a lock they hold on `name` blocks ours and ours blocks theirs. The
//! default prefix is empty for that reason.
//!
//! The fencing counter must be in the same Redis Cluster slot as the lock key, because one script
//! touches both. [`fence_key`] picks a name that hashes like the lock key:
//!
//! * a lock key with a hash tag (`jobs:{tenant-7}:nightly`) keeps it: `jobs:{tenant-7}:nightly:dlock:fence`;
//! * a lock key without braces is wrapped in one: `{jobs/nightly}:dlock:fence`;
//! * a lock key containing a `}` but no valid hash tag (rare: `a}b`, `x{}y`) cannot be wrapped, and
//!   uses a counter shared by every such key of its slot: `dlock:fence:{<tag of the slot>}`. Tokens
//!   still grow strictly per lock key (every grant increments the counter), they just advance
//!   faster.
//!
//! Names are not escaped, so a lock whose key equals another lock's counter key (for example a
//! lock named `{a}:dlock:fence` next to a lock named `a`) collides with it: keys ending in
//! [`FENCE_SUFFIX`] and keys starting with [`SHARED_FENCE_PREFIX`], [`OWNER_PREFIX`],
//! [`QUEUE_PREFIX`] or [`LAPSE_PREFIX`] are reserved.
//!
//! # The owner record
//!
//! The lock key's value must stay the plain owner token (other clients compare it), so who took
//! the lock is kept in a companion hash in the lock key's slot, written by the acquire script
//! with the lock's TTL, re-armed by the extend scripts and deleted with the lock. Its name
//! starts with [`OWNER_PREFIX`], so that one `SCAN … MATCH dlock:owner:*` finds every lock a
//! dlock client holds, and it names exactly one lock key ([`lock_key_of_owner`] reads it back):
//!
//! * a lock key without a hash tag or a `}` is wrapped whole: `dlock:owner:{jobs/nightly}`;
//! * a lock key with a hash tag keeps it in front: `dlock:owner:{t7}jobs:{t7}:nightly`;
//! * a lock key with a `}` but no valid hash tag gets its slot's numeric tag in front:
//!   `dlock:owner:{5061}a}b`.
//!
//! The hash's `token` tells whose record it is: it describes the holder only while it equals
//! the lock key's value (a peer's `SET NX` on the plain key leaves no record, and a record
//! never outlives its lock's TTL).
//!
//! # The waiters' queue
//!
//! Waiting `lock()` calls stand in two sorted sets named like the owner record, after
//! [`QUEUE_PREFIX`] and [`LAPSE_PREFIX`] (`dlock:queue:{jobs/nightly}`,
//! `dlock:lapse:{jobs/nightly}`), so they share the lock key's slot and name exactly one lock.
//! See [`scripts::ACQUIRE`](super::scripts::ACQUIRE) for how they are used.

use std::sync::OnceLock;

use dlock_core::backend::{check_len, LockKey};
use dlock_core::limits::MAX_KEY_LEN;
use dlock_core::Result;

/// Appended to a lock key (or to its wrapped form) to name its fencing counter.
pub const FENCE_SUFFIX: &str = ":dlock:fence";

/// The start of a fencing counter shared by the keys of one slot that cannot carry their own.
pub const SHARED_FENCE_PREFIX: &str = "dlock:fence:";

/// The start of every owner record's name (see [the module docs](self#the-owner-record)).
pub const OWNER_PREFIX: &str = "dlock:owner:";

/// The start of the name of every lock's queue of waiters (see
/// [the module docs](self#the-waiters-queue)).
pub const QUEUE_PREFIX: &str = "dlock:queue:";

/// The start of the name of every lock's set of waiter lapse times.
pub const LAPSE_PREFIX: &str = "dlock:lapse:";

/// The start of every release channel; the lock key follows.
pub const RELEASE_CHANNEL_PREFIX: &str = "dlock:released:";

/// The longest prefix accepted, in bytes: as long as the longest lock name.
pub const MAX_PREFIX_LEN: usize = MAX_KEY_LEN;

/// The number of Redis Cluster hash slots.
pub const SLOTS: u16 = 16384;

/// How lock names map to Redis keys: a prefix, then the name verbatim.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyLayout {
    prefix: String,
}

/// The Redis names of one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys {
    /// The lock key: prefix + name. Its value is the owner token while the lock is held.
    pub lock: String,
    /// The fencing counter, in the lock key's cluster slot; it never expires unless the client
    /// has a fence TTL.
    pub fence: String,
    /// The owner record, in the lock key's cluster slot, living as long as the lock.
    pub owner: String,
    /// The pub/sub channel a release is announced on.
    pub channel: String,
    /// The waiters, by arrival ([`queue_key`]).
    pub queue: String,
    /// When each waiter's entry lapses ([`lapse_key`]).
    pub lapses: String,
}

impl KeyLayout {
    /// A layout that puts `prefix` before every lock name. An empty prefix (the default) makes
    /// the lock key the name itself, as other single-instance clients use it.
    pub fn new(prefix: impl Into<String>) -> Result<Self> {
        let prefix = prefix.into();
        check_len("prefix", &prefix, MAX_PREFIX_LEN)?;
        Ok(KeyLayout { prefix })
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The lock key of `name`: the prefix followed by the name.
    pub fn lock_key(&self, name: &LockKey) -> String {
        concat(&[&self.prefix, name.as_str()])
    }

    /// Every Redis name the lock `name` uses.
    pub fn keys(&self, name: &LockKey) -> LockKeys {
        let lock = self.lock_key(name);
        LockKeys {
            fence: fence_key(&lock),
            owner: owner_key(&lock),
            channel: release_channel(&lock),
            queue: queue_key(&lock),
            lapses: lapse_key(&lock),
            lock,
        }
    }
}

/// The fencing counter of `lock_key`, always in the same cluster slot (see the module docs).
pub fn fence_key(lock_key: &str) -> String {
    if hash_tag(lock_key.as_bytes()).is_some() {
        return concat(&[lock_key, FENCE_SUFFIX]);
    }
    if !lock_key.contains('}') {
        return concat(&["{", lock_key, "}", FENCE_SUFFIX]);
    }
    let tag = slot_tag(hash_slot(lock_key.as_bytes())).to_string();
    concat(&[SHARED_FENCE_PREFIX, "{", &tag, "}"])
}

/// The owner record of `lock_key`, in the same cluster slot (see
/// [the module docs](self#the-owner-record)).
pub fn owner_key(lock_key: &str) -> String {
    companion_key(OWNER_PREFIX, lock_key)
}

/// The queue of waiters of `lock_key`, in the same cluster slot (see
/// [the module docs](self#the-waiters-queue)).
pub fn queue_key(lock_key: &str) -> String {
    companion_key(QUEUE_PREFIX, lock_key)
}

/// The lapse times of the waiters of `lock_key`, in the same cluster slot.
pub fn lapse_key(lock_key: &str) -> String {
    companion_key(LAPSE_PREFIX, lock_key)
}

/// `prefix` and a form of `lock_key` that hashes to its slot and names it alone (see
/// [the module docs](self#the-owner-record)).
fn companion_key(prefix: &str, lock_key: &str) -> String {
    if let Some(tag) = hash_tag(lock_key.as_bytes()) {
        let tag = String::from_utf8_lossy(tag);
        return concat(&[prefix, "{", &tag, "}", lock_key]);
    }
    if !lock_key.contains('}') {
        return concat(&[prefix, "{", lock_key, "}"]);
    }
    let tag = slot_tag(hash_slot(lock_key.as_bytes())).to_string();
    concat(&[prefix, "{", &tag, "}", lock_key])
}

/// The lock key an owner record's name `owner_key` belongs to, or `None` for a name
/// [`owner_key`] does not make.
pub fn lock_key_of_owner(owner_key: &str) -> Option<&str> {
    let rest = owner_key.strip_prefix(OWNER_PREFIX)?.strip_prefix('{')?;
    let close = rest.find('}')?;
    let (tag, lock) = (&rest[..close], &rest[close + 1..]);
    let lock = if lock.is_empty() { tag } else { lock };
    (!lock.is_empty() && self::owner_key(lock) == owner_key).then_some(lock)
}

/// The lock keys starting with `start` among the owner records named `names` (a page of
/// [`scan_owner_records`](super::scripts::scan_owner_records)); other names are skipped.
pub fn lock_keys_under<'a>(
    names: &'a [String],
    start: &'a str,
) -> impl Iterator<Item = String> + 'a {
    names
        .iter()
        .filter_map(|name| lock_key_of_owner(name))
        .filter(move |lock| lock.starts_with(start))
        .map(str::to_owned)
}

/// The channel a release of `lock_key` is published on.
pub fn release_channel(lock_key: &str) -> String {
    concat(&[RELEASE_CHANNEL_PREFIX, lock_key])
}

/// The channel on which a release names the head of `release_channel`'s lock's queue when that
/// waiter's client has the wake tag `tag`: only that client subscribes to it, so the other
/// clients waiting on the lock hear nothing. A tag is 16 hex digits, random per client; the
/// channel keeps the release channel's hash tag, so it stays in the lock key's slot in a cluster.
pub fn wake_channel(release_channel: &str, tag: &str) -> String {
    concat(&[release_channel, ":", tag])
}

fn concat(parts: &[&str]) -> String {
    let mut joined = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        joined.push_str(part);
    }
    joined
}

/// The part of `key` Redis Cluster hashes: the bytes between the first `{` and the next `}`, if
/// there are any; `None` means the whole key is hashed.
pub fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let rest = &key[open + 1..];
    let close = rest.iter().position(|&b| b == b'}')?;
    (close > 0).then(|| &rest[..close])
}

/// The Redis Cluster hash slot of `key` (CRC16-XMODEM of its hash tag or of the whole key).
pub fn hash_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key).unwrap_or(key)) % SLOTS
}

/// The smallest decimal number whose hash slot is `slot`, used as a hash tag that lands there.
///
/// Every slot is reached below 110 000 (checked by a unit test). The table of all 16 384 tags is
/// computed on first use (a few milliseconds, 64 KiB) and kept; only the rare keys described in
/// the module docs need it.
pub fn slot_tag(slot: u16) -> u32 {
    static TAGS: OnceLock<Vec<u32>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = vec![u32::MAX; usize::from(SLOTS)];
        let mut left = tags.len();
        let mut buf = itoa_buf();
        for n in 0u32..=MAX_SLOT_TAG {
            let entry = &mut tags[usize::from(crc16(decimal(n, &mut buf)) % SLOTS)];
            if *entry == u32::MAX {
                *entry = n;
                left -= 1;
                if left == 0 {
                    break;
                }
            }
        }
        tags
    });
    tags[usize::from(slot % SLOTS)]
}

/// Every slot has a decimal tag at or below this number.
const MAX_SLOT_TAG: u32 = 110_000;

fn itoa_buf() -> [u8; 10] {
    [0; 10]
}

fn decimal(mut n: u32, buf: &mut [u8; 10]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, as Redis Cluster uses it.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::Error;

    fn key(name: &str) -> LockKey {
        LockKey::new(name).unwrap()
    }

    #[test]
    fn crc16_matches_the_cluster_specification() {
        // The test vector of the Redis Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        // Slots quoted in the Redis documentation.
        assert_eq!(hash_slot(b"foo"), 12182);
        assert_eq!(hash_slot(b"bar"), 5061);
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
    }

    #[test]
    fn hash_tags_follow_the_first_brace_pair() {
        assert_eq!(hash_tag(b"{user}.x"), Some(&b"user"[..]));
        assert_eq!(hash_tag(b"foo{}{bar}"), None);
        assert_eq!(hash_tag(b"foo{{bar}}zap"), Some(&b"{bar"[..]));
        assert_eq!(hash_tag(b"foo{bar}{zap}"), Some(&b"bar"[..]));
        assert_eq!(hash_tag(b"no tag"), None);
        assert_eq!(hash_tag(b"open{only"), None);
    }

    #[test]
    fn the_lock_key_is_the_plain_name_after_the_prefix() {
        let plain = KeyLayout::default();
        assert_eq!(plain.lock_key(&key("jobs/nightly")), "jobs/nightly");
        let prefixed = KeyLayout::new("app:").unwrap();
        assert_eq!(prefixed.lock_key(&key("jobs/nightly")), "app:jobs/nightly");
    }

    /// Lock names with and without hash tags, empty, unbalanced or nested braces, and bytes
    /// outside ASCII.
    const AWKWARD_NAMES: [&str; 17] = [
        "jobs/nightly",
        "{tenant}:job",
        "a}b",
        "x{}y",
        "{}",
        "}",
        "{",
        "a{b",
        "ключ",
        "🔒",
        "a\nb",
        "{a}b",
        "{a}c",
        "{a}",
        "a",
        "{5061}a}b",
        "{a}{b}",
    ];

    #[test]
    fn the_fencing_counter_shares_the_lock_keys_slot() {
        for name in AWKWARD_NAMES {
            let keys = KeyLayout::default().keys(&key(name));
            assert_eq!(
                hash_slot(keys.fence.as_bytes()),
                hash_slot(keys.lock.as_bytes()),
                "{name:?}: {keys:?}"
            );
            assert_ne!(keys.fence, keys.lock);
        }
    }

    #[test]
    fn counter_names_follow_the_documented_forms() {
        let layout = KeyLayout::default();
        assert_eq!(
            layout.keys(&key("jobs/nightly")).fence,
            "{jobs/nightly}:dlock:fence"
        );
        assert_eq!(
            layout.keys(&key("jobs:{t7}:nightly")).fence,
            "jobs:{t7}:nightly:dlock:fence"
        );
        let shared = layout.keys(&key("a}b")).fence;
        assert!(shared.starts_with("dlock:fence:{"), "{shared}");
        assert_eq!(
            layout.keys(&key("jobs/nightly")).channel,
            "dlock:released:jobs/nightly"
        );
    }

    #[test]
    fn owner_records_share_the_slot_and_name_their_lock_key() {
        let mut seen = std::collections::HashSet::new();
        for name in AWKWARD_NAMES {
            let keys = KeyLayout::default().keys(&key(name));
            assert_eq!(
                hash_slot(keys.owner.as_bytes()),
                hash_slot(keys.lock.as_bytes()),
                "{name:?}: {keys:?}"
            );
            assert_eq!(lock_key_of_owner(&keys.owner), Some(name), "{keys:?}");
            for companion in [&keys.queue, &keys.lapses] {
                assert_eq!(
                    hash_slot(companion.as_bytes()),
                    hash_slot(keys.lock.as_bytes()),
                    "{name:?}: {keys:?}"
                );
                assert!(
                    seen.insert(companion.clone()),
                    "{name:?} shares {companion}"
                );
            }
            assert!(
                seen.insert(keys.owner.clone()),
                "{name:?} shares {}",
                keys.owner
            );
        }
        assert_eq!(owner_key("jobs/nightly"), "dlock:owner:{jobs/nightly}");
        assert_eq!(
            owner_key("jobs:{t7}:nightly"),
            "dlock:owner:{t7}jobs:{t7}:nightly"
        );
        assert_eq!(lock_key_of_owner("dlock:owner:{}"), None);
        assert_eq!(lock_key_of_owner("dlock:owner:{a}b"), None);
        assert_eq!(lock_key_of_owner("jobs/nightly"), None);
    }

    #[test]
    fn look_alike_names_get_distinct_counters() {
        let layout = KeyLayout::default();
        let a = layout.keys(&key("{a}b"));
        let c = layout.keys(&key("{a}c"));
        assert_ne!(a.fence, c.fence);
        let slash = layout.keys(&key("a/b"));
        let escaped = layout.keys(&key("a%2Fb"));
        assert_ne!(slash.fence, escaped.fence);
    }

    #[test]
    fn every_slot_has_a_short_tag() {
        for slot in 0..SLOTS {
            let tag = slot_tag(slot);
            assert!(tag <= MAX_SLOT_TAG, "slot {slot} has no tag");
            assert_eq!(hash_slot(tag.to_string().as_bytes()), slot);
        }
    }

    #[test]
    fn an_oversized_prefix_is_rejected_by_name() {
        let err = KeyLayout::new("p".repeat(MAX_PREFIX_LEN + 1)).unwrap_err();
        assert!(matches!(
            err,
            Error::InvalidInput {
                field: "prefix",
                ..
            }
        ));
    }
}
