//! Lock names to advisory lock keys, in the mapping of DistributedLock's `PostgresAdvisoryLockKey`
//! (the .NET library's Postgres backend, with hashing allowed), so that a dlock client and a
//! DistributedLock client given the same name take the same server lock.
//!
//! PostgreSQL has two advisory key spaces that never meet: one `bigint`, and a pair of
//! `integer`s. A name is mapped, in this order:
//!
//! 1. up to 9 ASCII characters: packed 7 bits each into 63 bits, then a `0` bit, then `1` bits
//!    for the unused characters; the 64 bits are split into the pair `(high, low)`. Distinct
//!    names get distinct keys, and none meets a hashed one (different space);
//! 2. exactly 16 hexadecimal digits: that `bigint` (`000000000000002a` is key 42);
//!    `XXXXXXXX,XXXXXXXX` (two groups of 8 hexadecimal digits): that pair;
//! 3. anything else: the first 8 bytes of the SHA-1 of its UTF-8, read little-endian, as a
//!    `bigint`.
//!
//! Hashed names can collide: two names with equal keys exclude each other (never the reverse:
//! one name always maps to one key). With 2^64 keys, a collision among a million names has a
//! chance near 3 × 10^-8.

use std::fmt;

/// A PostgreSQL advisory lock key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AdvisoryKey {
    /// A key of the `bigint` space: `pg_advisory_lock(bigint)`.
    Single(i64),
    /// A key of the pair space: `pg_advisory_lock(integer, integer)`.
    Pair(i32, i32),
}

const ASCII_BITS: u32 = 7;
const ASCII_MAX: u64 = (1 << ASCII_BITS) - 1;
const ASCII_MAX_LEN: usize = 9;

/// The advisory key of the lock named `name`, in DistributedLock's mapping (with hashing
/// allowed): up to 9 ASCII characters packed into the pair space; 16 hexadecimal digits as that
/// `bigint`, `XXXXXXXX,XXXXXXXX` as that pair; anything else the first 8 bytes of its SHA-1,
/// little-endian, as a `bigint`. Hashed names can collide (see the crate documentation).
///
/// ```
/// use dlock_postgres::{advisory_key, AdvisoryKey};
///
/// assert_eq!(advisory_key("000000000000002a"), AdvisoryKey::Single(42));
/// assert_eq!(advisory_key("00000001,00000002"), AdvisoryKey::Pair(1, 2));
/// ```
pub fn advisory_key(name: &str) -> AdvisoryKey {
    if let Some(packed) = ascii(name) {
        let (high, low) = split(packed);
        return AdvisoryKey::Pair(high, low);
    }
    if let Some(key) = hex(name) {
        return key;
    }
    let digest = sha1_smol::Sha1::from(name.as_bytes()).digest().bytes();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    AdvisoryKey::Single(i64::from_le_bytes(first))
}

/// Up to 9 ASCII characters, packed.
fn ascii(name: &str) -> Option<u64> {
    if name.len() > ASCII_MAX_LEN || !name.is_ascii() {
        return None;
    }
    let mut packed = 0u64;
    for byte in name.bytes() {
        packed = (packed << ASCII_BITS) | u64::from(byte);
    }
    packed <<= 1;
    for _ in name.len()..ASCII_MAX_LEN {
        packed = (packed << ASCII_BITS) | ASCII_MAX;
    }
    Some(packed)
}

/// `XXXXXXXXXXXXXXXX` or `XXXXXXXX,XXXXXXXX` in hexadecimal digits.
fn hex(name: &str) -> Option<AdvisoryKey> {
    let bytes = name.as_bytes();
    let (high, low, pair) = match bytes.len() {
        16 => (&name[..8], &name[8..], false),
        17 if bytes[8] == b',' => (&name[..8], &name[9..], true),
        _ => return None,
    };
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    if !digits(high) || !digits(low) {
        return None;
    }
    let high = u32::from_str_radix(high, 16).ok()?;
    let low = u32::from_str_radix(low, 16).ok()?;
    Some(if pair {
        AdvisoryKey::Pair(high as i32, low as i32)
    } else {
        AdvisoryKey::Single(((u64::from(high) << 32) | u64::from(low)) as i64)
    })
}

fn split(key: u64) -> (i32, i32) {
    ((key >> 32) as u32 as i32, key as u32 as i32)
}

impl AdvisoryKey {
    /// How `pg_locks` shows the key: `classid`, `objid` (both `oid`, read as unsigned) and
    /// `objsubid` (1 for the `bigint` space, 2 for pairs).
    pub fn in_pg_locks(self) -> (u32, u32, i16) {
        match self {
            AdvisoryKey::Single(key) => ((key as u64 >> 32) as u32, key as u64 as u32, 1),
            AdvisoryKey::Pair(high, low) => (high as u32, low as u32, 2),
        }
    }

    /// The SQL arguments of an advisory-lock function call for this key, as literals: the key
    /// is numbers only, so this cannot inject anything.
    pub(crate) fn sql_args(self) -> String {
        match self {
            AdvisoryKey::Single(key) => format!("{key}::bigint"),
            AdvisoryKey::Pair(high, low) => format!("{high}, {low}"),
        }
    }
}

/// `bigint 42` or `pair (1, 2)`; also the payload of release notifications.
impl fmt::Display for AdvisoryKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdvisoryKey::Single(key) => write!(f, "bigint {key}"),
            AdvisoryKey::Pair(high, low) => write!(f, "pair ({high}, {low})"),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Values computed by DistributedLock's `PostgresAdvisoryLockKey(name, allowHashing: true)`
    /// rules by hand: the packing of "a" is 'a' (97) shifted by the 0 bit and 8 × 7 one bits.
    #[test]
    fn ascii_names_pack_into_the_pair_space() {
        let a = (97u64 << 57) | ((1u64 << 56) - 1);
        assert_eq!(
            advisory_key("a"),
            AdvisoryKey::Pair((a >> 32) as u32 as i32, a as u32 as i32)
        );
        assert_eq!(advisory_key(""), AdvisoryKey::Pair(i32::MAX, -1));
        assert_ne!(advisory_key("a"), advisory_key("a\0"));
        assert!(matches!(advisory_key("123456789"), AdvisoryKey::Pair(..)));
        assert!(matches!(advisory_key("1234567890"), AdvisoryKey::Single(_)));
    }

    #[test]
    fn hex_names_are_their_numbers() {
        assert_eq!(advisory_key("ffffffffffffffff"), AdvisoryKey::Single(-1));
        assert_eq!(
            advisory_key("7FFFFFFFFFFFFFFF"),
            AdvisoryKey::Single(i64::MAX)
        );
        assert_eq!(advisory_key("ffffffff,00000000"), AdvisoryKey::Pair(-1, 0));
        // Not hex: hashed.
        assert!(matches!(
            advisory_key("gfffffffffffffff"),
            AdvisoryKey::Single(_)
        ));
    }

    /// SHA-1("invoices/42") begins e6 38 bb d0 ec 0a 54 b5 (`sha1sum`); read little-endian.
    #[test]
    fn other_names_hash_with_sha1_little_endian() {
        assert_eq!(
            advisory_key("invoices/42"),
            AdvisoryKey::Single(0xb554_0aec_d0bb_38e6_u64 as i64)
        );
        assert_eq!(advisory_key("ünïcode"), advisory_key("ünïcode"));
    }

    #[test]
    fn pg_locks_shows_the_halves() {
        assert_eq!(
            AdvisoryKey::Single(-1).in_pg_locks(),
            (u32::MAX, u32::MAX, 1)
        );
        assert_eq!(AdvisoryKey::Single(1 << 32 | 5).in_pg_locks(), (1, 5, 1));
        assert_eq!(AdvisoryKey::Pair(-2, 3).in_pg_locks(), (u32::MAX - 1, 3, 2));
    }
}
