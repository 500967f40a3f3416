//! Counting every anomaly of a history, for reports that compare backends.
//!
//! [`History::check`](crate::History::check) stops at the first violation, which is what a test
//! wants. A comparison wants the whole picture: how many holds overlapped, how many tokens went
//! backwards, how many stale writes a fenced resource admitted or refused, how many updates were
//! lost, how many operations ended with an unknown outcome. [`analyze`] counts them all.
//!
//! A write is *stale* when its holder's hold had already ended (its validity passed, it was lost or
//! released) or when another hold of the key began after the writer's and before the write: the
//! writer no longer holds the lock, whatever it believes. A fence should refuse exactly those.

use std::time::Duration;

use serde::Serialize;

use crate::history::{by_key, holds_of, Event, EventKind, Hold};

/// What a history shows, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Analysis {
    /// Holds granted (acquires that returned a lease).
    pub acquisitions: u64,
    /// Holds that began while another hold of the key was still valid.
    pub overlaps: u64,
    /// Holds whose token was not above every earlier holder's token (counted only when the
    /// backend promises ordered tokens).
    pub token_regressions: u64,
    /// Stale writes the fenced resource admitted: the violation fencing exists to stop.
    pub stale_writes_accepted: u64,
    /// Stale writes the fenced resource refused.
    pub stale_writes_rejected: u64,
    /// Writes of the current holder that the fence refused (after tokens went backwards).
    pub current_writes_rejected: u64,
    /// Admitted writes that overwrote an update they had not read.
    pub lost_updates: u64,
    /// Operations whose outcome the client could not learn.
    pub indeterminate: u64,
}

impl Analysis {
    /// Whether anything unsafe happened: overlapping holds, tokens going backwards, stale writes
    /// (admitted or not) or lost updates.
    pub fn any_violation(&self) -> bool {
        self.overlaps > 0
            || self.token_regressions > 0
            || self.stale_writes_accepted > 0
            || self.stale_writes_rejected > 0
            || self.lost_updates > 0
    }
}

/// Counts the anomalies of `events`; token order is judged only if `fencing` is promised.
pub fn analyze(events: &[Event], fencing: bool) -> Analysis {
    let mut out = Analysis::default();
    for (_, of_key) in by_key(events) {
        let holds = holds_of(&of_key);
        count_holds(&holds, fencing, &mut out);
        for e in &of_key {
            match e.kind {
                EventKind::Write {
                    accepted,
                    lost_update,
                } => {
                    let stale = is_stale(&holds, e);
                    match (stale, accepted) {
                        (true, true) => out.stale_writes_accepted += 1,
                        (true, false) => out.stale_writes_rejected += 1,
                        (false, false) => out.current_writes_rejected += 1,
                        (false, true) => {}
                    }
                    if accepted && lost_update {
                        out.lost_updates += 1;
                    }
                }
                EventKind::Indeterminate(_) => out.indeterminate += 1,
                _ => {}
            }
        }
    }
    out
}

fn count_holds(holds: &[Hold], fencing: bool, out: &mut Analysis) {
    let mut running_until: Option<Duration> = None;
    let mut highest = None;
    for h in holds {
        out.acquisitions += 1;
        if running_until.is_some_and(|until| h.from < until) {
            out.overlaps += 1;
        }
        running_until = Some(running_until.map_or(h.to, |until| until.max(h.to)));
        if fencing && highest.is_some_and(|top| h.token <= top) {
            out.token_regressions += 1;
        }
        highest = Some(highest.map_or(h.token, |top| top.max(h.token)));
    }
}

/// Whether a write no longer came from the holder of the lock.
fn is_stale(holds: &[Hold], write: &Event) -> bool {
    let own = holds
        .iter()
        .filter(|h| h.client == write.client && h.token == write.token && h.from <= write.at)
        .max_by_key(|h| h.from);
    match own {
        // A write without a hold of its own is not from a holder at all.
        None => true,
        Some(own) => {
            write.at > own.to
                || holds
                    .iter()
                    .any(|g| g != own && g.from >= own.from && g.from <= write.at)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::sample::{acq, ev, write};
    use dlock_core::LostReason;

    #[test]
    fn clean_sequential_history_counts_nothing_wrong() {
        let events = vec![
            acq(0, 1, 1, 1000),
            write(5, 1, 1, true, false),
            ev(10, 1, 1, EventKind::Releasing),
            acq(11, 2, 2, 1000),
            write(15, 2, 2, true, false),
            ev(20, 2, 2, EventKind::Releasing),
        ];
        let a = analyze(&events, true);
        assert_eq!(
            a,
            Analysis {
                acquisitions: 2,
                ..Analysis::default()
            }
        );
        assert!(!a.any_violation());
    }

    #[test]
    fn a_write_after_the_validity_deadline_is_stale() {
        // Client 1 paused past its 100 ms validity; client 2 took over; client 1 wrote anyway.
        let events = vec![
            acq(0, 1, 1, 100),
            acq(150, 2, 2, 1000),
            write(160, 2, 2, true, false),
            write(300, 1, 1, false, false),
        ];
        let a = analyze(&events, true);
        assert_eq!(a.overlaps, 0);
        assert_eq!(a.stale_writes_rejected, 1);
        assert_eq!(a.stale_writes_accepted, 0);
        assert!(a.any_violation());
    }

    #[test]
    fn overlaps_stale_acceptances_and_lost_updates_are_all_counted() {
        let events = vec![
            acq(0, 1, 7, 1000),
            acq(10, 2, 7, 1000),
            acq(20, 3, 7, 1000),
            write(30, 2, 7, true, false),
            write(40, 1, 7, true, true),
            ev(
                50,
                4,
                0,
                EventKind::Indeterminate("acquire timed out".into()),
            ),
        ];
        let a = analyze(&events, true);
        assert_eq!(a.acquisitions, 3);
        assert_eq!(a.overlaps, 2);
        assert_eq!(a.token_regressions, 2);
        assert_eq!(a.stale_writes_accepted, 2);
        assert_eq!(a.lost_updates, 1);
        assert_eq!(a.indeterminate, 1);
        // Without a fencing promise, equal tokens are not a regression.
        assert_eq!(analyze(&events, false).token_regressions, 0);
    }

    #[test]
    fn a_refused_write_of_the_current_holder_is_not_stale() {
        let events = vec![
            acq(0, 1, 9, 50),
            ev(40, 1, 9, EventKind::Lost(LostReason::Expired)),
            acq(60, 2, 3, 1000),
            write(70, 2, 3, false, false),
        ];
        let a = analyze(&events, true);
        assert_eq!(a.token_regressions, 1);
        assert_eq!(a.current_writes_rejected, 1);
        assert_eq!(a.stale_writes_rejected, 0);
    }

    #[test]
    fn writes_do_not_end_a_hold() {
        let events = vec![
            acq(0, 1, 1, 1000),
            write(5, 1, 1, true, false),
            acq(10, 2, 2, 1000),
        ];
        assert_eq!(analyze(&events, true).overlaps, 1);
    }
}
