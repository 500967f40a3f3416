//! Distributed locks with fencing tokens: one dependency, backends chosen by Cargo feature and
//! swapped per environment by URL.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> dlock::Result<()> {
//! use dlock::DistributedLockExt;
//!
//! // memory:// in tests, redis://, zk://, etcd:// or postgres:// in production: one setting.
//! let url = std::env::var("DLOCK_URL").unwrap_or_else(|_| "memory://?ttl=30s".into());
//! let locks = dlock::connect(&url).await?;
//!
//! let opts = locks.options().clone().with_auto_renew();
//! let lease = locks.acquire("invoices/42", &opts).await?;
//! // Present the token with every write, so the resource can reject a stale holder.
//! println!("writing with fencing token {}", lease.fencing_token());
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! This crate re-exports the API of [`dlock_core`] (also as [`core`]) — the
//! [`DistributedLock`] trait, [`DistributedLockExt`], [`Lease`], [`FencingToken`], [`Fence`],
//! [`LockOptions`], the in-process [`InMemoryLock`], and the primitives beside the lock
//! ([`Semaphore`], [`RwLock`], [`Election`], [`MultiLease`]; see [`Locks`]) — and each network
//! backend behind a Cargo feature, as a module named after it with the backend's own builder:
//!
//! | feature | module | URL schemes |
//! |---|---|---|
//! | — (always) | [`InMemoryLock`] | `memory://` |
//! | `redis` | `redis` ([`dlock-redis`](https://docs.rs/dlock-redis)) | `redis://`, `redis+unix://`, `redis+cluster://` |
//! | `redis-tls` | `redis`, with TLS | `rediss://`, `rediss+cluster://` as well |
//! | `redlock` | `redlock` ([`dlock-redlock`](https://docs.rs/dlock-redlock)) | `redlock://` |
//! | `zk` | `zk` ([`dlock-zk`](https://docs.rs/dlock-zk)) | `zk://` |
//! | `zk-tls` | `zk`, with TLS | `zk+tls://` as well |
//! | `etcd` | `etcd` ([`dlock-etcd`](https://docs.rs/dlock-etcd)) | `etcd://` |
//! | `postgres` | `postgres` ([`dlock-postgres`](https://docs.rs/dlock-postgres)) | `postgres://`, `postgresql://` |
//!
//! No network backend is on by default, so `cargo add dlock-rs` builds anywhere, without protoc or
//! a server. [`connect`] describes every URL form and its query parameters; a scheme whose
//! feature is not compiled in is an error that names the feature.
#![deny(missing_docs)]
// On docs.rs (`--cfg docsrs`), each feature-gated item is marked with the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod builder;
mod connect;

pub use builder::{builder, LocksBuilder};
pub use connect::{connect, COMMON_PARAMETERS, MEMORY_PARAMETERS, SCHEMES};
pub use dlock_core::backend::url::parse_duration;

/// The core API, for what the root does not re-export.
pub use dlock_core as core;

pub use dlock_core::backend::{
    url, Capabilities, FencingGuarantee, LockHandle, LockKey, Primitive, Primitives,
};
pub use dlock_core::inspect::{Eviction, HeldLock, Holder, Holding, Waiter};
pub use dlock_core::layer::{Layer, Metered, Traced};
pub use dlock_core::limits::{MAX_KEYS, MAX_PERMITS, MAX_VALUE_LEN, OBSERVE_INTERVAL};
pub use dlock_core::{
    Admin, AutoRenew, Backoff, CriticalSection, DistributedLock, DistributedLockExt, Drift,
    Election, Error, Expiring, Fence, FenceMode, Fenced, FencingToken, InMemoryLock, Leader,
    Leadership, Lease, LeaseEnd, LeaseState, LeaseWatch, LockOptions, Locks, LostReason,
    MultiLease, OwnerRecord, OwnerToken, Released, Result, RwLock, Semaphore, StaleToken,
};

/// The single-Redis backend (feature `redis`): [`RedisLock::builder`](dlock_redis::RedisLock::builder).
#[cfg(feature = "redis")]
pub use dlock_redis as redis;

/// The Redlock backend (feature `redlock`): [`RedlockBuilder`](dlock_redlock::RedlockBuilder).
#[cfg(feature = "redlock")]
pub use dlock_redlock as redlock;

/// The ZooKeeper backend (feature `zk`): [`ZkLock::builder`](dlock_zk::ZkLock::builder).
#[cfg(feature = "zk")]
pub use dlock_zk as zk;

/// The etcd backend (feature `etcd`): [`EtcdLock::builder`](dlock_etcd::EtcdLock::builder).
#[cfg(feature = "etcd")]
pub use dlock_etcd as etcd;

/// The PostgreSQL backend (feature `postgres`): [`PgLock::builder`](dlock_postgres::PgLock::builder).
#[cfg(feature = "postgres")]
pub use dlock_postgres as postgres;

/// The README's examples, compiled as doctests so they cannot rot. They live here, in the crate
/// that sees every part of the API the README shows.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The primitives page's examples, compiled as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../docs/primitives.md")]
pub struct PrimitivesDoctests;

/// The operating guide's examples (the tracing and metrics layers), compiled so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../docs/operating.md")]
pub struct OperatingDoctests;

/// The ZooKeeper guide's examples, compiled here because they use the facade's paths (`dlock::zk`).
#[cfg(all(doctest, feature = "zk"))]
#[doc = include_str!("../../dlock-zk/README.md")]
pub struct DlockZkReadmeDoctests;

/// The etcd guide's examples, compiled here because they use the facade's paths (`dlock::etcd`).
#[cfg(all(doctest, feature = "etcd"))]
#[doc = include_str!("../../dlock-etcd/README.md")]
pub struct DlockEtcdReadmeDoctests;
