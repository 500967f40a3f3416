//! The outcome classes of a cell, and how an observed history is classified.
//!
//! The classification is deliberately blunt, so that it cannot be talked into passing:
//!
//! 1. a stale write the fenced resource **admitted**, or a lost update, is a violation **not
//!    caught**;
//! 2. so is an overlap of holds that no refused stale write accompanies: the lock failed and the
//!    fence had nothing to show for it;
//! 3. otherwise, any overlap, token regression or refused stale write is a violation **caught by
//!    fencing**;
//! 4. otherwise, if the scenario's successor never got the lock, the service was **unavailable**;
//! 5. otherwise the cell is **safe**.

use dlock_testkit::Analysis;

pub use dlock_testkit::Class;

/// Classifies a run: `analysis` of its history, and whether the scenario's successor got the lock.
pub fn classify(analysis: &Analysis, handed_on: bool) -> Class {
    if analysis.stale_writes_accepted > 0 || analysis.lost_updates > 0 {
        return Class::NotCaught;
    }
    if analysis.overlaps > 0 && analysis.stale_writes_rejected == 0 {
        return Class::NotCaught;
    }
    if analysis.any_violation() {
        return Class::CaughtByFencing;
    }
    if !handed_on {
        return Class::Unavailable;
    }
    Class::Safe
}

#[cfg(test)]
mod tests {
    use dlock_testkit::analysis::analyze;
    use dlock_testkit::history::sample::{acq as acquired, ev as at, write as fenced_write};
    use dlock_testkit::history::{Event, EventKind};

    use super::*;

    /// The class of a history with tokens promised, whose successor got the lock.
    fn fenced_class(events: &[Event]) -> Class {
        classify(&analyze(events, true), true)
    }

    fn write(ms: u64, client: usize, token: u64, accepted: bool) -> Event {
        fenced_write(ms, client, token, accepted, false)
    }

    /// Client 1 holds token `t1`, client 2 takes the lock at 100 ms with `t2` while client 1 still
    /// believes it holds; client 1 then writes, and the fence decides `accepted`.
    fn overlap_then_stale_write(t1: u64, t2: u64, accepted: bool) -> Vec<Event> {
        vec![
            acquired(0, 1, t1, 1000),
            acquired(100, 2, t2, 2000),
            write(110, 2, t2, true),
            write(200, 1, t1, accepted),
        ]
    }

    /// Client 1 holds `t1` until 100 ms and releases at 50 ms; client 2 takes `t2` at 60 ms.
    fn released_then_taken(t1: u64, t2: u64) -> Vec<Event> {
        vec![
            acquired(0, 1, t1, 100),
            at(50, 1, t1, EventKind::Releasing),
            acquired(60, 2, t2, 1000),
        ]
    }

    #[test]
    fn an_overlap_whose_stale_write_is_admitted_is_not_caught() {
        let a = analyze(&overlap_then_stale_write(0, 0, true), false);
        assert_eq!(classify(&a, true), Class::NotCaught);
    }

    #[test]
    fn the_same_overlap_with_the_fence_refusing_is_caught_by_fencing() {
        let a = analyze(&overlap_then_stale_write(4, 5, false), true);
        assert_eq!(classify(&a, true), Class::CaughtByFencing);
    }

    #[test]
    fn an_overlap_without_any_write_is_not_caught() {
        let events = vec![acquired(0, 1, 1, 1000), acquired(100, 2, 2, 2000)];
        assert_eq!(fenced_class(&events), Class::NotCaught);
    }

    #[test]
    fn a_lost_update_is_not_caught_even_without_overlap() {
        let mut events = released_then_taken(1, 2);
        events.push(fenced_write(70, 2, 2, true, true));
        assert_eq!(fenced_class(&events), Class::NotCaught);
    }

    #[test]
    fn a_paused_holder_refused_after_its_lease_is_caught_by_fencing() {
        let events = vec![
            acquired(0, 1, 1, 100),
            acquired(150, 2, 2, 1000),
            write(160, 2, 2, true),
            write(400, 1, 1, false),
        ];
        assert_eq!(fenced_class(&events), Class::CaughtByFencing);
    }

    #[test]
    fn tokens_going_backwards_are_a_violation_even_if_nothing_overlapped() {
        let events = released_then_taken(9, 3);
        assert_eq!(fenced_class(&events), Class::CaughtByFencing);
    }

    #[test]
    fn a_clean_hand_over_is_safe_and_a_missing_one_unavailable() {
        let events = vec![
            acquired(0, 1, 1, 1000),
            write(10, 1, 1, true),
            at(20, 1, 1, EventKind::Releasing),
            acquired(30, 2, 2, 1000),
            write(40, 2, 2, true),
        ];
        let a = analyze(&events, true);
        assert_eq!(classify(&a, true), Class::Safe);
        assert_eq!(classify(&a, false), Class::Unavailable);
    }

    #[test]
    fn indeterminate_outcomes_are_counted_but_do_not_hide_a_violation() {
        let mut events = overlap_then_stale_write(0, 0, true);
        events.push(at(300, 3, 0, EventKind::Indeterminate("timed out".into())));
        let a = analyze(&events, false);
        assert_eq!(a.indeterminate, 1);
        assert_eq!(classify(&a, false), Class::NotCaught);
    }
}
