//! A read-only look at a lock: who, if anyone, holds a key right now.
//!
//! Operators and scripts (`dlock status`) want to know whether a lock is held without taking it:
//! taking it would change the lock, and on most backends also use up a fencing token. Not every
//! backend can answer; those that cannot say so with [`Error::Unsupported`](crate::Error).
//! A backend made of independent servers (Redlock) can also reach them and still not know: when
//! the servers that answered disagree, it says [`Holding::Unknown`] rather than pick a side.

use std::fmt;
use std::time::Duration;

use crate::token::FencingToken;

/// What a read-only look at a lock key found, at the moment the server answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Holding {
    /// Nobody holds the lock.
    Free,
    /// Someone holds the lock.
    Held {
        /// The holder's fencing token, if the backend can tell it for certain.
        fencing: Option<FencingToken>,
        /// How long the server keeps the lock without a renewal, if it has a per-key TTL.
        expires_in: Option<Duration>,
    },
    /// The servers answered but do not agree: no quorum shows one holder, and none shows the key
    /// absent (a lock being taken or given back at that moment, or held on a minority only).
    Unknown,
}

impl Holding {
    /// Whether someone holds the lock.
    pub fn is_held(&self) -> bool {
        matches!(self, Holding::Held { .. })
    }
}

impl fmt::Display for Holding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Holding::Free => f.write_str("free"),
            Holding::Unknown => f.write_str("unknown (the servers disagree)"),
            Holding::Held {
                fencing,
                expires_in,
            } => {
                f.write_str("held")?;
                match fencing {
                    Some(token) => write!(f, " (fencing token {token})")?,
                    None => f.write_str(" (fencing token unknown)")?,
                }
                if let Some(left) = expires_in {
                    write!(f, ", expires in {} ms unless renewed", left.as_millis())?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_says_what_is_known() {
        assert_eq!(Holding::Free.to_string(), "free");
        let held = Holding::Held {
            fencing: Some(FencingToken(7)),
            expires_in: Some(Duration::from_millis(1500)),
        };
        assert!(held.is_held());
        assert_eq!(
            held.to_string(),
            "held (fencing token 7), expires in 1500 ms unless renewed"
        );
        let unknown = Holding::Held {
            fencing: None,
            expires_in: None,
        };
        assert_eq!(unknown.to_string(), "held (fencing token unknown)");
        assert!(!Holding::Unknown.is_held());
        assert_eq!(
            Holding::Unknown.to_string(),
            "unknown (the servers disagree)"
        );
    }
}
