//! How dlock's Redis locks are stored and changed on the server: the key layout ([`keys`]), the
//! Lua scripts that take, extend, release and inspect a lock ([`scripts`]), and the checks and
//! error classification every client of those servers applies.
//!
//! Shared with dlock-redlock, which runs the same scripts on every master, so that a lock has one
//! layout whichever client took it. It is public only for that reason: it is not a stable API,
//! is hidden from the documentation, and may change in any release. Applications use
//! [`RedisLock`](crate::RedisLock) (or `dlock::connect`).

pub mod keys;
pub mod primitives;
pub mod scripts;

pub use crate::builder::{check_fence_ttl, check_timeout, ServerUrl};
pub use crate::error::from_redis as error_from_redis;
