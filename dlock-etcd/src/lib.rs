//! The etcd backend of dlock: etcd's own lock recipe, with the gaps closed.
//!
//! ```no_run
//! # async fn demo() -> dlock_core::Result<()> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use dlock_core::{DistributedLock, DistributedLockExt, LockOptions};
//! use dlock_etcd::EtcdLock;
//!
//! let locks: Arc<dyn DistributedLock> =
//!     Arc::new(EtcdLock::connect("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379").await?);
//! let opts = LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(5));
//! let lease = locks.acquire("invoices/42", &opts).await?;
//! // Present lease.fencing_token() with every write to the guarded resource.
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Protocol
//!
//! * **One session lease per client.** [`EtcdLock`] grants one etcd lease when it connects and
//!   keeps it alive with one keep-alive stream (a keep-alive every third of its TTL); every lock
//!   the client takes is a key attached to it. The lease is revoked by [`EtcdLock::close`] (and
//!   when the last handle is dropped), so a client's locks go at once when it shuts down, and
//!   within the session TTL when it dies or is cut off. If the lease is lost, the next acquire
//!   grants a new one.
//! * **The key layout of etcd's `concurrency.Mutex`.** A lock's contenders are keys under
//!   `<name>/`, attached to their session leases (see [`KeyLayout`]), and the one with the
//!   smallest create revision holds the lock. Go names its key `<name>/<lease id in hex>`; dlock
//!   adds the acquire, `<name>/<lease id in hex>_<owner token in hex>`, so that no two acquires
//!   ever write the same key and a release is a plain delete (a late one finds nothing of a
//!   later holding's). Go services using `concurrency.NewMutex(session, name)` and
//!   `etcdctl lock name` exclude each other with dlock clients; [`EtcdLock::lock_name`] tells the
//!   name for a key.
//! * **Acquire** is one transaction — create our key if absent, else read it, and read the oldest
//!   contender (and, when it creates our key, the one created just before ours; otherwise a
//!   second read finds that one). If ours is not the oldest, the acquire watches the contender
//!   just before ours for its deletion: no polling, and a release wakes exactly one waiter. (The
//!   watch starts from "now", which etcd serves at once, and the acquire reads again if the store
//!   moved on since its last read; a watch from a past revision would be served by etcd's
//!   catch-up loop, up to 100 ms late.) When nobody is left ahead, the acquire has seen its own key in the same
//!   read, and it checks that the session still has time left, before it reports the lock held
//!   (etcd issue #11456: a waiter was once granted a lock after its lease had expired). Its own
//!   key is watched on the same stream, so a waiter whose session ends fails its acquire at once
//!   with [`Error::Lost`](dlock_core::Error::Lost). `try_acquire` is a single transaction that
//!   creates the key only if no contender exists at all, so a busy answer leaves nothing behind.
//!   The waiter's "who is ahead of me" reads are served by the member without a consensus round:
//!   keys older than ours are never created later, so a stale view shows more of them, never
//!   fewer, and cannot grant the lock early.
//! * **Fencing token**: the create revision of the holder's key. Revisions of an etcd cluster
//!   only grow, and a later holder's key is always created later
//!   ([`FencingGuarantee::Monotonic`](dlock_core::backend::FencingGuarantee::Monotonic)).
//! * **Release is one plain delete of the holding's own key**, which returns the deleted key: the
//!   key names the acquire, so a late delete finds nothing of a later holding's, and the deleted
//!   key's create revision and lease tell whether it was this holding (only when it was not, a
//!   read tells a takeover from an expiry). **Extend is an ownership-checked read** of the key's
//!   create revision and lease. (etcd's server-side lock service deletes whatever key it is
//!   given on unlock, so a holder whose lease expired could delete its successor's key.) A
//!   release by an owner token alone — what the core sends after a cancelled acquire — deletes
//!   the keys of this client's session under the name while no acquire or holding of this
//!   client claims one there.
//! * **A holder learns at once when its key is deleted**, whoever deleted it: keys held longer
//!   than 50 ms are watched on one shared stream per client (shorter critical sections are spared
//!   the watch), and the lease is lost the moment the deletion is reported. Keep-alives alone
//!   would never reveal a key deleted while the session lives on.
//!
//! # Owner records, inspect, list and evict
//!
//! * **The owner record is the contender key's value**: the one-line JSON of
//!   [`OwnerRecord`](dlock_core::OwnerRecord) (host, pid, the label of
//!   [`EtcdLockBuilder::with_owner`] or `owner=`, and when the acquire began), written with the
//!   key and gone with it; `etcdctl get --prefix <name>/` prints it. Go's `concurrency.Mutex`
//!   and `etcdctl lock` write an empty value, which reads as no record (`owner: None`). The
//!   value also carries the acquire's random owner token as `token`, so it tells an acquire's
//!   own key from one an abandoned acquire left.
//! * **inspect** reads the lock's contender keys in create order: the holder (the oldest; its
//!   create revision is the fencing token) with its record, and the waiters in the order they
//!   will be served, each with its record. The remaining time is not told: a key lives as long
//!   as its session lease, and the per-acquire TTL is kept by the holding client.
//! * **list** reads the contender keys of the names under the prefix in pages, at the revision
//!   of the first page, groups them by lock and lists the locks whose holder left a record: other
//!   data in the namespace, and locks held by peers, are not listed.
//! * **evict** deletes the holder's key in one transaction comparing its create revision (with
//!   the expected token, or with the revision just read), so a lock that changed hands answers
//!   [`Eviction::Changed`](dlock_core::inspect::Eviction::Changed) and nothing is deleted. The next
//!   contender is woken as by a release and its key, created later, carries a greater token; an
//!   evicted dlock holder learns it at once from its key's watch and its lease turns lost.
//!
//! # Semaphore, read-write lock and election
//!
//! [`DistributedLock::primitive`](dlock_core::DistributedLock::primitive) serves all three as
//! queues of contender keys in create-revision order, each name in a folder of its family that
//! no lock name reaches ([`KeyLayout::family_name`]): `<namespace>%election/<key>`,
//! `<namespace>%semaphore/<key>`, `<namespace>%rw/<key>`. Every key is attached to the client's
//! session lease, as the lock's are (and as Go's `concurrency` package does), so a grant costs no
//! lease of its own and losing the session loses every grant. The transaction that writes an
//! acquire's key also reads what it waits behind: a grant that holds at once is one request. An
//! acquire that is dropped, times out or is answered busy deletes its key (a dropped one once more
//! after a grace period, in case its write was still on its way).
//!
//! * **Election**: the layout of Go's `concurrency.Election` and `etcdctl elect`
//!   ([`EtcdLock::election_name`]): a candidate's key is `<name>/<session lease hex>` and its
//!   value is the candidate's value (so the tasks of one client campaign on an election one at a
//!   time), the leader is the oldest key and its create revision is the term. A candidate waits until every older key is
//!   gone. Go candidates and observers share the election with dlock's.
//! * **Semaphore**: a permit's key is `<name>/<lease hex>_<owner token hex>`, one per acquire,
//!   so a client may hold several permits; the first `permits` keys hold. The key `<name>` keeps the permits agreed on;
//!   joining compares it in the same transaction, so a client with another number is refused
//!   with [`Error::Mismatch`](dlock_core::Error::Mismatch) while the name has contenders, and
//!   writes nothing.
//! * **Read-write lock**: readers `<name>/read/<lease>_<token>`, writers
//!   `<name>/write/<lease>_<token>` in one
//!   queue; a reader holds when no older writer key exists, a writer when no older key does. A
//!   waiting writer's key holds back every reader that comes after it, so writers are not
//!   starved; a `try_lock` writes only when it would hold at once.
//!
//! # The per-acquire TTL
//!
//! etcd leases are per session, not per lock, so a lock's TTL (`LockOptions::ttl`) cannot be a
//! lease of its own without giving up the shared session. It is enforced by the client instead:
//!
//! * A lock is held until the TTL runs out (counted from before the granting request, re-armed
//!   by `extend`); then this client deletes its key — ownership-checked — and the lease is lost.
//!   A live, unpaused client therefore frees an abandoned lock after its TTL, like every backend.
//! * A client that dies, freezes or is cut off cannot delete anything: its locks are freed when
//!   its session lease expires on the server, after the session TTL
//!   ([`EtcdLockBuilder::with_session_timeout`], default 10 s). So an abandoned lock is held for at most
//!   the TTL while its client runs, and at most the session TTL once it does not.
//! * The lease is valid until the earlier of the TTL's end (less the caller's drift
//!   allowance, see [`Drift`](dlock_core::Drift)) and the session's confirmed end: the last answered keep-alive's send time plus
//!   the lease TTL, less a margin. It is **uncertain** while keep-alives go unanswered (the
//!   server may still keep the lease) and **lost** the moment the server reports the lease gone
//!   or the confirmed end passes.
//!
//! # Endpoints and fail-over
//!
//! A client sends everything — requests, keep-alives, watches — to one member at a time,
//! preferring the leader (every write is decided there), and moves to the next endpoint when a
//! request to that member fails in a way another member might not: connection refused or
//! broken, no answer within the request timeout, no leader. Streams and watches follow it to the
//! new member. [`EtcdLock::endpoint_in_use`] tells which member that is. (etcd-client's own
//! balancer keeps sending requests to a member that refuses connections, and leaves streams on
//! a dead connection, so this client does not use it.)
//!
//! # TLS and authentication
//!
//! [`EtcdLockBuilder::with_tls`] turns TLS on (rustls with ring; the server is verified against
//! the given CA, and a client certificate is presented to servers with `--client-cert-auth`
//! when given), and [`EtcdLockBuilder::with_credentials`] authenticates as an etcd
//! user. etcd's simple auth tokens expire `--auth-token-ttl` after their last use, and
//! keep-alives do not use them, so a client that only holds its locks finds its token expired at
//! the next request: it authenticates again and repeats the request (etcd-client's token
//! refresh). A watch is refused differently — a cancellation on a stream that keeps the token it
//! was opened with — so the client authenticates again and reopens the stream itself. A lease is
//! never lost because a token expired.
//!
//! # Tasks of one client
//!
//! Tasks of the same client that want the same lock queue inside the client first (first come,
//! first served), and only one of them contends on the server at a time: the client's own tasks
//! do not herd the server.
//!
//! # Compatibility
//!
//! Only requests that etcd 3.4 and 3.5/3.6 both serve are used: transactions with range
//! comparisons, ranges bounded by create revision, watches with a start revision and filters,
//! and lease grant/keep-alive/revoke. Not the v3 lock service, and not `TryLock`, which only Go's
//! 3.5 client has.
#![deny(missing_docs)]

mod acquire_guard;
mod builder;
mod client;
mod contention;
mod endpoints;
mod error;
mod inspect;
mod keywatch;
mod layout;
mod local_queue;
mod primitives;
mod requests;
mod session;
mod url;
mod waiting;
mod watchdog;

pub use builder::{
    EtcdLockBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT, DEFAULT_SESSION_TTL,
    MAX_SESSION_TTL, MAX_TIMEOUT, MIN_SESSION_TTL,
};
pub use client::EtcdLock;
pub use layout::{KeyLayout, DEFAULT_NAMESPACE, MAX_NAMESPACE_LEN};
pub use url::{SCHEME, TLS_SCHEME};
