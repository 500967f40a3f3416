//! Freezing a network client: proxies in front of every endpoint, switched together.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use dlock_testkit::{Freeze, FreezeProxy};

/// The proxies of one client; freezing freezes all of them.
pub(crate) struct Proxies {
    proxies: Vec<FreezeProxy>,
    switches: Vec<Arc<dyn Freeze>>,
}

impl Proxies {
    /// One proxy per `host:port` endpoint (a scheme such as `http://` or `redis://` and any path
    /// are ignored).
    pub(crate) async fn start(endpoints: &[String]) -> anyhow::Result<Proxies> {
        let mut proxies = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let bare = endpoint.split("://").last().unwrap_or(endpoint);
            let bare = bare.split('/').next().unwrap_or(bare);
            let target: SocketAddr = bare.parse().with_context(|| {
                format!("freezing a client needs host:port endpoints, got {endpoint:?}")
            })?;
            proxies.push(FreezeProxy::start(target).await?);
        }
        let switches = proxies.iter().map(FreezeProxy::switch).collect();
        Ok(Proxies { proxies, switches })
    }

    /// Freezes only the links to the endpoints at `indices`: a client partitioned from some
    /// servers only.
    pub(crate) fn freeze_only(&self, indices: std::ops::Range<usize>) {
        self.switches
            .iter()
            .enumerate()
            .filter(|(i, _)| indices.contains(i))
            .for_each(|(_, s)| s.freeze());
    }

    /// The `127.0.0.1:PORT` addresses clients should use instead, in the endpoints' order.
    pub(crate) fn addrs(&self) -> Vec<String> {
        self.proxies.iter().map(|p| p.addr().to_string()).collect()
    }
}

impl Freeze for Proxies {
    fn freeze(&self) {
        self.switches.iter().for_each(|s| s.freeze());
    }

    fn thaw(&self) {
        self.switches.iter().for_each(|s| s.thaw());
    }
}
