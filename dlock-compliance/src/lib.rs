//! Shared test infrastructure for dlock's backends: server fixtures with fault injection.
//!
//! The compliance suite runs the same lock scenarios against every backend, and the interesting
//! scenarios are the broken ones — a frozen server, a crashed one, a lost disk, a partition. This
//! crate starts the servers in Docker containers it can break on purpose, and removes them again
//! however the test ends. See [`fixtures`] for what is available and how to run without Docker.

#![deny(missing_docs)]

pub mod analysis;
pub mod fixtures;
pub mod freeze;
pub mod history;
pub mod proxy;
pub mod subject;
pub mod suite;

pub use analysis::Analysis;
pub use freeze::Freezable;
pub use history::{History, Violation};
pub use proxy::{url_target, url_via, FreezeProxy};
pub use subject::{Freeze, Inspect, Outage, ServerControl, Subject, Timing};
