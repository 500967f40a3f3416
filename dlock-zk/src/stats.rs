//! Counters of what the backend did, for tests, benchmarks and operators.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of one [`ZkLock`](crate::ZkLock)'s counters since it was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZkStats {
    /// Sessions opened (1 plus one per expired session replaced).
    pub sessions_opened: u64,
    /// Times a waiting acquire was woken by its predecessor's node changing. With the
    /// predecessor-watch recipe one release wakes exactly one waiter, so under contention this
    /// grows by one per hand-over, never by the number of waiters.
    pub wakeups: u64,
    /// Lock nodes found again by their owner prefix after a create whose reply was lost.
    pub recovered_creates: u64,
    /// Lock nodes deleted because their TTL ran out without an extend.
    pub ttl_deletions: u64,
    /// Session probes sent to keep the leases' session bound fresh.
    pub probes: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) sessions_opened: AtomicU64,
    pub(crate) wakeups: AtomicU64,
    pub(crate) recovered_creates: AtomicU64,
    pub(crate) ttl_deletions: AtomicU64,
    pub(crate) probes: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> ZkStats {
        ZkStats {
            sessions_opened: self.sessions_opened.load(Ordering::Relaxed),
            wakeups: self.wakeups.load(Ordering::Relaxed),
            recovered_creates: self.recovered_creates.load(Ordering::Relaxed),
            ttl_deletions: self.ttl_deletions.load(Ordering::Relaxed),
            probes: self.probes.load(Ordering::Relaxed),
        }
    }
}
