//! dlock's comparative safety matrix: the same fault scenarios on every backend, checked against
//! what each backend declares, published as Markdown and JSON.
//!
//! ```text
//! cargo run -p dlock-safety --release --bin safety-report -- [--quick] [--out DIR] [--only 2/redis]…
//! ```
//!
//! Each cell runs one [`Scenario`] against one [`Backend`] on real servers (containers started by
//! `dlock-testkit`'s fixtures, or the servers named in `DLOCK_TEST_REDIS_URL`,
//! `DLOCK_TEST_REDLOCK_URLS`, `DLOCK_TEST_ZK_URL`, `DLOCK_TEST_ETCD_URL`), records what every client observed in a
//! [`History`](dlock_testkit::History) — grants, losses, releases, writes to a counter guarded
//! by a [`Fence`](dlock_core::Fence), operations with unknown outcomes — and classifies it
//! ([`classify`]): safe, violation caught by fencing, violation not caught, or unavailable. Each
//! backend declares, before anything runs, the class it expects per scenario, with a reason drawn
//! from its documented guarantees: its entry in the test kit's
//! [registry](dlock_testkit::registry), which also names the servers it runs on; a cell that
//! contradicts its declaration fails the run.
//!
//! Two deliberately broken clients run through the same scenarios as baselines ([`baselines`]):
//! the legacy `SETNX`/`GETSET` timestamp lock and a naive `SETNX`-then-`EXPIRE` lock, so the
//! checker is seen catching what it should.
//!
//! The report depends on the backends and on `dlock-testkit` (servers, faults, histories), not on
//! the compliance suite.
#![deny(missing_docs)]

pub mod baselines;
pub mod cell;
pub mod class;
pub mod filter;
pub mod matrix;
pub mod plan;
pub mod report;
pub mod run;
pub mod scenarios;
pub mod subject;
pub mod targets;

pub use cell::{Cell, Counts, Expected};
pub use class::{classify, Class};
/// The rows and columns of the matrix, and what each row declares: the test kit's registry.
pub use dlock_testkit::{Backend, Declared, Scenario};
pub use filter::Filter;
pub use plan::Plan;
pub use report::Report;
pub use subject::Subject;
