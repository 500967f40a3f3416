//! The in-process backend: every client shares one lock table.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{DistributedLock, InMemoryLock};
use dlock_testkit::Freezable;

use super::{FreezableClient, Target};

/// `InMemoryLock`; a frozen client's renewals are held back ([`Freezable`]).
#[derive(Debug, Default)]
pub struct MemoryTarget {
    table: Arc<InMemoryLock>,
}

#[async_trait]
impl Target for MemoryTarget {
    async fn client(&self) -> anyhow::Result<Arc<dyn DistributedLock>> {
        Ok(self.table.clone())
    }

    async fn freezable(&self) -> anyhow::Result<FreezableClient> {
        let client = Freezable::new(self.table.clone());
        Ok((Arc::new(client.clone()), Arc::new(client)))
    }

    fn fencing(&self) -> bool {
        true
    }

    fn abandon_bound(&self, ttl: Duration) -> Duration {
        ttl
    }
}
