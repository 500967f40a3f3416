//! Progress lines on standard error while the run goes on, with the time since the start.

use std::time::Instant;

pub struct Progress {
    started: Instant,
}

impl Progress {
    pub fn new() -> Self {
        Progress {
            started: Instant::now(),
        }
    }

    pub fn say(&self, backend: &str, what: impl std::fmt::Display) {
        eprintln!(
            "[{:6.1}s] {backend}: {what}",
            self.started.elapsed().as_secs_f64()
        );
    }
}
