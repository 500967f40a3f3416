//! Connection strings: `redlock://[user[:password]@]host[:port],host[:port],…[/db][?parameters]`,
//! one Redis master per host, sharing the credentials and the database.
//!
//! Parameters: `prefix`, `quorum`, `request_timeout` (each master's), `connect_timeout`,
//! `retry_jitter`, `fencing` (`true`/`false`), `delayed_restart`, `fence_ttl`, `owner`. Masters that need
//! their own credentials or TLS settings are given one URL each to
//! [`RedlockBuilder::from_urls`].

use dlock_core::backend::url::{ConnectUrl, FromUrl};
use dlock_core::Result;

use crate::RedlockBuilder;

/// The scheme of a Redlock connection string.
pub const SCHEME: &str = "redlock";

impl FromUrl for RedlockBuilder {
    const SCHEMES: &'static [&'static str] = &[SCHEME];
    const PARAMETERS: &'static [&'static str] = &[
        "prefix",
        "quorum",
        "request_timeout",
        "connect_timeout",
        "retry_jitter",
        "fencing",
        "delayed_restart",
        "fence_ttl",
        "owner",
    ];

    fn from_connect_url(url: &mut ConnectUrl) -> Result<Self> {
        let builder = RedlockBuilder::from_urls(url.per_host("redis")?);
        let builder = dlock_core::backend::apply_parameters!(url, builder, {
            "prefix" => take_text => Self::with_prefix,
            "quorum" => take_count => Self::with_quorum,
            "request_timeout" => take_duration => Self::with_request_timeout,
            "connect_timeout" => take_duration => Self::with_connect_timeout,
            "retry_jitter" => take_duration => Self::with_retry_jitter,
            "fencing" => take_bool => Self::with_fencing,
            "delayed_restart" => take_duration => Self::with_delayed_restart,
            "fence_ttl" => take_duration => Self::with_fence_ttl,
            "owner" => take_text => Self::with_owner,
        });
        Ok(builder)
    }
}
