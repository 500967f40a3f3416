//! What each backend declares, per scenario, before anything runs: one table per backend, each
//! line with a reason taken from the backend's documented guarantees (its crate docs).
//!
//! A cell whose observation differs from its line here fails the run. Change a line only when the
//! backend's documented guarantee changes, and say why in the reason.

use crate::backend::Backend;
use crate::class::Class::{self, *};
use crate::scenario::Scenario;

/// A declared expectation: the class and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Declared {
    /// The class the backend expects.
    pub class: Class,
    /// One line: the documented guarantee the expectation rests on.
    pub reason: &'static str,
}

type Table = [(Class, &'static str); 11];

/// `dlock_core::InMemoryLock`: one process, one counter, client-side validity.
const MEMORY: Table = [
    (Safe, "one table behind a mutex"),
    (
        CaughtByFencing,
        "the lease expires in-process; the token counter only grows",
    ),
    (
        CaughtByFencing,
        "the next holder gets a larger token; the late write is refused",
    ),
    (
        Safe,
        "dlock-core never hands out a lease whose validity is over",
    ),
    (
        NotApplicable,
        "a crash ends the process, which holds the lock table too",
    ),
    (NotApplicable, "in-process: there is no link to cut"),
    (
        NotApplicable,
        "in-process: there is no service to partition",
    ),
    (NotApplicable, "in-process: there is no server to restart"),
    (NotApplicable, "Redlock only: one lock table, one clock"),
    (NotApplicable, "in-process: nothing is replicated"),
    (Safe, "release and extend compare the owner token"),
];

/// `dlock-redis`: per-key counter, fencing "monotonic while the server keeps its data".
const REDIS: Table = [
    (Safe, "SET NX PX and the counter INCR run in one script"),
    (
        CaughtByFencing,
        "the key expires after the TTL; the counter gives the next holder a larger token",
    ),
    (
        CaughtByFencing,
        "the next holder's token is larger; the late write is refused",
    ),
    (
        Safe,
        "dlock-core never hands out a lease whose validity is over",
    ),
    (Safe, "an abandoned key expires after its TTL"),
    (
        Safe,
        "the client-side validity ends a drift allowance before the server's TTL",
    ),
    (
        NotApplicable,
        "one server: a cut between client and server is scenario 6",
    ),
    (
        CaughtByFencing,
        "a lost counter restarts from the server clock in µs, above earlier tokens (crate docs)",
    ),
    (NotApplicable, "Redlock only: one server, one clock"),
    (
        NotCaught,
        "replication is asynchronous: lock and counter can go back, tokens repeat (crate docs)",
    ),
    (Safe, "release and extend are ownership-checked scripts"),
];

/// `dlock-zk`: ephemeral sequential nodes, czxid tokens, leases that follow the session.
const ZOOKEEPER: Table = [
    (Safe, "the lowest sequence node holds the lock"),
    (CaughtByFencing, "the session expires while paused; czxids only grow"),
    (CaughtByFencing, "the client-side TTL deletes the node; the next czxid is larger"),
    (Safe, "dlock-core never hands out a lease whose validity is over"),
    (Safe, "the ephemeral node goes when the session expires"),
    (Safe, "the lease is uncertain, then lost, before the session can expire on the server"),
    (Safe, "the cut-off member's session expires on the quorum side; the client's session bound ends first"),
    (NotApplicable, "the ensemble logs every write before acknowledging; there is no cache-only mode"),
    (NotApplicable, "Redlock only: time is the session timeout, judged by the leader"),
    (NotApplicable, "replication is by consensus; no asynchronous replica is promoted"),
    (Safe, "release and extend check the own node in the own session"),
];

/// `dlock-etcd`: a session lease per client, create-revision tokens, client-enforced TTL.
const ETCD: Table = [
    (Safe, "the oldest contender key holds the lock"),
    (
        CaughtByFencing,
        "the session lease expires while paused; revisions only grow",
    ),
    (
        CaughtByFencing,
        "the client-side TTL deletes the key; the next revision is larger",
    ),
    (
        Safe,
        "dlock-core never hands out a lease whose validity is over",
    ),
    (
        Safe,
        "the contender key goes when the session lease expires",
    ),
    (
        Safe,
        "the lease is uncertain, then lost at the session's confirmed end",
    ),
    (
        Safe,
        "the cut-off member cannot keep the lease alive; the client's confirmed end passes first",
    ),
    (
        NotApplicable,
        "etcd persists every write through Raft before acknowledging",
    ),
    (
        NotApplicable,
        "Redlock only: lease time is judged by the leader",
    ),
    (
        NotApplicable,
        "replication is by consensus; no asynchronous replica is promoted",
    ),
    (
        Safe,
        "release and extend are transactions comparing revision and lease",
    ),
];

/// `dlock-redlock`: five masters, tokens the maximum over a quorum written back, no delayed
/// restart (the matrix's servers start fresh; see scenario 8's reason).
const REDLOCK: Table = [
    (Safe, "a quorum of SET NX PX grants within the validity"),
    (CaughtByFencing, "keys expire after the TTL; the intersecting master gives the next holder a larger token"),
    (CaughtByFencing, "the next holder's token is larger; the late write is refused"),
    (Safe, "the client checks the validity left after the quorum, and so does dlock-core"),
    (Safe, "abandoned keys expire after the TTL on every master"),
    (Safe, "renewals need a quorum; the client-side validity ends before the masters' TTL"),
    (Safe, "a holder left with a minority cannot renew and loses the lease before the majority's keys expire"),
    (CaughtByFencing, "without delayed restart a master restarted empty breaks exclusion; its counter restarts from its clock in µs, above earlier tokens (crate docs)"),
    (CaughtByFencing, "a master expiring early breaks exclusion (the clock assumption); the intersecting master still gives a larger token"),
    (NotApplicable, "independent masters: no replica is promoted"),
    (Safe, "release and extend are ownership-checked on every master"),
];

/// `dlock-redlock` with delayed restart: the same client as [`REDLOCK`] but for restarts.
const REDLOCK_DELAYED: Table = {
    let same = (
        NotApplicable,
        "the same client as the Redlock row; only restarts differ",
    );
    let mut table = [same; 11];
    table[7] = (
        Unavailable,
        "the restarted master does not vote for the longest TTL; the other masters cannot make a quorum without the holder's",
    );
    table
};

/// The legacy scheme: the value is an expiry timestamp, no owner, no token.
const LEGACY_GETSET: Table = [
    (Safe, "SETNX excludes while nothing fails"),
    (
        NotCaught,
        "no fencing token: every holder presents the same one",
    ),
    (
        NotCaught,
        "no fencing token: the late write is admitted over the successor's",
    ),
    (
        Safe,
        "dlock-core judges validity for every client, baselines included",
    ),
    (Safe, "an expired timestamp is taken over with GETSET"),
    (
        Safe,
        "dlock-core's client-side validity ends before the timestamp",
    ),
    (
        NotApplicable,
        "one server: a cut between client and server is scenario 6",
    ),
    (
        NotCaught,
        "the restart loses the lock and nothing orders the holders",
    ),
    (NotApplicable, "Redlock only"),
    (
        NotCaught,
        "the promoted replica lost the lock and nothing orders the holders",
    ),
    (
        NotCaught,
        "release is a plain DEL: it removes the successor's lock",
    ),
];

/// SETNX then EXPIRE in two round trips, DEL to release, no token.
const NAIVE_EXPIRE: Table = [
    (Safe, "SETNX excludes while nothing fails"),
    (
        NotCaught,
        "no fencing token: every holder presents the same one",
    ),
    (
        NotCaught,
        "no fencing token: the late write is admitted over the successor's",
    ),
    (
        Safe,
        "dlock-core judges validity for every client, baselines included",
    ),
    (
        Safe,
        "the crash comes after EXPIRE here, so the key still expires",
    ),
    (
        Safe,
        "dlock-core's client-side validity ends before the key's expiry",
    ),
    (
        NotApplicable,
        "one server: a cut between client and server is scenario 6",
    ),
    (
        NotCaught,
        "the restart loses the lock and nothing orders the holders",
    ),
    (NotApplicable, "Redlock only"),
    (
        NotCaught,
        "the promoted replica lost the lock and nothing orders the holders",
    ),
    (
        NotCaught,
        "release is a plain DEL: it removes the successor's lock",
    ),
];

/// What `backend` declares for `scenario`.
pub fn declared(backend: Backend, scenario: Scenario) -> Declared {
    let table = match backend {
        Backend::Memory => &MEMORY,
        Backend::Redis => &REDIS,
        Backend::ZooKeeper => &ZOOKEEPER,
        Backend::Etcd => &ETCD,
        Backend::Redlock => &REDLOCK,
        Backend::RedlockDelayedRestart => &REDLOCK_DELAYED,
        Backend::LegacyGetSet => &LEGACY_GETSET,
        Backend::NaiveExpire => &NAIVE_EXPIRE,
    };
    let (class, reason) = table[usize::from(scenario.number() - 1)];
    Declared { class, reason }
}
