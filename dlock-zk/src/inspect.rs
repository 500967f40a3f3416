//! Operator calls: a read-only look at a lock's queue, the held locks under the base path, and a
//! fenced eviction of a holder.
//!
//! Everything is read from the contender nodes: the first in sequence order holds the lock (its
//! creation zxid is the fencing token), the others wait in that order, and each node's data is
//! its contender's [`OwnerRecord`] — or a peer's own data (kazoo's identifier, Curator's address),
//! which reads as no record.

use std::sync::Arc;

use dlock_core::backend::LockKey;
use dlock_core::inspect::{Eviction, HeldLock, Holder, Holding, Waiter};
use dlock_core::{Error, FencingToken, OwnerRecord, Result};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::client::Inner;
use crate::error::{Failure, BACKEND};
use crate::naming::{decode_key, queue};
use crate::recipe::list_queue;
use crate::request::{call, read};
use crate::session::Session;

/// How often a look is repeated when the holder's node vanishes between the listing and the read
/// of its node (it released, and the next contender may hold the lock now).
const ATTEMPTS: usize = 3;

/// The holder's node, as one look at the queue found it.
struct Head {
    path: String,
    /// The node's data version, which the eviction's delete compares on the server.
    version: i32,
    holder: Holder,
}

/// What one look at a lock's queue found.
enum Look {
    Free,
    Held(Box<Head>),
    /// Every listing showed a holder, but each one was gone a moment later: the lock is busy
    /// changing hands, and which token holds it right now cannot be told.
    Changing,
}

/// Lists the queue of `parent` and reads its nodes: the holder's (with its creation zxid) and
/// every waiter's, in serving order. Nothing is written.
async fn look(
    inner: &Inner,
    session: &Session,
    parent: &str,
    until: Instant,
) -> Result<Look, Failure> {
    for _ in 0..ATTEMPTS {
        let children = list_queue(inner, session, parent, until).await?;
        let contenders = queue(&children);
        let Some((first, waiting)) = contenders.split_first() else {
            return Ok(Look::Free);
        };
        let path = format!("{parent}/{}", first.name);
        let Some((data, stat)) = node(inner, session, &path, until).await? else {
            continue;
        };
        let mut waiters = Vec::with_capacity(waiting.len());
        for contender in waiting {
            let path = format!("{parent}/{}", contender.name);
            // A waiter that left meanwhile is simply no longer in the queue.
            if let Some((data, _)) = node(inner, session, &path, until).await? {
                waiters.push(Waiter::new(OwnerRecord::parse(&data)));
            }
        }
        let mut holder = Holder::new()
            .with_owner(OwnerRecord::parse(&data))
            .with_queue(waiters);
        if let Some(token) = u64::try_from(stat.czxid).ok().filter(|t| *t > 0) {
            holder = holder.with_fencing(FencingToken(token));
        }
        return Ok(Look::Held(Box::new(Head {
            path,
            version: stat.version,
            holder,
        })));
    }
    Ok(Look::Changing)
}

/// The data and stat of the node at `path`, if it exists.
pub(crate) async fn node(
    inner: &Inner,
    session: &Session,
    path: &str,
    until: Instant,
) -> Result<Option<(Vec<u8>, zk::Stat)>, Failure> {
    match read(inner, session, until, |c| c.get_data(path)).await {
        Ok(node) => Ok(Some(node)),
        Err(Failure::Zk(zk::Error::NoNode)) => Ok(None),
        Err(f) => Err(f),
    }
}

/// Who holds `key`, and who waits for it in which order.
pub(crate) async fn holding(inner: &Arc<Inner>, key: &LockKey) -> Result<Holding> {
    let until = Instant::now() + inner.config.operation_timeout;
    let session = inner.open_session(until).await?;
    let parent = inner.parent_path(key);
    let found = look(inner, &session, &parent, until)
        .await
        .map_err(|f| f.into_error("read the lock's queue"))?;
    Ok(match found {
        Look::Free => Holding::Free,
        Look::Held(head) => Holding::Held(head.holder),
        Look::Changing => Holding::Held(Holder::new()),
    })
}

/// The held locks whose names start with `prefix`: the children of the base path are the
/// encoded lock names; a lock is listed when its holder's node carries a dlock owner record.
/// Each key's look has its own operation timeout.
pub(crate) async fn list(inner: &Arc<Inner>, prefix: &str) -> Result<Vec<HeldLock>> {
    let until = Instant::now() + inner.config.operation_timeout;
    let session = inner.open_session(until).await?;
    let base = inner.config.base.as_str();
    let names = list_queue(inner, &session, base, until)
        .await
        .map_err(|f| f.into_error("list the lock nodes"))?;
    let mut held = Vec::new();
    for name in names {
        // Other nodes under the base path (not made by dlock's encoding) are not locks.
        let Some(key) = decode_key(&name).filter(|k| k.starts_with(prefix)) else {
            continue;
        };
        let until = Instant::now() + inner.config.operation_timeout;
        let found = look(inner, &session, &format!("{base}/{name}"), until)
            .await
            .map_err(|f| f.into_error("read a lock's queue"))?;
        if let Look::Held(head) = found {
            if head.holder.owner.is_some() {
                held.push(HeldLock::new(key, head.holder));
            }
        }
    }
    Ok(held)
}

/// Deletes the holder's node of `key` — only if its creation zxid is `expected`, when given —
/// comparing the node's version on the server. The next contender's watch fires as on a
/// release, and the next grant's node is created later, with a greater zxid.
pub(crate) async fn evict(
    inner: &Arc<Inner>,
    key: &LockKey,
    expected: Option<FencingToken>,
) -> Result<Eviction> {
    let until = Instant::now() + inner.config.operation_timeout;
    let session = inner.open_session(until).await?;
    let parent = inner.parent_path(key);
    let mut expected = expected;
    // The holder a delete was sent for whose answer was lost.
    let mut sent_for: Option<Holder> = None;
    loop {
        let found = look(inner, &session, &parent, until)
            .await
            .map_err(|f| f.into_error("read the lock's queue"))?;
        if let Some(evicted) = sent_for.take() {
            // A delete whose answer was lost removed the holder if it is gone now (or the holder
            // released at that moment: either way it no longer holds the lock).
            let same = matches!(&found, Look::Held(head) if head.holder.fencing == evicted.fencing);
            if !same {
                return Ok(Eviction::Evicted(evicted));
            }
        }
        let head = match found {
            Look::Held(head) => head,
            Look::Free => return Ok(Eviction::Free),
            Look::Changing => {
                return Err(Error::backend(
                    BACKEND,
                    true,
                    "the lock changed hands while it was read; look again",
                ))
            }
        };
        if expected.is_some_and(|token| head.holder.fencing != Some(token)) {
            return Ok(Eviction::Changed(head.holder));
        }
        // From here on only this holder is evicted: if it goes before the delete lands, whoever
        // holds the lock next is someone the caller was not shown.
        expected = expected.or(head.holder.fencing);
        let deleted = call(inner, &session, until, |c| {
            c.delete(&head.path, Some(head.version))
        })
        .await;
        match deleted {
            Ok(()) => return Ok(Eviction::Evicted(head.holder)),
            // Released (or changed) meanwhile: look again.
            Err(Failure::Zk(zk::Error::NoNode | zk::Error::BadVersion)) => {}
            Err(f) if f.outcome_unknown() => sent_for = Some(head.holder),
            Err(f) => return Err(f.into_error("delete the holder's node")),
        }
    }
}
