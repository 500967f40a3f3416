//! Session-based leases follow their session: held, uncertain while suspended, lost on expiry.

mod support;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Attempt, Capabilities, Extension, LeaseRef, LockRequest, SessionState};
use dlock_core::{
    DistributedLock, DistributedLockExt, InMemoryLock, Lease, LeaseState, LockOptions, LostReason,
    Released, Result,
};
use support::settle;
use tokio::sync::watch;
use tokio::time::Instant;

/// The in-process lock, with every grant tied to one shared session the test controls.
#[derive(Debug)]
struct InSession {
    inner: InMemoryLock,
    session: watch::Sender<SessionState>,
}

#[async_trait]
impl DistributedLock for InSession {
    fn backend_name(&self) -> &'static str {
        "session"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities().with_sessions()
    }
    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        Ok(match self.inner.try_lock(req).await? {
            Attempt::Acquired(grant) => {
                Attempt::Acquired(grant.with_session(self.session.subscribe()))
            }
            busy => busy,
        })
    }
    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        self.inner.extend(lease, ttl).await
    }
    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        self.inner.release(lease).await
    }
}

fn setup() -> (Arc<dyn DistributedLock>, watch::Sender<SessionState>) {
    let (tx, _) = watch::channel(SessionState::Alive { until: None });
    let backend = InSession {
        inner: InMemoryLock::new(),
        session: tx.clone(),
    };
    (Arc::new(backend), tx)
}

/// [`setup`], with "k" held for a minute and the session's first state taken in.
async fn holding() -> (Arc<dyn DistributedLock>, watch::Sender<SessionState>, Lease) {
    let (locks, session) = setup();
    let lease = match locks
        .acquire("k", &LockOptions::new(Duration::from_secs(60)))
        .await
    {
        Ok(lease) => lease,
        Err(e) => panic!("acquire: {e}"),
    };
    settle().await;
    (locks, session, lease)
}

#[tokio::test(start_paused = true)]
async fn a_live_session_does_not_stretch_the_ttl() {
    let (locks, session) = setup();
    let opts = LockOptions::new(Duration::from_secs(2));
    let lease = locks.acquire("k", &opts).await.unwrap();
    let own_deadline = lease.valid_until();
    settle().await;
    // The session is vouched for far longer than the lease's TTL: the TTL still ends the lease.
    session.send_replace(SessionState::Alive {
        until: Some(Instant::now() + Duration::from_secs(3600)),
    });
    settle().await;
    assert_eq!(
        lease.state(),
        LeaseState::Held {
            until: own_deadline
        }
    );
    assert_eq!(lease.lost().await, LostReason::Expired);
    assert_eq!(Instant::now(), own_deadline);
}

#[tokio::test(start_paused = true)]
async fn the_earlier_bound_wins_and_each_moves_on_its_own() {
    let (locks, session) = setup();
    let opts = LockOptions::new(Duration::from_secs(10));
    let mut lease = locks.acquire("k", &opts).await.unwrap();
    let own_deadline = lease.valid_until();
    settle().await;
    let short = Instant::now() + Duration::from_secs(3);
    session.send_replace(SessionState::Alive { until: Some(short) });
    settle().await;
    assert_eq!(lease.valid_until(), short, "the session bound is earlier");
    // A later confirmation of the session moves its bound forward again, up to the TTL's.
    session.send_replace(SessionState::Alive { until: None });
    settle().await;
    assert_eq!(lease.valid_until(), own_deadline);
    // An extension moves the TTL deadline but not past a session bound in doubt.
    let doubt = Instant::now() + Duration::from_secs(5);
    session.send_replace(SessionState::Suspended { until: doubt });
    settle().await;
    lease.extend(Duration::from_secs(60)).await.unwrap();
    assert_eq!(lease.state(), LeaseState::Held { until: doubt });
    session.send_replace(SessionState::Alive { until: None });
    settle().await;
    assert!(lease.valid_until() > own_deadline, "{:?}", lease.state());
}

#[tokio::test(start_paused = true)]
async fn a_suspended_session_is_uncertain_then_lost_at_its_bound() {
    let (_locks, session, lease) = holding().await;
    let until = Instant::now() + Duration::from_secs(4);
    session.send_replace(SessionState::Suspended { until });
    settle().await;
    assert_eq!(lease.state(), LeaseState::Uncertain { until });
    session.send_replace(SessionState::Alive { until: None });
    settle().await;
    assert!(lease.is_held(), "reconnected in time: {:?}", lease.state());
    session.send_replace(SessionState::Suspended { until });
    let start = Instant::now();
    assert_eq!(lease.lost().await, LostReason::Expired);
    assert_eq!(start.elapsed(), Duration::from_secs(4));
}

#[tokio::test(start_paused = true)]
async fn a_lock_taken_over_in_a_live_session_is_lost_as_taken_over() {
    let (_locks, session, lease) = holding().await;
    session.send_replace(SessionState::TakenOver);
    settle().await;
    assert_eq!(lease.state(), LeaseState::Lost(LostReason::TakenOver));
}

#[tokio::test(start_paused = true)]
async fn an_expired_session_loses_the_lease_at_once() {
    let (locks, session) = setup();
    let lease = locks
        .acquire("k", &LockOptions::new(Duration::from_secs(60)))
        .await
        .unwrap();
    let watch = lease.watch();
    let lost = tokio::spawn(async move { (watch.lost().await, Instant::now()) });
    settle().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let expired_at = Instant::now();
    session.send_replace(SessionState::Expired);
    let (reason, at) = lost.await.unwrap();
    assert_eq!(reason, LostReason::SessionEnded);
    assert_eq!(at, expired_at);
    assert_eq!(lease.state(), LeaseState::Lost(LostReason::SessionEnded));
}
