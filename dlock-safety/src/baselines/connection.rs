//! What both baselines share: a name, a key prefix, a Redis connection that reconnects and is
//! bounded like `dlock-redis`'s, and the [`DistributedLock`] frame around their commands.

use std::marker::PhantomData;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{
    Attempt, Capabilities, Extension, FencingGuarantee, LeaseRef, LockRequest,
};
use dlock_core::{DistributedLock, Released, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// Every request gives up after this, as `dlock-redis`'s default request timeout does.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// A baseline's name, its key prefix and its connection.
#[derive(Clone)]
pub struct Baseline {
    name: &'static str,
    prefix: &'static str,
    conn: ConnectionManager,
}

impl std::fmt::Debug for Baseline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl Baseline {
    /// Connects to `url` with a connection that reconnects after a restart and never waits longer
    /// than 1 s.
    pub(crate) async fn connect(
        name: &'static str,
        prefix: &'static str,
        url: &str,
    ) -> dlock_core::Result<Self> {
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(REQUEST_TIMEOUT))
            .set_connection_timeout(Some(REQUEST_TIMEOUT));
        let connected = async {
            let client = redis::Client::open(url)?;
            ConnectionManager::new_with_config(client, config).await
        };
        let conn = connected
            .await
            .map_err(|e| dlock_core::Error::backend(name, true, e))?;
        Ok(Baseline { name, prefix, conn })
    }

    /// Sends `cmd`; a Redis error becomes a temporary backend error of this baseline.
    pub(crate) async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> dlock_core::Result<T> {
        cmd.query_async(&mut self.conn.clone())
            .await
            .map_err(|e| dlock_core::Error::backend(self.name, true, e))
    }

    /// The Redis key of the lock `key`.
    pub(crate) fn key(&self, key: &dlock_core::backend::LockKey) -> String {
        format!("{}{key}", self.prefix)
    }
}

/// The Redis commands of one baseline: how it takes, extends and releases a lock. The rest of
/// the lock — its name, its prefix, no fencing — is the same for both, in [`BaselineLock`].
#[async_trait]
pub trait Scheme: Send + Sync + 'static {
    /// The backend name.
    const NAME: &'static str;
    /// The prefix of its Redis keys.
    const PREFIX: &'static str;

    /// One attempt to take the lock.
    async fn try_lock(conn: &Baseline, req: &LockRequest<'_>) -> Result<Attempt>;
    /// Extends the lease by `ttl`.
    async fn extend(conn: &Baseline, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension>;
    /// Releases the lease.
    async fn release(conn: &Baseline, lease: &LeaseRef<'_>) -> Result<Released>;
}

/// A baseline lock: the commands of `S` on a connection of its own, with no fencing token.
pub struct BaselineLock<S> {
    conn: Baseline,
    scheme: PhantomData<S>,
}

impl<S: Scheme> BaselineLock<S> {
    /// Connects to the Redis server at `url`.
    pub async fn connect(url: &str) -> Result<Self> {
        Ok(BaselineLock {
            conn: Baseline::connect(S::NAME, S::PREFIX, url).await?,
            scheme: PhantomData,
        })
    }
}

impl<S> Clone for BaselineLock<S> {
    fn clone(&self) -> Self {
        BaselineLock {
            conn: self.conn.clone(),
            scheme: PhantomData,
        }
    }
}

impl<S> std::fmt::Debug for BaselineLock<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.conn.fmt(f)
    }
}

#[async_trait]
impl<S: Scheme> DistributedLock for BaselineLock<S> {
    fn backend_name(&self) -> &'static str {
        S::NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(FencingGuarantee::None)
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        S::try_lock(&self.conn, req).await
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        S::extend(&self.conn, lease, ttl).await
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        S::release(&self.conn, lease).await
    }
}
