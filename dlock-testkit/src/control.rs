//! The fault switches a harness hands to its cases: freeze one client's link, stop and start the
//! servers.

use async_trait::async_trait;

/// Freezes one client's link to the service, as a long process pause or a partition would.
pub trait Freeze: Send + Sync {
    /// Stops the client's traffic (its renewals or keep-alives) from reaching the service.
    fn freeze(&self);
    /// Lets it through again.
    fn thaw(&self);
}

/// Stops and starts the server behind a lock service, for outage cases and scenarios.
#[async_trait]
pub trait ServerControl: Send + Sync {
    /// Makes the service unreachable (stop the server or all of its members).
    async fn stop(&self) -> anyhow::Result<()>;
    /// Brings it back.
    async fn start(&self) -> anyhow::Result<()>;
}
