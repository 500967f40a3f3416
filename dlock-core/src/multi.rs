//! Several keys at once: every key or none, without deadlock between overlapping sets.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::future::{join_all, select_all};
use tokio::time::Instant;

use crate::backend::{DistributedLock, Released};
use crate::error::LostReason;
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::lease::Lease;
use crate::options::LockOptions;
use crate::state::{Expiring, LeaseState};
use crate::token::FencingToken;

/// The most keys one [`acquire_all`](crate::DistributedLockExt::acquire_all) may name.
pub const MAX_KEYS: usize = 1024;

/// Holds every key of one [`acquire_all`](crate::DistributedLockExt::acquire_all): one
/// [`Lease`] per key, in key order, each with its own fencing token.
///
/// The hold is as good as its weakest lease: [`state`](MultiLease::state) is lost as soon as
/// any lease is lost, and [`lost`](MultiLease::lost) completes then.
#[derive(Debug)]
pub struct MultiLease {
    leases: Vec<Lease>,
}

impl MultiLease {
    /// The leases, in key order.
    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    /// The lease on `key`, if it is one of the keys.
    pub fn get(&self, key: &str) -> Option<&Lease> {
        self.leases
            .binary_search_by(|lease| lease.key().cmp(key))
            .ok()
            .map(|index| &self.leases[index])
    }

    /// The fencing token of `key`, if it is one of the keys.
    pub fn fencing_token(&self, key: &str) -> Option<FencingToken> {
        self.get(key).map(Lease::fencing_token)
    }

    /// The weakest state among the leases: lost if any is lost, else uncertain if any is
    /// uncertain (until the earliest deadline), else held until the earliest deadline.
    pub fn state(&self) -> LeaseState {
        let states = self.leases.iter().map(Lease::state);
        let mut weakest: Option<LeaseState> = None;
        for state in states {
            weakest = Some(match (weakest, state) {
                (None, s) => s,
                (Some(lost @ LeaseState::Lost(_)), _) | (_, lost @ LeaseState::Lost(_)) => lost,
                (Some(LeaseState::Uncertain { until: a }), LeaseState::Uncertain { until: b })
                | (Some(LeaseState::Uncertain { until: a }), LeaseState::Held { until: b })
                | (Some(LeaseState::Held { until: a }), LeaseState::Uncertain { until: b }) => {
                    LeaseState::Uncertain { until: a.min(b) }
                }
                (Some(LeaseState::Held { until: a }), LeaseState::Held { until: b }) => {
                    LeaseState::Held { until: a.min(b) }
                }
            });
        }
        weakest.unwrap_or(LeaseState::Lost(LostReason::Released))
    }

    /// Whether every lease is held now.
    pub fn is_held(&self) -> bool {
        self.state().is_held()
    }

    /// Completes when the first of the leases is lost, with its reason.
    pub fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        let losses: Vec<_> = self.leases.iter().map(|l| Box::pin(l.lost())).collect();
        async move {
            if losses.is_empty() {
                return LostReason::Released;
            }
            select_all(losses).await.0
        }
    }

    /// Completes when the first of the leases is lost or comes within `margin` of its validity
    /// deadline with no renewal moving it: see [`LeaseWatch::expiring`](crate::LeaseWatch::expiring).
    pub fn expiring(
        &self,
        margin: std::time::Duration,
    ) -> impl std::future::Future<Output = Expiring> + Send + 'static {
        let ends: Vec<_> = self
            .leases
            .iter()
            .map(|l| Box::pin(l.expiring(margin)))
            .collect();
        async move {
            if ends.is_empty() {
                return Expiring::Lost(LostReason::Released);
            }
            select_all(ends).await.0
        }
    }

    /// Releases every key (all at once) and says what happened to each, in key order; the
    /// first error, if any release failed (the others are still released).
    pub async fn release(self) -> Result<Vec<Released>> {
        join_all(self.leases.into_iter().map(Lease::release))
            .await
            .into_iter()
            .collect()
    }
}

/// The keys, validated, without repeats, in the one order every client takes them in.
fn ordered(keys: &[&str]) -> Result<Vec<LockKey>> {
    if keys.is_empty() {
        return Err(Error::invalid("keys", "must name at least one key"));
    }
    if keys.len() > MAX_KEYS {
        return Err(Error::invalid(
            "keys",
            format!("at most {MAX_KEYS} keys, not {}", keys.len()),
        ));
    }
    let mut set = BTreeSet::new();
    for key in keys {
        if !set.insert(LockKey::new(key)?) {
            return Err(Error::invalid("keys", format!("{key:?} is named twice")));
        }
    }
    Ok(set.into_iter().collect())
}

/// Takes every key in `keys`, waiting up to `opts.wait` in all, or none.
///
/// Deadlock-free by order: every client takes its keys in one global order (byte order of the
/// key), so two clients naming overlapping sets in any order never wait on each other in a
/// cycle. On a timeout or an error, the keys already taken are released before it returns.
pub(crate) async fn acquire_all(
    backend: Arc<dyn DistributedLock>,
    keys: &[&str],
    opts: &LockOptions,
    wait: bool,
) -> Result<Option<MultiLease>> {
    let keys = ordered(keys)?;
    opts.validate()?;
    let deadline = opts.wait.map(|wait| Instant::now() + wait);
    let mut leases = Vec::with_capacity(keys.len());
    for key in &keys {
        let taken = if wait {
            let mut opts = opts.clone();
            if let Some(deadline) = deadline {
                opts.wait = Some(deadline.saturating_duration_since(Instant::now()));
            }
            crate::acquire::acquire(backend.clone(), Ok(key.clone()), &opts)
                .await
                .map(Some)
        } else {
            crate::acquire::try_acquire(backend.clone(), Ok(key.clone()), opts).await
        };
        match taken {
            Ok(Some(lease)) => leases.push(lease),
            Ok(None) => {
                give_back(leases).await;
                return Ok(None);
            }
            Err(error) => {
                give_back(leases).await;
                return Err(match error {
                    Error::Timeout { .. } => Error::Timeout {
                        key: keys
                            .iter()
                            .map(LockKey::as_str)
                            .collect::<Vec<_>>()
                            .join(", "),
                        waited: opts.wait.unwrap_or_default(),
                    },
                    other => other,
                });
            }
        }
    }
    Ok(Some(MultiLease { leases }))
}

/// Releases what a failed `acquire_all` took; a failure leaves the key to its TTL.
async fn give_back(leases: Vec<Lease>) {
    for result in join_all(leases.into_iter().map(Lease::release)).await {
        if let Err(error) = result {
            tracing::debug!(%error, "giving back a key of a failed acquire_all; its TTL frees it");
        }
    }
}
