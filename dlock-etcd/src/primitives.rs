//! The semaphore, the read-write lock and the election, served as views of the lock trait.
//!
//! Every primitive is a queue of contender keys ordered by create revision, like the lock, and
//! like the lock's its keys are attached to the client's session lease (as Go's `concurrency`
//! package attaches them to a session): a grant costs no lease of its own, and losing the session
//! loses every grant. A candidate's key is `<queue>/<session lease hex>`, as `etcdctl elect`
//! names it, so the tasks of one client campaign on an election one at a time (a local turn, as
//! the lock's tasks take); a permit's or a read or write hold's key is
//! `<queue>/<lease hex>_<owner token hex>`, one per acquire, so one client can hold several
//! permits or read holds of one name. The transaction that writes the key reads what it waits
//! behind, so a grant that holds at once costs one request, and its release one more.
//!
//! An acquire that is dropped, times out or is answered busy deletes its key; a dropped one
//! whose write went unanswered deletes it once more after a grace period, in case the write was
//! still on its way (see `acquire_guard::Written`).
//!
//! Names (each family in a folder no lock name can reach, since an escaped lock key never
//! contains `%e`, `%s` or `%r`):
//!
//! * **Election** `<namespace>%election/<escaped key>`, the layout of Go's
//!   `concurrency.Election` and `etcdctl elect`: candidates `<name>/<lease hex>` whose value is
//!   the candidate's value; the leader is the key with the smallest create revision, whose create
//!   revision is the term; a candidate waits until no key created before its own is left.
//! * **Semaphore** `<namespace>%semaphore/<escaped key>`: contenders `<name>/<lease hex>_<token>`
//!   (value: the owner record); the first `permits` in create order hold. The key `<name>` itself keeps the
//!   permits the holders agreed on, compared in the transaction that joins, so a client that asks
//!   with another number while contenders exist is refused and writes nothing.
//! * **Read-write lock** `<namespace>%rw/<escaped key>`: readers `<name>/read/<lease hex>_<token>` and
//!   writers `<name>/write/<lease hex>_<token>` in one queue (the sub-folders of etcd's
//!   `contrib/recipes` read-write mutex). A reader holds when no writer key was created before
//!   its own, a writer when no key at all was. A waiting writer's key stands in the queue, so
//!   readers that come after it wait behind it: writers are not starved.
//!
//! The per-acquire TTL is kept by the client, as for the lock: at its end (re-armed by `extend`)
//! the client deletes the grant's key. A client that dies loses its grants when its session lease
//! runs out on the server, after the session TTL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{
    Attempt, Capabilities, Extension, Grant, LeaseRef, LockKey, LockRequest, Primitive,
    SessionState, Waiting,
};
use dlock_core::inspect::{Holder, Holding};
use dlock_core::{
    Backoff, DistributedLock, Error, FencingToken, LostReason, OwnerRecord, OwnerToken, Released,
    Result,
};
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::acquire_guard::Written;
use crate::client::{contender_value, ClientState};
use crate::contention::{delete_own, remove_leftover};
use crate::error::BACKEND;
use crate::layout::{contender_key, session_key, KeyLayout};
use crate::local_queue::{TryTurn, Turn};
use crate::requests::{RequestError, Requests};
use crate::session::Session;
use crate::waiting::{arm, Woken};
use crate::watchdog::delete_while_alive;

/// How often a semaphore's join is tried again when the agreed permits change under it.
const JOIN_ATTEMPTS: u32 = 5;

/// How many times a key of ours in the way (an abandoned campaign's) is cleared in one acquire.
const LEFTOVER_ATTEMPTS: u32 = 3;

/// The primitive a view serves, as the etcd layout needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Semaphore { permits: u32 },
    Read,
    Write,
    Candidate { value: Arc<str> },
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

/// One grant: its key and create revision on the client's session, and when the client ends it.
struct Hold {
    session: Arc<Session>,
    /// `<name>/`, where the grant's key is.
    queue: Vec<u8>,
    key: Vec<u8>,
    revision: i64,
    deadline: watch::Sender<Instant>,
    /// A candidate's local turn on its election, kept while it leads.
    _turn: Option<Turn>,
}

impl Hold {
    /// Deletes the grant's key if it is still the one granted (comparing its create revision and
    /// lease).
    async fn delete(&self, requests: &Requests) -> std::result::Result<bool, RequestError> {
        let owner = delete_own(
            requests,
            &self.queue,
            &self.key,
            self.revision,
            self.session.id(),
        )
        .await?;
        Ok(owner == crate::contention::Owner::Us)
    }
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

    /// Forgets every grant (the client closes; revoking its session deletes their keys).
    pub(crate) fn clear(&self) {
        let all: Vec<Arc<Hold>> = self.map().drain().map(|(_, hold)| hold).collect();
        drop(all);
    }
}

/// Ends a grant at its TTL's end unless `extend` moved it, by deleting its key; forgets it
/// when its session ends (the server deleted the key with the lease), which passes a
/// candidate's turn on.
async fn end_at_deadline(
    holds: Weak<Holds>,
    requests: Requests,
    owner: OwnerToken,
    mut at: watch::Receiver<Instant>,
    mut session: watch::Receiver<SessionState>,
) {
    loop {
        let due = *at.borrow_and_update();
        let ended = matches!(
            crate::session::current(&session.borrow_and_update(), Instant::now()),
            SessionState::Expired
        );
        if ended {
            if let Some(holds) = holds.upgrade() {
                holds.remove(owner);
            }
            return;
        }
        tokio::select! {
            () = tokio::time::sleep_until(due) => {
                let Some(holds) = holds.upgrade() else { return };
                if let Some(hold) = holds.remove_if_due(owner, due) {
                    drop(holds);
                    delete_while_alive(
                        &requests,
                        &hold.queue,
                        &hold.key,
                        hold.revision,
                        hold.session.id(),
                        &session,
                    )
                    .await;
                    return;
                }
            }
            changed = at.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            changed = session.changed() => {
                if changed.is_err() {
                    if let Some(holds) = holds.upgrade() {
                        holds.remove(owner);
                    }
                    return;
                }
            }
        }
    }
}

/// An acquire of a primitive in progress: what it may have written, withdrawn unless it ends
/// with a grant, and a candidate's turn on its election.
struct Joining {
    key: LockKey,
    written: Option<Written>,
    turn: Option<Turn>,
}

impl Joining {
    /// Deletes what the acquire wrote before an acquire that failed returns, within dlock-core's
    /// withdrawal bound; past it (or while a write may still be on its way) the drop finishes in
    /// the background.
    async fn withdraw(&mut self) {
        let Some(written) = &self.written else {
            return;
        };
        if dlock_core::backend::withdraw(&self.key, written.delete()).await && !written.in_flight()
        {
            self.written = None;
        }
    }

    /// The acquire ends with a grant: nothing to withdraw; the turn goes to the grant.
    fn granted(mut self) -> Option<Turn> {
        self.written = None;
        self.turn.take()
    }
}

impl Drop for Joining {
    fn drop(&mut self) {
        // The turn goes on at once; a background withdrawal of a candidate's key takes it
        // again around each deletion (see `Written`).
        drop(self.turn.take());
        if let (Some(written), Ok(runtime)) =
            (self.written.take(), tokio::runtime::Handle::try_current())
        {
            runtime.spawn(written.withdraw());
        }
    }
}

/// What the transaction that writes an acquire's key answered.
enum Joined {
    /// The key was created at `revision`; `holds` if nobody it waits behind was there.
    Entered { revision: i64, holds: bool },
    /// A key of ours from an abandoned campaign is in the way.
    Leftover { mod_revision: i64 },
    /// The semaphore's agreed permits differ from the caller's.
    Refused(Error),
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
            Kind::Candidate { value } => value.to_string(),
            _ => contender_value(self.state.settings.owner.record(), req.owner),
        }
    }

    /// This acquire's key: a candidate's is `<name>/<session lease hex>`, as Go names it (one
    /// campaign per client and election at a time); a permit's or a read or write hold's is
    /// `<lease hex>_<owner token hex>` in its folder, one key per acquire, so that one client
    /// may hold several permits or read holds of one name.
    fn key_for(&self, place: &Place, lease: i64, owner: OwnerToken) -> Vec<u8> {
        match self.kind {
            Kind::Candidate { .. } => session_key(&place.mine, lease),
            _ => contender_key(&place.mine, lease, owner),
        }
    }

    /// A candidate's turn on its election, among the tasks of this client (`None` for the other
    /// primitives, whose keys are one per acquire); `Err` when `deadline` passed first.
    async fn turn(
        &self,
        key: &LockKey,
        deadline: Option<Instant>,
    ) -> std::result::Result<Option<Turn>, ()> {
        if !matches!(self.kind, Kind::Candidate { .. }) {
            return Ok(None);
        }
        match self.state.campaigns.owned_turn(key, deadline).await {
            Some(turn) => Ok(Some(turn)),
            None => Err(()),
        }
    }

    /// The read, in the transaction that writes our key, of the keys it waits behind: the
    /// oldest `permits` contenders for a semaphore, any writer for a reader, the oldest
    /// contender otherwise.
    fn first_blockers(&self, place: &Place) -> TxnOp {
        let options = GetOptions::new().with_prefix().with_keys_only();
        let options = match &self.kind {
            Kind::Read => options.with_limit(1),
            Kind::Semaphore { permits } => options
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(i64::from(*permits)),
            _ => options
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1),
        };
        TxnOp::get(place.blockers.clone(), Some(options))
    }

    /// Whether our key `mine` holds, given what [`first_blockers`](Self::first_blockers) read
    /// in the transaction that created it.
    fn holds_among(&self, blockers: &[KeyValue], mine: &[u8]) -> bool {
        match &self.kind {
            // Every writer key there is older than ours.
            Kind::Read => blockers.is_empty(),
            _ => blockers.iter().any(|kv| kv.key() == mine),
        }
    }

    /// Writes this acquire's key if it does not exist, and reads in the same transaction what it
    /// waits behind; for a semaphore, with the check of the agreed permits.
    async fn join(
        &self,
        key: &LockKey,
        place: &Place,
        mine: &[u8],
        value: &str,
        lease: i64,
    ) -> std::result::Result<Joined, RequestError> {
        let put = TxnOp::put(mine, value, Some(PutOptions::new().with_lease(lease)));
        let absent = Compare::create_revision(mine, CompareOp::Equal, 0);
        let entered = |response: &TxnResponse, at: usize| Joined::Entered {
            revision: store_revision(response),
            holds: self.holds_among(&kvs(response, at), mine),
        };
        let leftover = |kv: &KeyValue| Joined::Leftover {
            mod_revision: kv.mod_revision(),
        };
        let Kind::Semaphore { permits } = &self.kind else {
            let txn = Txn::new()
                .when([absent])
                .and_then([put, self.first_blockers(place)])
                .or_else([TxnOp::get(mine, None)]);
            let response = self.requests().txn(txn).await?;
            if response.succeeded() {
                return Ok(entered(&response, 1));
            }
            return Ok(kvs(&response, 0)
                .first()
                .map_or(Joined::Leftover { mod_revision: 0 }, leftover));
        };
        let permits_text = permits.to_string();
        for _ in 0..JOIN_ATTEMPTS {
            let txn = Txn::new()
                .when([
                    Compare::value(place.name.clone(), CompareOp::Equal, permits_text.clone()),
                    absent.clone(),
                ])
                .and_then([put.clone(), self.first_blockers(place)])
                .or_else([
                    TxnOp::get(place.name.clone(), None),
                    TxnOp::get(place.queue.clone(), Some(any_key())),
                    TxnOp::get(mine, None),
                ]);
            let response = self.requests().txn(txn).await?;
            if response.succeeded() {
                return Ok(entered(&response, 1));
            }
            if let Some(kv) = kvs(&response, 2).first() {
                return Ok(leftover(kv));
            }
            let agreed = kvs(&response, 0).into_iter().next();
            let in_use = !kvs(&response, 1).is_empty();
            let seen_mod = agreed.as_ref().map_or(0, KeyValue::mod_revision);
            if let (true, Some(agreed)) = (in_use, &agreed) {
                return Ok(Joined::Refused(Error::mismatch(
                    key,
                    format!(
                        "the semaphore has {} permits; asked with {permits}",
                        String::from_utf8_lossy(agreed.value())
                    ),
                )));
            }
            // Nobody uses the name (or its permits were deleted): agree on ours.
            let mut when = vec![
                Compare::mod_revision(place.name.clone(), CompareOp::Equal, seen_mod),
                absent.clone(),
            ];
            if !in_use {
                when.push(
                    Compare::create_revision(place.queue.clone(), CompareOp::Equal, 0)
                        .with_prefix(),
                );
            }
            let txn = Txn::new().when(when).and_then([
                TxnOp::put(place.name.clone(), permits_text.clone(), None),
                put.clone(),
                self.first_blockers(place),
            ]);
            let response = self.requests().txn(txn).await?;
            if response.succeeded() {
                return Ok(entered(&response, 2));
            }
        }
        Ok(Joined::Refused(Error::backend(
            BACKEND,
            true,
            "the semaphore's agreed permits kept changing",
        )))
    }

    /// Writes this acquire's key on the client's session (a fresh one if the server no longer
    /// has it), clearing a key of ours an abandoned campaign left in the way: the key entered,
    /// and whether it holds at once.
    async fn enter(
        &self,
        joining: &mut Joining,
        req: &LockRequest<'_>,
        place: Place,
        sent: Instant,
    ) -> Result<(Entered, bool)> {
        let value = self.value(req);
        let mut fresh_session = false;
        let mut leftovers = 0;
        loop {
            let session = self.state.session().await?;
            let mine = self.key_for(&place, session.id(), req.owner);
            let shared = matches!(self.kind, Kind::Candidate { .. })
                .then(|| (self.state.campaigns.clone(), req.key.clone()));
            joining.written = Some(Written::own_key(
                self.requests(),
                &place.queue,
                &mine,
                session.id(),
                shared,
            ));
            match self
                .join(req.key, &place, &mine, &value, session.id())
                .await
            {
                Ok(Joined::Entered { revision, holds }) => {
                    if let Some(written) = &mut joining.written {
                        written.created(revision);
                    }
                    let entered = Entered {
                        session,
                        place,
                        key: mine,
                        revision,
                        sent,
                    };
                    return Ok((entered, holds));
                }
                Ok(Joined::Leftover { mod_revision }) if leftovers < LEFTOVER_ATTEMPTS => {
                    joining.written = None;
                    leftovers += 1;
                    remove_leftover(self.requests(), &mine, mod_revision).await?;
                }
                Ok(Joined::Leftover { .. }) => {
                    joining.written = None;
                    return Err(Error::backend(
                        BACKEND,
                        true,
                        "a key of this client kept standing in the way",
                    ));
                }
                Ok(Joined::Refused(error)) => {
                    joining.written = None;
                    return Err(error);
                }
                Err(error) if error.is_lease_not_found() && !fresh_session => {
                    joining.written = None;
                    session.mark_expired();
                    fresh_session = true;
                }
                Err(error) => return Err(error.into()),
            }
        }
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

    /// Turns a key that holds into a grant the core can make a lease of.
    fn hold(&self, req: &LockRequest<'_>, joining: Joining, entered: Entered) -> Grant {
        let Entered {
            session,
            place,
            key,
            revision,
            sent,
        } = entered;
        let (deadline, at) = watch::channel(sent + req.ttl);
        let watch = session.watch();
        let hold = Arc::new(Hold {
            session,
            queue: place.queue,
            key,
            revision,
            deadline,
            _turn: joining.granted(),
        });
        self.state.holds.map().insert(req.owner, hold);
        tokio::spawn(end_at_deadline(
            Arc::downgrade(&self.state.holds),
            self.requests().clone(),
            req.owner,
            at,
            watch.clone(),
        ));
        Grant::new(FencingToken(revision.unsigned_abs()), sent).with_session(watch)
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

/// A key that holds, on its way to becoming a grant.
struct Entered {
    session: Arc<Session>,
    place: Place,
    key: Vec<u8>,
    revision: i64,
    /// When the acquire began: the grant's TTL counts from then.
    sent: Instant,
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

    /// One transaction that writes this acquire's key and reads what it waits behind; a key
    /// that does not hold at once is deleted again before the busy answer (in the background
    /// past dlock-core's withdrawal bound). A candidate whose client campaigns already on the
    /// name is answered busy without a request; one that finds only the background withdrawal
    /// of an abandoned campaign's key waits for that deletion first.
    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        if self.kind == Kind::Observer {
            Primitive::observer().value()?;
        }
        let sent = Instant::now();
        let turn = match self.kind {
            Kind::Candidate { .. } => match self.state.campaigns.try_turn_or_withdrawal(req.key) {
                TryTurn::Taken(turn) => Some(turn),
                TryTurn::Busy => return Ok(Attempt::Busy { retry_after: None }),
                // The background withdrawal of an abandoned campaign's key holds the turn for
                // one deletion request: wait for it rather than answer busy for a free
                // election. Only a live local campaign that queued first outlasts the wait.
                TryTurn::Withdrawing => {
                    let until = Instant::now() + self.requests().timeout() * 2;
                    match self.state.campaigns.owned_turn(req.key, Some(until)).await {
                        Some(turn) => Some(turn),
                        None => return Ok(Attempt::Busy { retry_after: None }),
                    }
                }
            },
            _ => None,
        };
        let mut joining = Joining {
            key: req.key.clone(),
            written: None,
            turn,
        };
        let place = self.place(req.key);
        match self.enter(&mut joining, req, place, sent).await {
            Ok((entered, true)) => Ok(Attempt::Acquired(self.hold(req, joining, entered))),
            Ok((_, false)) => {
                joining.withdraw().await;
                Ok(Attempt::Busy { retry_after: None })
            }
            Err(error) => {
                joining.withdraw().await;
                Err(error)
            }
        }
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
            self.state.holds.remove(lease.owner);
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

    /// Deletes the grant's key, comparing its create revision and lease. A release by owner
    /// token of an acquire that never completed finds nothing to do: the acquire withdraws its
    /// own key.
    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        let Some(hold) = self.state.holds.remove(lease.owner) else {
            return Ok(Released::Expired);
        };
        Ok(if hold.delete(self.requests()).await? {
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
    /// A wait that runs out deletes the acquire's key before it returns (bounded).
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
        let Ok(turn) = self.turn(req.key, deadline).await else {
            return Err(waiting.timeout());
        };
        let mut joining = Joining {
            key: req.key.clone(),
            written: None,
            turn,
        };
        let place = self.place(req.key);
        let waited: Result<Entered> = async {
            let (entered, mut holds) = self.enter(&mut joining, req, place, sent).await?;
            let (place, mine) = (&entered.place, &entered.key);
            while !holds {
                let armed = arm(self.requests(), vec![place.blockers.clone()], true).await?;
                match self.holds_now(place, mine, entered.revision).await? {
                    Some(true) => holds = true,
                    Some(false) => {
                        match armed.wait(Some(entered.session.watch()), deadline).await? {
                            Woken::Deleted => {}
                            Woken::SessionEnded => return Err(Self::lost(req.key)),
                            Woken::Deadline => return Err(waiting.timeout()),
                        }
                    }
                    None => return Err(Self::lost(req.key)),
                }
            }
            // etcd issue #11456: never report a grant whose lease ran out while it waited.
            entered
                .session
                .wait_alive(req.key.as_str(), deadline)
                .await?;
            Ok(entered)
        }
        .await;
        match waited {
            Ok(entered) => Ok(self.hold(req, joining, entered)),
            Err(error) => {
                joining.withdraw().await;
                Err(error)
            }
        }
    }
}
