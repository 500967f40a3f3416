//! What both baselines share: a name, a key prefix, and a Redis connection that reconnects and is
//! bounded like `dlock-redis`'s.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// Every request gives up after this, as `dlock-redis`'s default request timeout does.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// A baseline's name, its key prefix and its connection.
#[derive(Clone)]
pub(crate) struct Baseline {
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
    pub(crate) fn key(&self, key: &dlock_core::LockKey) -> String {
        format!("{}{key}", self.prefix)
    }
}
