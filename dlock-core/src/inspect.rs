//! A read-only look at locks — who holds a key, who waits for it, which keys are held — and the
//! one operator call that changes a lock it does not own: a fenced eviction.
//!
//! Operators and scripts (`dlock status`, `dlock list`) want to know who holds a lock without
//! taking it: taking it would change the lock, and on most backends also use up a fencing token.
//! Not every backend can answer every question; one that cannot says so with
//! [`Error::Unsupported`](crate::Error), and a field it cannot fill stays `None`. A backend made
//! of independent servers (Redlock) can also reach them and still not know: when the servers
//! that answered disagree, it says [`Holding::Unknown`] rather than pick a side.

use std::fmt;
use std::time::Duration;

use crate::owner::OwnerRecord;
use crate::token::FencingToken;

/// What a read-only look at a lock key found, at the moment the server answered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Holding {
    /// Nobody holds the lock.
    Free,
    /// Someone holds the lock.
    Held(Holder),
    /// The servers answered but do not agree: no quorum shows one holder, and none shows the key
    /// absent (a lock being taken or given back at that moment, or held on a minority only).
    Unknown,
}

impl Holding {
    /// Whether someone holds the lock.
    pub fn is_held(&self) -> bool {
        matches!(self, Holding::Held(_))
    }

    /// The holder, if someone holds the lock.
    pub fn holder(&self) -> Option<&Holder> {
        match self {
            Holding::Held(holder) => Some(holder),
            _ => None,
        }
    }
}

/// The current holder of a lock, as far as the backend can tell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The holder's fencing token, if the backend can tell it for certain.
    pub fencing: Option<FencingToken>,
    /// How long the server keeps the lock without a renewal, if it has a per-key TTL.
    pub expires_in: Option<Duration>,
    /// Who took it, if the holder left an [`OwnerRecord`] (every dlock client does; a peer
    /// library's client does not).
    pub owner: Option<OwnerRecord>,
    /// How many contenders wait for the lock, where the server keeps them (a queue of nodes or
    /// keys) or the backend otherwise knows; `None` where it cannot tell.
    pub waiting: Option<usize>,
    /// The waiting contenders in the order they will be served, where the backend queues them;
    /// empty otherwise.
    pub queue: Vec<Waiter>,
    /// How many hold the name at once, for the primitives that share it (a semaphore's permits
    /// in use, a read lock's readers); `None` for an exclusive hold. The other fields describe
    /// the earliest of them.
    pub holders: Option<usize>,
    /// The value an election's leader published; `None` elsewhere.
    pub value: Option<String>,
}

impl Holder {
    /// A holder the backend knows nothing about yet.
    pub fn new() -> Self {
        Holder::default()
    }

    /// With its fencing token.
    pub fn with_fencing(mut self, fencing: FencingToken) -> Self {
        self.fencing = Some(fencing);
        self
    }

    /// With the time left on its per-key TTL.
    pub fn with_expiry(mut self, expires_in: Duration) -> Self {
        self.expires_in = Some(expires_in);
        self
    }

    /// With its owner record, if it has one.
    pub fn with_owner(mut self, owner: Option<OwnerRecord>) -> Self {
        self.owner = owner;
        self
    }

    /// With a count of waiting contenders whose order is not known.
    pub fn with_waiting(mut self, waiting: usize) -> Self {
        self.waiting = Some(waiting);
        self
    }

    /// Shared by `holders` holders at once (a semaphore, a read lock).
    pub fn with_holders(mut self, holders: usize) -> Self {
        self.holders = Some(holders);
        self
    }

    /// With the value an election's leader published.
    pub fn with_value(mut self, value: Option<String>) -> Self {
        self.value = value;
        self
    }

    /// With the queue of waiting contenders, in the order they will be served.
    pub fn with_queue(mut self, queue: Vec<Waiter>) -> Self {
        self.waiting = Some(queue.len());
        self.queue = queue;
        self
    }
}

/// One contender waiting in a lock's queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Waiter {
    /// Who waits, if the contender left an [`OwnerRecord`].
    pub owner: Option<OwnerRecord>,
}

impl Waiter {
    /// A waiter with the given owner record.
    pub fn new(owner: Option<OwnerRecord>) -> Self {
        Waiter { owner }
    }
}

/// One held lock, as [`DistributedLock::list`](crate::DistributedLock::list) finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldLock {
    /// The lock's name, as the taker passed it.
    pub key: String,
    /// Its holder.
    pub holder: Holder,
}

impl HeldLock {
    /// `key` held by `holder`.
    pub fn new(key: impl Into<String>, holder: Holder) -> Self {
        HeldLock {
            key: key.into(),
            holder,
        }
    }
}

/// The outcome of a forced eviction ([`DistributedLock::evict`](crate::DistributedLock::evict)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Eviction {
    /// The holder's entry was removed; this is who it was.
    Evicted(Holder),
    /// Nobody held the lock; nothing was changed.
    Free,
    /// The lock is held by someone other than the holder the caller expected (it changed hands
    /// since the caller looked); nothing was changed.
    Changed(Holder),
}

impl fmt::Display for Holding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Holding::Free => f.write_str("free"),
            Holding::Unknown => f.write_str("unknown (the servers disagree)"),
            Holding::Held(holder) => write!(f, "held {holder}"),
        }
    }
}

impl fmt::Display for Holder {
    /// `by billing on web-1 (pid 4242) for 12 s (fencing token 7), expires in 1500 ms unless
    /// renewed, 2 waiting`: what is known, and says so where it is not.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.owner {
            Some(owner) => {
                write!(f, "by {owner}")?;
                if let Some(age) = owner.age() {
                    write!(f, " for {} s", age.as_secs())?;
                }
                f.write_str(" ")?;
            }
            None => f.write_str("by an unrecorded owner ")?,
        }
        match self.fencing {
            Some(token) => write!(f, "(fencing token {token})")?,
            None => f.write_str("(fencing token unknown)")?,
        }
        if let Some(left) = self.expires_in {
            write!(f, ", expires in {} ms unless renewed", left.as_millis())?;
        }
        if let Some(waiting) = self.waiting {
            write!(f, ", {waiting} waiting")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::owner::Owner;

    #[test]
    fn display_says_what_is_known() {
        assert_eq!(Holding::Free.to_string(), "free");
        let held = Holding::Held(
            Holder::new()
                .with_fencing(FencingToken(7))
                .with_expiry(Duration::from_millis(1500)),
        );
        assert!(held.is_held());
        assert_eq!(
            held.to_string(),
            "held by an unrecorded owner (fencing token 7), expires in 1500 ms unless renewed"
        );
        let unknown = Holding::Held(Holder::new().with_waiting(2));
        assert_eq!(
            unknown.to_string(),
            "held by an unrecorded owner (fencing token unknown), 2 waiting"
        );
        assert!(!Holding::Unknown.is_held());
        assert_eq!(
            Holding::Unknown.to_string(),
            "unknown (the servers disagree)"
        );
    }

    #[test]
    fn display_names_the_owner_and_its_age() {
        let owner = Owner::this_process().with_label("billing").unwrap();
        let holder = Holder::new()
            .with_fencing(FencingToken(3))
            .with_owner(Some(owner.record()))
            .with_queue(vec![Waiter::new(None)]);
        let text = Holding::Held(holder).to_string();
        assert!(text.starts_with("held by billing on "), "{text}");
        assert!(text.contains(" for 0 s (fencing token 3)"), "{text}");
        assert!(text.ends_with(", 1 waiting"), "{text}");
    }
}
