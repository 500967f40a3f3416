//! dlock's compliance suite: the same safety and liveness cases for every lock backend.
//!
//! A harness describes its backend as a [`Subject`] — how to make independent clients, what the
//! backend declares, which faults it can be put through — and [`suite::trials`] turns every case
//! that applies into a named test. The servers and fault switches come from `dlock-testkit`.

#![deny(missing_docs)]

pub mod subject;
pub mod suite;

pub use subject::{Inspect, Outage, Subject, Timing};
