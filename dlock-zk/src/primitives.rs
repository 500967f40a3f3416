//! The semaphore, the read-write lock and the election, in kazoo's layouts, as views of the lock
//! service ([`DistributedLock::primitive`]).
//!
//! Each primitive of a key `K` lives at its own path beside the lock's, `<lock path of K>` plus a
//! suffix no encoded key can end in (`%` followed by lowercase letters is never produced by
//! [`encode_key`](crate::encode_key)), so the four families of one name never meet:
//!
//! | primitive | path (point kazoo here) | children |
//! |---|---|---|
//! | read-write lock | `…/K%rw` | kazoo `ReadLock`/`WriteLock`: `<owner hex>__rlock__<seq>` / `<owner hex>__lock__<seq>` |
//! | election | `…/K%election` | kazoo `Election` (a `Lock`): `<owner hex>__lock__<seq>`, data = the candidate's value |
//! | semaphore | `…/K%semaphore` (data: the permits), its lock `…/K%semaphore-__lock__` | kazoo `Semaphore`: one ephemeral lease `<owner hex>` per holder |
//!
//! Every grant is fenced by its own node's creation zxid, like the lock's.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{
    Attempt, Capabilities, Extension, Grant, LeaseRef, LockKey, LockRequest, Primitive,
};
use dlock_core::inspect::{Holder, Holding};
use dlock_core::{
    Backoff, DistributedLock, FencingToken, OwnerRecord, OwnerToken, Released, Result,
};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::acquire::{try_in, wait_in, Rule, Spot};
use crate::client::Inner;
use crate::error::{Failure, BACKEND};
use crate::inspect::node;
use crate::naming::{
    is_kazoo_writer, kazoo_prefix, kazoo_queue, KAZOO_READ_MARKER, KAZOO_WRITE_MARKER,
};
use crate::recipe::list_queue;
use crate::request::read;
use crate::session::Session;

/// The suffix of a read-write lock's path.
const RW_SUFFIX: &str = "%rw";
/// The suffix of an election's path.
const ELECTION_SUFFIX: &str = "%election";
/// The suffix of a semaphore's path.
const SEMAPHORE_SUFFIX: &str = "%semaphore";

/// The path kazoo's recipe for `primitive` is pointed at for `key`.
pub(crate) fn path_of(inner: &Inner, key: &LockKey, primitive: &Primitive) -> String {
    let suffix = match primitive {
        Primitive::Read | Primitive::Write => RW_SUFFIX,
        Primitive::Election { .. } => ELECTION_SUFFIX,
        Primitive::Semaphore { .. } => SEMAPHORE_SUFFIX,
        // A primitive added to the core later has no layout here; `primitive` refuses it.
        _ => "%unknown",
    };
    format!("{}{suffix}", inner.parent_path(key))
}

/// The path of a semaphore's lock, as kazoo's `Semaphore` names it (`path + "-__lock__"`).
pub(crate) fn semaphore_lock_path(semaphore: &str) -> String {
    format!("{semaphore}-{KAZOO_WRITE_MARKER}")
}

/// The name of `owner`'s lease node in a semaphore (where kazoo puts a random uuid in hex).
pub(crate) fn lease_name(owner: OwnerToken) -> String {
    owner.to_hex()
}

/// One primitive of a [`ZkLock`](crate::ZkLock), as a lock service of its own.
pub(crate) struct View {
    pub(crate) inner: Arc<Inner>,
    pub(crate) primitive: Primitive,
    pub(crate) capabilities: Capabilities,
}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkPrimitive")
            .field("primitive", &self.primitive.name())
            .finish_non_exhaustive()
    }
}

impl View {
    fn path(&self, key: &LockKey) -> String {
        path_of(&self.inner, key, &self.primitive)
    }

    /// The queue of a read-write lock's side or an election's candidate.
    fn spot(&self, req: &LockRequest<'_>) -> Result<Spot> {
        let parent = self.path(req.key);
        let record = || self.inner.config.owner.record().to_json().into_bytes();
        Ok(match &self.primitive {
            Primitive::Read => Spot {
                parent,
                prefix: kazoo_prefix(req.owner, KAZOO_READ_MARKER),
                data: record(),
                rule: Rule::KazooRead,
            },
            Primitive::Election { .. } => Spot {
                parent,
                prefix: kazoo_prefix(req.owner, KAZOO_WRITE_MARKER),
                // kazoo's `Election.contenders()` shows the node data: the value.
                data: self.primitive.value()?.as_bytes().to_vec(),
                rule: Rule::KazooLock,
            },
            _ => Spot {
                parent,
                prefix: kazoo_prefix(req.owner, KAZOO_WRITE_MARKER),
                data: record(),
                rule: Rule::KazooWrite,
            },
        })
    }

    /// Where an owner's nodes may be, for a release or extend of a lease this client does not
    /// hold (an abandoned acquire): its queue node, or its lease and its semaphore lock node.
    fn places(&self, key: &LockKey, owner: OwnerToken) -> Vec<(String, String)> {
        let path = self.path(key);
        match &self.primitive {
            Primitive::Semaphore { .. } => vec![
                (path.clone(), lease_name(owner)),
                (
                    semaphore_lock_path(&path),
                    kazoo_prefix(owner, KAZOO_WRITE_MARKER),
                ),
            ],
            Primitive::Read => vec![(path, kazoo_prefix(owner, KAZOO_READ_MARKER))],
            _ => vec![(path, kazoo_prefix(owner, KAZOO_WRITE_MARKER))],
        }
    }

    /// Whether a new contender would be granted among `children` (a hint for waiting).
    fn grantable(&self, children: &[String]) -> bool {
        match &self.primitive {
            Primitive::Semaphore { permits } => children.len() < *permits as usize,
            Primitive::Read => !children.iter().any(|c| is_kazoo_writer(c)),
            Primitive::Election { .. } => kazoo_queue(children, false).is_empty(),
            _ => kazoo_queue(children, true).is_empty(),
        }
    }
}

#[async_trait]
impl DistributedLock for View {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    /// A read-write lock's side or an election's candidate: creates its node in kazoo's queue
    /// and holds if nobody it waits behind is ahead (otherwise deletes it again: busy). A
    /// semaphore: kazoo's `Semaphore` steps (see [`crate::semaphore`]).
    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        match &self.primitive {
            Primitive::Semaphore { permits } => {
                crate::semaphore::acquire(&self.inner, req, &self.path(req.key), *permits, None)
                    .await
            }
            _ => try_in(&self.inner, req, &self.spot(req)?).await,
        }
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        let places = self.places(lease.key, lease.owner);
        crate::extend::extend_in(&self.inner, lease, ttl, &places).await
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        let places = self.places(lease.key, lease.owner);
        crate::release::release_in(&self.inner, lease, &places).await
    }

    /// Watches the children of the primitive's path (a semaphore's leases, a queue) and returns
    /// when they change or when a new contender would be granted now.
    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        let inner = &self.inner;
        let session = inner.open_session(until).await?;
        let path = self.path(key);
        let watched = read(inner, &session, until, |c| c.list_and_watch_children(&path)).await;
        match watched {
            Ok((children, watcher)) => {
                if !self.grantable(&children) {
                    let _ = tokio::time::timeout_at(until, watcher.changed()).await;
                }
                Ok(())
            }
            Err(Failure::Zk(zk::Error::NoNode)) => Ok(()),
            Err(_) if Instant::now() >= until => Ok(()),
            Err(f) => Err(f.into_error("watch the primitive's nodes")),
        }
    }

    /// Who holds the key now. A semaphore: its earliest lease, with the number of leases. A
    /// read-write lock: the writer, or the first of the readers served together with their
    /// number. An election: the leader with its value; its term is the fencing token.
    async fn inspect(&self, key: &LockKey) -> Result<Holding> {
        let inner = &self.inner;
        let until = Instant::now() + inner.config.operation_timeout;
        let session = inner.open_session(until).await?;
        let path = self.path(key);
        look(inner, &session, &path, &self.primitive, until)
            .await
            .map_err(|f| f.into_error("read the primitive's nodes"))
    }

    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        match &self.primitive {
            Primitive::Semaphore { permits } => {
                let path = self.path(req.key);
                let waiting = crate::semaphore::Wait { deadline, retry };
                match crate::semaphore::acquire(&self.inner, req, &path, *permits, Some(waiting))
                    .await?
                {
                    Attempt::Acquired(grant) => Ok(grant),
                    // A waiting acquire answers a grant, a timeout or an error, never busy.
                    Attempt::Busy { .. } => Err(dlock_core::Error::backend(
                        BACKEND,
                        true,
                        "a waiting semaphore acquire answered busy",
                    )),
                }
            }
            _ => wait_in(&self.inner, req, &self.spot(req)?, deadline, retry).await,
        }
    }
}

fn token(stat: &zk::Stat) -> Option<FencingToken> {
    u64::try_from(stat.czxid)
        .ok()
        .filter(|t| *t > 0)
        .map(FencingToken)
}

/// How often a look is repeated when a holder's node vanishes between the listing and its read.
const ATTEMPTS: usize = 3;

/// Reads who holds the primitive at `path`.
async fn look(
    inner: &Inner,
    session: &Session,
    path: &str,
    primitive: &Primitive,
    until: Instant,
) -> Result<Holding, Failure> {
    for _ in 0..ATTEMPTS {
        let children = list_queue(inner, session, path, until).await?;
        // The holders, earliest first, and whether they share the name.
        let (holders, shared): (Vec<String>, bool) = match primitive {
            Primitive::Semaphore { .. } => (children.clone(), true),
            Primitive::Election { .. } => (
                kazoo_queue(&children, false)
                    .first()
                    .map(|c| c.name.to_owned())
                    .into_iter()
                    .collect(),
                false,
            ),
            _ => {
                let queue = kazoo_queue(&children, true);
                match queue.first() {
                    None => (Vec::new(), false),
                    Some(first) if is_kazoo_writer(first.name) => {
                        (vec![first.name.to_owned()], false)
                    }
                    Some(_) => (
                        queue
                            .iter()
                            .take_while(|c| !is_kazoo_writer(c.name))
                            .map(|c| c.name.to_owned())
                            .collect(),
                        true,
                    ),
                }
            }
        };
        if holders.is_empty() {
            return Ok(Holding::Free);
        }
        let mut read_all = Vec::with_capacity(holders.len());
        for name in &holders {
            if let Some(found) = node(inner, session, &format!("{path}/{name}"), until).await? {
                read_all.push(found);
            }
        }
        // A semaphore's leases are not sequential: the earliest is the one created first.
        read_all.sort_by_key(|(_, stat)| stat.czxid);
        let Some((data, stat)) = read_all.first() else {
            continue;
        };
        let mut holder = Holder::new();
        if let Some(token) = token(stat) {
            holder = holder.with_fencing(token);
        }
        holder = match primitive {
            Primitive::Election { .. } => {
                holder.with_value(Some(String::from_utf8_lossy(data).into_owned()))
            }
            _ => holder.with_owner(OwnerRecord::parse(data)),
        };
        if shared {
            holder = holder.with_holders(read_all.len());
        }
        return Ok(Holding::Held(holder));
    }
    Ok(Holding::Held(Holder::new()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode_key, encode_key};

    #[test]
    fn primitive_paths_never_name_a_lock() {
        for key in ["a", "a%rw", "a/b", "%", "x%semaphore-__lock__"] {
            let stem = encode_key(key);
            for suffix in [
                RW_SUFFIX.to_owned(),
                ELECTION_SUFFIX.to_owned(),
                SEMAPHORE_SUFFIX.to_owned(),
                semaphore_lock_path(SEMAPHORE_SUFFIX),
            ] {
                let name = format!("{stem}{suffix}");
                assert_eq!(decode_key(&name), None, "{name} decodes as a lock key");
            }
        }
    }
}
