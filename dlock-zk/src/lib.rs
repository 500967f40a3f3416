//! The ZooKeeper backend of dlock.
//!
//! ```no_run
//! # async fn demo() -> dlock_core::Result<()> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use dlock_core::{DistributedLock, DistributedLockExt, LockOptions};
//! use dlock_zk::ZkLock;
//!
//! let locks: Arc<dyn DistributedLock> =
//!     Arc::new(ZkLock::connect("zk://zk1:2181,zk2:2181,zk3:2181/billing").await?);
//! let opts = LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(5));
//! let lease = locks.acquire("invoices/42", &opts).await?;
//! println!("fencing token {}", lease.fencing_token());
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! # The recipe
//!
//! The classic ZooKeeper lock ("Locks" in the ZooKeeper recipes), as Curator and kazoo implement
//! it:
//!
//! * Every lock key has one parent node, `<chroot><root>/<encoded key>` (root `/dlock` by
//!   default). Keys are encoded injectively into node names by [`encode_key`]: letters, digits,
//!   `-`, `_` and `.` stay, every other byte becomes `%XX` (so `a/b` is `a%2Fb` and never
//!   collides with the key `a%2Fb`, which is `a%252Fb`).
//! * A contender creates an ephemeral sequential child named after its random owner token, in
//!   kazoo's or Curator's shape ([`Naming`]). It lists the children; the lowest sequence number
//!   among all sequential children holds the lock.
//! * A waiter watches **only its immediate predecessor** and lists again when that node goes, so
//!   one release wakes exactly one waiter — no herd, however long the queue.
//! * Release deletes the own node. [`try_acquire`](dlock_core::DistributedLockExt::try_acquire)
//!   creates, lists, and deletes its node again if it is not the lowest.
//! * Parents are *container* nodes (ZooKeeper 3.5.3+): the server deletes a container once its
//!   last child is gone (checked every minute by default), and that delete fails while a child
//!   exists, so cleanup can never remove a parent under a new contender; a contender whose
//!   create meets a parent deleted a moment earlier recreates it. Servers without containers get
//!   persistent parents, which stay.
//!
//! An uncontended acquire and release is therefore three requests — create, list, delete — the
//! floor for this recipe.
//!
//! # Lost replies
//!
//! If the connection drops after a create was sent, the create may or may not have happened.
//! The contender then reconnects (within the same session), lists the parent and finds its own
//! node by the owner prefix, and creates one only if there is none. Without this, the orphaned
//! node would block every other contender until the session expired. Dropped acquire futures are
//! cleaned up the same way: the node is deleted by path if its name is known, by owner prefix if
//! not (the library sends requests in order, so the look-up is answered after the create).
//!
//! # Fencing tokens
//!
//! The fencing token is the own node's creation zxid (`czxid`). Zxids number every write to the
//! ensemble, so a later holder's node always has a larger one — across all keys, and also after
//! the parent was deleted and recreated, when sequence numbers start again at zero. Tokens are
//! therefore [`Monotonic`](dlock_core::backend::FencingGuarantee::Monotonic) for as long as the ensemble
//! keeps its data.
//!
//! # Leases, TTLs and the session
//!
//! A ZooKeeper lock lives in the client's *session*: its node is ephemeral and disappears when
//! the session ends. The client library keeps the session alive by itself. dlock's leases map
//! onto it like this:
//!
//! | what happens | the lock on the server | the lease |
//! |---|---|---|
//! | the holder's TTL passes without an extend | the backend deletes the node at `sent + ttl` | lost (expired) at `sent + ttl − drift` |
//! | the client is connected | kept | held |
//! | the connection is lost | kept until the session expires, `T` after the server last heard from the client | **uncertain** until the last confirmation `+ T −` allowance, then lost |
//! | the session expires | the node is gone; another client may hold the lock | **lost** (the session ended) |
//! | the process dies or is cut off for good | the node goes when the session expires, `T` after the last contact | — |
//!
//! `T` is the negotiated session timeout
//! ([`with_session_timeout`](ZkLockBuilder::with_session_timeout), default 10 s; the server
//! clamps it to 2–20 ticks). So:
//!
//! * **The TTL** (from [`LockOptions`](dlock_core::LockOptions)) bounds how long a *living*
//!   holder keeps the lock without extending: it is enforced on the client, whose timer deletes
//!   the node. ZooKeeper has no per-node expiry for ephemeral nodes.
//! * **The session timeout** is the server-side TTL: it bounds how long a *dead or cut-off*
//!   holder blocks others. Choose it no longer than you can afford to wait after a crash.
//! * A lease is valid no longer than the earlier of its TTL and its session bound: the last
//!   instant the server is known to have heard from the session (the send time of a request it
//!   answered) plus `T`, minus an allowance (1 % + 2 ms for clock rates, and a tenth of `T` for a
//!   follower that answers a little after losing its leader). While locks are held the backend
//!   refreshes that bound with a cheap read every `T/4`, so a holder whose process was paused
//!   longer than the session timeout wakes up to a lost lease instead of a held one.
//! * **Extend** checks that the own node still exists in this session and moves its TTL to
//!   `sent + ttl`; it never recreates a node. It cannot lengthen the session, which the library
//!   keeps alive. Auto-renew therefore works as with every backend.
//! * A waiting acquire whose session expires fails (a temporary [`Error::Backend`]) instead of
//!   waiting forever; the next call opens a new session.
//!
//! A lost lease cannot prevent a paused holder from writing after another client took the lock;
//! present the fencing token to the resource ([`Fence`](dlock_core::Fence)) for that.
//!
//! # Interoperability
//!
//! dlock waits behind every sequential child of a lock's path, ordered by its sequence number
//! whatever its prefix, so kazoo's `Lock` and Curator's `InterProcessMutex` holders on the same
//! path ([`ZkLock::lock_path`], e.g. `/dlock/invoices%2F42` for the key `invoices/42`) make dlock
//! wait. Which of them waits behind a dlock holder is chosen by [`Naming`]: kazoo's naming (the
//! default; kazoo's `contenders()` then shows dlock holders' owner records) or Curator's. Both
//! directions are tested, kazoo against the kazoo shipped with Debian.
//!
//! # Semaphore, read-write lock and election
//!
//! [`DistributedLock::primitive`](dlock_core::DistributedLock::primitive) serves them in the
//! layouts of kazoo's recipes, so dlock and kazoo clients share them
//! ([`ZkLock::primitive_path`] is the path to hand to kazoo):
//!
//! * the read-write lock is kazoo's `ReadLock`/`WriteLock` queue at `<lock path>%rw`: readers'
//!   `__rlock__` and writers' `__lock__` nodes in one sequence order; a reader waits for the
//!   writers queued before it, a writer for every contender queued before it, so a waiting writer
//!   holds back the readers that arrive after it;
//! * the semaphore is kazoo's `Semaphore` at `<lock path>%semaphore`: the permits are the node's
//!   data, every holder has an ephemeral lease child, and the leases are counted under a kazoo
//!   `Lock` at `<path>-__lock__`; another number of permits while a lease is held is
//!   [`Error::Mismatch`](dlock_core::Error::Mismatch);
//! * the election is kazoo's `Election` at `<lock path>%election`: the first `__lock__` node
//!   leads, and its data is the leader's value.
//!
//! Every grant is fenced by its own node's creation zxid, like the lock's.
//!
//! # Owner records and operator calls
//!
//! Every contender node's data is its [`OwnerRecord`](dlock_core::OwnerRecord): one line of
//! JSON naming the host, the process id, the label given with
//! [`with_owner`](ZkLockBuilder::with_owner) (`owner=` in the URL) and when the node was
//! created. It is written by the create itself and deleted with the node, so it is there exactly
//! while the contender is; `zkCli get` and kazoo's `Lock.contenders()` show it.
//! ([`with_identifier`](ZkLockBuilder::with_identifier), which set the whole node data in earlier
//! releases, now sets the record's label.)
//!
//! * [`inspect`](dlock_core::DistributedLock::inspect) reads the queue: the lowest node holds the
//!   lock (its creation zxid is the fencing token), the others wait in sequence order, each with
//!   its record. kazoo's and Curator's nodes carry their own data and read as `owner: None`.
//!   `expires_in` stays `None`: the node has no server-side TTL.
//! * [`list`](dlock_core::DistributedLock::list) lists the base path's children, decodes them into
//!   lock names ([`decode_key`]) and looks at each name that starts with the prefix; it lists the
//!   locks whose holder carries a dlock record.
//! * [`evict`](dlock_core::DistributedLock::evict) deletes the holder's node, with the version it
//!   was read at and only if its creation zxid is the expected token. The next waiter wakes as on a
//!   release, and its node, created later, has a greater zxid. Every holder watches its own node
//!   (one `exists` watch per held lock, set right after the grant), so the evicted lease is lost
//!   at once, as [`TakenOver`](dlock_core::LostReason::TakenOver), without waiting for an extend:
//!   its `lost()` and `expiring()` futures complete. The same goes for a node deleted with
//!   `zkCli delete` or by kazoo. A paused holder, which does not look at its lease, is stopped by
//!   the fence.
//!
//! # Connection strings
//!
//! `zk://[user:password@]host1:2181,host2:2181[/chroot]` (see [`ConnectString::parse`]): the
//! `zk://` and the ports (2181) are optional; the chroot prefixes every path and is created on
//! first use; `user:password` adds digest credentials and never appears in `Debug` output or
//! errors. Malformed strings fail with [`Error::InvalidInput`] naming `url` before anything is
//! sent; unreachable servers fail with [`Error::Unavailable`] within the connect timeout.
//! [`ZkLockBuilder::from_url`] also takes the builder's settings as query parameters, and
//! `zk+tls://host:2281[,…][/chroot]?ca=PATH[&cert=PATH&key=PATH]` for TLS (`tls` feature).
//!
//! # TLS and access control
//!
//! With the `tls` feature, [`ZkLockBuilder::with_tls`] reaches every server over TLS
//! ([`TlsFiles`](dlock_core::backend::tls::TlsFiles): the authority the servers are checked against, and a client certificate for
//! servers that require one). With digest credentials, every node dlock creates carries
//! `digest:USER:HASH` ALL and `world:anyone` READ: other identities can see a queue and who holds
//! it, but cannot delete or overwrite a holder's node, nor queue for the key (ZooKeeper checks
//! DELETE on the parent, so letting others queue would let them delete the holder). A lock root
//! therefore belongs to the identity that created it. The crate's README ("ZooKeeper over TLS,
//! and ACLs under digest credentials") has the details.
//!
//! [`Error::InvalidInput`]: dlock_core::Error::InvalidInput
//! [`Error::Unavailable`]: dlock_core::Error::Unavailable
//! [`Error::Backend`]: dlock_core::Error::Backend
#![deny(missing_docs)]
// On docs.rs (`--cfg docsrs`), each feature-gated item is marked with the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acl;
mod acquire;
mod builder;
mod client;
mod error;
mod extend;
mod inspect;
mod keeper;
mod naming;
mod node_watch;
mod primitives;
mod queue;
mod recipe;
mod registry;
mod release;
mod request;
mod semaphore;
mod session;
mod stats;
mod tls;
mod url;
mod watchdog;

pub use builder::{
    ZkLockBuilder, DEFAULT_ROOT, DEFAULT_SESSION_TIMEOUT, MAX_TIMEOUT, MIN_TIMEOUT, URL_ENV,
};
pub use client::ZkLock;
pub use naming::{decode_key, encode_key, Naming};
pub use stats::ZkStats;
pub use url::{ConnectString, Server, DEFAULT_PORT};
