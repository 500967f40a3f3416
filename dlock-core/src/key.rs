//! Lock keys: validated once, shared cheaply.
//!
//! Any UTF-8 string is a valid key as long as it is not empty and not longer than [`MAX_KEY_LEN`]
//! bytes. Backends encode keys for their own namespaces (a Redis hash tag, a ZooKeeper node name, an
//! etcd prefix), so slashes, spaces and unicode never collide with each other.

use std::fmt;
use std::sync::Arc;

use crate::check::check_len;
use crate::error::{Error, Result};

/// The longest key accepted, in bytes of UTF-8.
///
/// Chosen so that every backend can store the key after its own encoding (ZooKeeper node names
/// grow up to three times when percent-encoded) well inside its request limits.
pub const MAX_KEY_LEN: usize = 1024;

/// A validated lock key. Cloning is cheap (a reference count).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey(Arc<str>);

impl LockKey {
    /// Validates `key`: it must be non-empty and at most [`MAX_KEY_LEN`] bytes.
    pub fn new(key: &str) -> Result<Self> {
        if key.is_empty() {
            return Err(Error::invalid("key", "must not be empty"));
        }
        check_len("key", key, MAX_KEY_LEN)?;
        Ok(LockKey(Arc::from(key)))
    }

    /// The key as given by the caller.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for LockKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_key_is_rejected_by_name() {
        let err = LockKey::new("").unwrap_err();
        assert!(matches!(err, Error::InvalidInput { field: "key", .. }));
        assert_eq!(err.to_string(), "invalid key: must not be empty");
    }

    #[test]
    fn oversized_key_names_the_limit() {
        let long = "x".repeat(MAX_KEY_LEN + 1);
        let err = LockKey::new(&long).unwrap_err();
        assert!(err.to_string().contains("1025 bytes"), "{err}");
        assert!(err.to_string().contains("1024"), "{err}");
        assert!(LockKey::new(&long[..MAX_KEY_LEN]).is_ok());
    }

    #[test]
    fn unusual_keys_are_accepted_verbatim() {
        for k in ["a/b/c", "with space", "ключ", "🔒", "../..", "%2F", "\0"] {
            assert_eq!(LockKey::new(k).unwrap().as_str(), k);
        }
    }

    #[test]
    fn length_is_measured_in_bytes() {
        // 4 bytes per character: 257 of them exceed the limit although fewer than 1024 characters.
        let key = "🔒".repeat(257);
        assert!(LockKey::new(&key).is_err());
    }
}
