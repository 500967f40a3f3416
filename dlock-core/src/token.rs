//! The two tokens every lease carries: who owns it, and where it stands in the order of holders.

use std::fmt;

/// A number that is strictly greater for every later holder of the same key.
///
/// A resource that remembers the highest token it has admitted (see [`Fence`](crate::Fence)) can
/// reject the writes of a holder whose lease ended while it was paused: time alone cannot make a
/// lock safe, ordering can. How strongly each backend guarantees the order is stated by its
/// [`FencingGuarantee`](crate::backend::FencingGuarantee).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token as a plain number, e.g. to store in a database column.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for u64 {
    fn from(t: FencingToken) -> u64 {
        t.0
    }
}

/// A random 128-bit identity of one lease, written to the server as the lock's value.
///
/// Ownership checks compare it, so whoever knows it can release the lock: it is shown in full only
/// by [`OwnerToken::to_hex`], never by `Debug`, `Display` or tracing.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken(u128);

impl OwnerToken {
    /// A fresh token from the thread-local cryptographically secure generator.
    pub fn random() -> Self {
        OwnerToken(rand::random())
    }

    /// Rebuilds a token from its value (e.g. one read back from a server).
    pub fn from_u128(value: u128) -> Self {
        OwnerToken(value)
    }

    /// Parses the 32-character lowercase hex form produced by [`OwnerToken::to_hex`].
    pub fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != 32 {
            return None;
        }
        u128::from_str_radix(hex, 16).ok().map(OwnerToken)
    }

    /// The token's value.
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// The token as 32 lowercase hex characters, the form backends store.
    pub fn to_hex(self) -> String {
        format!("{:032x}", self.0)
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Enough to tell two tokens apart in a log, not enough to release someone else's lock.
        write!(f, "OwnerToken(…{:04x})", self.0 & 0xffff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let t = OwnerToken::random();
        let hex = t.to_hex();
        assert_eq!(hex.len(), 32);
        assert_eq!(OwnerToken::from_hex(&hex), Some(t));
        assert_eq!(OwnerToken::from_hex("xyz"), None);
        assert_eq!(OwnerToken::from_hex(&"g".repeat(32)), None);
    }

    #[test]
    fn debug_hides_the_token() {
        let t = OwnerToken::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        let shown = format!("{t:?}");
        assert!(!shown.contains(&t.to_hex()), "{shown}");
        assert_eq!(shown, "OwnerToken(…cdef)");
    }

    #[test]
    fn random_tokens_differ() {
        assert_ne!(OwnerToken::random(), OwnerToken::random());
    }

    #[test]
    fn fencing_tokens_order_by_value() {
        assert!(FencingToken(2) > FencingToken(1));
        assert_eq!(FencingToken(7).to_string(), "7");
        assert_eq!(u64::from(FencingToken(9)), 9);
    }
}
