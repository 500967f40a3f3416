//! A history of lock events and a checker for the two safety properties of a lock.
//!
//! Cases record what each client observed — when an acquire returned and with which token and
//! validity deadline, when it released, when it learned its lease was lost — on one monotonic
//! clock. The checker rebuilds each hold as the interval from the acquire's return to the
//! earliest of its release, its loss and its validity deadline, and checks that
//!
//! * holds of one key never overlap (mutual exclusion within validity), and
//! * in the order holds began, their fencing tokens strictly increase (token monotonicity).
//!
//! Both are judged on what clients saw: an acquire returns after the server granted, and a
//! release is recorded before it is sent, so an overlap in the history is an overlap in fact.
//! On failure the error shows the offending slice of history. Fenced writes and operations with
//! unknown outcomes are recorded too; [`History::analyze`] counts every anomaly instead of stopping
//! at the first (see [`analysis`](crate::analysis)).

use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use dlock_core::{FencingToken, LostReason};
use tokio::time::Instant;

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// An acquire returned a lease.
    Acquired {
        /// The lease's fencing token.
        token: FencingToken,
        /// The lease's validity deadline, as an offset from the history's start.
        valid_until: Duration,
    },
    /// The holder's lease was renewed: its validity deadline moved.
    Extended {
        /// The new validity deadline, as an offset from the history's start.
        valid_until: Duration,
    },
    /// The holder is about to release (recorded before the request is sent).
    Releasing,
    /// The holder learned its lease was lost.
    Lost(LostReason),
    /// The holder wrote to a fenced resource, presenting the event's token.
    Write {
        /// Whether the fence admitted the write.
        accepted: bool,
        /// Whether an admitted write overwrote a value it had not read (another holder's update
        /// between this holder's read and its write is lost).
        lost_update: bool,
    },
    /// An operation whose outcome the client could not learn (a timeout, a broken connection):
    /// it may or may not have happened on the server. Counted, never dropped.
    Indeterminate(String),
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Time since the history started.
    pub at: Duration,
    /// Which client (any number the case chooses).
    pub client: usize,
    /// The lock key.
    pub key: String,
    /// The token of the lease the event concerns (for `Releasing`/`Lost`).
    pub token: FencingToken,
    /// What happened.
    pub kind: EventKind,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:>9.3} ms  client {:<3} {:<24} token {:<8} ",
            self.at.as_secs_f64() * 1e3,
            self.client,
            format!("{:?}", self.key),
            self.token.0
        )?;
        match &self.kind {
            EventKind::Acquired { valid_until, .. } => {
                write!(
                    f,
                    "acquired (valid until {:.3} ms)",
                    valid_until.as_secs_f64() * 1e3
                )
            }
            EventKind::Extended { valid_until } => write!(
                f,
                "extended (valid until {:.3} ms)",
                valid_until.as_secs_f64() * 1e3
            ),
            EventKind::Releasing => write!(f, "releasing"),
            EventKind::Lost(reason) => write!(f, "lost: {reason}"),
            EventKind::Write {
                accepted,
                lost_update,
            } => write!(
                f,
                "write {}{}",
                if *accepted { "accepted" } else { "rejected" },
                if *lost_update { " (lost update)" } else { "" }
            ),
            EventKind::Indeterminate(what) => write!(f, "indeterminate: {what}"),
        }
    }
}

/// A thread-safe, append-only event log.
#[derive(Debug)]
pub struct History {
    start: Instant,
    events: Mutex<Vec<Event>>,
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

/// A hold rebuilt from the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hold {
    pub(crate) client: usize,
    pub(crate) token: FencingToken,
    pub(crate) from: Duration,
    pub(crate) to: Duration,
}

/// A safety property the history breaks, with the events around it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// What is wrong.
    pub what: String,
    /// The slice of history that shows it.
    pub slice: Vec<Event>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.what)?;
        for e in &self.slice {
            writeln!(f, "    {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Violation {}

impl History {
    /// An empty history starting now.
    pub fn new() -> Self {
        History {
            start: Instant::now(),
            events: Mutex::new(Vec::new()),
        }
    }

    fn since(&self, t: Instant) -> Duration {
        t.saturating_duration_since(self.start)
    }

    fn push(&self, event: Event) {
        let mut events = self
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        events.push(event);
    }

    /// Records that `client` acquired `key` with `token`, valid until `valid_until`.
    pub fn acquired(&self, client: usize, key: &str, token: FencingToken, valid_until: Instant) {
        let at = self.since(Instant::now());
        self.push(Event {
            at,
            client,
            key: key.to_string(),
            token,
            kind: EventKind::Acquired {
                token,
                valid_until: self.since(valid_until),
            },
        });
    }

    /// Records that `client` saw its lease `token` on `key` renewed, now valid until `valid_until`.
    pub fn extended(&self, client: usize, key: &str, token: FencingToken, valid_until: Instant) {
        self.push(Event {
            at: self.since(Instant::now()),
            client,
            key: key.to_string(),
            token,
            kind: EventKind::Extended {
                valid_until: self.since(valid_until),
            },
        });
    }

    /// Records that `client` is about to release its lease `token` on `key`.
    pub fn releasing(&self, client: usize, key: &str, token: FencingToken) {
        self.push(Event {
            at: self.since(Instant::now()),
            client,
            key: key.to_string(),
            token,
            kind: EventKind::Releasing,
        });
    }

    /// Records that `client` learned its lease `token` on `key` was lost, at `when`.
    pub fn lost(
        &self,
        client: usize,
        key: &str,
        token: FencingToken,
        reason: LostReason,
        when: Instant,
    ) {
        self.push(Event {
            at: self.since(when),
            client,
            key: key.to_string(),
            token,
            kind: EventKind::Lost(reason),
        });
    }

    /// Records that `client`, holding lease `token` on `key`, wrote to a fenced resource.
    pub fn write(
        &self,
        client: usize,
        key: &str,
        token: FencingToken,
        accepted: bool,
        lost_update: bool,
    ) {
        self.push(Event {
            at: self.since(Instant::now()),
            client,
            key: key.to_string(),
            token,
            kind: EventKind::Write {
                accepted,
                lost_update,
            },
        });
    }

    /// Records an operation of `client` on `key` whose outcome is unknown, described by `what`.
    pub fn indeterminate(&self, client: usize, key: &str, what: impl Into<String>) {
        self.push(Event {
            at: self.since(Instant::now()),
            client,
            key: key.to_string(),
            token: FencingToken(0),
            kind: EventKind::Indeterminate(what.into()),
        });
    }

    /// Counts every anomaly of the history (see [`Analysis`](crate::analysis::Analysis)).
    pub fn analyze(&self, fencing: bool) -> crate::analysis::Analysis {
        crate::analysis::analyze(&self.events(), fencing)
    }

    /// A copy of the events, in time order.
    pub fn events(&self) -> Vec<Event> {
        let mut events = self
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        events.sort_by_key(|e| e.at);
        events
    }

    /// Checks mutual exclusion within validity and, if `fencing` is promised, token monotonicity.
    pub fn check(&self, fencing: bool) -> Result<(), Violation> {
        check_events(&self.events(), fencing)
    }
}

/// Each key with its events, in key order: every check is per key.
pub(crate) fn by_key(events: &[Event]) -> Vec<(&str, Vec<&Event>)> {
    let mut keys: Vec<&str> = events.iter().map(|e| e.key.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    keys.into_iter()
        .map(|key| (key, events.iter().filter(|e| e.key == key).collect()))
        .collect()
}

/// Checks a list of events (see [`History::check`]).
pub fn check_events(events: &[Event], fencing: bool) -> Result<(), Violation> {
    for (key, of_key) in by_key(events) {
        let holds = holds_of(&of_key);
        for pair in holds.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if b.from < a.to {
                return Err(Violation {
                    what: format!(
                        "mutual exclusion violated on {key:?}: client {} (token {}) acquired at {:?} while client {} (token {}) held it until {:?}",
                        b.client, b.token, b.from, a.client, a.token, a.to
                    ),
                    slice: slice(&of_key, a.from, b.to),
                });
            }
            if fencing && b.token <= a.token {
                return Err(Violation {
                    what: format!(
                        "fencing tokens not increasing on {key:?}: token {} (client {}) after token {} (client {})",
                        b.token, b.client, a.token, a.client
                    ),
                    slice: slice(&of_key, a.from, b.to),
                });
            }
        }
    }
    Ok(())
}

/// The holds of one key's events, in the order they began: each from its acquire's return to the
/// earliest of its release, its loss and its validity deadline.
pub(crate) fn holds_of(events: &[&Event]) -> Vec<Hold> {
    let mut holds: Vec<Hold> = Vec::new();
    for e in events {
        if let EventKind::Acquired { token, valid_until } = e.kind {
            let own = |o: &&&Event| o.client == e.client && o.token == token && o.at >= e.at;
            let end = events
                .iter()
                .filter(own)
                .filter(|o| matches!(o.kind, EventKind::Releasing | EventKind::Lost(_)))
                .map(|o| o.at)
                .min()
                .unwrap_or(Duration::MAX);
            // Renewals seen before the end move the validity deadline.
            let valid_until = events
                .iter()
                .filter(own)
                .filter(|o| o.at <= end)
                .filter_map(|o| match o.kind {
                    EventKind::Extended { valid_until } => Some(valid_until),
                    _ => None,
                })
                .fold(valid_until, Duration::max);
            holds.push(Hold {
                client: e.client,
                token,
                from: e.at,
                to: end.min(valid_until),
            });
        }
    }
    holds.sort_by_key(|h| (h.from, h.token));
    holds
}

fn slice(events: &[&Event], from: Duration, to: Duration) -> Vec<Event> {
    events
        .iter()
        .filter(|e| e.at >= from && e.at <= to)
        .take(40)
        .map(|e| (*e).clone())
        .collect()
}

/// Hand-written events of key `k`, times in milliseconds: the histories that unit tests of the
/// checkers ([`check_events`], [`analyze`](crate::analysis::analyze), the safety report's
/// classification) are built from.
pub mod sample {
    use std::time::Duration;

    use dlock_core::FencingToken;

    use super::{Event, EventKind};

    /// `kind` for `client` holding `token`, at `at_ms`.
    pub fn ev(at_ms: u64, client: usize, token: u64, kind: EventKind) -> Event {
        Event {
            at: Duration::from_millis(at_ms),
            client,
            key: "k".into(),
            token: FencingToken(token),
            kind,
        }
    }

    /// `client` acquired `token` at `at_ms`, valid until `until_ms`.
    pub fn acq(at_ms: u64, client: usize, token: u64, until_ms: u64) -> Event {
        let kind = EventKind::Acquired {
            token: FencingToken(token),
            valid_until: Duration::from_millis(until_ms),
        };
        ev(at_ms, client, token, kind)
    }

    /// `client` wrote with `token` at `at_ms`; the fence `accepted` it, and whether the write
    /// overwrote an update it had not read.
    pub fn write(
        at_ms: u64,
        client: usize,
        token: u64,
        accepted: bool,
        lost_update: bool,
    ) -> Event {
        let kind = EventKind::Write {
            accepted,
            lost_update,
        };
        ev(at_ms, client, token, kind)
    }
}

#[cfg(test)]
mod tests {
    use super::sample::{acq, ev};
    use super::*;

    /// Client 1 holds `first` and releases at 10 ms; client 2 takes `second` at `taken_ms`.
    fn released_then_taken(first: u64, second: u64, taken_ms: u64) -> Vec<Event> {
        vec![
            acq(0, 1, first, 1000),
            ev(10, 1, first, EventKind::Releasing),
            acq(taken_ms, 2, second, 1000),
        ]
    }

    #[test]
    fn sequential_holds_pass() {
        let mut events = released_then_taken(1, 2, 11);
        events.push(ev(20, 2, 2, EventKind::Releasing));
        assert!(check_events(&events, true).is_ok());
    }

    #[test]
    fn overlap_is_caught_and_shown() {
        let events = vec![
            acq(0, 1, 1, 1000),
            acq(5, 2, 2, 1000),
            ev(10, 1, 1, EventKind::Releasing),
        ];
        let v = check_events(&events, false).unwrap_err();
        assert!(v.what.contains("mutual exclusion"), "{v}");
        assert_eq!(
            v.slice.len(),
            3,
            "both acquisitions and the release between them"
        );
        assert!(v.to_string().contains("client 2"), "{v}");
    }

    #[test]
    fn a_hold_ends_at_its_validity_deadline() {
        // Client 1 never released, but its lease was only valid until 100 ms.
        let events = vec![acq(0, 1, 1, 100), acq(150, 2, 2, 1000)];
        assert!(check_events(&events, true).is_ok());
    }

    #[test]
    fn a_hold_ends_when_it_was_lost() {
        let events = vec![
            acq(0, 1, 1, 1000),
            ev(50, 1, 1, EventKind::Lost(LostReason::TakenOver)),
            acq(60, 2, 2, 1000),
        ];
        assert!(check_events(&events, true).is_ok());
    }

    #[test]
    fn a_renewal_moves_the_end_of_a_hold() {
        let extended = EventKind::Extended {
            valid_until: Duration::from_millis(300),
        };
        let events = vec![
            acq(0, 1, 1, 100),
            ev(80, 1, 1, extended.clone()),
            acq(150, 2, 2, 1000),
        ];
        assert!(check_events(&events, true).is_err());
        assert!(check_events(&events[..1], true).is_ok());
        let events = vec![
            acq(0, 1, 1, 100),
            ev(80, 1, 1, extended),
            acq(350, 2, 2, 1000),
        ];
        assert!(check_events(&events, true).is_ok());
    }

    #[test]
    fn repeated_or_decreasing_tokens_are_caught() {
        let events = released_then_taken(5, 5, 20);
        let v = check_events(&events, true).unwrap_err();
        assert!(v.what.contains("fencing"), "{v}");
        assert!(check_events(&events, false).is_ok());
    }
}
