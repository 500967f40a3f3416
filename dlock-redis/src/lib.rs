//! dlock on a Redis server or a Redis Cluster: fenced leases, woken waiters, and bounded failures.
//!
//! ```no_run
//! # async fn demo() -> dlock_core::Result<()> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use dlock_core::{DistributedLock, DistributedLockExt, LockOptions};
//! use dlock_redis::RedisLock;
//!
//! let locks: Arc<dyn DistributedLock> = Arc::new(RedisLock::connect("redis://127.0.0.1:6379").await?);
//! let opts = LockOptions::new(Duration::from_secs(10)).with_wait(Duration::from_secs(5));
//! let lease = locks.acquire("invoices/42", &opts).await?;
//! // … write to the resource, presenting lease.fencing_token() …
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Connecting
//!
//! [`RedisLock::connect`] takes `redis://[user[:password]@]host[:port][/db]`,
//! `rediss://…` (TLS, with the `tls` feature; `#insecure` skips certificate checks) or
//! `redis+unix:///path`. [`RedisLock::builder`] also sets the key prefix and the timeouts. A
//! malformed URL or setting is an [`Error::InvalidInput`](dlock_core::Error::InvalidInput) naming
//! the field, before anything is sent; passwords never appear in `Debug`, errors or logs.
//!
//! One client keeps **one multiplexed connection** for all its lock operations — concurrent
//! acquires from many tasks are pipelined on it without a client-side lock — and replaces it
//! automatically when it breaks. It opens a second connection for release notifications the first
//! time a task has to wait.
//!
//! Every request is bounded by the **request timeout** (default 1 s, replacing redis-rs's 500 ms),
//! which includes waiting for a reconnection: a frozen, partitioned or restarting server gives
//! [`Error::Unavailable`](dlock_core::Error::Unavailable) in bounded time, never a hang. A request
//! that timed out may still have been executed; dlock's core handles that (a cancelled acquire is
//! released by owner token, a failed renewal makes the lease uncertain).
//!
//! A request that timed out also **replaces the connection** it was sent on (once, however many
//! requests time out on it together): a server that stops answering on an open connection — a
//! dropped route, a half-open TCP connection, a middlebox that forgot it — would otherwise leave
//! the client failing every later request, since replies are matched to requests in order. Once
//! the server answers again, the next request after the timeout opens a new connection and
//! succeeds, so a client works again within about one request timeout plus a reconnection. A
//! request that was only slow costs one reconnection.
//!
//! The `tls` feature is **off by default**: it compiles rustls with the `ring` provider (a C build
//! step) into every build, and most deployments reach Redis over a private network; with it off, a
//! `rediss://` URL is an `InvalidInput` error that names the feature.
//!
//! # Sentinel
//!
//! `redis+sentinel://[user[:password]@]host:26379[,host…]/SERVICE[/db]` (`rediss+sentinel://…`
//! for TLS to the sentinels and the primary; `sentinel_password=` for the sentinels' own
//! password), or [`RedisLockBuilder::sentinel`] with [`SentinelSettings`], connects to whichever
//! server the sentinels name as the primary of `SERVICE`, and follows it: the client looks the
//! primary up again when a request fails with a connection error or `READONLY`, gets no answer
//! within the request timeout, when the release-notification connection cannot be opened, and
//! when a sentinel announces `+switch-master` (one sentinel at a time is listened to). The
//! command connection and the release-notification connection then move to the new primary; new
//! acquires work within a second or two of the promotion.
//!
//! Across a failover, the holder's lease reports what the new primary knows, since the
//! promoted replica may or may not have received the lock key: a renewal that finds the key
//! keeps the lease held; one that finds it missing marks the lease lost; while the sentinels
//! fail over, renewals get no answer and the lease is uncertain. A lease that is not renewed
//! cannot notice, so a new primary that missed the key can grant the lock to a second holder
//! during the first one's TTL: fencing tokens may repeat then (see "Fencing guarantee").
//!
//! # Replica acknowledgement
//!
//! [`RedisLockBuilder::with_min_replicas`] (`min_replicas=N&replica_timeout=…` in a URL; single
//! server, Sentinel and Cluster) sends `WAIT N timeout` right behind every grant, extension and
//! release, pipelined on the same connection (in a cluster, the one to the primary that owns the
//! lock's slot), so the count is for that write. A grant that fewer than N
//! replicas acknowledged in time is released again and reported as
//! [`Error::Unavailable`](dlock_core::Error::Unavailable), never returned as held; an extension
//! or a release that was not acknowledged is an `Unavailable` error too (an auto-renewed lease
//! becomes uncertain, and lost if no renewal is acknowledged before its validity ends; a
//! released key may come back with a failover until its TTL). N = 0, the default, sends no
//! `WAIT`. `WAIT` blocks its connection: requests behind it on the client's multiplexed
//! connection wait too, up to the replica timeout when replicas are missing.
//!
//! This narrows, not closes, the failover window: a replica that did not acknowledge may still
//! be promoted, one that did may lose the write in a restart without persistence, and a write
//! whose `WAIT` timed out stays on the primary.
//!
//! # Key layout
//!
//! | what | Redis name | value | expiry |
//! |---|---|---|---|
//! | lock | prefix + name, verbatim (prefix empty by default) | owner token, 32 hex digits | the lease's TTL |
//! | owner record | `dlock:owner:{<lock key>}` (same cluster slot; see [Owner records](#owner-records)) | hash: `token`, `fencing`, `record` | the lease's TTL |
//! | fencing counter | `{<lock key>}:dlock:fence` (same cluster slot) | integer | never, or the fence TTL after the last grant |
//! | release channel | `dlock:released:<lock key>` (pub/sub) | — | — |
//! | wake channel | the release channel + `:` + a client's wake tag (pub/sub) | — | — |
//! | waiters | `dlock:queue:{<lock key>}` (same cluster slot, named like the owner record) | sorted set: owner token + `:` + the client's wake tag → arrival order | none; empty while nobody waits |
//! | waiter lapses | `dlock:lapse:{<lock key>}` (same cluster slot) | sorted set: the same entries → server time (ms) each lapses | as the waiters |
//!
//! The lock key is the plain name, so the common single-instance convention interoperates: a
//! lock held by redis-py's `Lock`, redsync or any client that does `SET name <random> NX PX ttl`
//! and releases by compare-and-delete blocks ours on the same name, and ours blocks theirs. (They
//! do not know the queue of waiters: they can take a free key ahead of our waiters, and their
//! releases are not announced, so the head of our queue finds them by polling.) The counter shares the lock
//! key's hash slot, so each script touches one slot only, as Redis Cluster requires; see the source of `protocol::keys`
//! for the exact rules. In a [cluster](#redis-cluster) the release channel carries the lock
//! key's hash tag, so that sharded pub/sub can use it.
//!
//! # Owner records
//!
//! Every grant also writes an owner record, in the same script: a hash named
//! `dlock:owner:{<lock key>}` (`dlock:owner:{<tag>}<lock key>` when the lock key has a hash tag,
//! or a `}` without one) in the lock key's slot, with the lock's TTL, re-armed by every extension
//! and deleted with the lock. Its fields are `token` (the holder's owner token), `fencing` (its
//! fencing token) and `record`, the [`OwnerRecord`](dlock_core::OwnerRecord) JSON of the client's
//! [`Owner`](dlock_core::Owner) (label: [`RedisLockBuilder::with_owner`], `owner=` in a URL):
//! `redis-cli HGET 'dlock:owner:{jobs/nightly}' record` shows who took `jobs/nightly`. The lock
//! key's value stays the owner token, so the convention's clients (below) are unaffected.
//!
//! * [`inspect`](dlock_core::DistributedLock::inspect) reads the lock key, its TTL and its
//!   record together (`MULTI`): the holder's fencing token and owner are reported when the
//!   record's `token` is the lock key's value (the grant that wrote both). A holder that took the
//!   key with a plain `SET NX` has no record: no token, no owner. The queue of waiters is not
//!   reported.
//! * [`list`](dlock_core::DistributedLock::list) scans the records (`SCAN` with
//!   `MATCH dlock:owner:*`, a page of [`SCAN_COUNT`](protocol::scripts::SCAN_COUNT) keys at a
//!   time; in a cluster on every primary) and reads each lock under the prefix as `inspect` does:
//!   only locks dlock clients hold are listed, not other data of the keyspace.
//! * [`evict`](dlock_core::DistributedLock::evict) is one script: it compares the expected token
//!   with the record's, deletes the lock and its record and announces it on the release channel
//!   like a release, waking the head of the queue. The counter is left alone, so the next grant's token is
//!   greater; the evicted lease finds its key gone at its next renewal and turns lost. A holder
//!   without a record has no known token, so it is evicted only without an expected one.
//!
//! # Operations
//!
//! Each operation is one Lua script (see the source of `protocol::scripts`), run by SHA1 with a transparent reload when
//! the server lost its script cache:
//!
//! * acquire: `SET lock owner PX ttl` if the lock is free and nobody waits ahead of the caller,
//!   and then `INCR` the counter — the new fencing token — and write the owner record; if busy, a
//!   waiting acquire stands in the queue of waiters, and the holder's remaining TTL comes back so
//!   the head of the queue knows when an abandoned lock frees (see [Waiting](#waiting));
//! * extend: re-arm the TTL if the owner still holds the lock; never re-creates it;
//! * release: delete it and its owner record if the owner still holds it, else take the owner's
//!   queue entry out; then, if the lock is free, publish the owner token of the queue's head on
//!   its client's wake channel (or an empty message on the release channel if nobody waits);
//! * evict: delete whoever holds it (the expected holder only, if given) and publish as release
//!   does.
//!
//! Extending or releasing a lease that expired, or whose lock another owner took in the meantime,
//! reports it lost and leaves the other owner's key untouched. A renewal (auto-renew) that finds
//! the key gone — after it expired, or after the server lost its data — marks the lease lost at
//! once; one that gets no answer marks it uncertain.
//!
//! # Fencing guarantee
//!
//! Tokens come from a per-key counter, incremented atomically with each grant,
//! so they are **strictly increasing while the server keeps its data**
//! ([`FencingGuarantee::MonotonicWhileDataSurvives`](dlock_core::backend::FencingGuarantee)). Redis
//! replication is asynchronous: if the primary crashes and a replica that had not yet received the
//! latest writes is promoted, both the lock and the counter can go back in time — the lock can be
//! granted a second time and tokens can repeat. The same holds for a restore from an older
//! snapshot. When the counter is missing altogether (a restart without persistence, a
//! `FLUSHALL`), it restarts from the server's clock in microseconds, so tokens after a total data
//! loss stay above earlier ones as long as the server's clock did not go back (see the source of `protocol::scripts`).
//! A lease held without auto-renew cannot notice that the server lost its lock: it stays valid on
//! the client until its TTL runs out; renew (or extend) to find out.
//!
//! # Storage
//!
//! A lock key and its owner record exist only while the lock is held, but its counter stays: by default one small key
//! per lock name ever granted, which adds up for names made per job or per request. On Redis 7.0,
//! `MEMORY USAGE` reports 72 bytes for the counter of a name of up to about 15 bytes (104 for a
//! 44-byte name), and 100,000 counters named like `jobs/item-N` raise `used_memory` by about 90
//! bytes each — some 90 MB per million names; an expiry adds about 42 bytes per counter while it
//! is set. [`RedisLockBuilder::with_fence_ttl`] (the `fence_ttl` URL
//! parameter of `dlock::connect`) bounds that: each grant gives the counter an expiry, so it goes
//! away once its name has been idle that long. Tokens then stay strictly increasing while no name
//! is idle for longer than the fence TTL; after such a pause the counter restarts from the
//! server's clock, which keeps tokens above the earlier ones unless the clock went back — the
//! same condition as after a data loss (see "The fencing counter's expiry" in `protocol::scripts`).
//!
//! # Waiting
//!
//! Waiters are served in arrival order, from a queue kept on the server beside the lock (as
//! Redisson's fair lock does), and a release wakes only the next waiter in line:
//!
//! * The first attempt of a waiting acquire takes a free lock nobody waits for (one round trip,
//!   uncontended); otherwise it puts the caller at the end of the lock's queue, with an entry that
//!   lapses after the lease's TTL (server time) unless refreshed. The lock is granted only to the
//!   head of the queue (or to anyone while nobody waits): a task that releases and at once asks
//!   again queues behind the waiters, and `try_acquire` does not jump the queue either (it
//!   answers busy while anyone waits, and never queues).
//! * A release (or an eviction, or a waiter that gives up while the lock is free) publishes the
//!   head's owner token on the wake channel of the head's client (the release channel followed
//!   by `:` and the client's random wake tag, which its queue entry carries). Only that client
//!   receives the message, and it wakes only that task: one attempt per release, and nothing
//!   sent to the other clients, whatever the number of waiters. The subscription is on the
//!   client's subscriber connection (opened on first need, shared by all waiting tasks,
//!   reconnected when it breaks or when a `PING` every few seconds gets no answer). Waiters of a
//!   client of an earlier dlock version (entries without a tag) are announced on the release
//!   channel as before; a client of this version is not woken by such a client's releases and
//!   comes back by itself (below), so a fleet upgrades together.
//! * Without a message, a waiter comes back by itself: the head at the holder's expiry (plus a
//!   little jitter), the second in line when the head's entry lapses, every waiter to refresh its
//!   entry about every third of its TTL, and, with the caller's backoff, the head while a foreign
//!   client (no owner record) holds the lock and any waiter while its subscription is not
//!   confirmed. A waiter that crashed stops refreshing: its entry lapses after at most its TTL,
//!   and the next attempt that finds it lapsed while the lock is free announces the new head, so
//!   the queue is blocked no longer than that.
//! * A wait that runs out withdraws its entry before returning (a release by its owner token,
//!   within `dlock_core::backend::WITHDRAW_BOUND`; past it in the background), and a dropped wait is
//!   withdrawn by dlock-core the same way.
//!
//! Client commands per acquisition on a hot key: the attempt that queues, the winning attempt
//! and the release — three, whatever the number of waiters — plus one refresh per third of the
//! TTL waited and, the first time a client waits on a lock, its subscription and one more
//! attempt. Measured by the compliance case
//! `a_hot_key_costs_at_most_four_commands_per_acquisition`: 3.4 with 16 waiters on 16 clients,
//! 3.1 with 256 waiters on 16 clients.
//!
//! Releases that are not announced — an expiry, a foreign client's release, a message lost while
//! the subscriber reconnects — cost latency only, as bounded above. Works on the default server
//! configuration (no keyspace notifications). The queue's keys are deleted by Redis when the last
//! waiter leaves.
//!
//! # Redis Cluster
//!
//! [`RedisLockBuilder::cluster`] makes a client of a Redis Cluster from seed nodes (`host:port`),
//! with [`RedisLockBuilder::with_cluster_username`], [`RedisLockBuilder::with_cluster_password`]
//! and, with the `tls` feature, `with_cluster_tls`. It uses the `redis` crate's cluster client,
//! which follows `MOVED`, `ASK` and `TRYAGAIN` answers, so slot migrations only cost a retry
//! within the request timeout. The key layout is the single server's: a lock key and its counter
//! share a hash slot, so each script runs on one node. Release notifications use sharded pub/sub
//! (Redis 7): the release script `SPUBLISH`es on a channel of the lock key's slot —
//! `dlock:released:{<lock key>}`, or `dlock:released:<lock key>` when the key has a hash tag —
//! and waiters `SSUBSCRIBE` on the node that owns it, on one RESP3 cluster connection per client.
//! A slot that moves ends its subscriptions; they are made again on the new owner, waiters polling
//! meanwhile. Auto-renewal sends one [`EXTEND_MANY`](protocol::scripts::EXTEND_MANY) per slot.
//! A request that times out does not replace a cluster connection (the cluster client reconnects
//! to each node by itself).
//!
//! # Primitives
//!
//! [`DistributedLock::primitive`](dlock_core::DistributedLock::primitive) serves the semaphore,
//! the read-write lock and the election (`locks.semaphore(..)`, `locks.rw(..)`,
//! `locks.election(..)`) on single servers, Sentinel and Cluster, each operation one Lua script
//! on keys that share one hash slot per name (see the source of `protocol::primitives` for the
//! layout). Holders live in a sorted set scored by their expiry on the server's clock, pruned
//! by every script; a semaphore keeps its permits there too and refuses another number with
//! [`Error::Mismatch`](dlock_core::Error::Mismatch) while a holder is live; a read-write name
//! has one fencing counter for its readers and writers; a writer waiting in `lock()` leaves an
//! expiring intent that makes new readers busy until it is served or gives up; an election
//! keeps the leader's value beside its place, so that `inspect` shows value and term. Releases
//! are announced on `dlock:released:<holders key>` (sharded in a cluster) and wake waiters.
//! With [`RedisLockBuilder::with_min_replicas`], `WAIT` follows each of their grants, extensions
//! and releases as for the lock: a grant too few replicas acknowledged is given back and
//! reported as [`Error::Unavailable`](dlock_core::Error::Unavailable).
//!
//! # Server requirements
//!
//! Redis 5 or later (the acquire script may write after reading `TIME`, which needs script
//! effects replication, the default since Redis 5); the user must be allowed `EVALSHA`, `EVAL`,
//! `PING`, `MULTI`, `EXEC`, `GET`, `PTTL` and `HMGET` (the last five to look at a lock), `SCAN` (to
//! list, and `CLUSTER SLOTS` in a cluster), and — for release notifications — `PUBLISH` and `SUBSCRIBE` on the `dlock:released:*`
//! channels. Without the channel permission (Redis 7's default for new ACL users) locks work the
//! same, and waiters learn of releases by polling.
#![deny(missing_docs)]
// On docs.rs (`--cfg docsrs`), each feature-gated item is marked with the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod builder;
mod client;
mod cluster;
mod connection;
mod error;
mod primitives;
pub mod protocol;
mod replicas;
mod sentinel;
mod url;
pub mod waiting;
mod wakeups;

pub use builder::{
    RedisLockBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_REPLICA_TIMEOUT, DEFAULT_REQUEST_TIMEOUT,
    MAX_FENCE_TTL, MAX_MIN_REPLICAS, MAX_TIMEOUT, MIN_FENCE_TTL, MIN_TIMEOUT,
};
pub use client::{RedisLock, EXTEND_BATCH};
pub use cluster::{ClusterSettings, RedisConnection};
pub use sentinel::SentinelSettings;
pub use url::Endpoint;
pub use wakeups::{Registration, Wakeups};
