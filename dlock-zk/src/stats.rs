//! Counters of what the backend did, for tests, benchmarks and operators.

use std::sync::atomic::{AtomicU64, Ordering};

/// Declares every counter once: a `u64` field of the public snapshot [`ZkStats`], an `AtomicU64`
/// of the live `Counters` by the same name, and the snapshot that copies one into the other, so
/// that a new counter cannot be added to one and forgotten in the other.
macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident, )*) => {
        /// A snapshot of one [`ZkLock`](crate::ZkLock)'s counters since it was built.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct ZkStats {
            $( $(#[$doc])* pub $name: u64, )*
        }

        /// The live counters, bumped where the backend does what they count.
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $( pub(crate) $name: AtomicU64, )*
        }

        impl Counters {
            pub(crate) fn snapshot(&self) -> ZkStats {
                ZkStats {
                    $( $name: self.$name.load(Ordering::Relaxed), )*
                }
            }
        }
    };
}

counters! {
    /// Sessions opened (1 plus one per expired session replaced).
    sessions_opened,
    /// Times a waiting acquire was woken by its predecessor's node changing. With the
    /// predecessor-watch recipe one release wakes exactly one waiter, so under contention this
    /// grows by one per hand-over, never by the number of waiters.
    wakeups,
    /// Lock nodes found again by their owner prefix after a create whose reply was lost.
    recovered_creates,
    /// Lock nodes deleted because their TTL ran out without an extend.
    ttl_deletions,
    /// Session probes sent to keep the leases' session bound fresh.
    probes,
    /// Leases lost because another client deleted their lock node (an operator's eviction,
    /// `zkCli delete`), as the holder's watch on its own node saw it.
    taken_over,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
