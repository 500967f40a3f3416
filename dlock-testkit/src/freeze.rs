//! Freezing the client side: a holder that stops renewing and keeps working.
//!
//! A garbage-collection pause, a swapped-out VM or a stopped container freezes the holder's
//! process: its renewals stop, its lease runs out on the server, and another client takes the
//! lock, while the holder itself notices nothing until it wakes. [`Freezable`] reproduces that for
//! any backend: while frozen, the wrapped client's extend calls (the renewals) do not reach the
//! server. A primitive's view of a frozen client ([`DistributedLock::primitive`]) is frozen by the
//! same switch.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{ExtendRequest, Extension, LeaseRef, Primitive};
use dlock_core::layer::Layer;
use dlock_core::{DistributedLock, Result};
use tokio::sync::watch;

/// A client whose renewals can be frozen and thawed.
#[derive(Debug, Clone)]
pub struct Freezable {
    inner: Arc<dyn DistributedLock>,
    frozen: Arc<watch::Sender<bool>>,
}

impl Freezable {
    /// Wraps `inner`, initially running.
    pub fn new(inner: Arc<dyn DistributedLock>) -> Self {
        Freezable {
            inner,
            frozen: Arc::new(watch::channel(false).0),
        }
    }

    /// Stops the client's renewals from reaching the server until [`thaw`](Self::thaw).
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Lets held-up and later renewals through again.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    async fn wait_thawed(&self) {
        let mut rx = self.frozen.subscribe();
        // An error means the sender is gone, which cannot happen while `self` lives.
        let _ = rx.wait_for(|frozen| !*frozen).await;
    }
}

impl crate::control::Freeze for Freezable {
    fn freeze(&self) {
        Freezable::freeze(self);
    }

    fn thaw(&self) {
        Freezable::thaw(self);
    }
}

#[async_trait]
impl Layer for Freezable {
    fn inner(&self) -> &dyn DistributedLock {
        self.inner.as_ref()
    }

    /// The view is wrapped too, sharing this client's switch: freezing the client freezes the
    /// renewals of its semaphore permits, read and write holds and leaderships as well.
    fn primitive(&self, primitive: &Primitive) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(Freezable {
            inner: self.inner.primitive(primitive)?,
            frozen: self.frozen.clone(),
        }))
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        self.wait_thawed().await;
        self.inner.extend(lease, ttl).await
    }

    async fn extend_many(&self, requests: &[ExtendRequest<'_>]) -> Vec<Result<Extension>> {
        self.wait_thawed().await;
        self.inner.extend_many(requests).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use dlock_core::{DistributedLockExt, InMemoryLock, LockOptions};

    use super::*;

    /// A permit held through a frozen client's semaphore view is not renewed while frozen (it
    /// runs out and another client takes it), and is renewed again once thawed.
    #[tokio::test]
    async fn a_primitive_view_of_a_frozen_client_is_frozen_too() {
        let table: Arc<dyn DistributedLock> = Arc::new(InMemoryLock::new());
        let client = Freezable::new(table.clone());
        let view = DistributedLock::primitive(&client, &Primitive::semaphore(1)).unwrap();
        let other = table.primitive(&Primitive::semaphore(1)).unwrap();
        let ttl = Duration::from_millis(300);
        let opts = LockOptions::new(ttl).with_auto_renew();

        // Running: auto-renew keeps the permit well past its TTL.
        let lease = view.acquire("permit", &opts).await.unwrap();
        tokio::time::sleep(ttl * 3).await;
        assert!(other.try_acquire("permit", &opts).await.unwrap().is_none());
        lease.release().await.unwrap();

        // Frozen: the renewals are held back, the permit runs out and passes to another client.
        let lease = view.acquire("permit", &opts).await.unwrap();
        client.freeze();
        let wait = LockOptions::new(ttl).with_wait(ttl * 4);
        let successor = other.acquire("permit", &wait).await.unwrap();
        assert!(successor.fencing_token() > lease.fencing_token());
        successor.release().await.unwrap();

        // Thawed: the view's calls reach the table again.
        client.thaw();
        drop(lease);
        let again = view.acquire("permit", &wait).await.unwrap();
        assert!(other.try_acquire("permit", &opts).await.unwrap().is_none());
        again.release().await.unwrap();
    }

    /// A view made while the client is already frozen shares the switch rather than a copy of
    /// its state: its hold runs out, and thawing the client lets its renewals through again.
    #[tokio::test]
    async fn the_view_carries_the_switch_not_a_copy_of_its_state() {
        let client = Freezable::new(Arc::new(InMemoryLock::new()));
        client.freeze();
        let view = DistributedLock::primitive(&client, &Primitive::Write).unwrap();
        let ttl = Duration::from_millis(200);
        let lease = view
            .acquire("w", &LockOptions::new(ttl).with_auto_renew())
            .await
            .unwrap();
        // Frozen before the view was made: its renewals are held back, so the hold runs out.
        tokio::time::timeout(ttl * 10, lease.watch().lost())
            .await
            .expect("the frozen view's hold must run out");
        drop(lease);
        client.thaw();
        let renewed = view
            .acquire("w", &LockOptions::new(ttl).with_auto_renew())
            .await
            .unwrap();
        tokio::time::sleep(ttl * 3).await;
        assert!(renewed.is_held());
        renewed.release().await.unwrap();
    }
}
