//! The baselines' Redis connection: reconnecting, and bounded like `dlock-redis`'s.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// Every request gives up after this, as `dlock-redis`'s default request timeout does.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// A connection to `url` that reconnects after a restart and never waits longer than 1 s.
pub(crate) async fn connect(url: &str) -> redis::RedisResult<ConnectionManager> {
    let client = redis::Client::open(url)?;
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(REQUEST_TIMEOUT))
        .set_connection_timeout(Some(REQUEST_TIMEOUT));
    ConnectionManager::new_with_config(client, config).await
}

/// A Redis error as a temporary backend error of `backend`.
pub(crate) fn error(backend: &'static str, e: redis::RedisError) -> dlock_core::Error {
    dlock_core::Error::backend(backend, true, e)
}
