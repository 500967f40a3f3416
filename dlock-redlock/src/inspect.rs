//! Who holds a lock, by reading every master: what a quorum of them shows, or "unknown".
//!
//! Each master answers with `protocol::scripts::peek` of dlock-redis: the lock key's value,
//! its remaining TTL and the key's fencing counter, read together. Only masters that count
//! towards a quorum (see [`crate::restart`]) are counted:
//!
//! * **held** if a quorum shows the same value — the same owner — on the key. Its remaining time
//!   is the smallest TTL among those masters: the earliest a master of that quorum lets go.
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
//! The token is reported only when all of these hold, and is otherwise "unknown":
//!
//! * this client has fencing on (the holder's token is meant to be the one a quorum's counters
//!   agree on only when the holder wrote it back, which fencing does);
//! * the value is an owner token in dlock's form, 32 lowercase hex digits;
//! * a quorum of the masters showing that value have the same counter, `T`; `T` is reported.
//!
//! That is what a dlock grant leaves behind: the holder's token `T` is the maximum counter among
//! the masters that granted, and the write-back brings a quorum of the masters holding its key to
//! exactly `T` (masters that already had `T` need none). While the key is held there, nobody else
//! can increment those counters. A master that granted late, after the client had decided, may
//! hold a larger counter; it is alone, so it does not change which value a quorum agrees on —
//! but with masters down, those left may be too few to agree, and the token is then "unknown".
//!
//! What it cannot tell: a client of another library that takes the same names on a quorum of the
//! masters with a value of the same form (node-redlock's values are 32 hex digits too) would be
//! reported with the token of the last dlock holder, since it leaves the counters alone. Keep
//! other Redlock clients off dlock's lock names, or do not rely on the token `status` shows.

use dlock_core::{FencingToken, Holder, Holding, OwnerToken};
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
                agreed_token(holder, &same, quorum, pending)?
            } else {
                None
            };
            let mut holder = Holder::new();
            holder.fencing = fencing;
            holder.expires_in = same.iter().filter_map(|p| p.pttl).min();
            return Some(Holding::Held(holder));
        }
        largest = largest.max(same.len());
    }
    (seen.len() >= quorum && largest + pending < quorum).then_some(Holding::Unknown)
}

/// The counter a quorum of the masters holding `holder` agree on: `Some(Some(token))`;
/// `Some(None)` if `holder` is not a dlock owner token or no quorum can agree any more; `None`
/// while the `pending` masters could still make one (the first quorum to answer may include a
/// master that granted late, with a larger counter).
fn agreed_token(
    holder: &[u8],
    same: &[&Peek],
    quorum: usize,
    pending: usize,
) -> Option<Option<FencingToken>> {
    let owner = std::str::from_utf8(holder)
        .ok()
        .and_then(|text| OwnerToken::from_hex(text).filter(|o| o.to_hex() == text));
    if owner.is_none() {
        return Some(None);
    }
    let mut most = 0;
    for counter in same.iter().filter_map(|p| p.counter) {
        let agreeing = same.iter().filter(|p| p.counter == Some(counter)).count();
        if agreeing >= quorum {
            return Some(Some(FencingToken(counter)));
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

    const OWNER: &str = "0123456789abcdef0123456789abcdef";

    fn held(holder: &str, pttl: u64, counter: u64) -> Reply<Peek> {
        Reply {
            index: 0,
            counts: true,
            result: Ok(Peek {
                holder: Some(holder.as_bytes().to_vec()),
                pttl: Some(Duration::from_millis(pttl)),
                counter: Some(counter),
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
    fn a_foreign_value_is_held_without_a_token() {
        let foreign = "0123456789ABCDEF0123456789ABCDEF";
        let replies = [
            held(foreign, 1, 7),
            held(foreign, 1, 7),
            held(foreign, 1, 7),
        ];
        assert!(matches!(
            decide(&replies, 0, 3, true),
            Some(Holding::Held(Holder { fencing: None, .. }))
        ));
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
