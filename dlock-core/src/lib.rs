//! The distributed-lock API of dlock.
//!
//! Services hold one [`DistributedLock`] backend as `Arc<dyn DistributedLock>`, chosen at run
//! time, and call the operations of [`DistributedLockExt`] on it. Every backend — the in-process
//! [`InMemoryLock`] here, Redis, Redlock, ZooKeeper and etcd in their own crates — gives the same
//! semantics:
//!
//! * [`try_acquire`](DistributedLockExt::try_acquire) answers held or busy after one attempt;
//!   [`acquire`](DistributedLockExt::acquire) waits, up to an optional deadline.
//! * A [`Lease`] carries a random [`OwnerToken`], a [`FencingToken`] that grows with every new
//!   holder, and a conservative validity deadline on the client's monotonic clock.
//! * Every lease is [held, uncertain or lost](LeaseState), observable as a query and as a future
//!   ([`Lease::lost`]), so work can stop the moment the lock is gone.
//! * [Auto-renew](LockOptions::with_auto_renew) is opt-in, written once here for every backend;
//!   a backend handle renews all its due leases in one batch per tick
//!   ([`extend_many`](DistributedLock::extend_many)), not one timer and one request per lease.
//! * [`Lease::release`] is explicit and async; dropping a lease never blocks.
//! * A [`Fence`] lets a resource reject the writes of a holder whose lease already ended, which no
//!   lock service can prevent by time alone.
//! * Every grant leaves an [`OwnerRecord`] (host, pid, label) next to the lock;
//!   [`holding`](DistributedLockExt::holding) shows the holder and its waiters, and [`Admin`]
//!   lists the held locks and evicts a stuck holder, fenced so that its late writes are rejected.
//! * [`Traced`](layer::Traced) and [`Metered`](layer::Metered) are [`Layer`](layer::Layer)s that
//!   trace and meter every call of any backend.
//! * Beside the lock: a [`Semaphore`], a read-write lock ([`RwLock`]), leader [`Election`] and
//!   [`acquire_all`](DistributedLockExt::acquire_all) over several keys, each hold a fenced
//!   [`Lease`] like the lock's.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> dlock_core::Result<()> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use dlock_core::{DistributedLock, DistributedLockExt, Fenced, InMemoryLock, LockOptions};
//!
//! let locks: Arc<dyn DistributedLock> = Arc::new(InMemoryLock::new());
//! let ledger = Fenced::new(Vec::new());
//!
//! let opts = LockOptions::new(Duration::from_secs(10)).with_auto_renew();
//! let done = locks
//!     .with_lock("ledger", &opts, |lease| async move {
//!         ledger.write(lease.fencing_token(), |entries| entries.push("debit 10"))
//!     })
//!     .await?;
//! assert!(done.completed_under_lock());
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod acquire;
mod admin;
pub mod backend;
mod check;
mod critical;
mod election;
mod error;
mod ext;
mod fence;
mod inspect;
mod key;
pub mod layer;
mod lease;
pub mod limits;
mod memory;
#[cfg(test)]
mod module_graph;
mod multi;
mod options;
mod owner;
mod pending;
mod primitive;
mod retry;
mod rwlock;
mod semaphore;
mod session;
mod state;
mod token;
mod waiting;

pub use admin::Admin;
pub use backend::{DistributedLock, Released};
pub use critical::{CriticalSection, LeaseEnd};
pub use election::{Election, Leader, Leadership};
pub use error::{Error, LostReason, Result};
pub use ext::DistributedLockExt;
pub use fence::{Fence, FenceMode, Fenced, StaleToken};
pub use inspect::{Eviction, HeldLock, Holder, Holding, Waiter};
pub use lease::Lease;
pub use memory::InMemoryLock;
pub use multi::MultiLease;
pub use options::{AutoRenew, Drift, LockOptions};
pub use owner::{Owner, OwnerRecord};
pub use retry::Backoff;
pub use rwlock::RwLock;
pub use semaphore::Semaphore;
pub use state::{Expiring, LeaseState, LeaseWatch};
pub use token::{FencingToken, OwnerToken};
