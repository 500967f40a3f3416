//! Looking at locks and evicting a holder: what the contender keys tell an operator.
//!
//! A lock's contenders are its keys under `<name>/`, served in the order of their create
//! revisions: the oldest holds the lock (its create revision is the fencing token), the others
//! wait in that order. Each dlock contender's value is its owner record; a Go
//! `concurrency.Mutex` or `etcdctl lock` leaves the value empty, which reads as no record.

use dlock_core::inspect::{Eviction, HeldLock, Holder, Waiter};
use dlock_core::{FencingToken, OwnerRecord};
use etcd_client::{GetOptions, KeyValue};

use crate::contention::{delete_holder, queue};
use crate::layout::{range_of, KeyLayout};
use crate::requests::{RequestError, Requests};

/// How many keys one page of a listing reads.
pub(crate) const PAGE: i64 = 256;

/// The holder of a lock whose contenders are `contenders`, oldest first; `None` if there are
/// none.
pub(crate) fn holder_of(contenders: &[KeyValue]) -> Option<Holder> {
    let (head, waiting) = contenders.split_first()?;
    let queue = waiting
        .iter()
        .map(|kv| Waiter::new(OwnerRecord::parse(kv.value())))
        .collect();
    Some(
        Holder::new()
            .with_fencing(FencingToken(head.create_revision().unsigned_abs()))
            .with_owner(OwnerRecord::parse(head.value()))
            .with_queue(queue),
    )
}

/// Removes the holder of the lock whose contenders live under `prefix`: one transaction that
/// deletes the oldest contender's key if it is still the one read (created at `expected` when
/// given, else at the revision just read). Deleting it is what a release does, so the next
/// contender's watch fires, and its key, created later, carries a greater revision.
pub(crate) async fn evict(
    requests: &Requests,
    prefix: &[u8],
    expected: Option<FencingToken>,
) -> Result<Eviction, RequestError> {
    let contenders = queue(requests, prefix).await?;
    let (Some(head), Some(holder)) = (contenders.first(), holder_of(&contenders)) else {
        return Ok(Eviction::Free);
    };
    let revision = head.create_revision();
    if expected.is_some_and(|token| token.get() != revision.unsigned_abs()) {
        return Ok(Eviction::Changed(holder));
    }
    Ok(
        match delete_holder(requests, prefix, head.key(), revision).await? {
            None => Eviction::Evicted(holder),
            // The lock changed hands between the read and the transaction.
            Some(now) => holder_of(&now).map_or(Eviction::Free, Eviction::Changed),
        },
    )
}

/// The held locks whose keys start with `key_prefix` and whose holder left an owner record:
/// the contender keys in the range of their names, read in pages of [`PAGE`] keys at the
/// revision of the first page (one consistent view; a compaction past it between two pages
/// fails the listing, which can be repeated), grouped by lock.
pub(crate) async fn list(
    requests: &Requests,
    layout: &KeyLayout,
    key_prefix: &str,
) -> Result<Vec<HeldLock>, RequestError> {
    let (mut start, end) = range_of(layout.name_prefix(key_prefix).as_bytes());
    let mut revision = 0;
    let mut locks = Vec::new();
    let mut group: Option<(dlock_core::backend::LockKey, Vec<KeyValue>)> = None;
    loop {
        let mut options = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
        if revision > 0 {
            options = options.with_revision(revision);
        }
        let mut page = requests.get(start.clone(), options).await?;
        if revision == 0 {
            revision = page.header().map_or(0, |h| h.revision());
        }
        let kvs = page.take_kvs();
        let more = page.more() && !kvs.is_empty();
        if let Some(last) = kvs.last() {
            // The next page starts just after the last key read.
            start = last.key().to_vec();
            start.push(0);
        }
        for kv in kvs {
            let Some(key) = layout.key_of(kv.key()) else {
                continue;
            };
            if !key.as_str().starts_with(key_prefix) {
                continue;
            }
            match &mut group {
                Some((current, contenders)) if *current == key => contenders.push(kv),
                _ => {
                    if let Some((done, contenders)) = group.replace((key, vec![kv])) {
                        locks.extend(recorded(done, contenders));
                    }
                }
            }
        }
        if !more {
            break;
        }
    }
    if let Some((done, contenders)) = group {
        locks.extend(recorded(done, contenders));
    }
    Ok(locks)
}

/// The lock `key` with its holder, if the holder is a dlock client (it left an owner record).
fn recorded(key: dlock_core::backend::LockKey, mut contenders: Vec<KeyValue>) -> Option<HeldLock> {
    contenders.sort_by_key(KeyValue::create_revision);
    let holder = holder_of(&contenders)?;
    holder
        .owner
        .is_some()
        .then(|| HeldLock::new(key.as_str(), holder))
}
