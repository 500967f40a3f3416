//! The distributed-lock API of dlock.
//!
//! Applications hold a [`Locks`]: one backend, chosen at run time, with the defaults for each
//! acquire. It offers the calls an application makes and none of the backend's own; the backend
//! implements [`DistributedLock`] (the calls in [`backend`], for backend authors and layers), and
//! code that holds the trait object itself calls the same operations through
//! [`DistributedLockExt`]. Every backend — the in-process [`InMemoryLock`] here, Redis, Redlock,
//! ZooKeeper, etcd and PostgreSQL in their own crates — gives the same semantics:
//!
//! * [`try_acquire`](Locks::try_acquire) answers held or busy after one attempt;
//!   [`acquire`](Locks::acquire) waits, up to an optional deadline.
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
//!   [`holding`](Locks::holding) shows the holder and its waiters, and [`Admin`]
//!   lists the held locks and evicts a stuck holder, fenced so that its late writes are rejected.
//! * [`Traced`](layer::Traced) and [`Metered`](layer::Metered) are [`Layer`](layer::Layer)s that
//!   trace and meter every call of any backend.
//! * Beside the lock: a [`Semaphore`], a read-write lock ([`RwLock`]), leader [`Election`] and
//!   [`acquire_all`](Locks::acquire_all) over several keys, each hold a fenced
//!   [`Lease`] like the lock's.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> dlock_core::Result<()> {
//! use std::time::Duration;
//! use dlock_core::{Fenced, InMemoryLock, LockOptions, Locks};
//!
//! let locks = Locks::from(InMemoryLock::new());
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
pub mod inspect;
mod key;
pub mod layer;
mod lease;
pub mod limits;
mod locks;
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
pub use lease::Lease;
pub use locks::Locks;
pub use memory::InMemoryLock;
pub use multi::MultiLease;
pub use options::{AutoRenew, Drift, LockOptions};
pub use owner::{Owner, OwnerRecord};
pub use retry::Backoff;
pub use rwlock::RwLock;
pub use semaphore::Semaphore;
pub use state::{Expiring, LeaseState, LeaseWatch};
pub use token::{FencingToken, OwnerToken};

#[cfg(test)]
mod root {
    /// The names at the crate's root: every name its `pub use` lines bring and every public module.
    fn names() -> Vec<String> {
        let text = include_str!("lib.rs");
        let code = text
            .split("#[cfg(test)]\nmod root")
            .next()
            .unwrap_or_default();
        let mut names = Vec::new();
        for item in code.split(';') {
            let item = item.trim();
            if let Some(module) = item.strip_prefix("pub mod ") {
                names.push(module.trim().to_string());
            } else if let Some(path) = item.strip_prefix("pub use ") {
                let listed = match path.split_once('{') {
                    Some((_, list)) => list.trim_end_matches('}').to_string(),
                    None => path.rsplit("::").next().unwrap_or_default().to_string(),
                };
                names.extend(
                    listed
                        .split(',')
                        .map(str::trim)
                        .filter(|n| !n.is_empty())
                        .map(str::to_string),
                );
            }
        }
        names
    }

    #[test]
    fn the_root_holds_at_most_forty_names_and_the_handle_an_application_holds() {
        let names = names();
        assert!(
            names.len() <= 40,
            "{} names at the root: {names:?}",
            names.len()
        );
        for expected in [
            "Locks",
            "Lease",
            "LockOptions",
            "backend",
            "inspect",
            "Error",
        ] {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} is not at the root: {names:?}"
            );
        }
        // The backend author's kit lives in `backend`, a look at a lock's answers in `inspect`.
        for elsewhere in [
            "LockRequest",
            "LeaseRef",
            "Attempt",
            "retry_until_granted",
            "Holding",
        ] {
            assert!(
                !names.iter().any(|n| n == elsewhere),
                "{elsewhere} is at the root"
            );
        }
    }
}
