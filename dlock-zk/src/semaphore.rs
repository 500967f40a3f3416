//! kazoo's `Semaphore`, step for step, so that dlock and kazoo share one semaphore.
//!
//! At the semaphore's path `P` (a persistent node whose data is the number of permits, in
//! decimal) every holder has one ephemeral child, its lease: kazoo names it with a random uuid in
//! hex, dlock with its owner token in hex. A contender takes the semaphore's lock first — a kazoo
//! `Lock` at `P-__lock__` — then counts the leases and creates its own if there are fewer than
//! the permits; a waiter keeps the lock and watches the leases until one goes, so waiters are
//! served in the lock's order. The lease's creation zxid is the holder's fencing token: every
//! lease is created after the ones granted before it.
//!
//! kazoo refuses a `max_leases` other than the stored one (`ValueError`); dlock answers
//! [`Error::Mismatch`] and changes nothing while a lease is held. With no lease held the stored
//! number is the next holder's to set, as in dlock's other backends: dlock rewrites it, under
//! the semaphore's lock.

use std::sync::Arc;

use dlock_core::backend::{Attempt, LockRequest, Waiting};
use dlock_core::{Backoff, Error, Result};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::acquire::{far_future, grant, vanished, Cleanup, Rule};
use crate::client::Inner;
use crate::error::Failure;
use crate::inspect::node;
use crate::naming::{kazoo_prefix, KAZOO_WRITE_MARKER};
use crate::primitives::{lease_name, semaphore_lock_path};
use crate::recipe::{create_node, delete_node, list_queue, OwnNode};
use crate::request::{call, read};
use crate::session::Session;
use crate::stats::Counters;

/// How a waiting acquire waits.
pub(crate) struct Wait<'a> {
    pub(crate) deadline: Option<Instant>,
    pub(crate) retry: &'a Backoff,
}

/// The stored number of permits, if the data is one (kazoo ignores data that is not a number).
fn stored_permits(data: &[u8]) -> Option<u32> {
    std::str::from_utf8(data).ok()?.trim().parse().ok()
}

fn mismatch(req: &LockRequest<'_>, stored: u32, permits: u32) -> Error {
    Error::mismatch(
        req.key,
        format!("the semaphore has {stored} permits; asked with {permits}"),
    )
}

/// Takes a permit of the semaphore at `path`: once (`wait: None`, busy when every permit is
/// held), or waiting until `wait.deadline` (a timeout error then, never busy).
pub(crate) async fn acquire(
    inner: &Arc<Inner>,
    req: &LockRequest<'_>,
    path: &str,
    permits: u32,
    wait: Option<Wait<'_>>,
) -> Result<Attempt> {
    let started = Instant::now();
    let first_pass_by = started + inner.config.operation_timeout;
    let waiting = wait
        .as_ref()
        .map(|w| Waiting::new(req.key, w.deadline, w.retry));
    let deadline = wait.as_ref().and_then(|w| w.deadline);
    // A single attempt is bounded by the operation timeout; a wait by its deadline (or the first
    // pass's bound, if later), like the lock's.
    let until = match &wait {
        None => first_pass_by,
        Some(w) => w.deadline.map_or_else(far_future, |d| d.max(first_pass_by)),
    };
    let timed_out = |f: &Failure| {
        matches!(f, Failure::OutOfTime)
            && waiting.as_ref().is_some_and(|w| w.is_over(Instant::now()))
    };
    let fail = |f: Failure, op: &'static str| match &waiting {
        Some(w) if timed_out(&f) => w.timeout(),
        _ => f.into_error(op),
    };
    let session = inner
        .session(first_pass_by)
        .await
        .map_err(|f| fail(f, "open a ZooKeeper session"))?;

    // A number other than the stored one is refused before anything is created.
    if let Some((data, _)) = node(inner, &session, path, until)
        .await
        .map_err(|f| fail(f, "read the semaphore"))?
    {
        if let Some(stored) = stored_permits(&data).filter(|n| *n != permits) {
            let leases = list_queue(inner, &session, path, until)
                .await
                .map_err(|f| fail(f, "list the semaphore's leases"))?;
            if !leases.is_empty() {
                return Err(mismatch(req, stored, permits));
            }
        }
    }

    let lock_parent = semaphore_lock_path(path);
    let lock_prefix = kazoo_prefix(req.owner, KAZOO_WRITE_MARKER);
    let mut lock_cleanup = Cleanup::new(inner, &session, &lock_parent, &lock_prefix);
    let lease_path = format!("{path}/{}", lease_name(req.owner));
    let mut lease_cleanup = Cleanup::new(inner, &session, path, &lease_name(req.owner));
    lease_cleanup.disarm();

    let outcome: Result<Attempt> = async {
        // kazoo's `Lock` on `P-__lock__`: the semaphore's lock, held only while counting (and,
        // by a waiter, while it waits for a lease to go).
        let record = inner.config.owner.record().to_json();
        let own = create_node(
            inner,
            &session,
            &lock_parent,
            &lock_prefix,
            record.as_bytes(),
            until,
        )
        .await
        .map_err(|f| fail(f, "create the semaphore's lock node"))?;
        lock_cleanup.node(&own.path);
        let seen = loop {
            if let Some(w) = &waiting {
                w.check()?;
            }
            let seen = look(inner, &session, &lock_parent, path, until)
                .await
                .map_err(|f| fail(f, "read the semaphore's lock queue and leases"))?;
            let blocker = match Rule::KazooLock.blocker(&seen.queue, &own.name) {
                None => return Err(vanished(&session)),
                Some(None) => break seen,
                Some(Some(blocker)) => format!("{lock_parent}/{blocker}"),
            };
            // A single attempt behind a full semaphore is busy at once: whoever holds the lock
            // then is a waiter, and waits for the same lease to go.
            if waiting.is_none() && seen.leases.len() >= permits as usize {
                return Ok(Attempt::Busy { retry_after: None });
            }
            let watched = call(inner, &session, until, |c| c.check_and_watch_stat(&blocker)).await;
            let watcher = match watched {
                Ok((Some(_), watcher)) => watcher,
                Ok((None, _)) => continue,
                Err(f) if f.connection_failed() => continue,
                Err(f) if waiting.is_none() && matches!(f, Failure::OutOfTime) => {
                    return Ok(Attempt::Busy { retry_after: None })
                }
                Err(f) => return Err(fail(f, "watch the semaphore's lock")),
            };
            let bound = match (&waiting, deadline) {
                (Some(_), Some(d)) => d,
                (Some(_), None) => until,
                (None, _) => first_pass_by,
            };
            let event = tokio::select! {
                event = watcher.changed() => event,
                _ = tokio::time::sleep_until(bound) => {
                    return match &waiting {
                        Some(w) => Err(w.timeout()),
                        None => Ok(Attempt::Busy { retry_after: None }),
                    };
                }
            };
            if event.event_type == zk::EventType::Session {
                return Err(Failure::SessionEnded.into_error("wait for the semaphore's lock"));
            }
            Counters::bump(&inner.counters.wakeups);
        };

        // The lock is ours: agree on the number of permits.
        let Look { node, leases, .. } = seen;
        agree(inner, &session, req, path, permits, until, (node, &leases))
            .await
            .map_err(|e| match e {
                Agreement::Refused(error) => error,
                Agreement::Failed(f) => fail(f, "write the semaphore's permits"),
            })?;

        // Count the leases; take one if there is room, otherwise wait for one to go (holding the
        // lock, as kazoo does) or answer busy. The first count is the one read with the queue.
        let mut counted = Some(leases);
        loop {
            let (leases, watcher) = if let Some(leases) = counted.take() {
                (leases, None)
            } else if waiting.is_some() {
                let (leases, watcher) =
                    read(inner, &session, until, |c| c.list_and_watch_children(path))
                        .await
                        .map_err(|f| fail(f, "list the semaphore's leases"))?;
                (leases, Some(watcher))
            } else {
                let leases = list_queue(inner, &session, path, until)
                    .await
                    .map_err(|f| fail(f, "list the semaphore's leases"))?;
                (leases, None)
            };
            let mine = lease_name(req.owner);
            if leases.len() < permits as usize || leases.contains(&mine) {
                let sent = Instant::now();
                lease_cleanup = Cleanup::new(inner, &session, path, &mine);
                let lock_node = lock_cleanup.path();
                let (lease, lock_deleted) =
                    create_lease(inner, &session, &lease_path, lock_node.as_deref(), until)
                        .await
                        .map_err(|f| fail(f, "create the semaphore's lease"))?;
                if lock_deleted {
                    lock_cleanup.disarm();
                }
                lease_cleanup.node(&lease_path);
                let own = OwnNode {
                    path: lease_path.clone(),
                    name: mine,
                    czxid: lease.czxid,
                };
                let grant = grant(inner, &session, req, &own, sent)?;
                lease_cleanup.disarm();
                return Ok(Attempt::Acquired(grant));
            }
            let Some(watcher) = watcher else {
                if waiting.is_some() {
                    // The first count found no room: count again, watching the leases.
                    continue;
                }
                return Ok(Attempt::Busy { retry_after: None });
            };
            let event = match deadline {
                Some(d) => tokio::select! {
                    event = watcher.changed() => event,
                    _ = tokio::time::sleep_until(d) => {
                        return Err(waiting.as_ref().map_or_else(
                            || Failure::OutOfTime.into_error("wait for a lease"),
                            Waiting::timeout,
                        ));
                    }
                },
                None => watcher.changed().await,
            };
            if event.event_type == zk::EventType::Session {
                return Err(Failure::SessionEnded.into_error("wait for a lease"));
            }
            Counters::bump(&inner.counters.wakeups);
        }
    }
    .await;

    // The semaphore's lock is given back whatever happened; a wait that ran out withdraws it
    // before it returns (bounded), as the lock's does.
    match &outcome {
        Err(Error::Timeout { .. }) => lock_cleanup.withdraw(&session, req).await,
        _ => {
            if let Some(path) = lock_cleanup.path() {
                if delete_node(inner, &session, &path, until).await.is_ok() {
                    lock_cleanup.disarm();
                }
            }
        }
    }
    outcome
}

/// Why the permits could not be agreed on.
enum Agreement {
    /// Another number is stored while a lease is held.
    Refused(Error),
    /// A request failed.
    Failed(Failure),
}

impl From<Failure> for Agreement {
    fn from(f: Failure) -> Self {
        Agreement::Failed(f)
    }
}

/// Under the semaphore's lock: makes sure the semaphore's node exists and stores `permits`,
/// refusing another number while a lease is held. `seen` is the node and its leases as
/// [`look`] read them once the lock was ours; they are read again after a change of its own.
async fn agree(
    inner: &Inner,
    session: &Session,
    req: &LockRequest<'_>,
    path: &str,
    permits: u32,
    until: Instant,
    seen: (Option<(Vec<u8>, zk::Stat)>, &[String]),
) -> Result<(), Agreement> {
    let text = permits.to_string();
    let mut seen = Some(seen);
    loop {
        let (found, seen_leases) = match seen.take() {
            Some((found, leases)) => (found, Some(leases)),
            None => (node(inner, session, path, until).await?, None),
        };
        let Some((data, stat)) = found else {
            // Persistent, as kazoo's `ensure_path` makes it: a kazoo `Semaphore` checks the node
            // once and expects it to stay.
            let options = zk::CreateMode::Persistent.with_acls(inner.config.acl.acls());
            match call(inner, session, until, |c| {
                c.create(path, text.as_bytes(), &options)
            })
            .await
            {
                Ok(_) | Err(Failure::Zk(zk::Error::NodeExists)) => continue,
                Err(f) if f.outcome_unknown() => continue,
                Err(f) => return Err(f.into()),
            }
        };
        match stored_permits(&data) {
            Some(stored) if stored == permits => return Ok(()),
            // Data that is no number is someone else's: left alone, as kazoo leaves it.
            None if !data.is_empty() => return Ok(()),
            stored => {
                let held = match seen_leases {
                    Some(leases) => !leases.is_empty(),
                    None => !list_queue(inner, session, path, until).await?.is_empty(),
                };
                if let Some(stored) = stored.filter(|_| held) {
                    return Err(Agreement::Refused(mismatch(req, stored, permits)));
                }
                let version = Some(stat.version);
                match call(inner, session, until, |c| {
                    c.set_data(path, text.as_bytes(), version)
                })
                .await
                {
                    Ok(_) => return Ok(()),
                    Err(Failure::Zk(zk::Error::BadVersion | zk::Error::NoNode)) => continue,
                    Err(f) if f.outcome_unknown() => continue,
                    Err(f) => return Err(f.into()),
                }
            }
        }
    }
}

/// Creates the own lease (ephemeral, not sequential, data: the owner record); a lease that
/// already exists is the own one, made by an earlier request whose answer was lost.
///
/// The semaphore's lock node `lock_node` is deleted in the same transaction: one write for the
/// server to make durable instead of two, and the lock's next holder counts the new lease.
/// Returns the lease's stat and whether the lock node is gone (otherwise the caller deletes it).
async fn create_lease(
    inner: &Inner,
    session: &Session,
    lease_path: &str,
    lock_node: Option<&str>,
    until: Instant,
) -> Result<(zk::Stat, bool), Failure> {
    let record = inner.config.owner.record().to_json();
    let options = zk::CreateMode::Ephemeral.with_acls(inner.config.acl.acls());
    let mut lock_gone = false;
    if let Some(lock_node) = lock_node {
        let together = call(inner, session, until, |c| {
            let mut writer = c.new_multi_writer();
            let added = writer
                .add_create(lease_path, record.as_bytes(), &options)
                .and_then(|()| writer.add_delete(lock_node, None));
            let commit = writer.commit();
            async move {
                added?;
                match commit.await {
                    Ok(mut results) => Ok(Ok(results.swap_remove(0))),
                    Err(zk::MultiWriteError::OperationFailed { index, source }) => {
                        Ok(Err((index, source)))
                    }
                    Err(zk::MultiWriteError::RequestFailed { source }) => Err(source),
                }
            }
        })
        .await;
        match together {
            Ok(Ok(zk::MultiWriteResult::Create { stat, .. })) if !stat.is_invalid() => {
                return Ok((stat, true))
            }
            // Some servers answer a transaction's create without its stat: read it.
            Ok(Ok(_)) => lock_gone = true,
            // The lock node is gone already (nothing was written): create the lease alone.
            Ok(Err((1, zk::Error::NoNode))) => lock_gone = true,
            Ok(Err((_, zk::Error::NodeExists))) => {}
            Ok(Err((_, error))) => return Err(Failure::Zk(error)),
            Err(f) if f.outcome_unknown() => {}
            Err(f) => return Err(f),
        }
    }
    // After a request that may have created it, the lease is looked for before it is created.
    let mut sent = lock_node.is_some();
    loop {
        if sent {
            if let Some(stat) = read(inner, session, until, |c| c.check_stat(lease_path)).await? {
                if stat.ephemeral_owner == session.id {
                    return Ok((stat, lock_gone));
                }
                return Err(Failure::Zk(zk::Error::NodeExists));
            }
        }
        sent = true;
        match call(inner, session, until, |c| {
            c.create(lease_path, record.as_bytes(), &options)
        })
        .await
        {
            Ok((stat, _)) => return Ok((stat, lock_gone)),
            Err(Failure::Zk(zk::Error::NodeExists)) => {}
            Err(f) if f.outcome_unknown() => {}
            Err(f) => return Err(f),
        }
    }
}

/// The semaphore's lock queue, its node and its leases, read in one round trip.
struct Look {
    queue: Vec<String>,
    node: Option<(Vec<u8>, zk::Stat)>,
    leases: Vec<String>,
}

/// Reads the lock queue at `lock_parent`, then the semaphore's node and leases at `path`. A
/// session's requests are answered in the order sent, so when the queue shows this contender
/// first, the node and leases are as a read under the lock would find them: a holder changes
/// them before it leaves the queue.
async fn look(
    inner: &Inner,
    session: &Session,
    lock_parent: &str,
    path: &str,
    until: Instant,
) -> Result<Look, Failure> {
    fn or_none<T>(answer: Result<T, zk::Error>) -> Result<Option<T>, zk::Error> {
        match answer {
            Ok(found) => Ok(Some(found)),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(e),
        }
    }
    read(inner, session, until, |c| {
        let (queue, node, leases) = (
            c.list_children(lock_parent),
            c.get_data(path),
            c.list_children(path),
        );
        async move {
            Ok(Look {
                queue: or_none(queue.await)?.unwrap_or_default(),
                node: or_none(node.await)?,
                leases: or_none(leases.await)?.unwrap_or_default(),
            })
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_are_read_as_kazoo_writes_them() {
        assert_eq!(stored_permits(b"3"), Some(3));
        assert_eq!(stored_permits(b""), None);
        assert_eq!(stored_permits(b"three"), None);
    }
}
