//! dlock on N independent Redis masters with the Redlock algorithm — with fencing tokens,
//! bounded latency, and the delayed-restart rule.
//!
//! ```no_run
//! # async fn demo() -> dlock_core::Result<()> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use dlock_core::{DistributedLock, DistributedLockExt, LockOptions};
//! use dlock_redlock::RedlockLock;
//!
//! let masters = ["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"];
//! let locks: Arc<dyn DistributedLock> = Arc::new(RedlockLock::connect(&masters).await?);
//! let opts = LockOptions::new(Duration::from_secs(10)).with_wait(Duration::from_secs(5));
//! let lease = locks.acquire("invoices/42", &opts).await?;
//! // … write to the resource, presenting lease.fencing_token() …
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Connecting
//!
//! [`RedlockLock::connect`] takes the masters' URLs, in any form
//! [`dlock_redis::Endpoint`] accepts; [`RedlockBuilder::from_urls`] also sets the quorum, the
//! per-node timeout, the drift allowance, the retry jitter, fencing and the delayed-restart
//! rule. The masters are independent servers — no replication, no cluster — and their number
//! must be odd and at least 3 (5 is usual). A bad URL or setting is an
//! [`Error::InvalidInput`](dlock_core::Error::InvalidInput) naming the field, before anything is
//! sent. `connect` needs a quorum of the masters to answer; the others are connected when a
//! request needs them.
//!
//! The client keeps one multiplexed connection per master and replaces it in the background
//! when it breaks; every new connection is checked with `INFO server` (see the delayed restart
//! below). Keys are those of [`dlock_redis`] (`dlock_redis::protocol::keys`), and each operation is
//! one of its scripts (`dlock_redis::protocol::scripts`), run on every master.
//!
//! # The algorithm
//!
//! As its author specified it (<https://redis.io/docs/latest/develop/use/patterns/distributed-locks/>):
//!
//! * **Acquire**: note the time `sent`, then send the acquire script (`SET key owner NX PX ttl`,
//!   and increment the key's fencing counter if granted) to **every master in parallel**, each
//!   request bounded by the **per-node timeout** (configurable; by default `ttl / 200`, between
//!   5 and 50 ms). A master that hangs costs at most that timeout, and one without a connection
//!   (being reconnected in the background) answers "no" at once. The client stops waiting as soon
//!   as a quorum (`N/2 + 1` by default) granted, or a quorum answered and no quorum can grant;
//!   requests still pending finish in the background, so none is skipped or overtaken. The lock is acquired
//!   only if a quorum granted *and* the time since `sent` is still below the validity
//!   `ttl − (ttl × drift.factor + drift.fixed)` — the same formula and the same `sent` stamp from
//!   which dlock's core computes the lease's validity deadline, so the lease the caller gets ends
//!   where the algorithm says it does. (The core applies [`LockOptions::drift`](dlock_core::LockOptions::drift); the client checks
//!   its own [`RedlockBuilder::with_drift`], both [`Drift::default`](dlock_core::Drift) unless set:
//!   whichever is larger decides.)
//! * **On failure** (too few grants, or too late) the client releases on **every** master,
//!   including those that did not answer — their answer may have been lost — and reports either
//!   busy (a quorum answered, the lock is held elsewhere) or
//!   [`Error::Unavailable`](dlock_core::Error::Unavailable) whose message says
//!   "reached R of N nodes, needed Q".
//! * **Retry**: a waiting acquire tries again after the caller's jittered backoff, bounded by the
//!   holder's remaining TTL and by the caller's deadline, and wakes a random bit (up to
//!   [`RedlockBuilder::with_retry_jitter`]) earlier, so that contenders that split the masters between
//!   them do not keep doing so.
//! * **Extend** re-arms the TTL on every master where the owner still holds the key, and succeeds
//!   only if a quorum did so within the new validity. **Release** deletes the key on every master
//!   where the owner holds it; it never touches another owner's key.
//! * **Batched renewal**: auto-renew re-arms every due lease of a client with one
//!   [`extend_many`](dlock_core::DistributedLock::extend_many) call. It sends one
//!   `EXTEND_MANY` script per
//!   [`EXTEND_BATCH`](dlock_redis::EXTEND_BATCH) leases to every master in parallel — one round
//!   for up to 500 leases instead of one round each — and decides each lease by exactly the
//!   rules of a single extend (the same code). A batch's per-node timeout is that of its longest
//!   TTL plus 20 µs per lease (10 ms for a full chunk), at most half the shortest validity in it.
//!   The chunks of a larger batch go one after another, so the client's other requests wait
//!   behind one chunk at most.
//!
//! # Fencing tokens
//!
//! No other Redlock implementation hands out fencing tokens; this one does (unless turned off
//! with [`RedlockBuilder::with_fencing`]). Each master keeps a per-key counter, incremented by the
//! acquire script atomically with the grant. The client takes the **maximum** `T` over the
//! masters that granted, then **writes `T` back** — as a maximum, never lowering a counter (the
//! `RAISE_FENCE` script, which also checks that the owner
//! still holds the key there) — to the granted masters whose counter is below `T`. The lock counts
//! as acquired only when a quorum of masters both hold the key for the owner and have a counter of
//! at least `T`, all within the validity. When the masters' counters already agree (the usual
//! case once they have been written back once), no write-back is needed and an acquire costs one
//! round, as without fencing. So does the first grant of a key nobody used: no master has a
//! counter yet, and each starts one at the same value, which the client sends with the attempt
//! (its clock in microseconds, one second ahead, or the master's own clock if that is later).
//!
//! **Why tokens grow.** Let holder A get token `T` with quorum `M_A`: every master in `M_A` had a
//! counter ≥ `T` while it held A's key. The next holder B gets a quorum `M_B`; any two quorums of
//! N masters intersect, so some master `m` is in both. B's grant on `m` happened after A's key on
//! `m` was gone (released or expired), hence after `m`'s counter was ≥ `T`; B's acquire script
//! incremented it, so `m` granted B a token > `T`, and B's token — the maximum over `M_B` — is
//! > `T`. By induction, tokens strictly increase from holder to holder of a key.
//!
//! **Assumptions** (where the comparative safety work shows it breaks):
//!
//! * *No loss of the intersecting master's counter.* If `m` loses its data (restart without
//!   persistence, `appendfsync everysec` losing the last second, a restore from an older
//!   snapshot), its counter may go back. The acquire script restarts a missing counter at the
//!   later of the master's clock and the client's (one second ahead) in microseconds, so after a
//!   *total* loss tokens still stay above earlier ones as long as neither clock went back, or lags
//!   the one that started the lost counter by more than the time since; a *stale* counter (older
//!   snapshot) can repeat tokens. Hence [`FencingGuarantee::MonotonicWhileDataSurvives`](dlock_core::backend::FencingGuarantee).
//! * *Bounded clock drift.* Mutual exclusion — that A's key on `m` is gone only after A's
//!   lease ended — relies on the masters' clocks running at about the client's rate (within the
//!   drift allowance) and on no process pause longer than the allowance between the grant and the
//!   validity check. A paused holder can outlive its lease; that is what the fencing token is for:
//!   the resource rejects its late writes, since B's token is larger.
//! * A master that restarted empty and rejoins at once breaks the intersection argument for locks
//!   held at the time; the delayed-restart rule below closes that gap.
//!
//! With fencing off, the token is still the maximum over the quorum, but it can repeat or go back
//! ([`FencingGuarantee::None`](dlock_core::backend::FencingGuarantee)).
//!
//! # Delayed restart and persistence
//!
//! A master that restarts **without its data** forgets the locks it granted. If it voted again at
//! once, a second client could win a quorum with it while the first holder's lease is still valid —
//! two holders (the test suite shows exactly that). Redlock's author gives two remedies:
//!
//! * **Persistence with `appendfsync always`**: every write is on disk before it is
//!   acknowledged, so a restart keeps the locks (and the counters). Safe, at the cost of one
//!   fsync per acquire, extend and release on every master.
//! * **`appendfsync everysec`** (Redis's default with AOF) can lose the last second of writes on a
//!   crash (not on a clean shutdown): a lock granted in that second, and its counter increment, can
//!   be lost. **No persistence** (a cache-only Redis) loses everything on any restart. Both need:
//! * **Delayed restart** ([`RedlockBuilder::with_delayed_restart`]): a restarted master must not take
//!   part for the longest TTL in use, after which every lock it knew has expired anyway. The client
//!   checks every connection it opens with `INFO server`: a master whose server process started
//!   less than `max_ttl` (plus the drift allowance) ago does not count towards any quorum
//!   until then. Requests still go to it (so it holds the keys once it counts again), but its
//!   answers are not counted; with one of five masters excluded, three of the other four must
//!   agree. The check is by the server's uptime, so it also covers restarts that happened
//!   before this client first connected — which means that **right after the masters are
//!   started** (a new deployment) the lock is unavailable for `max_ttl`. Requests with a TTL above
//!   `max_ttl` are refused as invalid input, since the rule would not cover them.
//!
//! Delayed restart protects the locks, not the fencing counters: a counter lost on a master that
//! was in the intersecting quorum restarts from that master's clock (see above).
//!
//! # Looking at a lock
//!
//! [`inspect`](dlock_core::DistributedLock::inspect) (and `dlock status`) reads the lock key, its
//! remaining TTL and its owner record on every master without changing anything, and reports:
//!
//! * **held** if a quorum of the masters show the same owner on the key, expiring after the
//!   smallest remaining TTL among them;
//! * **free** if a quorum show no key;
//! * [`Holding::Unknown`](dlock_core::inspect::Holding::Unknown) if a quorum answered but neither is true (a
//!   lock changing hands at that moment, or a key on a minority of masters only — which nobody can
//!   hold the lock with);
//! * [`Error::Unavailable`](dlock_core::Error::Unavailable) if fewer than a quorum answered.
//!
//! The holder's fencing token is reported only when this client has fencing on and a quorum of
//! the masters holding the key have its owner record (the record's owner token is the key's
//! value) with the same token — which the fencing write-back above guarantees for a dlock holder;
//! otherwise it is "unknown". Another library's client leaves no record, so its holder shows no
//! token and no owner.
//!
//! # Owner records
//!
//! Every grant writes the same owner record on every master that grants, in the acquire script
//! of [`dlock_redis`] (see its crate docs for the hash `dlock:owner:{<lock key>}` and its fields:
//! owner token, fencing token and the [`OwnerRecord`](dlock_core::OwnerRecord) JSON, label from
//! [`RedlockBuilder::with_owner`] or `owner=`); it lives as long as the lock key on that master,
//! and the fencing write-back sets its token to the lease's.
//!
//! * [`list`](dlock_core::DistributedLock::list) scans the records on every master (`SCAN`, page by
//!   page) and looks at each lock found under the prefix as `inspect` does, listing those a quorum
//!   shows held by a holder with a record. A lock held on a quorum has records on a quorum, so the
//!   scan needs all but `quorum − 1` masters; with fewer it fails as unavailable.
//! * [`evict`](dlock_core::DistributedLock::evict) looks first (by quorum), compares the expected
//!   token with the token it found (a holder without one is evicted only without an expected
//!   token), then deletes the holder's owner token from every master with the release script
//!   (compare-and-delete of the key and its record on each). It counts as evicted once a quorum of
//!   masters answered: none of them keeps the key, so the holder can no longer renew (its lease
//!   turns lost at its next renewal) and the next grant, whose quorum meets one of them, gets a
//!   greater token (no counter is touched). With fewer answers it fails as unavailable: the
//!   masters that answered no longer hold the key, the others keep it until its TTL, and evicting
//!   again finishes the job. Masters that disagree on the holder
//!   ([`Holding::Unknown`](dlock_core::inspect::Holding::Unknown)) are an error: look again once the lock
//!   settles.
//!
//! # Storage
//!
//! As with [`dlock_redis`], each master keeps one counter per lock name ever granted, unless
//! [`RedlockBuilder::with_fence_ttl`] (the `fence_ttl` URL parameter) lets counters expire once their
//! name has been idle that long: the acquire script and the write-back re-arm the expiry on every
//! master they touch. Tokens stay strictly increasing while no name is idle longer than that;
//! after a longer pause the counters restart from the masters' and the client's clocks, above the
//! earlier tokens as long as no such clock went back or lags another by more than the pause (see
//! `dlock_redis::protocol::scripts`).
//!
//! # Waiting
//!
//! A waiting acquire of the lock stands in every master's fair queue with one arrival score and
//! is woken by the release notification of any master that names it; it comes back by itself at
//! the holder's expiry and every third of its TTL, in case a notification was lost (the
//! loop of [`dlock_redis::waiting`]). The primitives' waiters poll, at the caller's backoff, bounded by the holder's
//! remaining TTL (reported by the masters that refused).
//!
//! # Primitives
//!
//! The read-write lock and the election are served by quorum, like the lock: the scripts of
//! `dlock_redis::protocol::primitives` run on every master, a place (a read hold, the write hold,
//! a leadership) is granted when a quorum granted it within the validity, its token is the
//! maximum over every master that granted (unlike the lock's acquire, it waits for every
//! counting master's answer, at most the per-node timeout) written back to the masters behind,
//! and a refused attempt is given back everywhere. Readers and writers of a name draw from one counter per master, so by the
//! intersection argument above a writer's token is above every earlier reader's, and a new
//! leader's term above every earlier leader's. A writer waiting in `lock()` leaves an expiring
//! intent on every master it reached, which makes new readers busy there; it is withdrawn when
//! the writer is served or gives up, and runs out by itself after the request's TTL.
//! [`inspect`](dlock_core::DistributedLock::inspect) reports the earliest holder a quorum of
//! masters agree on (an election's leader, its value and term) once a quorum shows the greatest
//! token any of them shows for it; while a grant's write-back is under way the holder is
//! [`Holding::Unknown`](dlock_core::inspect::Holding::Unknown), which an observer takes as no leader yet.
//!
//! The **semaphore is not served** ([`Primitives::ALL.without_semaphore()`](dlock_core::backend::Primitives)):
//! majority quorum does not make it sound. Each master admits up to N holders, and N + 1
//! clients can each be admitted by a different majority — with N = 2 and three masters, A and B
//! on the first, B and C on the second, A and C on the third — so N + 1 would hold it at once.
//! Asking for one is [`Error::Unsupported`](dlock_core::Error::Unsupported).
//!
//! # Cancellation
//!
//! Dropping an acquire after requests went out is handled by dlock's core: it releases by owner
//! token on every master in the background. Dropping a lease releases it the same way.
#![deny(missing_docs)]

mod builder;
mod client;
mod extension;
mod inspect;
mod node;
mod primitives;
mod quorum;
mod restart;
mod url;

pub use builder::{
    RedlockBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_RETRY_JITTER, MAX_DERIVED_NODE_TIMEOUT,
    MAX_NODES, MAX_TIMEOUT, MIN_DERIVED_NODE_TIMEOUT, MIN_NODES, MIN_TIMEOUT,
};
pub use client::RedlockLock;
pub use url::SCHEME;
