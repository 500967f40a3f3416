//! How dlock's Redis locks are stored and changed on the server: the key layout ([`keys`]), the
//! Lua scripts that take, extend, release and inspect a lock ([`scripts`]), and the checks and
//! error classification every client of those servers applies.
//!
//! One algorithm for every client of these servers: [`RedisLock`](crate::RedisLock) runs these
//! scripts on its server, and dlock-redlock runs the same ones on each of its masters and
//! counts a quorum, so that a lock has one layout whichever client took it, and other
//! libraries' clients (redis-py, rslock) can be written against it. It is part of the crate's
//! API, versioned with it; a change to the layout or to a script's keys and arguments is a
//! breaking change. Applications use [`RedisLock`](crate::RedisLock) (or `dlock::connect`).

pub mod keys;
pub mod primitives;
pub mod scripts;

pub use crate::builder::{check_fence_ttl, check_timeout, ServerUrl};
pub use crate::error::from_redis as error_from_redis;
