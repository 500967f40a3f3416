//! Five independent Redis masters, spoken to by `dlock-redlock`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use dlock_core::DistributedLock;
use dlock_testkit::fixtures::redis::set_clock_offset;
use dlock_testkit::fixtures::RedisMasters;

use super::freeze::Proxies;
use super::{fault_error, FreezableClient, Target};
use crate::Backend;

/// The master the server-side faults hit: one of the holder's bare quorum.
const FAULTY: usize = 2;

/// `dlock-redlock` clients of [`RedisMasters::DEFAULT_COUNT`] masters.
pub struct RedlockTarget {
    backend: &'static Backend,
    masters: Arc<RedisMasters>,
    /// The delayed-restart rule's longest TTL, if the rule is on.
    delayed_restart: Option<Duration>,
    /// The holder's proxies while scenario 7 runs.
    partitioned: Mutex<Option<Arc<Proxies>>>,
    /// The proxies of bare-quorum holders, kept as long as the target.
    held: Mutex<Vec<Arc<Proxies>>>,
}

impl std::fmt::Debug for RedlockTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockTarget")
            .field("masters", &self.masters)
            .finish()
    }
}

impl RedlockTarget {
    /// `backend`'s clients of `masters`, with the delayed-restart rule for leases up to
    /// `delayed_restart`.
    pub fn new(
        backend: &'static Backend,
        masters: Arc<RedisMasters>,
        delayed_restart: Option<Duration>,
    ) -> Self {
        RedlockTarget {
            backend,
            masters,
            delayed_restart,
            partitioned: Mutex::new(None),
            held: Mutex::new(Vec::new()),
        }
    }

    async fn connect(&self, urls: &[String]) -> anyhow::Result<Arc<dyn DistributedLock>> {
        // The default node timeout (TTL / 200) is too tight for a loaded test machine.
        let mut params = "request_timeout=200ms".to_owned();
        if let Some(max_ttl) = self.delayed_restart {
            params += &format!("&delayed_restart={}ms", max_ttl.as_millis());
        }
        let url = self.backend.url(urls, &params);
        Ok(dlock::connect(&url).await?.backend().clone())
    }

    /// A client through proxies to every master, and the proxies.
    async fn proxied(&self) -> anyhow::Result<(Arc<dyn DistributedLock>, Arc<Proxies>)> {
        let proxies = Arc::new(Proxies::start(&self.masters.urls()).await?);
        let urls: Vec<String> = proxies
            .addrs()
            .iter()
            .map(|a| format!("redis://{a}"))
            .collect();
        Ok((self.connect(&urls).await?, proxies))
    }

    fn quorum(&self) -> usize {
        self.masters.len() / 2 + 1
    }
}

#[async_trait]
impl Target for RedlockTarget {
    async fn client(&self) -> anyhow::Result<Arc<dyn DistributedLock>> {
        self.connect(&self.masters.urls()).await
    }

    async fn freezable(&self) -> anyhow::Result<FreezableClient> {
        let (client, proxies) = self.proxied().await?;
        Ok((client, proxies))
    }

    fn fencing(&self) -> bool {
        true
    }

    fn abandon_bound(&self, ttl: Duration) -> Duration {
        ttl
    }

    async fn holder_client(&self) -> anyhow::Result<Arc<dyn DistributedLock>> {
        // Reaches masters 0..quorum only, so its locks live on a bare quorum.
        let (client, proxies) = self.proxied().await?;
        proxies.freeze_only(self.quorum()..self.masters.len());
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(proxies);
        Ok(client)
    }

    async fn restart_without_data(&self) -> anyhow::Result<()> {
        let member = self.masters.member(FAULTY).map_err(fault_error)?;
        member.restart_keep_data().await?;
        Ok(())
    }

    async fn jump_clock(&self, ahead: Duration) -> anyhow::Result<()> {
        let member = self.masters.member(FAULTY).map_err(fault_error)?;
        set_clock_offset(member, i64::try_from(ahead.as_millis())?).await?;
        Ok(())
    }

    async fn restore_clock(&self) -> anyhow::Result<()> {
        let member = self.masters.member(FAULTY).map_err(fault_error)?;
        set_clock_offset(member, 0).await?;
        Ok(())
    }

    async fn partition_clients(
        &self,
    ) -> anyhow::Result<(Arc<dyn DistributedLock>, Arc<dyn DistributedLock>)> {
        let (holder, proxies) = self.proxied().await?;
        *self
            .partitioned
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(proxies);
        Ok((holder, self.client().await?))
    }

    async fn isolate(&self) -> anyhow::Result<()> {
        // The holder keeps a minority of the masters.
        let proxies = self
            .partitioned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let proxies = proxies.context("partition_clients first")?;
        proxies.freeze_only(self.masters.len() - self.quorum()..self.masters.len());
        Ok(())
    }

    async fn rejoin(&self) -> anyhow::Result<()> {
        if let Some(proxies) = self
            .partitioned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            dlock_testkit::Freeze::thaw(&*proxies);
        }
        Ok(())
    }
}
