//! The backends of the matrix: dlock's own, and the two baselines written to be caught.

use serde::Serialize;

/// One row of the matrix. Adding a backend is one more entry here, one more table in
/// [`declared`](crate::declared) and one more target in [`targets`](crate::targets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// `dlock_core::InMemoryLock`, in-process.
    Memory,
    /// `dlock-redis`, one Redis server.
    Redis,
    /// `dlock-zk`, a ZooKeeper ensemble.
    ZooKeeper,
    /// `dlock-etcd`, an etcd cluster.
    Etcd,
    /// `dlock-redlock`, N independent Redis masters.
    Redlock,
    /// `dlock-redlock` with the delayed-restart rule: a restarted master does not vote for the
    /// longest TTL in use.
    RedlockDelayedRestart,
    /// The legacy `SETNX`/`GETSET` timestamp scheme from Redis's old `SETNX` documentation.
    LegacyGetSet,
    /// `SETNX` followed by a separate `EXPIRE`, with a plain `DEL` to release.
    NaiveExpire,
}

impl Backend {
    /// Every backend, in the matrix's column order.
    pub const ALL: [Backend; 8] = [
        Backend::Memory,
        Backend::Redis,
        Backend::ZooKeeper,
        Backend::Etcd,
        Backend::Redlock,
        Backend::RedlockDelayedRestart,
        Backend::LegacyGetSet,
        Backend::NaiveExpire,
    ];

    /// The name used in `--only` filters and the JSON.
    pub fn slug(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Redis => "redis",
            Backend::ZooKeeper => "zk",
            Backend::Etcd => "etcd",
            Backend::Redlock => "redlock",
            Backend::RedlockDelayedRestart => "redlock-delayed",
            Backend::LegacyGetSet => "legacy-getset",
            Backend::NaiveExpire => "naive-expire",
        }
    }

    /// The name shown in tables.
    pub fn title(self) -> &'static str {
        match self {
            Backend::Memory => "in-process",
            Backend::Redis => "Redis",
            Backend::ZooKeeper => "ZooKeeper",
            Backend::Etcd => "etcd",
            Backend::Redlock => "Redlock",
            Backend::RedlockDelayedRestart => "Redlock, delayed restart",
            Backend::LegacyGetSet => "baseline: SETNX/GETSET",
            Backend::NaiveExpire => "baseline: SETNX+EXPIRE",
        }
    }

    /// Parses a slug, as given to `--only`.
    pub fn parse(s: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.slug() == s)
    }
}
