//! The clock watch: a backend whose server expires keys by the server's own wall clock (Redis,
//! each Redlock master) compares that clock with the client's monotonic clock at every renewal.
//!
//! A lease's validity is counted on the client (`sent + ttl − drift allowance`), while the server
//! drops the key when *its* clock says the TTL is over. If the server's clock jumps ahead (an NTP
//! step, a VM restored from a snapshot, an operator's `date -s`) or runs fast, or the client was
//! suspended without its monotonic clock counting the pause, the key goes before the client's
//! deadline and another client can be granted the lock while this one still counts itself the
//! holder. Nothing on the wire tells: the renewal itself succeeds.
//!
//! The renewal scripts therefore return the server's `TIME`. [`ClockWatch::observe`] compares
//! two such readings of one server: the server's clock moved `server` between them, while the
//! client's clock moved between `this.sent − last.answered` and `this.answered − last.sent` (each
//! reading was taken somewhere inside its request's round trip). Beyond that window and a
//! tolerance, the server ran ahead (or behind) by at least the difference.
//!
//! What happens then:
//! * **ahead**: the backend answers the renewal with
//!   [`Extension::ClockAhead`](crate::backend::Extension::ClockAhead), and the lease counts its validity
//!   that much shorter, so that a repeat of the same jump before the next renewal cannot outrun
//!   its deadline (a clock that runs fast keeps being seen ahead at every renewal); the jump is
//!   logged at WARN and counted in `dlock_clock_jumps_total{backend, direction="ahead"}`;
//! * **behind**: keys then live longer than asked, which delays the next holder but never lets two
//!   hold at once; it is logged at WARN and counted (`direction="behind"`), since fencing tokens
//!   restarted from a server's clock after a data loss rest on that clock not going back.
//!
//! A jump is seen at the first renewal after it, not when it happens: the lease may have passed
//! to another client in between, and only a fencing token protects the resource then. The watch
//! makes the holder and the operator know, and keeps a repeated jump from shortening a lease
//! unnoticed.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// A gap between the server's clock and the client's below this is noise, not a jump: a round
/// trip's timing on a loaded client, the server's clock read inside a script that waited.
pub const TOLERANCE: Duration = Duration::from_millis(25);
/// The part of the interval between two readings tolerated as the clocks' rate difference
/// (the same as the default [`Drift`](crate::Drift) factor).
pub const TOLERANCE_RATE: f64 = 0.01;

/// One reading of a server's clock: what it said, and the client's monotonic time just before
/// the request that read it was sent and just after its answer arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockReading {
    /// The server's wall clock (`TIME`) since the Unix epoch, in microseconds.
    pub server_us: i64,
    /// The client's time before the request was sent.
    pub sent: Instant,
    /// The client's time after the answer arrived.
    pub answered: Instant,
}

/// The last reading of each server a client talks to, compared with the next one.
#[derive(Debug)]
pub struct ClockWatch {
    backend: &'static str,
    last: Mutex<HashMap<u64, ClockReading>>,
}

/// What a comparison of two readings found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockJump {
    /// The server's clock moved this much more than the client's could have.
    Ahead(Duration),
    /// The server's clock moved this much less than the client's must have.
    Behind(Duration),
}

impl ClockWatch {
    /// A watch for `backend`'s servers (the name in logs and metrics).
    pub fn new(backend: &'static str) -> Self {
        ClockWatch {
            backend,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// Compares `reading` with the last one of the same server (`server`: any number that tells
    /// a client's servers apart, such as a cluster's hash slot; 0 for a client of one server),
    /// keeps it as the last, and returns how far the server's clock ran ahead of the client's, if
    /// it did. A jump either way is logged and counted.
    pub fn observe(&self, server: u64, reading: ClockReading) -> Option<Duration> {
        let last = self
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(server, reading)?;
        match compare(&last, &reading)? {
            ClockJump::Ahead(by) => {
                tracing::warn!(
                    backend = self.backend,
                    server,
                    ahead_ms = by.as_millis() as u64,
                    "the server's clock ran ahead of this client's: leases on it count as that \
                     much shorter; a key may have expired early and a fencing token is the only \
                     guard for what happened meanwhile"
                );
                count(self.backend, "ahead");
                Some(by)
            }
            ClockJump::Behind(by) => {
                tracing::warn!(
                    backend = self.backend,
                    server,
                    behind_ms = by.as_millis() as u64,
                    "the server's clock went back against this client's: keys on it live longer \
                     than asked"
                );
                count(self.backend, "behind");
                None
            }
        }
    }
}

fn count(backend: &'static str, direction: &'static str) {
    metrics::counter!("dlock_clock_jumps_total", "backend" => backend, "direction" => direction)
        .increment(1);
}

/// The jump between two readings of one server, in either order, if it exceeds the tolerance.
pub fn compare(a: &ClockReading, b: &ClockReading) -> Option<ClockJump> {
    let (first, second) = if b.sent >= a.sent { (a, b) } else { (b, a) };
    let server = i128::from(second.server_us) - i128::from(first.server_us);
    // The client's clock between the two readings: at most from before the first request to
    // after the second answer; at least from after the first answer to before the second
    // request, which is negative when the requests overlapped (the server may then have read
    // its clock for the second one first).
    let longest = second.answered.saturating_duration_since(first.sent);
    let shortest = signed_micros(second.sent, first.answered);
    let tolerance = micros(TOLERANCE + longest.mul_f64(TOLERANCE_RATE));
    let longest = micros(longest);
    if server > longest + tolerance {
        Some(ClockJump::Ahead(duration(server - longest)))
    } else if server < shortest - tolerance {
        Some(ClockJump::Behind(duration(shortest - server)))
    } else {
        None
    }
}

fn micros(d: Duration) -> i128 {
    i128::try_from(d.as_micros()).unwrap_or(i128::MAX)
}

/// `later − earlier` in microseconds, negative if `later` is before `earlier`.
fn signed_micros(later: Instant, earlier: Instant) -> i128 {
    if later >= earlier {
        micros(later - earlier)
    } else {
        -micros(earlier - later)
    }
}

fn duration(us: i128) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(server_ms: i64, sent: Instant, rtt_ms: u64) -> ClockReading {
        ClockReading {
            server_us: server_ms * 1000,
            sent,
            answered: sent + Duration::from_millis(rtt_ms),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn agreeing_clocks_are_quiet() {
        let t0 = Instant::now();
        let a = reading(1_000_000, t0, 2);
        let b = reading(1_002_000, t0 + Duration::from_secs(2), 2);
        assert_eq!(compare(&a, &b), None);
        // A reading taken anywhere inside a slow round trip is not a jump either.
        let slow = reading(1_002_400, t0 + Duration::from_secs(2), 400);
        assert_eq!(compare(&a, &slow), None);
        // Overlapping requests answered in either order.
        let c = reading(1_000_001, t0 + Duration::from_millis(1), 2);
        assert_eq!(compare(&a, &c), None);
        assert_eq!(compare(&c, &a), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_clock_that_jumps_ahead_is_seen_by_the_jump() {
        let t0 = Instant::now();
        let a = reading(1_000_000, t0, 2);
        let b = reading(1_005_000, t0 + Duration::from_secs(2), 2);
        // 5 s on the server in at most 2.004 s on the client.
        assert_eq!(
            compare(&a, &b),
            Some(ClockJump::Ahead(Duration::from_millis(2_998)))
        );
        assert_eq!(
            compare(&b, &a),
            Some(ClockJump::Ahead(Duration::from_millis(2_998)))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_clock_that_goes_back_is_seen_behind() {
        let t0 = Instant::now();
        let a = reading(1_000_000, t0, 2);
        let later = t0 + Duration::from_secs(2);
        // Two seconds later by the client, one second earlier by the server.
        let b = reading(999_000, later, 2);
        assert_eq!(
            compare(&a, &b),
            Some(ClockJump::Behind(Duration::from_millis(2_998)))
        );
        // Stood still for two seconds.
        let c = reading(1_000_000, later, 2);
        assert_eq!(
            compare(&a, &c),
            Some(ClockJump::Behind(Duration::from_millis(1_998)))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_watch_compares_each_server_with_itself() {
        let watch = ClockWatch::new("test");
        let t0 = Instant::now();
        assert_eq!(watch.observe(1, reading(1_000_000, t0, 2)), None);
        // Another server's clock is an hour off: not compared with the first.
        assert_eq!(watch.observe(2, reading(4_600_000, t0, 2)), None);
        let later = t0 + Duration::from_secs(1);
        assert_eq!(watch.observe(2, reading(4_601_000, later, 2)), None);
        assert_eq!(
            watch.observe(1, reading(1_004_000, later, 2)),
            Some(Duration::from_millis(2_998))
        );
        // The jump is counted once: the next reading is compared with the jumped one.
        let again = later + Duration::from_secs(1);
        assert_eq!(watch.observe(1, reading(1_005_000, again, 2)), None);
    }
}
