//! The fault switches a harness hands to its cases: freeze one client's link, stop and start the
//! servers.

use async_trait::async_trait;
use tokio::runtime::Handle;

use crate::fixtures::Member;

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

/// Stops and starts every one of some container members, each on the runtime that created
/// its fixture (Docker calls must run there, whichever runtime a case calls from). Without a
/// runtime — a run that opted out of Docker — both fail.
pub struct Members {
    handle: Option<Handle>,
    members: Vec<Member>,
}

impl Members {
    /// Controls `members`, created on the runtime of `handle`.
    pub fn new(handle: Handle, members: Vec<Member>) -> Self {
        Self {
            handle: Some(handle),
            members,
        }
    }

    /// A control of no servers, for the placeholder subject of a run without Docker.
    pub fn none() -> Self {
        Self {
            handle: None,
            members: Vec::new(),
        }
    }

    async fn each(&self, start: bool) -> anyhow::Result<()> {
        let Some(handle) = &self.handle else {
            anyhow::bail!("no servers in a run without Docker");
        };
        let mut tasks = Vec::new();
        for member in self.members.clone() {
            tasks.push(handle.spawn(async move {
                if start {
                    member.start().await
                } else {
                    member.stop().await
                }
            }));
        }
        anyhow::ensure!(!tasks.is_empty(), "no servers to control");
        for task in tasks {
            task.await??;
        }
        Ok(())
    }
}

#[async_trait]
impl ServerControl for Members {
    async fn stop(&self) -> anyhow::Result<()> {
        self.each(false).await
    }

    async fn start(&self) -> anyhow::Result<()> {
        self.each(true).await
    }
}
