//! One shape for everything a workload drives: dlock itself, each server's floor (the bare round
//! trips a lock cycle cannot avoid) and the peers (other lock implementations).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::layer::{Metered, Traced};
use dlock_core::{DistributedLock, DistributedLockExt, Leadership, Lease, LockOptions};
use futures::future::BoxFuture;

/// Something that takes a named lock and gives it back.
#[async_trait]
pub trait Locker: Send + Sync {
    /// Takes `key`, waiting while it is busy. Floors do not exclude anyone: they only pay the
    /// round trips, so workloads that need exclusion (the hot key) never use them.
    async fn acquire(&self, key: &str) -> anyhow::Result<Held>;
}

/// A held lock, given back by [`Release::release`].
pub type Held = Box<dyn Release>;

/// Gives a held lock back.
#[async_trait]
pub trait Release: Send {
    async fn release(self: Box<Self>) -> anyhow::Result<()>;
}

/// Makes a new client for one contender (a client of its own, as separate processes would have).
pub type Connect =
    Arc<dyn Fn() -> BoxFuture<'static, anyhow::Result<Arc<dyn Locker>>> + Send + Sync>;

/// Makes a new dlock client of a backend (a connection or session of its own).
pub type Client =
    Arc<dyn Fn() -> BoxFuture<'static, anyhow::Result<Arc<dyn DistributedLock>>> + Send + Sync>;

/// A [`Client`] that calls `connect(address)`.
pub fn client<F, Fut>(address: String, connect: F) -> Client
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<Arc<dyn DistributedLock>>> + Send + 'static,
{
    Arc::new(move || Box::pin(connect(address.clone())))
}

/// What a side is, for the ratios.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Dlock,
    /// dlock with the tracing and metrics layers on, compared with plain dlock.
    Layered,
    Floor,
    Peer,
    /// One of dlock's primitives, compared with dlock's lock and with the peer's recipe for the
    /// same primitive.
    Primitive(Recipe),
    /// A peer's recipe for a primitive.
    PrimitivePeer(Recipe),
}

/// Which primitive a side measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Recipe {
    /// One permit of a one-permit semaphore: taken and given back.
    Permit,
    /// A campaign that wins, then a resignation; on the hot key, the hand-over between leaders.
    Election,
}

/// One row of a backend's comparison.
pub struct Side {
    pub kind: Kind,
    /// What it is, e.g. `2 × EVALSHA "return 1"`.
    pub label: String,
    pub locker: Arc<dyn Locker>,
    /// New contenders for the hot key; `None` for floors.
    pub connect: Option<Connect>,
}

impl Side {
    /// dlock on `locks`; the hot key's contenders get clients of their own from `client`.
    pub fn dlock(label: &str, locks: &Arc<dyn DistributedLock>, client: &Client) -> Side {
        let client = client.clone();
        Side {
            kind: Kind::Dlock,
            label: label.to_owned(),
            locker: Arc::new(Dlock::new(locks.clone())),
            connect: Some(Arc::new(move || {
                let connecting = client();
                Box::pin(
                    async move { Ok(Arc::new(Dlock::new(connecting.await?)) as Arc<dyn Locker>) },
                )
            })),
        }
    }

    /// dlock on `locks` inside the tracing and metrics layers, for their cost next to plain
    /// dlock; no hot key (its contenders would measure the backend again, not the layers).
    pub fn layered(locks: &Arc<dyn DistributedLock>) -> Side {
        let layered: Arc<dyn DistributedLock> = Arc::new(Metered::new(Traced::new(locks.clone())));
        Side {
            kind: Kind::Layered,
            label: "dlock + tracing + metrics".to_owned(),
            locker: Arc::new(Dlock::new(layered)),
            connect: None,
        }
    }

    /// dlock's primitives on `locks`, where the backend declares them: a one-permit semaphore
    /// and an election, each with contenders of their own on the hot key.
    pub fn primitives(locks: &Arc<dyn DistributedLock>, client: &Client) -> Vec<Side> {
        let declared = locks.capabilities().primitives;
        let mut sides = Vec::new();
        for (recipe, label, served) in [
            (
                Recipe::Permit,
                "dlock semaphore: 1 permit",
                declared.semaphore,
            ),
            (
                Recipe::Election,
                "dlock election: campaign + resign",
                declared.election,
            ),
        ] {
            if !served {
                continue;
            }
            let client = client.clone();
            sides.push(Side {
                kind: Kind::Primitive(recipe),
                label: label.to_owned(),
                locker: Arc::new(Primitive::new(locks.clone(), recipe)),
                connect: Some(Arc::new(move || {
                    let connecting = client();
                    Box::pin(async move {
                        Ok(Arc::new(Primitive::new(connecting.await?, recipe)) as Arc<dyn Locker>)
                    })
                })),
            });
        }
        sides
    }

    /// A floor: bare round trips, no exclusion, so no hot key.
    pub fn floor(label: &str, locker: Arc<dyn Locker>) -> Side {
        Side {
            kind: Kind::Floor,
            label: label.to_owned(),
            locker,
            connect: None,
        }
    }

    /// A side whose hot-key contenders all share `locker`, as tasks of one process do.
    pub fn shared(kind: Kind, label: &str, locker: Arc<dyn Locker>) -> Side {
        let shared = locker.clone();
        Side {
            kind,
            label: label.to_owned(),
            locker,
            connect: Some(Arc::new(move || {
                let shared = shared.clone();
                Box::pin(async move { Ok(shared) })
            })),
        }
    }
}

/// dlock's own acquire and release, on any backend.
pub struct Dlock {
    pub locks: Arc<dyn DistributedLock>,
    pub opts: LockOptions,
}

impl Dlock {
    /// A 30 s lease, waiting up to a minute.
    pub fn new(locks: Arc<dyn DistributedLock>) -> Self {
        let opts = LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(60));
        Dlock { locks, opts }
    }
}

#[async_trait]
impl Locker for Dlock {
    async fn acquire(&self, key: &str) -> anyhow::Result<Held> {
        Ok(Box::new(self.locks.acquire(key, &self.opts).await?))
    }
}

/// A dlock primitive held like a lock: a permit, or a leadership.
pub struct Primitive {
    locks: Arc<dyn DistributedLock>,
    recipe: Recipe,
    opts: LockOptions,
}

impl Primitive {
    /// A 30 s lease, waiting up to a minute, as [`Dlock::new`].
    pub fn new(locks: Arc<dyn DistributedLock>, recipe: Recipe) -> Self {
        let opts = Dlock::new(locks.clone()).opts;
        Primitive {
            locks,
            recipe,
            opts,
        }
    }
}

#[async_trait]
impl Locker for Primitive {
    async fn acquire(&self, key: &str) -> anyhow::Result<Held> {
        Ok(match self.recipe {
            Recipe::Permit => Box::new(self.locks.semaphore(key, 1)?.acquire(&self.opts).await?),
            Recipe::Election => Box::new(
                self.locks
                    .election(key)?
                    .campaign("bench", &self.opts)
                    .await?,
            ),
        })
    }
}

#[async_trait]
impl Release for Leadership {
    async fn release(self: Box<Self>) -> anyhow::Result<()> {
        Leadership::resign(*self).await?;
        Ok(())
    }
}

#[async_trait]
impl Release for Lease {
    async fn release(self: Box<Self>) -> anyhow::Result<()> {
        Lease::release(*self).await?;
        Ok(())
    }
}

/// The in-process peer: one `tokio::sync::Mutex` per key, found in a table like the in-process
/// backend's.
#[derive(Default)]
pub struct TokioMutexes {
    table: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

#[async_trait]
impl Locker for TokioMutexes {
    async fn acquire(&self, key: &str) -> anyhow::Result<Held> {
        let mutex = {
            let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
            table.entry(key.to_owned()).or_default().clone()
        };
        Ok(Box::new(mutex.lock_owned().await))
    }
}

#[async_trait]
impl Release for tokio::sync::OwnedMutexGuard<()> {
    async fn release(self: Box<Self>) -> anyhow::Result<()> {
        drop(self);
        Ok(())
    }
}
