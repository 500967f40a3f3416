//! The coordination primitives beside the lock: semaphore, read-write lock and election.
//!
//! Each primitive is served by a backend as a *view*: a [`DistributedLock`](crate::DistributedLock)
//! of its own ([`DistributedLock::primitive`](crate::DistributedLock::primitive)) whose
//! `try_lock`, `extend`, `release`, `wait_for_release` and `inspect` act on the primitive's
//! on-server layout rather than the lock's. A permit, a read or write hold and a leadership are
//! then ordinary [`Lease`](crate::Lease)s: the same owner and fencing tokens, the same
//! held/uncertain/lost states, the same auto-renew, cancellation and layers, written once.
//! A name used as a lock, a semaphore, a read-write lock and an election names four independent
//! things.

use std::sync::Arc;

use crate::check::check_len;
use crate::error::{Error, Result};

/// The most permits a semaphore may have.
pub const MAX_PERMITS: u32 = 10_000;

/// The longest value a candidate may publish, in bytes of UTF-8.
pub const MAX_VALUE_LEN: usize = 1024;

/// Which primitive a view serves.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Primitive {
    /// A semaphore: up to `permits` holders of a name at once, each with a lease of its own.
    /// Every client of one name must pass the same `permits`; a client that passes another
    /// number is refused with [`Error::Mismatch`] while the name is in use.
    Semaphore {
        /// How many holders at once (1 to [`MAX_PERMITS`]).
        permits: u32,
    },
    /// The reading side of a read-write lock: shares the name with other readers, never with a
    /// writer, and waits behind a writer that is already waiting.
    Read,
    /// The writing side of a read-write lock: holds the name alone.
    Write,
    /// A candidate in an election: an exclusive hold whose holder is the leader and publishes
    /// `value` for observers. Observers use `value: None`; campaigning needs a value.
    Election {
        /// What the leader publishes (its address, say): 1 to [`MAX_VALUE_LEN`] bytes. Shared,
        /// so that the views and holders that carry it do not copy it.
        value: Option<Arc<str>>,
    },
}

impl Primitive {
    /// A semaphore of `permits` permits.
    pub fn semaphore(permits: u32) -> Self {
        Primitive::Semaphore { permits }
    }

    /// A candidate publishing `value`.
    pub fn candidate(value: impl Into<Arc<str>>) -> Self {
        Primitive::Election {
            value: Some(value.into()),
        }
    }

    /// An election looked at by an observer.
    pub fn observer() -> Self {
        Primitive::Election { value: None }
    }

    /// The primitive's name in errors and docs.
    pub fn name(&self) -> &'static str {
        match self {
            Primitive::Semaphore { .. } => "semaphore",
            Primitive::Read => "read lock",
            Primitive::Write => "write lock",
            Primitive::Election { .. } => "election",
        }
    }

    /// Checks the settings against the documented limits; nothing is sent to a server.
    pub fn validate(&self) -> Result<()> {
        match self {
            Primitive::Semaphore { permits } if !(1..=MAX_PERMITS).contains(permits) => {
                Err(Error::invalid(
                    "permits",
                    format!("must be 1 to {MAX_PERMITS}, not {permits}"),
                ))
            }
            Primitive::Election { value: Some(value) } => check_value(value),
            _ => Ok(()),
        }
    }

    /// The candidate's value, or an error naming the observer that tried to campaign.
    pub fn value(&self) -> Result<&Arc<str>> {
        match self {
            Primitive::Election { value: Some(value) } => Ok(value),
            _ => Err(Error::invalid(
                "value",
                "only a candidate with a value can campaign",
            )),
        }
    }
}

/// Checks a candidate's value: 1 to [`MAX_VALUE_LEN`] bytes.
pub fn check_value(value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid("value", "must not be empty"));
    }
    check_len("value", value, MAX_VALUE_LEN)
}

/// Which primitives a backend serves besides the lock (see [`Capabilities`](crate::backend::Capabilities)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Primitives {
    /// [`Primitive::Semaphore`].
    pub semaphore: bool,
    /// [`Primitive::Read`] and [`Primitive::Write`].
    pub read_write: bool,
    /// [`Primitive::Election`].
    pub election: bool,
}

impl Primitives {
    /// None besides the lock.
    pub const NONE: Primitives = Primitives {
        semaphore: false,
        read_write: false,
        election: false,
    };

    /// Every primitive.
    pub const ALL: Primitives = Primitives {
        semaphore: true,
        read_write: true,
        election: true,
    };

    /// Whether `primitive` is among them.
    pub fn serves(&self, primitive: &Primitive) -> bool {
        match primitive {
            Primitive::Semaphore { .. } => self.semaphore,
            Primitive::Read | Primitive::Write => self.read_write,
            Primitive::Election { .. } => self.election,
        }
    }

    /// `Ok` if `primitive` is among them, otherwise the [`Error::Unsupported`] that `backend`
    /// answers for it.
    pub fn require(&self, backend: &'static str, primitive: &Primitive) -> Result<()> {
        if self.serves(primitive) {
            return Ok(());
        }
        Err(Error::Unsupported {
            backend,
            what: primitive.name(),
        })
    }

    /// Without the semaphore.
    pub const fn without_semaphore(mut self) -> Self {
        self.semaphore = false;
        self
    }

    /// Without the election.
    pub const fn without_election(mut self) -> Self {
        self.election = false;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_checked() {
        assert!(Primitive::semaphore(0).validate().is_err());
        assert!(Primitive::semaphore(MAX_PERMITS + 1).validate().is_err());
        assert!(Primitive::semaphore(1).validate().is_ok());
        assert!(Primitive::candidate("").validate().is_err());
        assert!(Primitive::candidate("x".repeat(MAX_VALUE_LEN + 1))
            .validate()
            .is_err());
        assert!(Primitive::candidate("10.0.0.7:8080").validate().is_ok());
        assert!(Primitive::observer().validate().is_ok());
        assert!(Primitive::observer().value().is_err());
    }
}
