//! The semaphore, the read-write lock and the election, served as views of the lock trait.
//!
//! Every primitive is a queue of contender keys ordered by create revision, like the lock, but
//! **every grant has an etcd lease of its own** (granted with the client's session TTL and kept
//! alive by its own keep-alive stream), and its key is `<queue>/<that lease in hex>`, as
//! `etcdctl elect` and Go's `concurrency` package name keys after a session. So one client can
//! hold several permits or read holds of one name, a key always belongs to exactly one acquire,
//! and an acquire that is dropped, times out or is answered busy is withdrawn by revoking its
//! lease: the key goes, and a write of it still on its way is refused by the server (its lease
//! is gone), so nothing is left behind and nothing needs a second look.
//!
//! Names (each family in a folder no lock name can reach, since an escaped lock key never
//! contains `%e`, `%s` or `%r`):
//!
//! * **Election** `<namespace>%election/<escaped key>`, the layout of Go's
//!   `concurrency.Election` and `etcdctl elect`: candidates `<name>/<lease hex>` whose value is
//!   the candidate's value; the leader is the key with the smallest create revision, whose create
//!   revision is the term; a candidate waits until no key created before its own is left.
//! * **Semaphore** `<namespace>%semaphore/<escaped key>`: contenders `<name>/<lease hex>` (value:
//!   the owner record); the first `permits` in create order hold. The key `<name>` itself keeps the
//!   permits the holders agreed on, compared in the transaction that joins, so a client that asks
//!   with another number while contenders exist is refused and writes nothing.
//! * **Read-write lock** `<namespace>%rw/<escaped key>`: readers `<name>/read/<lease hex>` and
//!   writers `<name>/write/<lease hex>` in one queue (the sub-folders of etcd's
//!   `contrib/recipes` read-write mutex). A reader holds when no writer key was created before
//!   its own, a writer when no key at all was. A waiting writer's key stands in the queue, so
//!   readers that come after it wait behind it: writers are not starved.
//!
//! The per-acquire TTL is kept by the client, as for the lock: at its end (re-armed by `extend`)
//! the client revokes the grant's lease. A client that dies loses its grants when their leases
//! run out on the server, after the session TTL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{
    Attempt, Backoff, Capabilities, DistributedLock, Error, Extension, FencingToken, Grant, Holder,
    Holding, LeaseRef, LockKey, LockRequest, LostReason, OwnerRecord, OwnerToken, Primitive,
    Released, Result, Waiting,
};
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::client::{contender_value, ClientState};
use crate::error::BACKEND;
use crate::layout::{contender_key, KeyLayout};
use crate::requests::Requests;
use crate::session::Session;
use crate::waiting::{arm, Woken};

/// How often a semaphore's join is tried again when the agreed permits change under it.
const JOIN_ATTEMPTS: u32 = 5;

/// The primitive a view serves, as the etcd layout needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Semaphore { permits: u32 },
    Read,
    Write,
    Candidate { value: String },
    Observer,
}

impl Kind {
    fn of(primitive: &Primitive) -> Result<Kind> {
        Ok(match primitive {
            Primitive::Semaphore { permits } => Kind::Semaphore { permits: *permits },
            Primitive::Read => Kind::Read,
            Primitive::Write => Kind::Write,
            Primitive::Election { value: Some(value) } => Kind::Candidate {
                value: value.clone(),
            },
            Primitive::Election { value: None } => Kind::Observer,
            other => {
                return Err(Error::Unsupported {
                    backend: BACKEND,
                    what: other.name(),
                })
            }
        })
    }

    /// The folder of the primitive's names.
    fn family(&self) -> &'static str {
        match self {
            Kind::Semaphore { .. } => "semaphore",
            Kind::Read | Kind::Write => "rw",
            Kind::Candidate { .. } | Kind::Observer => "election",
        }
    }
}

/// Where one name of one primitive lives.
struct Place {
    /// `<name>`: a semaphore's agreed permits.
    name: Vec<u8>,
    /// `<name>/`: every contender.
    queue: Vec<u8>,
    /// Where this view's contender keys go (`<name>/`, or `<name>/read/`, `<name>/write/`).
    mine: Vec<u8>,
    /// The contenders this view waits behind (everyone, or the writers for a reader).
    blockers: Vec<u8>,
}

fn place(layout: &KeyLayout, kind: &Kind, key: &LockKey) -> Place {
    let name = layout.family_name(kind.family(), key).into_bytes();
    let mut queue = name.clone();
    queue.push(b'/');
    let sub = |s: &str| {
        let mut p = queue.clone();
        p.extend_from_slice(s.as_bytes());
        p
    };
    let (mine, blockers) = match kind {
        Kind::Read => (sub("read/"), sub("write/")),
        Kind::Write => (sub("write/"), queue.clone()),
        _ => (queue.clone(), queue.clone()),
    };
    Place {
        name,
        queue,
        mine,
        blockers,
    }
}

/// One grant: its lease, key and create revision, and when the client ends it.
struct Hold {
    session: Arc<Session>,
    key: Vec<u8>,
    revision: i64,
    deadline: watch::Sender<Instant>,
}

/// The grants of one client's primitives, by the acquire's owner token (random per acquire).
#[derive(Default)]
pub(crate) struct Holds {
    holds: Mutex<HashMap<OwnerToken, Arc<Hold>>>,
}

impl Holds {
    fn map(&self) -> MutexGuard<'_, HashMap<OwnerToken, Arc<Hold>>> {
        self.holds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn get(&self, owner: OwnerToken) -> Option<Arc<Hold>> {
        self.map().get(&owner).cloned()
    }

    fn remove(&self, owner: OwnerToken) -> Option<Arc<Hold>> {
        self.map().remove(&owner)
    }

    /// Removes the grant if its TTL still ends at `at` (no extend moved it).
    fn remove_if_due(&self, owner: OwnerToken, at: Instant) -> Option<Arc<Hold>> {
        let mut map = self.map();
        let due = map
            .get(&owner)
            .is_some_and(|hold| *hold.deadline.borrow() == at);
        if due {
            map.remove(&owner)
        } else {
            None
        }
    }

    /// Ends every grant (the client closes): their leases are revoked.
    pub(crate) async fn revoke_all(&self) {
        let all: Vec<Arc<Hold>> = self.map().drain().map(|(_, hold)| hold).collect();
        for hold in all {
            let _ = hold.session.revoke().await;
        }
    }
}

/// Ends a grant at its TTL's end unless `extend` moved it, by revoking its lease.
async fn end_at_deadline(holds: Weak<Holds>, owner: OwnerToken, mut at: watch::Receiver<Instant>) {
    loop {
        let due = *at.borrow_and_update();
        tokio::select! {
            () = tokio::time::sleep_until(due) => {
                let Some(holds) = holds.upgrade() else { return };
                if let Some(hold) = holds.remove_if_due(owner, due) {
                    let _ = hold.session.revoke().await;
                    return;
                }
            }
            changed = at.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

/// A primitive of one client, as a lock service of its own.
pub(crate) struct View {
    state: Arc<ClientState>,
    kind: Kind,
    capabilities: Capabilities,
}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdPrimitive")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl View {
    pub(crate) fn new(
        state: Arc<ClientState>,
        primitive: &Primitive,
        capabilities: Capabilities,
    ) -> Result<View> {
        Ok(View {
            state,
            kind: Kind::of(primitive)?,
            capabilities,
        })
    }

    fn requests(&self) -> &Requests {
        &self.state.requests
    }

    fn place(&self, key: &LockKey) -> Place {
        place(&self.state.settings.layout, &self.kind, key)
    }

    /// The value of this acquire's key: the candidate's value for an election (as Go and
    /// `etcdctl elect` write it), the owner record with the owner token otherwise.
    fn value(&self, req: &LockRequest<'_>) -> String {
        match &self.kind {
            Kind::Candidate { value } => value.clone(),
            _ => contender_value(self.state.settings.owner.record(), req.owner),
        }
    }

    /// A lease of its own for one acquire.
    async fn grant_lease(&self) -> Result<Arc<Session>> {
        if self.state.is_closed() {
            return Err(crate::error::closed());
        }
        let settings = &self.state.settings;
        Ok(Arc::new(
            Session::grant(
                self.requests(),
                settings.session_ttl,
                settings.request_timeout,
            )
            .await?,
        ))
    }

    /// Writes this acquire's key, and answers its create revision; for a semaphore, in the same
    /// transaction as the check of the agreed permits.
    async fn join(
        &self,
        key: &LockKey,
        place: &Place,
        mine: &[u8],
        value: &str,
        lease: i64,
    ) -> Result<i64> {
        let put = TxnOp::put(mine, value, Some(PutOptions::new().with_lease(lease)));
        let Kind::Semaphore { permits } = &self.kind else {
            let txn = Txn::new()
                .when([Compare::create_revision(mine, CompareOp::Equal, 0)])
                .and_then([put]);
            let response = self.requests().txn(txn).await?;
            if !response.succeeded() {
                return Err(Error::backend(BACKEND, true, "a fresh lease's key existed"));
            }
            return Ok(store_revision(&response));
        };
        let permits_text = permits.to_string();
        for _ in 0..JOIN_ATTEMPTS {
            let txn = Txn::new()
                .when([Compare::value(
                    place.name.clone(),
                    CompareOp::Equal,
                    permits_text.clone(),
                )])
                .and_then([put.clone()])
                .or_else([
                    TxnOp::get(place.name.clone(), None),
                    TxnOp::get(place.queue.clone(), Some(any_key())),
                ]);
            let response = self.requests().txn(txn).await?;
            if response.succeeded() {
                return Ok(store_revision(&response));
            }
            let agreed = kvs(&response, 0).into_iter().next();
            let in_use = !kvs(&response, 1).is_empty();
            let seen_mod = agreed.as_ref().map_or(0, KeyValue::mod_revision);
            if let (true, Some(agreed)) = (in_use, &agreed) {
                return Err(Error::mismatch(
                    key,
                    format!(
                        "the semaphore has {} permits; asked with {permits}",
                        String::from_utf8_lossy(agreed.value())
                    ),
                ));
            }
            // Nobody uses the name (or its permits were deleted): agree on ours.
            let mut when = vec![Compare::mod_revision(
                place.name.clone(),
                CompareOp::Equal,
                seen_mod,
            )];
            if !in_use {
                when.push(
                    Compare::create_revision(place.queue.clone(), CompareOp::Equal, 0)
                        .with_prefix(),
                );
            }
            let txn = Txn::new().when(when).and_then([
                TxnOp::put(place.name.clone(), permits_text.clone(), None),
                put.clone(),
            ]);
            let response = self.requests().txn(txn).await?;
            if response.succeeded() {
                return Ok(store_revision(&response));
            }
        }
        Err(Error::backend(
            BACKEND,
            true,
            "the semaphore's agreed permits kept changing",
        ))
    }

    /// Whether the key created at `revision` holds now: `None` if it is gone.
    async fn holds_now(&self, place: &Place, mine: &[u8], revision: i64) -> Result<Option<bool>> {
        let limit = match &self.kind {
            Kind::Semaphore { permits } => i64::from(*permits),
            _ => 1,
        };
        let before = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_max_create_revision(revision - 1)
            .with_limit(limit);
        let txn = Txn::new()
            .when([Compare::create_revision(mine, CompareOp::Equal, revision)])
            .and_then([TxnOp::get(place.blockers.clone(), Some(before))]);
        let response = self.requests().txn(txn).await?;
        if !response.succeeded() {
            return Ok(None);
        }
        let ahead = i64::try_from(kvs(&response, 0).len()).unwrap_or(i64::MAX);
        Ok(Some(ahead < limit))
    }

    /// Whether an attempt that never waits would find the name busy, read before a lease is
    /// granted for it (writers, readers and candidates; the transaction decides in the end).
    async fn looks_busy(&self, place: &Place) -> Result<bool> {
        if matches!(self.kind, Kind::Semaphore { .. }) {
            return Ok(false);
        }
        let response = self
            .requests()
            .txn(Txn::new().and_then([TxnOp::get(place.blockers.clone(), Some(any_key()))]))
            .await?;
        Ok(!kvs(&response, 0).is_empty())
    }

    /// Turns a key that holds into a grant the core can make a lease of.
    fn hold(
        &self,
        req: &LockRequest<'_>,
        session: Arc<Session>,
        key: Vec<u8>,
        revision: i64,
        sent: Instant,
    ) -> Grant {
        let (deadline, at) = watch::channel(sent + req.ttl);
        let watch = session.watch();
        let hold = Arc::new(Hold {
            session,
            key,
            revision,
            deadline,
        });
        self.state.holds.map().insert(req.owner, hold);
        tokio::spawn(end_at_deadline(
            Arc::downgrade(&self.state.holds),
            req.owner,
            at,
        ));
        Grant::new(FencingToken(revision.unsigned_abs()), sent).with_session(watch)
    }

    /// Revokes the lease of an acquire that ends without a grant, within dlock-core's
    /// withdrawal bound (dropping the session finishes it in the background past that).
    async fn withdraw(key: &LockKey, session: Arc<Session>) {
        dlock_core::withdraw(key, session.revoke()).await;
    }

    fn lost(key: &LockKey) -> Error {
        Error::Lost {
            key: key.to_string(),
            reason: LostReason::SessionEnded,
        }
    }

    /// The contenders of the name, oldest first.
    async fn contenders(&self, prefix: &[u8]) -> Result<Vec<KeyValue>> {
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let response = self
            .requests()
            .txn(Txn::new().and_then([TxnOp::get(prefix, Some(options))]))
            .await?;
        Ok(kvs(&response, 0))
    }
}

fn any_key() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_keys_only()
        .with_limit(1)
}

fn kvs(response: &TxnResponse, index: usize) -> Vec<KeyValue> {
    match response.op_responses().into_iter().nth(index) {
        Some(TxnOpResponse::Get(mut get)) => get.take_kvs(),
        _ => Vec::new(),
    }
}

fn store_revision(response: &TxnResponse) -> i64 {
    response.header().map_or(0, |h| h.revision())
}

fn is_writer(queue: &[u8], kv: &KeyValue) -> bool {
    kv.key()
        .strip_prefix(queue)
        .is_some_and(|rest| rest.starts_with(b"write/"))
}

fn holder(kv: &KeyValue) -> Holder {
    Holder::new()
        .with_fencing(FencingToken(kv.create_revision().unsigned_abs()))
        .with_owner(OwnerRecord::parse(kv.value()))
}

#[async_trait]
impl DistributedLock for View {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    /// One transaction that writes this acquire's key only if it would hold at once (a writer
    /// or candidate when nobody contends, a reader when no writer does); a semaphore's key is
    /// written with the check of the permits and withdrawn again if it does not hold.
    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        if self.kind == Kind::Observer {
            Primitive::observer().value()?;
        }
        let sent = Instant::now();
        let place = self.place(req.key);
        if self.looks_busy(&place).await? {
            return Ok(Attempt::Busy { retry_after: None });
        }
        let session = self.grant_lease().await?;
        let mine = contender_key(&place.mine, session.id());
        let value = self.value(req);
        let revision = if let Kind::Semaphore { .. } = self.kind {
            let joined = self
                .join(req.key, &place, &mine, &value, session.id())
                .await;
            let revision = match joined {
                Ok(revision) => revision,
                Err(error) => {
                    Self::withdraw(req.key, session).await;
                    return Err(error);
                }
            };
            if self.holds_now(&place, &mine, revision).await? != Some(true) {
                Self::withdraw(req.key, session).await;
                return Ok(Attempt::Busy { retry_after: None });
            }
            revision
        } else {
            let txn = Txn::new()
                .when([
                    Compare::create_revision(place.blockers.clone(), CompareOp::Equal, 0)
                        .with_prefix(),
                ])
                .and_then([TxnOp::put(
                    mine.clone(),
                    value,
                    Some(PutOptions::new().with_lease(session.id())),
                )]);
            let response = self.requests().txn(txn).await?;
            if !response.succeeded() {
                Self::withdraw(req.key, session).await;
                return Ok(Attempt::Busy { retry_after: None });
            }
            store_revision(&response)
        };
        Ok(Attempt::Acquired(
            self.hold(req, session, mine, revision, sent),
        ))
    }

    /// Re-arms the client's TTL of a grant whose key is still the one it was granted with.
    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        let sent = Instant::now();
        let Some(hold) = self.state.holds.get(lease.owner) else {
            return Ok(Extension::Expired);
        };
        if Instant::now() >= *hold.deadline.borrow() || !hold.session.is_usable() {
            return Ok(Extension::Expired);
        }
        let txn = Txn::new().when([
            Compare::create_revision(hold.key.clone(), CompareOp::Equal, hold.revision),
            Compare::lease(hold.key.clone(), CompareOp::Equal, hold.session.id()),
        ]);
        if !self.requests().txn(txn).await?.succeeded() {
            if let Some(gone) = self.state.holds.remove(lease.owner) {
                let _ = gone.session.revoke().await;
            }
            return Ok(Extension::Expired);
        }
        let now = Instant::now();
        let moved = hold.deadline.send_if_modified(|at| {
            if now < *at {
                *at = sent + ttl;
                true
            } else {
                false
            }
        });
        Ok(if moved {
            Extension::Extended
        } else {
            Extension::Expired
        })
    }

    /// Deletes the grant's key (comparing its create revision and lease) and revokes its lease.
    /// A release by owner token of an acquire that never completed finds nothing to do: its
    /// lease went with the acquire.
    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        let Some(hold) = self.state.holds.remove(lease.owner) else {
            return Ok(Released::Expired);
        };
        let txn = Txn::new()
            .when([
                Compare::create_revision(hold.key.clone(), CompareOp::Equal, hold.revision),
                Compare::lease(hold.key.clone(), CompareOp::Equal, hold.session.id()),
            ])
            .and_then([TxnOp::delete(hold.key.clone(), None)]);
        let deleted = self.requests().txn(txn).await;
        let _ = hold.session.revoke().await;
        Ok(if deleted?.succeeded() {
            Released::Released
        } else {
            Released::Expired
        })
    }

    /// Waits for the deletion of any key this view waits behind (a watch), or until `until`.
    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        let place = self.place(key);
        let armed = arm(self.requests(), vec![place.blockers.clone()], true).await?;
        let response = self
            .requests()
            .txn(Txn::new().and_then([TxnOp::get(place.blockers.clone(), Some(any_key()))]))
            .await?;
        if kvs(&response, 0).is_empty() {
            return Ok(());
        }
        armed.wait(None, Some(until)).await?;
        Ok(())
    }

    /// The holder (the oldest key) with its create revision as the token; for an election its
    /// value, for a semaphore and readers how many hold.
    async fn inspect(&self, key: &LockKey) -> Result<Holding> {
        let place = self.place(key);
        let contenders = self.contenders(&place.queue).await?;
        let Some(first) = contenders.first() else {
            return Ok(Holding::Free);
        };
        Ok(Holding::Held(match &self.kind {
            Kind::Candidate { .. } | Kind::Observer => Holder::new()
                .with_fencing(FencingToken(first.create_revision().unsigned_abs()))
                .with_value(Some(String::from_utf8_lossy(first.value()).into_owned())),
            Kind::Semaphore { .. } => {
                let response = self
                    .requests()
                    .txn(Txn::new().and_then([TxnOp::get(place.name.clone(), None)]))
                    .await?;
                let agreed = kvs(&response, 0)
                    .first()
                    .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse::<usize>().ok())
                    .unwrap_or(contenders.len());
                holder(first).with_holders(contenders.len().min(agreed))
            }
            Kind::Read | Kind::Write if is_writer(&place.queue, first) => holder(first),
            Kind::Read | Kind::Write => {
                let readers = contenders
                    .iter()
                    .take_while(|kv| !is_writer(&place.queue, kv))
                    .count();
                holder(first).with_holders(readers)
            }
        }))
    }

    /// Joins the queue and waits, watching the keys ahead for deletions, until this key holds.
    /// A wait that runs out revokes the acquire's lease before it returns (bounded), which
    /// deletes its key.
    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        if self.kind == Kind::Observer {
            Primitive::observer().value()?;
        }
        let waiting = Waiting::new(req.key, deadline, retry);
        let sent = Instant::now();
        let place = self.place(req.key);
        let session = self.grant_lease().await?;
        let mine = contender_key(&place.mine, session.id());
        let value = self.value(req);
        let waited: Result<i64> = async {
            let revision = self
                .join(req.key, &place, &mine, &value, session.id())
                .await?;
            loop {
                let armed = arm(self.requests(), vec![place.blockers.clone()], true).await?;
                match self.holds_now(&place, &mine, revision).await? {
                    Some(true) => break,
                    Some(false) => {}
                    None => return Err(Self::lost(req.key)),
                }
                match armed.wait(Some(session.watch()), deadline).await? {
                    Woken::Deleted => {}
                    Woken::SessionEnded => return Err(Self::lost(req.key)),
                    Woken::Deadline => return Err(waiting.timeout()),
                }
            }
            // etcd issue #11456: never report a grant whose lease ran out while it waited.
            session.wait_alive(req.key.as_str(), deadline).await?;
            Ok(revision)
        }
        .await;
        match waited {
            Ok(revision) => Ok(self.hold(req, session, mine, revision, sent)),
            Err(error) => {
                Self::withdraw(req.key, session).await;
                Err(error)
            }
        }
    }
}
