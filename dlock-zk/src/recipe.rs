//! The node operations of the lock recipe: create the own node (with its parents, recovering a
//! lost reply), list the queue, delete a node.
//!
//! Parents are container nodes where the server has them (ZooKeeper 3.5.3 and later): the server
//! deletes a container once its last child is gone, and its delete fails while a child exists, so
//! cleanup can never remove a parent under a new contender. A contender whose create meets a
//! parent deleted a moment earlier gets `NoNode` and simply creates the parent again.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;
use zookeeper_client as zk;

use crate::client::Inner;
use crate::error::Failure;
use crate::naming::queue;
use crate::request::{call, read};
use crate::session::Session;
use crate::stats::Counters;

/// How often a create may meet a missing parent before giving up: the parent can vanish between
/// being made and being used only when the server's container cleanup runs in that instant.
const PARENT_ATTEMPTS: usize = 4;

/// The contender's own node.
#[derive(Debug, Clone)]
pub(crate) struct OwnNode {
    /// Its full path.
    pub(crate) path: String,
    /// Its name (the last path segment).
    pub(crate) name: String,
    /// The zxid of its creation: the fencing token if it becomes the holder.
    pub(crate) czxid: i64,
}

/// The lock parents this client created or used lately: a node's create under one of them goes
/// out alone; under any other, together with the parent's create (see [`create_node`]). Bounded:
/// forgotten all at once when full, which costs only a pipelined parent create per name.
#[derive(Debug, Default)]
pub(crate) struct KnownParents(Mutex<HashSet<String>>);

/// How many parents a client remembers.
const KNOWN_PARENTS: usize = 4096;

impl KnownParents {
    fn set(&self) -> MutexGuard<'_, HashSet<String>> {
        // Inserts and lookups leave the set whole before anything can panic.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn knows(&self, parent: &str) -> bool {
        self.set().contains(parent)
    }

    fn learn(&self, parent: &str) {
        let mut set = self.set();
        if set.len() >= KNOWN_PARENTS {
            set.clear();
        }
        set.insert(parent.to_owned());
    }
}

/// Creates an ephemeral sequential node named `prefix` plus its sequence in `parent`, holding
/// `data`, creating missing parents.
///
/// Under a parent this client has not used lately (a key nobody may have used), the parent's
/// create goes out with the node's, one round trip: the server runs a session's requests in
/// order, so the node's create finds the parent, and a parent that exists only answers
/// `NodeExists`, which changes nothing. Under a known parent the node's create goes alone, and
/// meets a missing parent (removed by the server's container cleanup) with `NoNode`: then the
/// pair is sent, and if the node still finds no parent, [`ensure_parent`] makes the base path
/// or falls back to persistent parents.
///
/// If the connection is lost before the reply arrives, the create may or may not have happened:
/// the node is then looked up by its name prefix (which embeds the owner token) after
/// reconnecting, and created only if it is not there, so one acquire never leaves two nodes.
pub(crate) async fn create_node(
    inner: &Inner,
    session: &Session,
    parent: &str,
    prefix: &str,
    data: &[u8],
    until: Instant,
) -> Result<OwnNode, Failure> {
    let create_path = format!("{parent}/{prefix}");
    let options = zk::CreateMode::EphemeralSequential.with_acls(inner.config.acl.acls());
    let mut with_parent = !inner.parents.knows(parent);
    let mut missing_parent = 0;
    loop {
        let created = if with_parent {
            let parent_options = parent_mode(inner).with_acls(inner.config.acl.acls());
            call(inner, session, until, |c| {
                let parent_made = c.create(parent, &[], &parent_options);
                let made = c.create(&create_path, data, &options);
                async move {
                    // Whatever the parent's create answered, the node's tells.
                    let _ = parent_made.await;
                    made.await
                }
            })
            .await
        } else {
            call(inner, session, until, |c| {
                c.create(&create_path, data, &options)
            })
            .await
        };
        match created {
            Ok((stat, sequence)) => {
                if with_parent {
                    inner.parents.learn(parent);
                }
                let name = format!("{prefix}{sequence}");
                return Ok(OwnNode {
                    path: format!("{parent}/{name}"),
                    name,
                    czxid: stat.czxid,
                });
            }
            Err(Failure::Zk(zk::Error::NoNode)) if missing_parent < PARENT_ATTEMPTS => {
                missing_parent += 1;
                if with_parent {
                    ensure_parent(inner, session, parent, until).await?;
                }
                with_parent = !with_parent;
            }
            Err(f) if f.outcome_unknown() => {
                if let Some(node) = find_own(inner, session, parent, prefix, until).await? {
                    Counters::bump(&inner.counters.recovered_creates);
                    tracing::debug!(
                        backend = crate::error::BACKEND,
                        "create reply lost: found the own lock node by its owner prefix"
                    );
                    return Ok(node);
                }
            }
            Err(f) => return Err(f),
        }
    }
}

/// Creates `parent` (a container node, or persistent on servers without containers) and the
/// base path above it if needed.
pub(crate) async fn ensure_parent(
    inner: &Inner,
    session: &Session,
    parent: &str,
    until: Instant,
) -> Result<(), Failure> {
    let mut made_base = false;
    loop {
        let containers = inner.containers.load(Ordering::Relaxed);
        let options = parent_mode(inner).with_acls(inner.config.acl.acls());
        match call(inner, session, until, |c| c.create(parent, &[], &options)).await {
            Ok(_) | Err(Failure::Zk(zk::Error::NodeExists)) => return Ok(()),
            Err(Failure::Zk(zk::Error::NoNode)) if !made_base => {
                made_base = true;
                let options = zk::CreateMode::Persistent.with_acls(inner.config.acl.acls());
                let base = inner.config.base.as_str();
                call(inner, session, until, |c| c.mkdir(base, &options)).await?;
            }
            Err(Failure::Zk(zk::Error::Unimplemented)) if containers => {
                tracing::info!(
                    backend = crate::error::BACKEND,
                    "the server has no container nodes: lock parents are persistent"
                );
                inner.containers.store(false, Ordering::Relaxed);
            }
            // The caller's next create tells whether the parent exists.
            Err(f) if f.outcome_unknown() => return Ok(()),
            Err(f) => return Err(f),
        }
    }
}

/// A lock parent's mode: a container node, or persistent on servers without containers.
fn parent_mode(inner: &Inner) -> zk::CreateMode {
    if inner.containers.load(Ordering::Relaxed) {
        zk::CreateMode::Container
    } else {
        zk::CreateMode::Persistent
    }
}

/// Finds `owner`'s node in `parent` by its name prefix.
pub(crate) async fn find_own(
    inner: &Inner,
    session: &Session,
    parent: &str,
    prefix: &str,
    until: Instant,
) -> Result<Option<OwnNode>, Failure> {
    let children = list_queue(inner, session, parent, until).await?;
    let Some(name) = children.into_iter().find(|c| c.starts_with(prefix)) else {
        return Ok(None);
    };
    let path = format!("{parent}/{name}");
    match read(inner, session, until, |c| c.check_stat(&path)).await? {
        Some(stat) => Ok(Some(OwnNode {
            path,
            name,
            czxid: stat.czxid,
        })),
        None => Ok(None),
    }
}

/// Where an owner this client holds no lease for stands in its key's queue.
pub(crate) enum Standing {
    /// Nobody holds the key, or the session that had anything of ours ended.
    Expired,
    /// The owner's node exists, at this path.
    Queued(String),
    /// Another owner's node heads the queue.
    TakenOver,
}

/// Looks for a node named by one of `places` (a parent and the name prefix of the own node in
/// it), in order: the first found is the owner's; none found is [`Standing::TakenOver`] when
/// the first place has other sequential contenders, [`Standing::Expired`] otherwise.
pub(crate) async fn standing_in(
    inner: &Inner,
    session: &Session,
    places: &[(String, String)],
    until: Instant,
) -> Result<Standing, Failure> {
    let mut taken = false;
    for (index, (parent, prefix)) in places.iter().enumerate() {
        let children = match list_queue(inner, session, parent, until).await {
            Ok(children) => children,
            Err(f) if f.session_ended() => return Ok(Standing::Expired),
            Err(f) => return Err(f),
        };
        if let Some(name) = children.iter().find(|c| c.starts_with(prefix.as_str())) {
            return Ok(Standing::Queued(format!("{parent}/{name}")));
        }
        if index == 0 {
            taken = !queue(&children).is_empty();
        }
    }
    Ok(if taken {
        Standing::TakenOver
    } else {
        Standing::Expired
    })
}

/// The children of `parent` (none if it does not exist).
pub(crate) async fn list_queue(
    inner: &Inner,
    session: &Session,
    parent: &str,
    until: Instant,
) -> Result<Vec<String>, Failure> {
    match read(inner, session, until, |c| c.list_children(parent)).await {
        Ok(children) => Ok(children),
        Err(Failure::Zk(zk::Error::NoNode)) => Ok(Vec::new()),
        Err(f) => Err(f),
    }
}

/// What a delete found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deletion {
    /// The node existed and is gone now.
    Deleted,
    /// The node did not exist.
    Missing,
    /// The node is gone; an earlier attempt whose reply was lost may have deleted it.
    Gone,
}

/// Deletes the node at `path`, repeating after a lost connection.
pub(crate) async fn delete_node(
    inner: &Inner,
    session: &Session,
    path: &str,
    until: Instant,
) -> Result<Deletion, Failure> {
    let mut attempted = false;
    loop {
        match call(inner, session, until, |c| c.delete(path, None)).await {
            Ok(()) => return Ok(Deletion::Deleted),
            Err(Failure::Zk(zk::Error::NoNode)) => {
                return Ok(if attempted {
                    Deletion::Gone
                } else {
                    Deletion::Missing
                })
            }
            Err(f) if f.connection_failed() => attempted = true,
            Err(f) => return Err(f),
        }
    }
}
