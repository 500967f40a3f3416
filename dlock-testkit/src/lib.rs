//! What every dlock test harness needs to run lock servers and break them on purpose.
//!
//! The compliance suite, the safety report and the benchmark all run real servers and inject
//! faults — a frozen server, a crashed one, a lost disk, a partition, a silent link. This crate
//! owns that: [`fixtures`] start Redis, etcd, ZooKeeper and PostgreSQL in Docker containers (or
//! use servers named in `DLOCK_TEST_*` variables) and remove them however the run ends;
//! [`FreezeProxy`] and [`Freezable`] freeze one client's link; [`History`] records what every
//! client observed and [`Analysis`] counts what went wrong; [`trials`] is the frame of the test
//! binaries that run all of this. The [`registry`] is the one table of backends — fixture, URL, declared
//! capabilities, expected safety classes per [`Scenario`] — that every harness reads.

#![deny(missing_docs)]

pub mod analysis;
pub mod certs;
pub mod clock_watch;
pub mod control;
pub mod fixtures;
pub mod freeze;
pub mod history;
pub mod page;
pub mod proxy;
pub mod registry;
pub mod scenario;
pub mod trials;

pub use analysis::Analysis;
pub use control::{Freeze, Members, ServerControl};
pub use freeze::Freezable;
pub use history::{History, Violation};
pub use proxy::{url_target, url_via, DroppingProxies, FreezeProxy};
pub use registry::{Backend, Fixture, BACKENDS};
pub use scenario::{Class, Declared, Scenario};
