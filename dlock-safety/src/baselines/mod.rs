//! Two broken lock clients, run through every scenario so the checker is seen catching them.
//!
//! Both are written the way they were widely deployed, against the same Redis server as
//! `dlock-redis`, behind the same [`DistributedLock`](dlock_core::DistributedLock) trait: so
//! dlock-core still judges validity and renews for them, and every difference in the matrix comes
//! from the server-side protocol. Neither has a fencing token: they present token 0 to the
//! resource, which therefore cannot tell their holders apart.

mod connection;
mod legacy_getset;
mod naive_expire;

pub use legacy_getset::LegacyGetSetLock;
pub use naive_expire::NaiveExpireLock;
