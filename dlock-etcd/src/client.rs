//! The etcd lock client, [`EtcdLock`], and its implementation of the lock contract (on the
//! state its clones share, to which the client forwards every call; tracing is a layer,
//! [`Traced`](dlock_core::layer::Traced), that an application adds).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{
    Attempt, Capabilities, Extension, Grant, LeaseRef, LockKey, LockRequest, Primitive, Primitives,
    SessionState, Waiting,
};
use dlock_core::inspect::{Eviction, HeldLock, Holding};
use dlock_core::layer::Layer;
use dlock_core::{
    Backoff, DistributedLock, Error, FencingToken, LostReason, OwnerRecord, OwnerToken, Released,
    Result,
};
use etcd_client::ConnectOptions;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::acquire_guard::AcquireGuard;
use crate::builder::{EtcdLockBuilder, Settings};
use crate::contention::{
    ahead, anyone, confirm_own, delete_abandoned, delete_mine, delete_on_lease, join, occupied,
    queue, remove_leftover, take_if_free, Ahead, Contender, Join, Owner, Read, Take,
};
use crate::endpoints::Endpoints;
use crate::error::{closed, says_no_leader, BACKEND};
use crate::inspect::{self, holder_of};
use crate::keywatch::KeyWatch;
use crate::layout::{contender_key, lease_hex, KeyLayout};
use crate::local_queue::{Held, LocalExpiry, LocalQueue};
use crate::primitives::{Holds, View};
use crate::requests::{RequestError, Requests};
use crate::session::{Session, SessionSlot};
use crate::waiting::{arm, WaitError, Woken};
use crate::watchdog::{merge, Started, Watchdog, WATCH_AFTER};

/// HTTP/2 keep-alive pings on connections with open streams. etcd refuses pings more frequent
/// than every 5 s (`--grpc-keepalive-min-time`) by closing the connection, so stay above that.
const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(10);

/// How long a connect waits before asking again while the cluster has no leader: an election
/// takes about a second with etcd's default timings.
const NO_LEADER_PAUSE: Duration = Duration::from_millis(200);

/// How many times an abandoned key of our own may be cleared out of the way in one attempt.
const LEFTOVER_ATTEMPTS: u32 = 3;

/// A distributed lock service on etcd.
///
/// One value is one etcd client with one session lease, shared by every lock it takes; clone it
/// (cheaply) to share it between tasks, or hold it as `Arc<dyn DistributedLock>`. See the crate
/// documentation for the protocol and what each guarantee rests on.
#[derive(Clone)]
pub struct EtcdLock {
    state: Arc<ClientState>,
}

/// What every clone of one [`EtcdLock`] shares: its connections, settings, session and the
/// locks it holds or waits for.
pub(crate) struct ClientState {
    pub(crate) requests: Requests,
    pub(crate) settings: Settings,
    sessions: SessionSlot,
    local_queue: Arc<LocalQueue>,
    keys: Arc<KeyWatch>,
    closed: AtomicBool,
    /// The grants of the primitives (semaphore, read-write lock, election).
    pub(crate) holds: Arc<Holds>,
    /// The candidates' turns, election by election: a candidate's key is named after the
    /// session, so one task of this client campaigns on an election at a time.
    pub(crate) campaigns: Arc<LocalQueue>,
}

impl fmt::Debug for EtcdLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.state;
        f.debug_struct("EtcdLock")
            .field("endpoints", &s.settings.endpoints)
            .field("prefix", &s.settings.layout.namespace())
            .field("tls", &s.settings.tls)
            .field(
                "user",
                &s.settings.credentials.as_ref().map(|(user, _)| user),
            )
            .field("session", &s.sessions.current_id().map(lease_hex))
            .field("keys", &s.local_queue.len())
            .field("closed", &s.closed.load(Ordering::Relaxed))
            .finish()
    }
}

/// Every lock call goes to the shared state.
impl Layer for EtcdLock {
    fn inner(&self) -> &dyn DistributedLock {
        &self.state
    }

    /// The semaphore, the read-write lock and the election: views on the same client (see the
    /// crate documentation for their layout).
    fn primitive(&self, primitive: &Primitive) -> Result<Arc<dyn DistributedLock>> {
        primitive.validate()?;
        let capabilities = self.state.capabilities();
        capabilities.primitives.require(BACKEND, primitive)?;
        Ok(Arc::new(View::new(
            self.state.clone(),
            primitive,
            capabilities,
        )?))
    }
}

/// The handle's `Debug` shows the state; this one only names it.
impl fmt::Debug for ClientState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientState").finish_non_exhaustive()
    }
}

/// Why one pass of a waiting acquire did not end with the lock.
enum ContendError {
    /// Give up with this error.
    Fatal(Error),
    /// The caller's deadline passed.
    Deadline,
    /// A temporary failure: try again after a pause, while a session still bounds the wait.
    Temporary(Error),
    /// Try again at once (the session was replaced, or our own leftover key was removed).
    Restart,
}

/// Where a waiting acquire stands once the lock is its own.
struct Granted {
    session: Arc<Session>,
    contender: Vec<u8>,
    revision: i64,
    sent: Instant,
}

fn released(owner: Owner) -> Released {
    match owner {
        Owner::Us => Released::Released,
        Owner::Other => Released::TakenOver,
        Owner::Nobody => Released::Expired,
    }
}

fn session_ended(key: &LockKey) -> Error {
    Error::Lost {
        key: key.to_string(),
        reason: LostReason::SessionEnded,
    }
}

/// The lock's expiry for a TTL starting at `sent`.
///
/// The key is deleted at `sent + ttl` by this client; the lease is valid until `sent + ttl` minus
/// the caller's drift allowance, which dlock-core keeps beside the session's bound. (The
/// per-acquire TTL is enforced on this client's own clock, so no drift between clocks applies to
/// it; the session's part is bounded separately.)
fn expiry(sent: Instant, ttl: Duration) -> LocalExpiry {
    LocalExpiry {
        delete_at: sent + ttl,
    }
}

/// The value of one acquire's contender key: its owner record, with the acquire's owner token
/// as `token` (readers of the record ignore the field).
///
/// The token, random for every acquire, makes the value the acquire's own: a retry finds its
/// key by it, a key an abandoned acquire of this client left under the same name is told apart
/// and not adopted (see `contention::remove_leftover`), and the abandoned acquire's withdrawal
/// (a delete if the value is its own) stays off the new key.
pub(crate) fn contender_value(record: OwnerRecord, owner: OwnerToken) -> String {
    #[derive(serde::Serialize)]
    struct Value {
        #[serde(flatten)]
        record: OwnerRecord,
        token: String,
    }
    let token = owner.to_hex();
    // A record of strings, an integer and a time always serializes; the token alone would still
    // be a value of the acquire's own.
    serde_json::to_string(&Value {
        record,
        token: token.clone(),
    })
    .unwrap_or(token)
}

/// Whether a transport error is a connection the server closed as the request went out (not one
/// refused or unanswered).
fn closed_at_once(error: &str) -> bool {
    [
        "BrokenPipe",
        "broken pipe",
        "ConnectionReset",
        "connection reset",
        "connection closed",
    ]
    .iter()
    .any(|word| error.contains(word))
}

/// Explains a connection that the server closed at once, which the transport reports in its own
/// words ("broken pipe", "connection closed"): a plaintext client talking to a TLS port, or a
/// TLS client without the client certificate the server requires. (With TLS 1.3 the server
/// checks the client's certificate after the client has sent its first request, so its refusal
/// may arrive as a closed connection rather than as a certificate alert.)
fn explain_closed(error: Error, settings: &Settings) -> Error {
    let hint = match &settings.tls {
        None => {
            "a server that requires TLS closes plaintext connections like this: set its CA \
             with with_tls, or use etcd+https://…?ca=PATH"
        }
        Some(tls) if !tls.has_client_cert() => {
            "TLS: a server that requires a client certificate closes connections without one \
             like this: set it with with_tls(TlsFiles::new(ca).with_client_cert(..)), or cert=PATH&key=PATH"
        }
        Some(_) => return error,
    };
    match error {
        Error::Unavailable {
            reached,
            needed,
            source: Some(source),
        } if closed_at_once(&source.to_string()) => Error::Unavailable {
            reached,
            needed,
            source: Some(format!("{source} ({hint})").into()),
        },
        other => other,
    }
}

impl EtcdLock {
    /// What an etcd client declares about itself ([`DistributedLock::capabilities`]): tokens
    /// (creation revisions) that only grow, waiters woken by watches in arrival order, leases in
    /// the client's session, every primitive.
    pub const CAPABILITIES: Capabilities =
        Capabilities::session_queue().with_primitives(Primitives::ALL);

    /// A builder for the endpoints, namespace, session TTL, timeouts and credentials.
    pub fn builder() -> EtcdLockBuilder {
        EtcdLockBuilder::new()
    }

    /// Connects with a connection string,
    /// `etcd://[user[:password]@]host:port[,host:port…][/namespace][?session_timeout=10s&…]`, or
    /// `etcd+https://…?ca=PATH…` over TLS (see [`EtcdLockBuilder::from_url`]).
    ///
    /// # Cancel safety
    /// If cancelled after the session lease was granted, the lease expires after its TTL.
    pub async fn connect(url: &str) -> Result<EtcdLock> {
        EtcdLockBuilder::from_url(url)?.connect().await
    }

    pub(crate) async fn from_settings(settings: Settings) -> Result<EtcdLock> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(settings.connect_timeout)
            .with_keep_alive(HTTP2_PING_INTERVAL, settings.request_timeout)
            .with_keep_alive_while_idle(false)
            .with_require_leader(true);
        if let Some((user, password)) = &settings.credentials {
            // etcd's auth tokens expire (`--auth-token-ttl`, 5 minutes by default, counted from
            // their last use); etcd-client then authenticates again and repeats the request.
            // Watches need more: see `waiting` and `keywatch`.
            options = options
                .with_user(user.clone(), password.expose())
                .with_auto_token_refresh(true);
        }
        if let Some(tls) = &settings.tls {
            options = options.with_tls(tls.options.clone());
        }
        let endpoints = Endpoints::new(
            settings.endpoints.clone(),
            options,
            settings.request_timeout,
        );
        let requests = Requests::new(endpoints);
        if settings.endpoints.len() > 1 {
            let _ =
                tokio::time::timeout(settings.connect_timeout, requests.endpoints().pin_leader())
                    .await;
        }
        let state = ClientState {
            keys: Arc::new(KeyWatch::start(requests.clone())),
            requests,
            sessions: SessionSlot::default(),
            local_queue: Arc::new(LocalQueue::default()),
            closed: AtomicBool::new(false),
            holds: Arc::default(),
            campaigns: Arc::default(),
            settings,
        };
        // Granting the session proves that a member answers, within the connect timeout. While
        // the members answer that they have no leader, an election is under way: the grant is
        // tried again until it ends or the connect timeout runs out.
        let give_up = Instant::now() + state.settings.connect_timeout;
        loop {
            let budget = give_up.saturating_duration_since(Instant::now());
            let granted = state
                .sessions
                .get_or_grant(&state.requests, state.settings.session_ttl, budget)
                .await;
            match granted {
                Ok(_) => break,
                Err(error)
                    if says_no_leader(&error) && Instant::now() + NO_LEADER_PAUSE < give_up =>
                {
                    tracing::debug!(%error, "etcd: connecting while the cluster has no leader");
                    tokio::time::sleep(NO_LEADER_PAUSE).await;
                }
                Err(error) => return Err(explain_closed(error, &state.settings)),
            }
        }
        Ok(EtcdLock {
            state: Arc::new(state),
        })
    }

    /// The key layout: where each lock lives in etcd.
    pub fn layout(&self) -> &KeyLayout {
        &self.state.settings.layout
    }

    /// The lock name of `key` for etcd's Go `concurrency.NewMutex` and `etcdctl lock`: a Go
    /// service locking this name excludes, and is excluded by, dlock clients locking `key`.
    pub fn lock_name(&self, key: &str) -> Result<String> {
        Ok(self.layout().lock_name(&LockKey::new(key)?))
    }

    /// The election name of `key` for etcd's Go `concurrency.NewElection` and `etcdctl elect`:
    /// Go candidates and observers of this name share the election with dlock's candidates and
    /// observers of `key` (see [`KeyLayout::family_name`]).
    pub fn election_name(&self, key: &str) -> Result<String> {
        Ok(self.layout().family_name("election", &LockKey::new(key)?))
    }

    /// The endpoint of the member this client currently talks to. Everything — requests, the
    /// session's keep-alives, watches — goes to one member at a time, and moves to the next
    /// endpoint when that member fails.
    pub fn endpoint_in_use(&self) -> &str {
        self.state.requests.endpoints().pinned_endpoint()
    }

    /// The id of the client's current session lease, if it has one.
    pub fn session_lease(&self) -> Option<i64> {
        self.state.sessions.current_id()
    }

    /// What the client knows about its current session lease (`Expired` if it has none).
    pub fn session_state(&self) -> SessionState {
        self.state
            .sessions
            .usable()
            .map_or(SessionState::Expired, |s| s.state())
    }

    /// The TTL the server granted the current session lease.
    pub fn session_ttl(&self) -> Option<Duration> {
        self.state.sessions.usable().map(|s| s.ttl())
    }

    /// Closes the client: every lease it holds becomes lost at once, then the session lease is
    /// revoked, which deletes all its keys on the server, so waiters elsewhere proceed without
    /// waiting for a TTL. Later operations fail.
    ///
    /// # Cancel safety
    /// If cancelled, the leases are lost already and the revocation may not have been sent; the
    /// session lease then expires after its TTL.
    pub async fn close(&self) -> Result<()> {
        let state = &self.state;
        state.closed.store(true, Ordering::SeqCst);
        drop(state.local_queue.clear());
        state.holds.clear();
        match state.sessions.take() {
            Some(session) => session.revoke().await,
            None => Ok(()),
        }
    }
}

impl ClientState {
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// The value of the contender key of the acquire `req` (see [`contender_value`]).
    fn owner_value(&self, req: &LockRequest<'_>) -> String {
        contender_value(self.settings.owner.record(), req.owner)
    }

    /// The session new keys are attached to (a new one if the last has expired).
    pub(crate) async fn session(&self) -> Result<Arc<Session>> {
        if self.is_closed() {
            return Err(closed());
        }
        self.sessions
            .get_or_grant(
                &self.requests,
                self.settings.session_ttl,
                self.settings.request_timeout,
            )
            .await
    }

    /// Turns a granted contest into a held lock and its grant.
    fn hold(
        &self,
        acquiring: AcquireGuard,
        req: &LockRequest<'_>,
        granted: Granted,
        prefix: Vec<u8>,
    ) -> Result<Grant> {
        let expiry = expiry(granted.sent, req.ttl);
        let session_now = *granted.session.watch().borrow();
        let initial = merge(session_now, expiry, Instant::now());
        if matches!(initial, SessionState::Expired) {
            // Dropping the turn withdraws the key.
            return Err(session_ended(req.key));
        }
        let Some(guard) = acquiring.into_guard() else {
            return Err(Error::backend(
                BACKEND,
                false,
                "the key's local acquiring was lost",
            ));
        };
        let (term_tx, term_rx) = watch::channel(expiry);
        let (view, view_rx) = watch::channel(initial);
        let watchdog = Watchdog {
            local_queue: Arc::downgrade(&self.local_queue),
            requests: self.requests.clone(),
            key: req.key.clone(),
            prefix,
            contender: granted.contender.clone(),
            revision: granted.revision,
            lease: granted.session.id(),
            session: granted.session.watch(),
            expiry: term_rx,
            view,
            keys: Arc::downgrade(&self.keys),
            subscription: None,
            watch_at: Some(Instant::now() + WATCH_AFTER),
        };
        let session = granted.session.clone();
        self.local_queue.insert(
            req.key,
            Held {
                owner: req.owner,
                revision: granted.revision,
                contender: granted.contender,
                session: granted.session,
                expiry: term_tx,
                expiring: false,
                watchdog: Started::No,
                _turn: guard,
            },
        );
        // Registered only once the record exists, so that it always finds it when it starts.
        let revision = granted.revision;
        let id = session.watchdogs.add(watchdog);
        self.local_queue.with_held(req.key, |held| {
            if held.revision == revision && matches!(held.watchdog, Started::No) {
                held.watchdog = Started::Deferred(Arc::downgrade(&session.watchdogs), id);
            }
        });
        Ok(Grant::new(FencingToken(revision.unsigned_abs()), granted.sent).with_session(view_rx))
    }

    /// Classifies a failed request of a waiting acquire.
    fn classify(error: RequestError, session: &Session) -> ContendError {
        if error.is_lease_not_found() {
            session.mark_expired();
            return ContendError::Restart;
        }
        let error = Error::from(error);
        if error.is_temporary() {
            ContendError::Temporary(error)
        } else {
            ContendError::Fatal(error)
        }
    }

    /// One pass of a waiting acquire: join the queue (or find our key in it), then wait for the
    /// contenders ahead to go, one at a time.
    async fn contend(
        &self,
        acquiring: &mut AcquireGuard,
        req: &LockRequest<'_>,
        prefix: &[u8],
        value: &str,
        deadline: Option<Instant>,
    ) -> Result<Granted, ContendError> {
        // A session that cannot be granted ends the acquire: no session bounds the wait.
        let session = self.session().await.map_err(ContendError::Fatal)?;
        let key = contender_key(prefix, session.id(), req.owner);
        let c = Contender {
            prefix,
            key: &key,
            value,
            lease: session.id(),
        };
        acquiring.may_write(&self.requests, prefix, &key, value);
        let mut sent = Instant::now();
        let (revision, mut first, mut joined_behind) = match join(&self.requests, &c).await {
            Ok(Join::Head { revision }) => (revision, true, None),
            Ok(Join::Queued { revision, ahead }) => (revision, false, ahead),
            Ok(Join::Leftover {
                key: leftover,
                mod_revision,
            }) => {
                remove_leftover(&self.requests, &leftover, mod_revision)
                    .await
                    .map_err(|e| Self::classify(e, &session))?;
                return Err(ContendError::Restart);
            }
            Err(error) => return Err(Self::classify(error, &session)),
        };
        loop {
            if first {
                // etcd issue #11456: never report a lock held whose session has run out while
                // it waited. Our key existed at the last read; the session must still be alive.
                session
                    .wait_alive(req.key.as_str(), deadline)
                    .await
                    .map_err(|e| match e {
                        Error::Timeout { .. } => ContendError::Deadline,
                        other => ContendError::Fatal(other),
                    })?;
                return Ok(Granted {
                    session,
                    contender: key,
                    revision,
                    sent,
                });
            }
            let read = match joined_behind.take() {
                // The join read the contender ahead at its own revision.
                Some(ahead) => Ok(ahead),
                None => {
                    sent = Instant::now();
                    self.ahead(&c, revision).await
                }
            };
            let (predecessor, seen_at) = match read {
                Ok(Ahead::Nobody) => {
                    first = true;
                    continue;
                }
                Ok(Ahead::Gone) => {
                    // Our key went while we waited: its lease ended (or someone deleted it).
                    return Err(ContendError::Fatal(session_ended(req.key)));
                }
                Ok(Ahead::Predecessor { key, seen_at }) => (key, seen_at),
                Err(error) => return Err(Self::classify(error, &session)),
            };
            let armed = match arm(
                &self.requests,
                vec![predecessor.clone(), key.clone()],
                false,
            )
            .await
            {
                Ok(armed) => armed,
                Err(WaitError::Request(error)) => return Err(Self::classify(error, &session)),
                Err(WaitError::Broken(error)) => return Err(ContendError::Temporary(error)),
            };
            if armed.at > seen_at {
                // The store moved on between the read and the watch: whatever happened in
                // between is not in the watch, so look again before relying on it.
                match self.ahead(&c, revision).await {
                    Ok(Ahead::Predecessor { key: again, .. }) if again == predecessor => {}
                    Ok(Ahead::Gone) => return Err(ContendError::Fatal(session_ended(req.key))),
                    Ok(Ahead::Nobody) => {
                        // The predecessor went in between: this read is the one to go by.
                        first = true;
                        continue;
                    }
                    Ok(Ahead::Predecessor { .. }) => continue,
                    Err(error) => return Err(Self::classify(error, &session)),
                }
            }
            match armed.wait(Some(session.watch()), deadline).await {
                Ok(Woken::Deleted) => {}
                Ok(Woken::SessionEnded) => return Err(ContendError::Fatal(session_ended(req.key))),
                Ok(Woken::Deadline) => return Err(ContendError::Deadline),
                Err(WaitError::Request(error)) => return Err(Self::classify(error, &session)),
                Err(WaitError::Broken(error)) => return Err(ContendError::Temporary(error)),
            }
        }
    }

    /// Who is ahead of our key, read from the member; a "gone" answer, which a member that lags
    /// behind can give wrongly, is confirmed with a linearizable read.
    async fn ahead(&self, c: &Contender<'_>, revision: i64) -> Result<Ahead, RequestError> {
        match ahead(&self.requests, c, revision, Read::Local).await? {
            Ahead::Gone => ahead(&self.requests, c, revision, Read::Fresh).await,
            answer => Ok(answer),
        }
    }

    /// The held lock of `lease`, if this client holds it for that owner (and token).
    fn held_by(&self, lease: &LeaseRef<'_>) -> Option<HeldView> {
        self.local_queue
            .with_held(lease.key, |held| {
                let token_matches = lease
                    .fencing
                    .is_none_or(|f| f.get() == held.revision.unsigned_abs());
                (held.owner == lease.owner && token_matches).then(|| HeldView {
                    contender: held.contender.clone(),
                    revision: held.revision,
                    session: held.session.clone(),
                    over: held.expiring || Instant::now() >= held.expiry.borrow().delete_at,
                })
            })
            .flatten()
    }
}

/// What release and extend need from a held lock's record.
struct HeldView {
    contender: Vec<u8>,
    revision: i64,
    session: Arc<Session>,
    /// The TTL ran out: the watchdog deletes the key.
    over: bool,
}

#[async_trait]
impl DistributedLock for ClientState {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    /// Fencing tokens are create revisions of a consensus store: they only grow. Waiters are
    /// woken by watches; leases follow the client's session lease.
    fn capabilities(&self) -> Capabilities {
        EtcdLock::CAPABILITIES
    }

    /// # Cancel safety
    /// Not cancel safe on its own: if dropped after the request was sent, the key is withdrawn in
    /// the background, and a release by owner token (which the core issues) finds it too.
    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        let sent = Instant::now();
        // A background withdrawal of a failed attempt's key holds the turn for one deletion:
        // worth waiting for. Only a live local holder or acquire makes the lock busy.
        let withdrawn_by = sent + self.requests.timeout() * 2;
        let Some(guard) = self
            .local_queue
            .try_turn_after_withdrawal(req.key, withdrawn_by)
            .await
        else {
            return Ok(Attempt::Busy { retry_after: None });
        };
        let mut acquiring = AcquireGuard::new(self.local_queue.clone(), req.key.clone(), guard);
        let prefix = self.settings.layout.prefix(req.key);
        let value = self.owner_value(req);
        let mut fresh_session = false;
        let mut leftovers = 0;
        loop {
            let session = self.session().await?;
            let key = contender_key(&prefix, session.id(), req.owner);
            let c = Contender {
                prefix: &prefix,
                key: &key,
                value: &value,
                lease: session.id(),
            };
            acquiring.may_write(&self.requests, &prefix, &key, &value);
            match take_if_free(&self.requests, &c).await {
                Ok(Take::Taken { revision }) => {
                    let granted = Granted {
                        session,
                        contender: key,
                        revision,
                        sent,
                    };
                    return self
                        .hold(acquiring, req, granted, prefix)
                        .map(Attempt::Acquired);
                }
                // A key on a session this client gave up on (its keep-alives went unanswered)
                // whose revocation could not be confirmed: written by a request whose answer was
                // lost. That session's grants are all lost; its key goes as the revocation would
                // have taken it.
                Ok(Take::Busy { first, lease })
                    if self.sessions.is_abandoned(lease) && leftovers < LEFTOVER_ATTEMPTS =>
                {
                    acquiring.nothing_written();
                    leftovers += 1;
                    delete_on_lease(&self.requests, &prefix, &first, lease).await?;
                }
                Ok(Take::Busy { .. }) => {
                    acquiring.nothing_written();
                    return Ok(Attempt::Busy { retry_after: None });
                }
                Ok(Take::Leftover {
                    key: leftover,
                    mod_revision,
                }) if leftovers < LEFTOVER_ATTEMPTS => {
                    acquiring.nothing_written();
                    leftovers += 1;
                    remove_leftover(&self.requests, &leftover, mod_revision).await?;
                }
                Ok(Take::Leftover { .. }) => {
                    acquiring.nothing_written();
                    return Ok(Attempt::Busy { retry_after: None });
                }
                Err(error) if error.is_lease_not_found() && !fresh_session => {
                    acquiring.nothing_written();
                    session.mark_expired();
                    fresh_session = true;
                }
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// # Cancel safety
    /// The extension may or may not have happened; ownership is unchanged either way.
    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        let sent = Instant::now();
        let prefix = self.settings.layout.prefix(lease.key);
        let Some(held) = self.held_by(lease) else {
            return Ok(match anyone(&self.requests, &prefix).await? {
                Owner::Other => Extension::TakenOver,
                Owner::Us | Owner::Nobody => Extension::Expired,
            });
        };
        if held.over || !held.session.is_usable() {
            return Ok(Extension::Expired);
        }
        let owner = confirm_own(
            &self.requests,
            &prefix,
            &held.contender,
            held.revision,
            held.session.id(),
            Read::Fresh,
        )
        .await?;
        match owner {
            Owner::Us => {
                let now = Instant::now();
                let applied = self.local_queue.with_held(lease.key, |record| {
                    let current = *record.expiry.borrow();
                    if record.revision != held.revision
                        || record.expiring
                        || now >= current.delete_at
                    {
                        return false;
                    }
                    record.expiry.send_replace(expiry(sent, ttl));
                    true
                });
                Ok(if applied == Some(true) {
                    Extension::Extended
                } else {
                    Extension::Expired
                })
            }
            Owner::Other => {
                self.local_queue.discard(lease.key, held.revision);
                Ok(Extension::TakenOver)
            }
            Owner::Nobody => {
                self.local_queue.discard(lease.key, held.revision);
                Ok(Extension::Expired)
            }
        }
    }

    /// # Cancel safety
    /// The release may or may not have happened; repeating it is harmless.
    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        let prefix = self.settings.layout.prefix(lease.key);
        match self.held_by(lease) {
            // The watchdog is deleting it already: the TTL ran out first.
            Some(held) if held.over => Ok(Released::Expired),
            Some(held) => {
                let owner = delete_mine(
                    &self.requests,
                    &prefix,
                    &held.contender,
                    held.revision,
                    held.session.id(),
                )
                .await?;
                self.local_queue.discard(lease.key, held.revision);
                Ok(released(owner))
            }
            None => {
                // Not a lock we know of: an acquire whose outcome is unknown may have written
                // our key (dlock-core releases by owner token after cutting one off), or the
                // caller is not the owner at all. While this client's turn on the key is free,
                // no acquire or holder of this client claims our key there: it is abandoned,
                // and deleting it is what the acquire's own withdrawal does. The turn is taken
                // as a withdrawal's, which an acquire of this client that finds it waits for.
                let turn = self.local_queue.try_withdrawal_turn(lease.key);
                let owner = match (self.sessions.current_id(), turn) {
                    (Some(id), Some(_turn)) => {
                        delete_abandoned(&self.requests, &prefix, id).await?
                    }
                    _ => anyone(&self.requests, &prefix).await?,
                };
                Ok(released(owner))
            }
        }
    }

    /// Reads the contender keys of `key` in create order: the oldest is the holder, whose create
    /// revision is its fencing token (for a dlock holder as for a Go `concurrency.Mutex` or
    /// `etcdctl lock`), and the others are the queue in serving order, each with the owner
    /// record in its value (`None` for a peer's empty value). The remaining time is not told: a
    /// holder's key lives as long as its session lease.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    async fn inspect(&self, key: &LockKey) -> Result<Holding> {
        let prefix = self.settings.layout.prefix(key);
        let contenders = queue(&self.requests, &prefix).await?;
        Ok(holder_of(&contenders).map_or(Holding::Free, Holding::Held))
    }

    /// Reads the contender keys under the namespace in pages and lists the locks whose holder
    /// left an owner record (a dlock client's): other data in the namespace, and locks held by
    /// peers, are not listed.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        Ok(inspect::list(&self.requests, &self.settings.layout, prefix).await?)
    }

    /// Deletes the holder's contender key in one transaction comparing its create revision:
    /// the next contender is woken as by a release, gets a greater fencing token, and the
    /// evicted dlock holder, which watches its key, loses its lease at once.
    ///
    /// # Cancel safety
    /// The eviction may or may not have happened.
    async fn evict(&self, key: &LockKey, expected: Option<FencingToken>) -> Result<Eviction> {
        let prefix = self.settings.layout.prefix(key);
        Ok(inspect::evict(&self.requests, &prefix, expected).await?)
    }

    /// Waits for the deletion of any contender key of `key` (a watch), or until `until`.
    ///
    /// # Cancel safety
    /// Cancel safe.
    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        let prefix = self.settings.layout.prefix(key);
        let Some(seen_at) = occupied(&self.requests, &prefix).await? else {
            return Ok(());
        };
        let armed = arm(&self.requests, vec![prefix.clone()], true).await?;
        if armed.at > seen_at && occupied(&self.requests, &prefix).await?.is_none() {
            return Ok(());
        }
        armed.wait(None, Some(until)).await?;
        Ok(())
    }

    /// Joins the queue of contenders and waits, watching only the contender just ahead, until
    /// the lock is ours; transient failures are retried while the session lease bounds the wait.
    /// A wait that runs out deletes its contender key before it returns (bounded; then in the
    /// background), so it stands in nobody's way.
    ///
    /// # Cancel safety
    /// Not cancel safe on its own: if dropped, the contender key is withdrawn in the background.
    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        let mut waiting = Waiting::new(req.key, deadline, retry);
        let Some(guard) = self.local_queue.turn(req.key, deadline).await else {
            return Err(waiting.timeout());
        };
        let mut acquiring = AcquireGuard::new(self.local_queue.clone(), req.key.clone(), guard);
        let prefix = self.settings.layout.prefix(req.key);
        let value = self.owner_value(req);
        let mut agains = 0u32;
        let contended: Result<Granted> = async {
            loop {
                let error = match self
                    .contend(&mut acquiring, req, &prefix, &value, deadline)
                    .await
                {
                    Ok(granted) => return Ok(granted),
                    Err(ContendError::Fatal(error)) => return Err(error),
                    Err(ContendError::Deadline) => return Err(waiting.timeout()),
                    Err(ContendError::Restart) if agains < LEFTOVER_ATTEMPTS => {
                        agains += 1;
                        continue;
                    }
                    Err(ContendError::Restart) => Error::backend(
                        BACKEND,
                        true,
                        "the contender key kept changing under this client",
                    ),
                    Err(ContendError::Temporary(error)) => error,
                };
                // A temporary failure: try again while a live session bounds the wait. If the
                // cluster stays unreachable the session expires and the error is returned.
                let now = Instant::now();
                if self.sessions.usable().is_none() || waiting.is_over(now) {
                    return Err(error);
                }
                let until = waiting.next_attempt(now, None);
                tracing::debug!(key = %req.key, %error, "etcd acquire: temporary failure; trying again");
                agains = 0;
                tokio::time::sleep_until(until).await;
            }
        }
        .await;
        match contended {
            Ok(granted) => self.hold(acquiring, req, granted, prefix),
            // The `lock` contract: a wait that ran out leaves no contender key behind.
            Err(error @ Error::Timeout { .. }) => {
                acquiring.withdraw().await;
                Err(error)
            }
            Err(error) => Err(error),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_acquire_writes_a_value_of_its_own() {
        let owner = dlock_core::Owner::this_process();
        let values: Vec<String> = (0..1000)
            .map(|_| contender_value(owner.record(), OwnerToken::random()))
            .collect();
        let distinct: std::collections::BTreeSet<&String> = values.iter().collect();
        assert_eq!(distinct.len(), values.len());
        let record = OwnerRecord::parse(values[999].as_bytes()).unwrap();
        assert_eq!(record.pid, std::process::id());
    }

    #[test]
    fn a_connection_closed_at_once_says_what_may_be_missing() {
        let plain = EtcdLockBuilder::new()
            .with_endpoint("h:2379")
            .validate()
            .unwrap();
        let closed =
            || Error::unreachable("transport error: stream closed because of a broken pipe");
        let explained = explain_closed(closed(), &plain).to_string();
        assert!(explained.contains("with_tls"), "{explained}");
        let refused = explain_closed(Error::unreachable("Connection refused"), &plain).to_string();
        assert!(!refused.contains("with_tls"), "{refused}");
    }
}
