//! The implementor contract: what a backend must do, and nothing more.
//!
//! A backend answers four questions on the server: may this owner take this key now
//! ([`try_lock`](DistributedLock::try_lock)), may it keep it longer
//! ([`extend`](DistributedLock::extend)), may it give it back ([`release`](DistributedLock::release)),
//! and, optionally, tell me when it may be free ([`wait_for_release`](DistributedLock::wait_for_release)).
//! For operators it may also say who holds a key ([`inspect`](DistributedLock::inspect)), which
//! keys are held ([`list`](DistributedLock::list)), and evict a stuck holder
//! ([`evict`](DistributedLock::evict)). Everything a user touches — validation, validity
//! deadlines, leases, renewal, cancellation — is written once in this crate on top of these calls
//! (see [`DistributedLockExt`](crate::DistributedLockExt)), and tracing and metrics are
//! [layers](crate::layer::Layer) around any backend ([`Traced`](crate::layer::Traced),
//! [`Metered`](crate::layer::Metered)).
//!
//! This module is the backend author's kit, all of it: the trait and the types its calls take
//! and answer ([`LockKey`], [`Capabilities`], …), and what every backend shares — input checks,
//! the waiting loop, sessions, connection URLs ([`url`], with [`apply_parameters!`]), TLS files
//! ([`tls`]), the server clock watch ([`clock`]) and builder setters ([`setters!`]). An
//! application needs none of it beyond [`DistributedLock`] and [`Released`], which the crate's
//! root re-exports; the bounds of the input are in [`limits`](crate::limits).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::inspect::{Eviction, HeldLock, Holding};
use crate::retry::Backoff;
use crate::token::{FencingToken, OwnerToken};

pub mod clock;
pub mod tls;
pub mod url;

pub use crate::check::{check_len, check_within};
pub use crate::error::BoxError;
pub use crate::key::LockKey;
pub use crate::options::validate_ttl;
pub use crate::owner::check_label;
pub use crate::primitive::{check_value, Primitive, Primitives};
pub use crate::session::{SessionState, SessionWatch};
pub use crate::waiting::{withdraw, Waiting, WITHDRAW_BOUND};
#[doc(inline)]
pub use crate::{apply_parameters, setters};

/// How strongly a backend orders the fencing tokens of successive holders of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FencingGuarantee {
    /// No ordering is promised.
    None,
    /// Strictly increasing while the server keeps its data (e.g. a single Redis without
    /// persistence: a restart or a failover to a lagging replica can reset the counter).
    MonotonicWhileDataSurvives,
    /// Strictly increasing for as long as the service exists (consensus-backed stores).
    Monotonic,
}

/// What a backend declares about itself; the compliance suite checks the declaration. Each
/// backend states its own as a constant (`RedisLock::CAPABILITIES`, …), built with these `const`
/// methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The ordering of fencing tokens.
    pub fencing: FencingGuarantee,
    /// Whether a release wakes waiters (rather than waiters finding out by polling).
    pub notifies_waiters: bool,
    /// Whether a lease is tied to a client session (ZooKeeper, etcd) rather than a per-key TTL.
    pub session_based: bool,
    /// The primitives served besides the lock ([`DistributedLock::primitive`]).
    pub primitives: Primitives,
    /// Whether waiters are granted in the order they began to wait (a queue kept on the server),
    /// so that a releasing task cannot jump ahead of them.
    pub fair_queue: bool,
}

impl Capabilities {
    /// A declaration with the given fencing guarantee, no wake-ups and per-key TTLs.
    pub const fn new(fencing: FencingGuarantee) -> Self {
        Capabilities {
            fencing,
            notifies_waiters: false,
            session_based: false,
            primitives: Primitives::NONE,
            fair_queue: false,
        }
    }

    /// What a queue of contenders in a consensus store declares (ZooKeeper, etcd): tokens that
    /// only grow, waiters woken by watches and served in arrival order, and leases that live in
    /// the client's session.
    pub const fn session_queue() -> Self {
        Capabilities::new(FencingGuarantee::Monotonic)
            .with_notifications()
            .with_sessions()
            .with_fair_queue()
    }

    /// Declares that releases wake waiters.
    pub const fn with_notifications(mut self) -> Self {
        self.notifies_waiters = true;
        self
    }

    /// Declares that leases live in a client session.
    pub const fn with_sessions(mut self) -> Self {
        self.session_based = true;
        self
    }

    /// Declares that waiters are served in arrival order.
    pub const fn with_fair_queue(mut self) -> Self {
        self.fair_queue = true;
        self
    }

    /// Declares the primitives served besides the lock.
    pub const fn with_primitives(mut self, primitives: Primitives) -> Self {
        self.primitives = primitives;
        self
    }
}

/// One request to take a lock, already validated.
#[derive(Debug, Clone, Copy)]
pub struct LockRequest<'a> {
    /// The key.
    pub key: &'a LockKey,
    /// The random identity to store as the lock's value.
    pub owner: OwnerToken,
    /// How long the server should keep the lock without renewal.
    pub ttl: Duration,
}

/// Identifies a lease to extend or release: its key and owner, and its token when known.
#[derive(Debug, Clone, Copy)]
pub struct LeaseRef<'a> {
    /// The key.
    pub key: &'a LockKey,
    /// The owner token the lock was taken with.
    pub owner: OwnerToken,
    /// The fencing token, if the lock was granted (unknown when cleaning up a cancelled acquire).
    pub fencing: Option<FencingToken>,
}

/// One lease to re-arm in a batch ([`DistributedLock::extend_many`]): which, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct ExtendRequest<'a> {
    /// The lease, with its owner token.
    pub lease: LeaseRef<'a>,
    /// The TTL to re-arm it with.
    pub ttl: Duration,
}

/// The server's answer to a successful lock request.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Grant {
    /// The fencing token of the new holder.
    pub fencing: FencingToken,
    /// The client's monotonic time just before the granting request was sent. The lease's
    /// validity is measured from here, so time spent on the wire counts against it.
    pub sent_at: Instant,
    /// For session-based backends: the session the lock lives in, which the lease then follows
    /// (see [`SessionState`]).
    pub session: Option<SessionWatch>,
}

impl Grant {
    /// A grant of `fencing` for a request sent at `sent_at`.
    pub fn new(fencing: FencingToken, sent_at: Instant) -> Self {
        Grant {
            fencing,
            sent_at,
            session: None,
        }
    }

    /// Ties the lease to a session: it is held while the session is alive, uncertain while it is
    /// suspended, and lost when it expires.
    pub fn with_session(mut self, session: SessionWatch) -> Self {
        self.session = Some(session);
        self
    }

    /// The grant with its validity starting no later than `sent`, a time the caller took before
    /// the request. Taking the earlier of two honest stamps only ever shortens the validity.
    pub fn sent_no_later_than(mut self, sent: Instant) -> Self {
        self.sent_at = self.sent_at.min(sent);
        self
    }
}

/// The result of one attempt to take a lock.
#[derive(Debug, Clone)]
pub enum Attempt {
    /// The lock is ours.
    Acquired(Grant),
    /// Someone else holds it.
    Busy {
        /// When the current holder's lease runs out at the latest, if the backend knows.
        retry_after: Option<Duration>,
    },
}

/// The outcome of an ownership-checked extend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extension {
    /// The lock's TTL was re-armed.
    Extended,
    /// The lock's TTL was re-armed, but the server's clock, which expires the key, was seen
    /// running ahead of the client's by this much since the client last read it (see
    /// [`clock`]): the lease counts its validity that much shorter.
    ClockAhead(Duration),
    /// The lock had expired (nobody holds it); nothing was changed.
    Expired,
    /// Another owner holds the lock; nothing was changed.
    TakenOver,
}

impl Extension {
    /// Whether the lock's TTL was re-armed ([`Extended`](Self::Extended) or
    /// [`ClockAhead`](Self::ClockAhead)).
    pub fn is_extended(&self) -> bool {
        matches!(self, Extension::Extended | Extension::ClockAhead(_))
    }

    /// The answer of a renewal that also read the server's clock: `ahead` as the clock watch
    /// found it turns [`Extended`](Self::Extended) into [`ClockAhead`](Self::ClockAhead).
    pub fn with_clock_ahead(self, ahead: Option<Duration>) -> Self {
        match (self, ahead) {
            (Extension::Extended, Some(by)) => Extension::ClockAhead(by),
            (Extension::ClockAhead(was), Some(by)) => Extension::ClockAhead(was.max(by)),
            (other, _) => other,
        }
    }
}

/// The outcome of an ownership-checked release. Only [`Released::Released`] removed anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The lock was ours and is now free.
    Released,
    /// The lock had already expired (or was never taken); nothing was changed.
    Expired,
    /// Another owner holds the lock now; it was left untouched.
    TakenOver,
}

/// The word the tracing and metrics layers record as the `outcome` of a lock call, the same for
/// every backend: `acquired`, `busy`, `extended`, `released`, `expired`, `taken_over` for answers,
/// and `timeout`, `lost`, `not_owner`, `unavailable`, `invalid_input`, `backend_error` or
/// `unsupported` for failures (the kind of [`Error`]).
pub trait Outcome {
    /// The outcome's word.
    fn outcome(&self) -> &'static str;
}

impl Outcome for Grant {
    fn outcome(&self) -> &'static str {
        "acquired"
    }
}

impl Outcome for Attempt {
    fn outcome(&self) -> &'static str {
        match self {
            Attempt::Acquired(_) => "acquired",
            Attempt::Busy { .. } => "busy",
        }
    }
}

impl Outcome for Extension {
    fn outcome(&self) -> &'static str {
        match self {
            Extension::Extended | Extension::ClockAhead(_) => "extended",
            Extension::Expired => "expired",
            Extension::TakenOver => "taken_over",
        }
    }
}

impl Outcome for Released {
    fn outcome(&self) -> &'static str {
        match self {
            Released::Released => "released",
            Released::Expired => "expired",
            Released::TakenOver => "taken_over",
        }
    }
}

impl Outcome for Error {
    fn outcome(&self) -> &'static str {
        match self {
            Error::Timeout { .. } => "timeout",
            Error::Lost { .. } => "lost",
            Error::NotOwner { .. } => "not_owner",
            Error::Unavailable { .. } => "unavailable",
            Error::InvalidInput { .. } => "invalid_input",
            Error::Mismatch { .. } => "mismatch",
            Error::Backend { .. } => "backend_error",
            Error::Unsupported { .. } => "unsupported",
        }
    }
}

impl<T: Outcome> Outcome for Result<T> {
    fn outcome(&self) -> &'static str {
        match self {
            Ok(answer) => answer.outcome(),
            Err(error) => error.outcome(),
        }
    }
}

/// A distributed lock service. Implement this for a backend; use it through
/// [`DistributedLockExt`](crate::DistributedLockExt), usually as `Arc<dyn DistributedLock>`.
///
/// Implementations must check ownership on the server for [`extend`](Self::extend) and
/// [`release`](Self::release) (compare the owner token atomically with the change), must never
/// re-create a lock in `extend`, and must answer fast: none of these calls should wait for the
/// lock to become free, except [`lock`](Self::lock) and
/// [`wait_for_release`](Self::wait_for_release).
#[async_trait]
pub trait DistributedLock: Send + Sync + fmt::Debug + 'static {
    /// A short name for errors and tracing, e.g. `"redis"`.
    fn backend_name(&self) -> &'static str;

    /// What the backend guarantees.
    fn capabilities(&self) -> Capabilities;

    /// One attempt to take `req.key` for `req.owner`.
    ///
    /// # Cancel safety
    /// Not cancel safe on its own: the request may have reached the server. Callers that drop it
    /// must release by owner token, which [`DistributedLockExt`](crate::DistributedLockExt) does.
    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt>;

    /// Re-arms the TTL of a lock this owner still holds.
    ///
    /// # Cancel safety
    /// The extension may or may not have happened; either way ownership is unchanged.
    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension>;

    /// Re-arms many leases at once; one answer per request, in the same order.
    ///
    /// Auto-renew calls this once per tick with every lease of this handle that is due, so that
    /// 10,000 renewing leases cost one timer and a few requests rather than 10,000 of each. Each
    /// request has the semantics of [`extend`](Self::extend). The default sends one `extend` per
    /// lease, all at once; a backend that can batch on the wire (one pipeline or one script over
    /// many keys) overrides it. A failure of the whole batch is reported for every lease.
    ///
    /// # Cancel safety
    /// Like [`extend`](Self::extend): any of the extensions may or may not have happened.
    async fn extend_many(&self, requests: &[ExtendRequest<'_>]) -> Vec<Result<Extension>> {
        futures::future::join_all(
            requests
                .iter()
                .map(|request| self.extend(&request.lease, request.ttl)),
        )
        .await
    }

    /// Frees a lock this owner still holds; never touches another owner's lock.
    ///
    /// # Cancel safety
    /// The release may or may not have happened; repeating it is harmless.
    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released>;

    /// Waits until `key` may have become free, or until `until`.
    ///
    /// Backends with a notification (pub/sub, a watch, an in-process wake-up) return as soon as a
    /// release is signalled; the default just sleeps, which turns waiting into polling.
    ///
    /// # Cancel safety
    /// Cancel safe.
    async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
        let _ = key;
        tokio::time::sleep_until(until).await;
        Ok(())
    }

    /// Looks at `key` without changing anything: whether it is held, and by which fencing token
    /// where the backend can tell.
    ///
    /// Optional: the default answers [`Error::Unsupported`], which is the honest answer for a
    /// backend that could only find out by taking the lock.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    async fn inspect(&self, key: &LockKey) -> Result<Holding> {
        let _ = key;
        Err(Error::Unsupported {
            backend: self.backend_name(),
            what: "looking at a lock without taking it",
        })
    }

    /// The locks held now whose names start with `prefix` (every lock for `""`), each with what
    /// [`inspect`](Self::inspect) would say of its holder. Backends list the locks their
    /// own clients took (with an owner record), so that a key space shared with other data does
    /// not show up as locks.
    ///
    /// Optional: the default answers [`Error::Unsupported`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let _ = prefix;
        Err(Error::Unsupported {
            backend: self.backend_name(),
            what: "listing the held locks",
        })
    }

    /// Removes the current holder of `key`, whoever it is: the operator's way out of a lock
    /// whose holder is stuck. With `expected`, only a holder with that fencing token is removed
    /// (the one the operator was shown), and any other answers [`Eviction::Changed`] with
    /// nothing changed.
    ///
    /// Safe by fencing, not by time: the next grant of `key` gets a fencing token strictly
    /// greater than the evicted holder's (on every backend that orders tokens), so a resource
    /// guarded by a [`Fence`](crate::Fence) rejects the evicted holder's late writes, and the
    /// evicted holder's lease turns lost at its next renewal (or at once, where the backend
    /// watches its entry).
    ///
    /// Optional: the default answers [`Error::Unsupported`].
    ///
    /// # Cancel safety
    /// The eviction may or may not have happened.
    async fn evict(&self, key: &LockKey, expected: Option<FencingToken>) -> Result<Eviction> {
        let _ = (key, expected);
        Err(Error::Unsupported {
            backend: self.backend_name(),
            what: "evicting a lock's holder",
        })
    }

    /// A view of this service that serves `primitive` (a semaphore, one side of a read-write
    /// lock, an election) instead of the lock: its `try_lock`, `extend`, `release`,
    /// `wait_for_release`, `inspect` and `lock` act on the primitive's layout for the same key
    /// names, and its grants become ordinary [`Lease`](crate::Lease)s. `primitive` is validated
    /// first (see [`Primitive::validate`]).
    ///
    /// Optional: the default answers [`Error::Unsupported`]; a backend that serves a primitive
    /// declares it in [`Capabilities::primitives`].
    fn primitive(&self, primitive: &Primitive) -> Result<Arc<dyn DistributedLock>> {
        primitive.validate()?;
        Err(Error::Unsupported {
            backend: self.backend_name(),
            what: primitive.name(),
        })
    }

    /// Takes the lock, waiting until `deadline` (or forever) while it is busy.
    ///
    /// The default repeats [`try_lock`](Self::try_lock), waiting in between with
    /// [`wait_for_release`](Self::wait_for_release) bounded by the jittered `retry` delay and by the
    /// holder's remaining TTL. Queue-based backends (ZooKeeper, etcd) override it. Errors are
    /// returned at once, not retried: an unreachable server must not turn into an endless wait.
    ///
    /// A backend that returns [`Error::Timeout`] has left nothing on the server: a queue entry it
    /// made (a sequential node, a contender key) is withdrawn before it returns, within
    /// [`WITHDRAW_BOUND`] (see [`withdraw`]), and only
    /// past that bound finished in the background. The caller trusts this and sends nothing
    /// more, so a timed-out wait on a backend that queues nothing (every attempt answered busy)
    /// costs no extra round trip. An attempt that got no answer is an error, not a timeout.
    ///
    /// # Cancel safety
    /// Not cancel safe on its own, like [`try_lock`](Self::try_lock).
    async fn lock(
        &self,
        req: &LockRequest<'_>,
        deadline: Option<Instant>,
        retry: &Backoff,
    ) -> Result<Grant> {
        retry_until_granted(self, req, deadline, retry).await
    }
}

/// The default waiting loop of [`DistributedLock::lock`], for a backend that overrides `lock`
/// to do something around it (a view that marks a waiting writer, say) and then waits the same
/// way: [`try_lock`](DistributedLock::try_lock), then
/// [`wait_for_release`](DistributedLock::wait_for_release) bounded by the jittered `retry`
/// delay and the holder's remaining TTL, until granted or `deadline`
/// ([`Error::Timeout`]); errors are returned at once.
pub async fn retry_until_granted<S: DistributedLock + ?Sized>(
    service: &S,
    req: &LockRequest<'_>,
    deadline: Option<Instant>,
    retry: &Backoff,
) -> Result<Grant> {
    let mut waiting = Waiting::new(req.key, deadline, retry);
    // The wait's start is when the first attempt is sent: one clock reading, not two, on the
    // path of every uncontended acquire.
    let mut sent = waiting.started();
    loop {
        let retry_after = match service.try_lock(req).await? {
            Attempt::Acquired(grant) => return Ok(grant.sent_no_later_than(sent)),
            Attempt::Busy { retry_after } => retry_after,
        };
        let now = waiting.check()?;
        let holder_left = retry_after.map(|left| left + Duration::from_millis(1));
        let until = waiting.next_attempt(now, holder_left);
        service.wait_for_release(req.key, until).await?;
        sent = Instant::now();
    }
}

macro_rules! forward_distributed_lock {
    ($($ptr:ident),*) => {$(
        #[async_trait]
        impl<T: DistributedLock + ?Sized> DistributedLock for $ptr<T> {
            fn backend_name(&self) -> &'static str {
                (**self).backend_name()
            }
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
                (**self).try_lock(req).await
            }
            async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
                (**self).extend(lease, ttl).await
            }
            async fn extend_many(&self, requests: &[ExtendRequest<'_>]) -> Vec<Result<Extension>> {
                (**self).extend_many(requests).await
            }
            async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
                (**self).release(lease).await
            }
            async fn wait_for_release(&self, key: &LockKey, until: Instant) -> Result<()> {
                (**self).wait_for_release(key, until).await
            }
            async fn inspect(&self, key: &LockKey) -> Result<Holding> {
                (**self).inspect(key).await
            }
            async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
                (**self).list(prefix).await
            }
            async fn evict(
                &self,
                key: &LockKey,
                expected: Option<FencingToken>,
            ) -> Result<Eviction> {
                (**self).evict(key, expected).await
            }
            fn primitive(&self, primitive: &Primitive) -> Result<Arc<dyn DistributedLock>> {
                (**self).primitive(primitive)
            }
            async fn lock(
                &self,
                req: &LockRequest<'_>,
                deadline: Option<Instant>,
                retry: &Backoff,
            ) -> Result<Grant> {
                (**self).lock(req, deadline, retry).await
            }
        }
    )*};
}

forward_distributed_lock!(Arc);

/// A handle that can be shared with the leases it grants: `Arc<dyn DistributedLock>` or
/// `Arc<B>` for a concrete backend `B`.
pub trait LockHandle: Send + Sync {
    /// The handle as the trait object that leases keep (a reference-count increment).
    fn shared(&self) -> Arc<dyn DistributedLock>;
}

impl<T: DistributedLock> LockHandle for Arc<T> {
    fn shared(&self) -> Arc<dyn DistributedLock> {
        self.clone()
    }
}

impl LockHandle for Arc<dyn DistributedLock> {
    fn shared(&self) -> Arc<dyn DistributedLock> {
        self.clone()
    }
}
