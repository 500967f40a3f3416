//! Who holds a lock, by reading every master: what a quorum of them shows, or "unknown".
//!
//! Each master answers with `protocol::scripts::peek` of dlock-redis: the lock key's value,
//! its remaining TTL and the lock's owner record, read together. Only masters that count
//! towards a quorum (see [`crate::restart`]) are counted:
//!
//! * **held** if a quorum shows the same value — the same owner — on the key. Its remaining time
//!   is the smallest TTL among those masters: the earliest a master of that quorum lets go. Its
//!   owner is the owner record those masters keep for that value (the acquire script writes the
//!   same record on every master with the grant); a holder without one (another library's
//!   client) has none.
//! * **free** if a quorum shows no key.
//! * **unknown** ([`Holding::Unknown`]) if a quorum answered and neither is true: a lock being
//!   taken or given back right then, or a key held on a minority only (a failed attempt not yet
//!   cleaned up, or a master that missed a release). A minority's key does not make the lock held,
//!   since nobody can hold it without a quorum.
//! * an error ([`Error::Unavailable`](dlock_core::Error::Unavailable)) if fewer than a quorum
//!   answered.
//!
//! # The holder's fencing token
//!
//! The token is reported only when both of these hold, and is otherwise "unknown":
//!
//! * this client has fencing on (the masters' tokens are meant to agree only when the holder
//!   wrote its token back, which fencing does);
//! * a quorum of the masters showing the value have an owner record of that value (its owner
//!   token is the value) with the same token, `T`; `T` is reported.
//!
//! That is what a dlock grant leaves behind: each granting master records its own counter, the
//! holder's token `T` is the maximum of them, and the write-back brings the record and the
//! counter of a quorum of the masters holding its key to exactly `T` (masters that already had
//! `T` need none). A master that granted late, after the client had decided, may record a larger
//! token; it is alone, so it does not change which token a quorum agrees on — but with masters
//! down, those left may be too few to agree, and the token is then "unknown". A client of another
//! library leaves no owner record, so its holder has no token, whatever its value looks like.

use dlock_core::inspect::{Holder, Holding};
use dlock_core::FencingToken;
use dlock_redis::protocol::scripts::Peek;

use crate::quorum::Reply;

/// The verdict on the answers so far, or `None` while it is open — or, with nothing `pending`,
/// when fewer than `quorum` counting masters answered.
///
/// `fenced`: whether the client uses fencing tokens (see the module docs for when a token is
/// reported).
pub(crate) fn decide(
    replies: &[Reply<Peek>],
    pending: usize,
    quorum: usize,
    fenced: bool,
) -> Option<Holding> {
    let seen: Vec<&Peek> = replies
        .iter()
        .filter(|r| r.counts)
        .filter_map(|r| r.result.as_ref().ok())
        .collect();
    let free = seen.iter().filter(|p| p.holder.is_none()).count();
    if free >= quorum {
        return Some(Holding::Free);
    }
    let mut largest = free;
    for peek in &seen {
        let Some(holder) = &peek.holder else {
            continue;
        };
        let same: Vec<&Peek> = seen
            .iter()
            .copied()
            .filter(|p| p.holder.as_ref() == Some(holder))
            .collect();
        if same.len() >= quorum {
            let fencing = if fenced {
                // Held is decided, but the token may need the answers still pending.
                agreed_token(&same, quorum, pending)?
            } else {
                None
            };
            let owner = same
                .iter()
                .find_map(|p| p.holders_record().and_then(|r| r.owner.clone()));
            let mut holder = Holder::new().with_owner(owner);
            holder.fencing = fencing;
            holder.expires_in = same.iter().filter_map(|p| p.pttl).min();
            return Some(Holding::Held(holder));
        }
        largest = largest.max(same.len());
    }
    (seen.len() >= quorum && largest + pending < quorum).then_some(Holding::Unknown)
}

/// The value a quorum of the counting masters show on the key — the holder's owner token, for a
/// dlock holder — if there is one.
pub(crate) fn quorum_value(replies: &[Reply<Peek>], quorum: usize) -> Option<Vec<u8>> {
    let values: Vec<&Vec<u8>> = replies
        .iter()
        .filter(|r| r.counts)
        .filter_map(|r| r.result.as_ref().ok()?.holder.as_ref())
        .collect();
    values
        .iter()
        .find(|v| values.iter().filter(|w| w == v).count() >= quorum)
        .map(|v| (*v).clone())
}

/// The token a quorum of the masters showing one holder (`same`) record for it:
/// `Some(Some(token))`; `Some(None)` if no quorum can agree any more (a holder without owner
/// records never can); `None` while the `pending` masters could still make one (the first quorum
/// to answer may include a master that granted late, with a larger token).
fn agreed_token(same: &[&Peek], quorum: usize, pending: usize) -> Option<Option<FencingToken>> {
    let recorded = |p: &Peek| p.holders_record().and_then(|r| r.fencing);
    let mut most = 0;
    for token in same.iter().filter_map(|p| recorded(p)) {
        let agreeing = same.iter().filter(|p| recorded(p) == Some(token)).count();
        if agreeing >= quorum {
            return Some(Some(token));
        }
        most = most.max(agreeing);
    }
    (most + pending < quorum).then_some(None)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::node::NodeFailure;
    use dlock_core::Owner;
    use dlock_redis::protocol::scripts::Recorded;

    const OWNER: &str = "0123456789abcdef0123456789abcdef";

    /// A master holding `holder` with its owner record of token `recorded`.
    fn held(holder: &str, pttl: u64, recorded: u64) -> Reply<Peek> {
        let record = Recorded {
            token: holder.as_bytes().to_vec(),
            fencing: Some(FencingToken(recorded)),
            owner: None,
        };
        peeked(holder, pttl, Some(record))
    }

    fn peeked(holder: &str, pttl: u64, recorded: Option<Recorded>) -> Reply<Peek> {
        Reply {
            index: 0,
            counts: true,
            result: Ok(Peek {
                holder: Some(holder.as_bytes().to_vec()),
                pttl: Some(Duration::from_millis(pttl)),
                counter: Some(1),
                recorded,
            }),
        }
    }

    fn free() -> Reply<Peek> {
        Reply {
            index: 0,
            counts: true,
            result: Ok(Peek {
                holder: None,
                pttl: None,
                counter: Some(1),
                recorded: None,
            }),
        }
    }

    fn down() -> Reply<Peek> {
        Reply {
            index: 0,
            counts: true,
            result: Err(NodeFailure {
                endpoint: "redis://127.0.0.1:1".into(),
                error: Arc::new(dlock_core::Error::backend("redis", true, "down")),
            }),
        }
    }

    #[test]
    fn a_quorum_with_one_owner_is_held_with_its_agreed_token_and_shortest_ttl() {
        let replies = [
            held(OWNER, 900, 7),
            held(OWNER, 800, 7),
            held(OWNER, 950, 9),
            free(),
            down(),
        ];
        assert_eq!(
            decide(&replies, 0, 3, true),
            Some(Holding::Held(
                Holder::new().with_expiry(Duration::from_millis(800))
            )),
            "two agreeing counters are not a quorum"
        );
        let replies = [
            held(OWNER, 900, 7),
            held(OWNER, 800, 7),
            held(OWNER, 950, 7),
            held(OWNER, 990, 9),
        ];
        assert_eq!(
            decide(&replies, 1, 3, true),
            Some(Holding::Held(
                Holder::new()
                    .with_fencing(FencingToken(7))
                    .with_expiry(Duration::from_millis(800))
            ))
        );
        assert_eq!(
            decide(&replies, 1, 3, false),
            Some(Holding::Held(
                Holder::new().with_expiry(Duration::from_millis(800))
            )),
            "without fencing the counters promise nothing"
        );
    }

    #[test]
    fn a_late_larger_counter_waits_for_the_other_answers() {
        let first = [
            held(OWNER, 900, 7),
            held(OWNER, 900, 9),
            held(OWNER, 900, 7),
        ];
        assert_eq!(decide(&first, 2, 3, true), None);
        let all = [
            held(OWNER, 900, 7),
            held(OWNER, 900, 9),
            held(OWNER, 900, 7),
            held(OWNER, 900, 7),
        ];
        assert!(matches!(
            decide(&all, 1, 3, true),
            Some(Holding::Held(Holder {
                fencing: Some(FencingToken(7)),
                ..
            }))
        ));
    }

    #[test]
    fn a_holder_without_its_owner_records_is_held_without_a_token_or_owner() {
        let stale = Recorded {
            token: b"fedcba9876543210fedcba9876543210".to_vec(),
            fencing: Some(FencingToken(7)),
            owner: Some(Owner::this_process().record()),
        };
        let replies = [
            peeked(OWNER, 1, None),
            peeked(OWNER, 1, Some(stale.clone())),
            peeked(OWNER, 1, Some(stale)),
        ];
        assert_eq!(
            decide(&replies, 0, 3, true),
            Some(Holding::Held(
                Holder::new().with_expiry(Duration::from_millis(1))
            ))
        );
    }

    #[test]
    fn the_owner_comes_from_the_holders_records() {
        let owner = Owner::this_process()
            .with_label("billing")
            .unwrap()
            .record();
        let record = Recorded {
            token: OWNER.as_bytes().to_vec(),
            fencing: Some(FencingToken(7)),
            owner: Some(owner.clone()),
        };
        let replies = [
            peeked(OWNER, 5, Some(record.clone())),
            peeked(OWNER, 5, Some(record.clone())),
            peeked(OWNER, 5, Some(record)),
        ];
        assert_eq!(
            decide(&replies, 0, 3, true),
            Some(Holding::Held(
                Holder::new()
                    .with_owner(Some(owner))
                    .with_fencing(FencingToken(7))
                    .with_expiry(Duration::from_millis(5))
            ))
        );
    }

    #[test]
    fn free_needs_a_quorum_and_a_minority_holder_does_not_count() {
        let replies = [held(OWNER, 1, 7), held(OWNER, 1, 7), free(), free(), free()];
        assert_eq!(decide(&replies, 0, 3, true), Some(Holding::Free));
        let replies = [held(OWNER, 1, 7), held(OWNER, 1, 7), free(), free()];
        assert_eq!(
            decide(&replies, 1, 3, true),
            None,
            "the last master decides"
        );
        assert_eq!(decide(&replies, 0, 3, true), Some(Holding::Unknown));
    }

    #[test]
    fn too_few_answers_decide_nothing() {
        let replies = [held(OWNER, 1, 7), free(), down(), down(), down()];
        assert_eq!(decide(&replies, 0, 3, true), None);
        let other = "fedcba9876543210fedcba9876543210";
        let replies = [held(OWNER, 1, 7), held(other, 1, 8), free()];
        assert_eq!(decide(&replies, 2, 3, true), None);
        assert_eq!(decide(&replies, 1, 3, true), Some(Holding::Unknown));
    }
}
