//! Deciding an extension from the masters' answers.
//!
//! A single `extend` and each lease of an `extend_many` batch go through the same [`Tally`], so
//! the two cannot come to different answers for the same replies: the same stop condition for
//! listening, the same quorum, validity and delayed-restart rules for the outcome.

use std::time::Duration;

use dlock_core::backend::Extension;

use crate::quorum::Reply;

/// Extra per-node time a batch gets for each lease in it: the masters run one script over every
/// key and send one code per key back. About twenty times what a loaded Redis needs per key, so
/// a full chunk of [`dlock_redis::EXTEND_BATCH`] leases adds 10 ms.
const BATCH_TIME_PER_LEASE: Duration = Duration::from_micros(20);

/// One lease's answers in one extend round, counted over the masters that count in it (masters
/// left out by the delayed-restart rule are not counted, as in every other round).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Masters that re-armed the lease.
    pub(crate) extended: usize,
    /// Masters where another owner holds the key.
    pub(crate) taken_over: usize,
    /// Masters that answered at all.
    pub(crate) answered: usize,
    /// How far each extending master's clock was seen running ahead (zero for most; see
    /// [`dlock_core::backend::clock`]): its key goes that much before the lease's validity ends.
    pub(crate) ahead: Vec<Duration>,
}

impl Tally {
    /// Counts `replies`; `answer` picks this lease's answer out of one master's reply.
    pub(crate) fn of<T>(replies: &[Reply<T>], answer: impl Fn(&T) -> Option<Extension>) -> Self {
        let mut tally = Tally {
            extended: 0,
            taken_over: 0,
            answered: 0,
            ahead: Vec::new(),
        };
        for reply in replies.iter().filter(|r| r.counts) {
            let Some(extension) = reply.result.as_ref().ok().and_then(&answer) else {
                continue;
            };
            tally.answered += 1;
            match extension {
                Extension::Extended => {
                    tally.extended += 1;
                    tally.ahead.push(Duration::ZERO);
                }
                Extension::ClockAhead(by) => {
                    tally.extended += 1;
                    tally.ahead.push(by);
                }
                Extension::TakenOver => tally.taken_over += 1,
                Extension::Expired => {}
            }
        }
        tally
    }

    /// Whether further answers cannot change the outcome: a quorum extended, or a quorum answered
    /// and the `pending` counting masters are too few to make one.
    pub(crate) fn settled(&self, pending: usize, quorum: usize) -> bool {
        self.extended >= quorum || (self.extended + pending < quorum && self.answered >= quorum)
    }

    /// The outcome of the round, `None` when too few masters answered to know (the caller reports
    /// [`Error::Unavailable`](dlock_core::Error::Unavailable) with its replies). `in_time` says
    /// whether the round ended within the new validity, measured from before it was sent: a
    /// quorum that answers too late extended a lease whose validity is gone.
    ///
    /// A master whose clock ran ahead drops its key that much early; the lease holds while a
    /// quorum of keys does, so it counts its validity shorter by the quorum-th smallest excess:
    /// one fast master among more than a quorum costs nothing, one a bare quorum needs costs its
    /// excess.
    pub(crate) fn outcome(&self, quorum: usize, in_time: bool) -> Option<Extension> {
        if self.extended >= quorum {
            let mut ahead = self.ahead.clone();
            ahead.sort_unstable();
            let cut = ahead
                .get(quorum.saturating_sub(1))
                .copied()
                .filter(|by| !by.is_zero());
            return Some(if in_time {
                Extension::Extended.with_clock_ahead(cut)
            } else {
                Extension::Expired
            });
        }
        if self.answered < quorum {
            return None;
        }
        Some(if self.taken_over > 0 {
            Extension::TakenOver
        } else {
            Extension::Expired
        })
    }
}

/// The per-node timeout for a batch of `leases` whose own timeouts are at most `base` and whose
/// shortest validity is `validity`: `base` plus [`BATCH_TIME_PER_LEASE`] per lease, but never
/// more than half of `validity`, the bound a single request keeps (see `Settings::plan`).
pub(crate) fn batch_timeout(base: Duration, leases: usize, validity: Duration) -> Duration {
    let extra = BATCH_TIME_PER_LEASE.saturating_mul(u32::try_from(leases).unwrap_or(u32::MAX));
    let room = (validity / 2).saturating_sub(base);
    base + extra.min(room)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(extended: usize, taken_over: usize, answered: usize) -> Tally {
        Tally {
            extended,
            taken_over,
            answered,
            ahead: vec![Duration::ZERO; extended],
        }
    }

    #[test]
    fn masters_whose_clocks_ran_ahead_shorten_the_lease_only_where_the_quorum_needs_them() {
        let by = |ms| Extension::ClockAhead(Duration::from_millis(ms));
        let tally_of = |answers: &[Extension]| {
            let replies: Vec<Reply<Extension>> = answers
                .iter()
                .enumerate()
                .map(|(index, answer)| Reply {
                    index,
                    counts: true,
                    result: Ok(*answer),
                })
                .collect();
            Tally::of(&replies, |r| Some(*r))
        };
        let ok = Extension::Extended;
        // Five extended, one fast: three keys outlast the lease's validity anyway.
        let spare = tally_of(&[ok, ok, ok, ok, by(4_500)]);
        assert_eq!(spare.outcome(3, true), Some(ok));
        // A bare quorum needs every key: the fastest clock decides.
        let bare = tally_of(&[ok, by(300), by(4_500)]);
        assert_eq!(bare.extended, 3);
        assert_eq!(bare.outcome(3, true), Some(by(4_500)));
        assert_eq!(bare.outcome(2, true), Some(by(300)));
        assert_eq!(bare.outcome(3, false), Some(Extension::Expired));
    }

    #[test]
    fn a_quorum_in_time_extends_and_a_late_one_has_expired() {
        assert_eq!(tally(3, 0, 3).outcome(3, true), Some(Extension::Extended));
        assert_eq!(tally(3, 0, 5).outcome(3, false), Some(Extension::Expired));
    }

    #[test]
    fn an_answering_quorum_without_extensions_tells_taken_over_from_expired() {
        assert_eq!(tally(2, 1, 4).outcome(3, true), Some(Extension::TakenOver));
        assert_eq!(tally(2, 0, 4).outcome(3, true), Some(Extension::Expired));
    }

    #[test]
    fn too_few_answers_are_no_outcome() {
        assert_eq!(tally(2, 0, 2).outcome(3, true), None);
        assert_eq!(tally(0, 2, 2).outcome(3, true), None);
    }

    #[test]
    fn listening_stops_once_pending_masters_cannot_change_the_outcome() {
        assert!(tally(3, 0, 3).settled(2, 3));
        assert!(!tally(2, 0, 3).settled(1, 3));
        assert!(tally(1, 0, 4).settled(1, 3));
        assert!(!tally(0, 0, 2).settled(0, 3));
    }

    #[test]
    fn a_batch_gets_more_time_per_lease_within_half_the_validity() {
        let base = Duration::from_millis(50);
        let long = Duration::from_secs(10);
        assert_eq!(batch_timeout(base, 0, long), base);
        assert_eq!(
            batch_timeout(base, 500, long),
            base + Duration::from_millis(10)
        );
        let short = Duration::from_millis(110);
        assert_eq!(batch_timeout(base, 500, short), Duration::from_millis(55));
    }
}
