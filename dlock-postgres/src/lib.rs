//! The PostgreSQL backend of dlock: session-level advisory locks, fencing tokens from a
//! sequence, leases that follow the session.
//!
//! ```no_run
//! # async fn demo() -> dlock_core::Result<()> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use dlock_core::{DistributedLock, DistributedLockExt, LockOptions};
//! use dlock_postgres::PgLock;
//!
//! let locks: Arc<dyn DistributedLock> =
//!     Arc::new(PgLock::connect("postgres://app:secret@db:5432/billing?sslmode=verify-full&sslrootcert=/etc/ca.pem").await?);
//! let opts = LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(5));
//! let lease = locks.acquire("invoices/42", &opts).await?;
//! println!("fencing token {}", lease.fencing_token());
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! # The protocol
//!
//! * A lock is a **session-level advisory lock** (`pg_try_advisory_lock`) on the key its name
//!   maps to ([`advisory_key`], DistributedLock's mapping, so a .NET service using
//!   DistributedLock's `PostgresDistributedLock` with the same name excludes dlock and the
//!   reverse), in the database the client connects to: the same name in two databases is two
//!   locks.
//! * Each client holds its locks in **a lock session** (a dedicated connection), and serves the
//!   rest (hearing releases, operator reads) on a second connection. A session-level advisory
//!   lock is re-entrant within its session, so the client itself refuses a second owner of a key
//!   it holds. A session that holds [`LOCKS_PER_SESSION`] locks takes no new ones, nor does one
//!   left idle for half the session timeout (no statement under way, none answered since; the
//!   server may be ending it): the client opens another for them, and closes the one it replaced
//!   once its locks are given back and no statement is under way on it. (Every statement of a PostgreSQL session costs time in proportion to the
//!   locks it holds; see [`LOCKS_PER_SESSION`].) A lock's TTL counts from when its attempt
//!   began, before a session was sought, as its lease's validity does.
//! * A grant is one statement, one round trip: the lock if free, then `nextval('dlock_fencing')`
//!   for the **fencing token** and the holder's row in the unlogged table `dlock_holders` (see
//!   [`sql`] for the layout). A release is one statement: the row deleted if still
//!   ours, the lock given back, and a `pg_notify` for the next waiter.
//! * **Waiting** is a fair queue: a waiting acquire that finds the lock busy stands in the
//!   unlogged table `dlock_waiters` in the same statement, and the lock is granted only to the
//!   head of the queue (or to anyone while nobody waits; `try_lock` never queues and never
//!   jumps the queue). Between attempts a waiter waits in PostgreSQL's lock manager, on one of
//!   its client's **waiting connections**
//!   ([`with_waiting_connections`](PgLockBuilder::with_waiting_connections), 4 by default), where
//!   it holds a ticket (an advisory lock of its own) while it waits: the head blocks on the
//!   lock's key, every other waiter on the ticket of the waiter just ahead. So a release — by
//!   dlock, a peer's `pg_advisory_unlock`, or a session the server ended — wakes the head alone,
//!   and a grant or a withdrawal the next waiter alone. A waiter without a waiting connection is
//!   announced the release instead: on its client's wake channel `dlock_release_<tag>` (the tag
//!   is random per client) if it heads the queue, or on `dlock_release` when nobody is queued.
//!   Without a wake a waiter comes back by itself: every third of its TTL to refresh its entry,
//!   when the head's entry lapses (one TTL after its last attempt, so a crashed head holds the
//!   queue up no longer), as the head without a waiting connection at the caller's backoff,
//!   and with one within a second whenever it waits for an announcement. A wait that runs out or is dropped withdraws its entry (and wakes the new head if
//!   it headed the queue) and gives its ticket back.
//! * **Tokens** come from a sequence: they grow across all keys and across restarts and crashes
//!   (a sequence logs ahead and never goes back), for as long as the server keeps its data. A
//!   failover to an asynchronous replica that missed the last writes can hand out a token again,
//!   and loses every held lock (sessions do not move to the replica).
//!
//! # Primitives
//!
//! The semaphore and the read-write lock are views of the client (`locks.semaphore(name, n)`,
//! `locks.rw(name)`) on advisory keys of their own, in the same lock sessions: readers share the
//! name's key (the lock's, as DistributedLock's reader-writer lock takes it), a waiting writer
//! holds back new readers with a companion key, and a semaphore's permits are slot keys that
//! carry its number of permits. See [`primitives`] for the layout and the reasons.
//!
//! # Leases, TTLs and the session
//!
//! | what happens | the lock on the server | the lease |
//! |---|---|---|
//! | the holder's TTL passes without an extend | the client's keeper gives it back | lost (expired) at `sent + ttl − drift` |
//! | the client is connected | kept | held |
//! | the connection is silent or broken | kept until the server ends the idle session, `T` after the last request it answered | **uncertain** until the last confirmation `+ T −` allowance, then lost |
//! | the server ends the session (`pg_terminate_backend`, a restart, the idle timeout) | freed | **lost** at once (the server says so on the connection) or at the bound |
//! | the process dies | freed as soon as the server sees the connection close | — |
//!
//! `T` is the session timeout (`session_timeout=`, default 10 s), set on the lock session as
//! PostgreSQL's `idle_session_timeout` (so **PostgreSQL 14 or later** is needed). While locks are
//! held the client pings every `T/4`, so a living client's session is never idle that long (it
//! pings its current session so while idle too, so that an acquire after a quiet spell finds it
//! open rather than connecting again within its lease's validity); a
//! paused, frozen or cut-off client's session is ended by the server after `T`, which frees its
//! locks. Extend pings the session once for a whole batch and moves the TTL kept on the client.
//!
//! Connect directly or through a session-mode pooler: a transaction-mode pooler (PgBouncer's
//! `pool_mode = transaction`) moves a client between server sessions, which session locks
//! cannot survive.
//!
//! # What the database user needs
//!
//! The first client creates `dlock_fencing`, `dlock_holders` and `dlock_waiters` in the first
//! schema of its search path (so it needs `CREATE` there once, and once more on the upgrade that
//! brought `dlock_waiters`); later ones need `USAGE` on the sequence and
//! `SELECT, INSERT, UPDATE, DELETE` on the tables. Evicting a holder ends its session with
//! `pg_terminate_backend`, which needs the same user, a superuser, or `pg_signal_backend`.

mod batch;
mod builder;
mod client;
mod error;
mod held;
mod inspect;
mod key;
mod listener;
mod lock_wait;
pub mod primitives;
mod session;
pub mod sql;
mod tls;
mod url;

pub use builder::{
    PgLockBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PORT, DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_SESSION_TIMEOUT, DEFAULT_WAITING_CONNECTIONS, MAX_SESSION_TIMEOUT, MAX_TIMEOUT,
    MAX_WAITING_CONNECTIONS, MIN_SESSION_TIMEOUT, SCHEMES,
};
pub use client::{PgLock, LOCKS_PER_SESSION};
pub use key::{advisory_key, AdvisoryKey};
pub use primitives::{rw_companion_key, semaphore_guard_key, semaphore_slot_key};
pub use tls::SslMode;
