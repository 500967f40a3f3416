//! The transactions that order contenders and check ownership, one round trip each.
//!
//! A lock is held by the contender key under `<name>/` with the smallest create revision, as in
//! etcd's `concurrency.Mutex`. Every decision below is one etcd transaction, so it is made at one
//! revision of the store: "our key exists and nobody is ahead of it" cannot be torn apart by a
//! concurrent change.

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, GetResponse, KeyValue, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};

use crate::layout::lease_keys;
use crate::requests::{RequestError, Requests};

/// Our contender key for one lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Contender<'a> {
    /// `<name>/`, the range of all contenders.
    pub(crate) prefix: &'a [u8],
    /// `<name>/<lease id in hex>_<owner token in hex>`, this acquire's alone (see
    /// `layout::contender_key`).
    pub(crate) key: &'a [u8],
    /// The key's value: the owner record of this acquire with its owner token, which no other
    /// acquire shares, so it also tells this acquire's key from an abandoned one (see
    /// `client::contender_value`).
    pub(crate) value: &'a str,
    /// The session lease the key is attached to.
    pub(crate) lease: i64,
}

/// The answer of [`take_if_free`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Take {
    /// Nobody contended; our key was created at `revision`.
    Taken { revision: i64 },
    /// Someone else holds or waits for the lock: the oldest contender is `first`, on lease
    /// `lease` (0 if unknown).
    Busy { first: Vec<u8>, lease: i64 },
    /// A key of ours from an abandoned acquire is in the way (see [`remove_leftover`]).
    Leftover { key: Vec<u8>, mod_revision: i64 },
}

/// The answer of [`join`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Join {
    /// Our key (at `revision`) is the oldest: the lock is ours.
    Head { revision: i64 },
    /// Our key (at `revision`) waits behind older ones; `ahead` is the one just before it, as
    /// [`ahead`] would answer, when the join created our key (a join that found it reads no
    /// queue beyond the oldest).
    Queued { revision: i64, ahead: Option<Ahead> },
    /// A key of ours from an abandoned acquire is in the way (see [`remove_leftover`]).
    Leftover { key: Vec<u8>, mod_revision: i64 },
}

/// The answer of [`ahead`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ahead {
    /// Our key exists and no older one does: the lock is ours.
    Nobody,
    /// The newest key older than ours, and the store revision at which it was seen.
    Predecessor { key: Vec<u8>, seen_at: i64 },
    /// Our key is gone (its lease ended, or someone deleted it).
    Gone,
}

/// Who a lock belongs to, as far as an ownership check could tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// Our key, as identified, was there (and was changed as asked).
    Us,
    /// Our key was not there, but someone else's is.
    Other,
    /// No contender at all.
    Nobody,
}

/// The oldest contender under `prefix`: the holder.
fn first_created(prefix: &[u8]) -> TxnOp {
    TxnOp::get(prefix, Some(oldest()))
}

fn oldest() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// The oldest contender's key and revisions, without its value (its owner record), which a
/// join does not read.
fn first_created_key(prefix: &[u8]) -> TxnOp {
    TxnOp::get(prefix, Some(oldest().with_keys_only()))
}

fn any_key(prefix: &[u8]) -> TxnOp {
    TxnOp::get(
        prefix,
        Some(
            GetOptions::new()
                .with_prefix()
                .with_keys_only()
                .with_limit(1),
        ),
    )
}

/// The key-values of the `index`th response, which must be a get.
fn kvs(response: &TxnResponse, index: usize) -> Vec<KeyValue> {
    match response.op_responses().into_iter().nth(index) {
        Some(TxnOpResponse::Get(mut get)) => get.take_kvs(),
        _ => Vec::new(),
    }
}

/// The `index`th of a transaction's answers, if it is a get's.
fn get_at(answers: &[TxnOpResponse], index: usize) -> Option<&GetResponse> {
    match answers.get(index) {
        Some(TxnOpResponse::Get(get)) => Some(get),
        _ => None,
    }
}

fn store_revision(response: &TxnResponse) -> i64 {
    response.header().map_or(0, |h| h.revision())
}

fn put(c: &Contender<'_>) -> TxnOp {
    TxnOp::put(c.key, c.value, Some(PutOptions::new().with_lease(c.lease)))
}

/// The two newest contenders under `prefix`, keys only: in the transaction that creates our
/// key, ours and the one created just before it.
fn newest_two(prefix: &[u8]) -> TxnOp {
    TxnOp::get(
        prefix,
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(2)
                .with_keys_only(),
        ),
    )
}

/// Every contender under `prefix`, oldest first.
fn all_contenders(prefix: &[u8]) -> TxnOp {
    TxnOp::get(
        prefix,
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend),
        ),
    )
}

/// The contenders under `prefix` in the order they are served: the holder first, then the
/// queue. Empty when nobody holds or waits. One read; nothing is written.
pub(crate) async fn queue(
    requests: &Requests,
    prefix: &[u8],
) -> Result<Vec<KeyValue>, RequestError> {
    let response = requests
        .txn(Txn::new().and_then([all_contenders(prefix)]))
        .await?;
    Ok(kvs(&response, 0))
}

/// Deletes the holder's key `key` if it is still the one created at `revision`; otherwise
/// changes nothing and answers the contenders as they are now (as [`queue`] reads them).
pub(crate) async fn delete_holder(
    requests: &Requests,
    prefix: &[u8],
    key: &[u8],
    revision: i64,
) -> Result<Option<Vec<KeyValue>>, RequestError> {
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, revision)])
        .and_then([TxnOp::delete(key, None)])
        .or_else([all_contenders(prefix)]);
    let response = requests.txn(txn).await?;
    Ok((!response.succeeded()).then(|| kvs(&response, 0)))
}

/// One attempt that never waits: creates our key only if no contender exists at all.
pub(crate) async fn take_if_free(
    requests: &Requests,
    c: &Contender<'_>,
) -> Result<Take, RequestError> {
    let txn = Txn::new()
        .when([Compare::create_revision(c.prefix, CompareOp::Equal, 0).with_prefix()])
        .and_then([put(c)])
        .or_else([first_created(c.prefix)]);
    let response = requests.txn(txn).await?;
    if response.succeeded() {
        return Ok(Take::Taken {
            revision: store_revision(&response),
        });
    }
    Ok(match kvs(&response, 0).first() {
        Some(kv) if kv.key() == c.key && kv.value() == c.value.as_bytes() => Take::Taken {
            revision: kv.create_revision(),
        },
        // Another acquire's key on our lease (ours would carry our value): no acquire of ours
        // claims it while this one has the key's turn.
        Some(kv) if kv.key().starts_with(&lease_keys(c.prefix, c.lease)) => Take::Leftover {
            key: kv.key().to_vec(),
            mod_revision: kv.mod_revision(),
        },
        Some(kv) => Take::Busy {
            first: kv.key().to_vec(),
            lease: kv.lease(),
        },
        None => Take::Busy {
            first: Vec::new(),
            lease: 0,
        },
    })
}

/// Joins the queue: creates our key if absent, else reads it (a repeated attempt of the same
/// acquire finds its own key), and reads the oldest contender and the keys of our lease, all at
/// one revision. A join that creates our key also reads the contender just before it, so that
/// a waiter arms its watch without another read first.
///
/// A key of our lease other than ours was left by an abandoned acquire of this client (no
/// other acquire of ours claims the key while this one has its turn); it is reported wherever it
/// stands in the queue, since nobody behind it would be served before our session ends.
pub(crate) async fn join(requests: &Requests, c: &Contender<'_>) -> Result<Join, RequestError> {
    let ours = lease_keys(c.prefix, c.lease);
    // Counted only (the members read no values); the rare leftover is read after.
    let count_ours = TxnOp::get(
        ours.clone(),
        Some(GetOptions::new().with_prefix().with_count_only()),
    );
    let txn = Txn::new()
        .when([Compare::create_revision(c.key, CompareOp::Equal, 0)])
        .and_then([
            put(c),
            first_created_key(c.prefix),
            count_ours.clone(),
            newest_two(c.prefix),
        ])
        .or_else([
            TxnOp::get(c.key, None),
            first_created_key(c.prefix),
            count_ours,
        ]);
    let response = requests.txn(txn).await?;
    // One copy of the answers (each `op_responses` call copies them all).
    let answers = response.op_responses();
    if get_at(&answers, 2).map_or(0, GetResponse::count) > 1 {
        let options = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_limit(2);
        let mut found = requests.get(ours, options).await?;
        if let Some(kv) = found.take_kvs().into_iter().find(|kv| kv.key() != c.key) {
            return Ok(Join::Leftover {
                mod_revision: kv.mod_revision(),
                key: kv.into_key_value().0,
            });
        }
    }
    let mine = if response.succeeded() {
        store_revision(&response)
    } else {
        match get_at(&answers, 0).and_then(|get| get.kvs().first()) {
            Some(kv) if kv.value() == c.value.as_bytes() => kv.create_revision(),
            Some(kv) => {
                return Ok(Join::Leftover {
                    key: c.key.to_vec(),
                    mod_revision: kv.mod_revision(),
                })
            }
            // Cannot happen inside one transaction; a retry sorts it out.
            None => {
                return Ok(Join::Leftover {
                    key: c.key.to_vec(),
                    mod_revision: 0,
                })
            }
        }
    };
    let head = get_at(&answers, 1)
        .and_then(|get| get.kvs().first())
        .map(KeyValue::create_revision);
    if head == Some(mine) {
        return Ok(Join::Head { revision: mine });
    }
    // Ours is the newest key of the transaction that created it; the next is the one ahead.
    let ahead = get_at(&answers, 3).and_then(|get| match get.kvs() {
        [newest, before] if newest.key() == c.key => Some(Ahead::Predecessor {
            key: before.key().to_vec(),
            seen_at: store_revision(&response),
        }),
        _ => None,
    });
    Ok(Join::Queued {
        revision: mine,
        ahead,
    })
}

/// How fresh a read must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Read {
    /// Served by the member from what it has applied, without a round of consensus.
    Local,
    /// Linearizable: reflects every write committed before the request.
    Fresh,
}

/// Checks that our key (created at `revision`) still exists, and finds the newest contender
/// created before it: the one to wait for. Waiting for that one alone, rather than for the
/// holder, is what keeps a release from waking every waiter at once.
///
/// A [`Read::Local`] answer may be stale, but never wrongly says that nobody is ahead: no key can
/// be created with a revision older than ours, so the keys ahead of us only ever go away, and an
/// older view shows more of them, not fewer. It can wrongly say [`Ahead::Gone`] (a member that
/// has not applied our key's creation yet), so that answer must be confirmed with a
/// [`Read::Fresh`] one.
pub(crate) async fn ahead(
    requests: &Requests,
    c: &Contender<'_>,
    revision: i64,
    read: Read,
) -> Result<Ahead, RequestError> {
    let mut before = GetOptions::new()
        .with_prefix()
        .with_max_create_revision(revision - 1)
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(1)
        .with_keys_only();
    if read == Read::Local {
        // A read-only transaction whose reads are all serializable is served serializably.
        before = before.with_serializable();
    }
    let txn = Txn::new()
        .when([Compare::create_revision(c.key, CompareOp::Equal, revision)])
        .and_then([TxnOp::get(c.prefix, Some(before))]);
    let response = requests.txn(txn).await?;
    if !response.succeeded() {
        return Ok(Ahead::Gone);
    }
    Ok(match kvs(&response, 0).into_iter().next() {
        None => Ahead::Nobody,
        Some(kv) => Ahead::Predecessor {
            key: kv.into_key_value().0,
            seen_at: store_revision(&response),
        },
    })
}

/// Deletes a contender key of ours that an abandoned acquire left behind, unless it changed.
///
/// Such a key is never adopted: its create revision may already have been handed out as a
/// fencing token, and the next holder's token must be greater.
pub(crate) async fn remove_leftover(
    requests: &Requests,
    key: &[u8],
    mod_revision: i64,
) -> Result<(), RequestError> {
    let txn = Txn::new()
        .when([Compare::mod_revision(key, CompareOp::Equal, mod_revision)])
        .and_then([TxnOp::delete(key, None)]);
    requests.txn(txn).await.map(|_| ())
}

fn owner_from(response: &TxnResponse) -> Owner {
    if response.succeeded() {
        Owner::Us
    } else if kvs(response, 0).is_empty() {
        Owner::Nobody
    } else {
        Owner::Other
    }
}

/// Deletes our key if it is still the one created at `revision` on lease `lease`, in one
/// transaction. A key that a later acquire of this client writes again (an election
/// candidate's, named after the session) must be deleted so, lest a late delete take the later
/// one; the lock's release, whose key only one acquire writes, uses [`delete_mine`].
pub(crate) async fn delete_own(
    requests: &Requests,
    prefix: &[u8],
    key: &[u8],
    revision: i64,
    lease: i64,
) -> Result<Owner, RequestError> {
    let own = [
        Compare::create_revision(key, CompareOp::Equal, revision),
        Compare::lease(key, CompareOp::Equal, lease),
    ];
    delete_if(requests, prefix, key, own).await
}

/// Deletes `key` if every one of `conditions` holds, in one transaction; otherwise tells who
/// contends.
async fn delete_if<const N: usize>(
    requests: &Requests,
    prefix: &[u8],
    key: &[u8],
    conditions: [Compare; N],
) -> Result<Owner, RequestError> {
    let txn = Txn::new()
        .when(conditions)
        .and_then([TxnOp::delete(key, None)])
        .or_else([any_key(prefix)]);
    Ok(owner_from(&requests.txn(txn).await?))
}

/// Deletes our key, created at `revision` on lease `lease`, with a plain delete.
///
/// No condition is needed: the key is this acquire's alone (see `layout::contender_key`), so a
/// delete that arrives late finds nothing of a later holding's. The deleted key tells the
/// outcome; only when this holding's key was gone does a read tell whether someone else
/// contends. A plain delete costs etcd's members less than a transaction does.
pub(crate) async fn delete_mine(
    requests: &Requests,
    prefix: &[u8],
    key: &[u8],
    revision: i64,
    lease: i64,
) -> Result<Owner, RequestError> {
    let response = requests
        .delete(key.to_vec(), DeleteOptions::new().with_prev_key())
        .await?;
    let ours = response
        .prev_kvs()
        .iter()
        .any(|kv| kv.create_revision() == revision && kv.lease() == lease);
    owner_after(requests, prefix, ours).await
}

/// Deletes every key of lease `lease` under `prefix`: the keys of acquires of ours that no
/// acquire claims any more, while this client's turn on the lock is free.
pub(crate) async fn delete_abandoned(
    requests: &Requests,
    prefix: &[u8],
    lease: i64,
) -> Result<Owner, RequestError> {
    let response = requests
        .delete(
            lease_keys(prefix, lease),
            DeleteOptions::new().with_prefix(),
        )
        .await?;
    owner_after(requests, prefix, response.deleted() > 0).await
}

/// [`Owner::Us`] after a delete that removed a key of ours; otherwise whoever contends now.
async fn owner_after(
    requests: &Requests,
    prefix: &[u8],
    deleted_ours: bool,
) -> Result<Owner, RequestError> {
    if deleted_ours {
        Ok(Owner::Us)
    } else {
        anyone(requests, prefix).await
    }
}

/// Checks, without changing anything, that our key is still the one created at `revision` on
/// lease `lease`.
pub(crate) async fn confirm_own(
    requests: &Requests,
    prefix: &[u8],
    key: &[u8],
    revision: i64,
    lease: i64,
    read: Read,
) -> Result<Owner, RequestError> {
    let mut others = GetOptions::new()
        .with_prefix()
        .with_keys_only()
        .with_limit(1);
    if read == Read::Local {
        others = others.with_serializable();
    }
    let txn = Txn::new()
        .when([
            Compare::create_revision(key, CompareOp::Equal, revision),
            Compare::lease(key, CompareOp::Equal, lease),
        ])
        .and_then([])
        .or_else([TxnOp::get(prefix, Some(others))]);
    Ok(owner_from(&requests.txn(txn).await?))
}

/// Deletes `key` if its value is `value`: what an acquire whose outcome is unknown may have
/// written.
pub(crate) async fn delete_by_value(
    requests: &Requests,
    prefix: &[u8],
    key: &[u8],
    value: &str,
) -> Result<Owner, RequestError> {
    let written = [Compare::value(key, CompareOp::Equal, value)];
    delete_if(requests, prefix, key, written).await
}

/// Deletes `key` if it is attached to lease `lease`: a key only one acquire writes, whose
/// creation was not confirmed.
pub(crate) async fn delete_on_lease(
    requests: &Requests,
    prefix: &[u8],
    key: &[u8],
    lease: i64,
) -> Result<Owner, RequestError> {
    let attached = [Compare::lease(key, CompareOp::Equal, lease)];
    delete_if(requests, prefix, key, attached).await
}

/// Whether any contender exists under `prefix`.
pub(crate) async fn anyone(requests: &Requests, prefix: &[u8]) -> Result<Owner, RequestError> {
    let response = requests.txn(Txn::new().and_then([any_key(prefix)])).await?;
    Ok(if kvs(&response, 0).is_empty() {
        Owner::Nobody
    } else {
        Owner::Other
    })
}

/// Whether any contender exists under `prefix`, and if so the store revision at which one was
/// seen (to watch for its deletion from the next revision on).
pub(crate) async fn occupied(
    requests: &Requests,
    prefix: &[u8],
) -> Result<Option<i64>, RequestError> {
    let response = requests.txn(Txn::new().and_then([any_key(prefix)])).await?;
    Ok((!kvs(&response, 0).is_empty()).then(|| store_revision(&response)))
}
