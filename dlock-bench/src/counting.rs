//! A backend wrapper that counts renewal traffic: leases renewed and requests sent for them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{ExtendRequest, Extension, LeaseRef};
use dlock_core::layer::Layer;
use dlock_core::{DistributedLock, Result};

/// Counts what passes through `extend` and `extend_many`.
#[derive(Debug)]
pub struct Counting {
    inner: Arc<dyn DistributedLock>,
    /// How many leases the backend renews per request in `extend_many`, if it batches on the wire;
    /// otherwise the default `extend_many` runs here, so that each `extend` is counted.
    wire_batch: Option<usize>,
    renewals: AtomicU64,
    requests: AtomicU64,
}

impl Counting {
    pub fn new(inner: Arc<dyn DistributedLock>, wire_batch: Option<usize>) -> Self {
        Counting {
            inner,
            wire_batch,
            renewals: AtomicU64::new(0),
            requests: AtomicU64::new(0),
        }
    }

    /// (leases renewed, requests sent) since the last call.
    pub fn take(&self) -> (u64, u64) {
        (
            self.renewals.swap(0, Ordering::Relaxed),
            self.requests.swap(0, Ordering::Relaxed),
        )
    }
}

#[async_trait]
impl Layer for Counting {
    fn inner(&self) -> &dyn DistributedLock {
        self.inner.as_ref()
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        self.renewals.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.inner.extend(lease, ttl).await
    }

    async fn extend_many(&self, requests: &[ExtendRequest<'_>]) -> Vec<Result<Extension>> {
        match self.wire_batch {
            Some(batch) => {
                let n = requests.len() as u64;
                self.renewals.fetch_add(n, Ordering::Relaxed);
                self.requests
                    .fetch_add(n.div_ceil(batch.max(1) as u64), Ordering::Relaxed);
                self.inner.extend_many(requests).await
            }
            None => {
                futures::future::join_all(
                    requests
                        .iter()
                        .map(|r| Layer::extend(self, &r.lease, r.ttl)),
                )
                .await
            }
        }
    }
}
