//! Faults on a three-member etcd cluster: a follower stops; the leader stops; the member a
//! client talks to is cut off; the holder's session lease ends behind its back; a client
//! connects while the cluster has no leader.
//!
//! Every trial runs the same scene — client A holds a lock, client B waits for it — breaks the
//! cluster, checks that the lock survives the break (A still holds it, B still waits, nobody
//! else gets it), that service goes on (A extends, a new lock can be taken, B gets the lock
//! promptly when A releases), then repairs the cluster. The trials share one cluster and break
//! it, so they run one at a time.
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-etcd --test faults
//! ```

#![allow(clippy::unwrap_used)]

mod support;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use dlock_core::{DistributedLockExt, Fenced, Lease, LeaseState, LockOptions, Released};
use dlock_etcd::EtcdLock;
use dlock_testkit::case;
use dlock_testkit::fixtures::{EtcdCluster, Member};
use dlock_testkit::trials::{self, Case};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use support::{client, raw, TRIAL_BUDGET};

/// Long enough to ride out an election (about 1–2 s with etcd's default timings).
const SESSION_TTL: Duration = Duration::from_secs(5);
/// How long the scene watches the broken cluster before it checks.
const BROKEN_FOR: Duration = Duration::from_secs(3);
/// Generous bound for "promptly" on a loaded two-core machine.
const PROMPT: Duration = Duration::from_secs(5);

fn cases() -> Vec<(&'static str, Case<Arc<EtcdCluster>>)> {
    vec![
        case!(a_follower_stops),
        case!(the_leader_stops),
        case!(the_member_in_use_is_cut_off),
        case!(the_session_lease_ends_behind_the_holders_back),
        case!(a_connect_during_an_election_waits_for_the_leader),
    ]
}

fn main() {
    trials::run_one_at_a_time(
        "etcd_faults",
        &cases(),
        TRIAL_BUDGET,
        "a three-member etcd cluster",
        || EtcdCluster::start(3),
    )
}

fn key(name: &str) -> String {
    format!(
        "faults/{:x}/{name}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    )
}

/// Records how long a lease spent uncertain, and whether it was ever lost.
struct Observer {
    task: JoinHandle<(Duration, bool)>,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl Observer {
    fn watch(lease: &Lease) -> Self {
        let view = lease.watch();
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut uncertain = Duration::ZERO;
            let mut lost = false;
            let tick = Duration::from_millis(20);
            loop {
                match view.state() {
                    LeaseState::Uncertain { .. } => uncertain += tick,
                    LeaseState::Lost(_) => lost = true,
                    _ => {}
                }
                tokio::select! {
                    _ = &mut stopped => return (uncertain, lost),
                    _ = tokio::time::sleep(tick) => {}
                }
            }
        });
        Observer { task, stop }
    }

    async fn finish(self) -> anyhow::Result<(Duration, bool)> {
        let _ = self.stop.send(());
        Ok(self.task.await?)
    }
}

/// A holding, B waiting, on one key.
struct Scene {
    key: String,
    a: Arc<EtcdLock>,
    b: Arc<EtcdLock>,
    lease: Lease,
    waiting: JoinHandle<dlock_core::Result<Lease>>,
    observer: Observer,
}

impl Scene {
    async fn set(cluster: &EtcdCluster, name: &str) -> anyhow::Result<Scene> {
        let endpoints = cluster.endpoints();
        let a = Arc::new(client(&endpoints, SESSION_TTL).await?);
        let b = Arc::new(client(&endpoints, SESSION_TTL).await?);
        let key = key(name);
        let lease = a
            .acquire(&key, &LockOptions::new(Duration::from_secs(60)))
            .await?;
        let waiting = {
            let (b, key) = (b.clone(), key.clone());
            let opts = LockOptions::new(Duration::from_secs(60)).with_wait(Duration::from_secs(90));
            tokio::spawn(async move { b.acquire(&key, &opts).await })
        };
        // B is queued once its key is on the server.
        let raw = raw(&endpoints).await?;
        support::eventually("B queues", PROMPT, || {
            let (raw, a, key) = (raw.clone(), a.clone(), key.clone());
            async move { Ok(support::contenders(&raw, &a, &key).await?.len() == 2) }
        })
        .await?;
        let observer = Observer::watch(&lease);
        Ok(Scene {
            key,
            a,
            b,
            lease,
            waiting,
            observer,
        })
    }

    /// The lock survived the break and service goes on; then A hands over to B.
    async fn check_and_hand_over(mut self, cluster: &EtcdCluster) -> anyhow::Result<()> {
        ensure!(
            !self.waiting.is_finished(),
            "B got the lock while A held it"
        );
        // A third client cannot take it either. It connects as a user's would, retrying while the
        // service is unavailable: the member cut off may have led the cluster, and a new client's
        // session lease waits for the others to elect a leader.
        let endpoints = cluster.endpoints();
        let third = Arc::new(
            retry("connect a third client", || {
                support::builder(&endpoints, SESSION_TTL).connect()
            })
            .await?,
        );
        let short = LockOptions::new(Duration::from_secs(5));
        let busy = retry("try_acquire by a third client", || {
            third.try_acquire(&self.key, &short)
        })
        .await?;
        ensure!(busy.is_none(), "a third client took the lock A holds");
        // A can still extend, after at most a few retries while the client fails over.
        let deadline = Instant::now() + PROMPT;
        loop {
            match self.lease.extend(Duration::from_secs(60)).await {
                Ok(()) => break,
                Err(e) if e.is_temporary() && Instant::now() < deadline => {
                    eprintln!("extend: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => bail!("A could not extend its lease: {e}"),
            }
        }
        let (uncertain, lost) = std::mem::replace(&mut self.observer, Observer::watch(&self.lease))
            .finish()
            .await?;
        ensure!(!lost, "A's lease was lost during the fault");
        support::eventually("A's lease is held again", PROMPT, || {
            let held = self.lease.is_held();
            async move { Ok(held) }
        })
        .await?;
        eprintln!("A's lease was uncertain for about {uncertain:?} and never lost");
        // Another lock can be taken and released.
        let other_key = format!("{}-other", self.key);
        let other = retry("acquire another key", || {
            self.a.try_acquire(&other_key, &short)
        })
        .await?
        .context("a free key was busy")?;
        other.release().await?;
        let first = self.lease.fencing_token();
        let released_at = Instant::now();
        ensure!(
            self.lease.release().await? == Released::Released,
            "A's release"
        );
        let successor = tokio::time::timeout(PROMPT, self.waiting)
            .await
            .context("B did not get the lock promptly after A released")???;
        eprintln!("hand-over to B after {:?}", released_at.elapsed());
        ensure!(successor.fencing_token() > first, "token did not grow");
        ensure!(successor.release().await? == Released::Released);
        let _ = self.observer.finish().await;
        drop((self.a, self.b));
        Ok(())
    }
}

/// Repeats `op` for a few seconds while it fails with a temporary error.
async fn retry<T, F, Fut>(what: &str, mut op: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = dlock_core::Result<T>>,
{
    let deadline = Instant::now() + PROMPT;
    loop {
        match op().await {
            Ok(value) => return Ok(value),
            Err(e) if e.is_temporary() && Instant::now() < deadline => {
                eprintln!("{what}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => bail!("{what}: {e}"),
        }
    }
}

async fn a_follower_stops(cluster: Arc<EtcdCluster>) -> anyhow::Result<()> {
    let leader = cluster.leader().await?;
    let follower = cluster.member((leader + 1) % 3)?.clone();
    let scene = Scene::set(&cluster, "follower").await?;
    while_stopped(&cluster, &follower, async {
        tokio::time::sleep(BROKEN_FOR).await;
        scene.check_and_hand_over(&cluster).await
    })
    .await
}

async fn the_leader_stops(cluster: Arc<EtcdCluster>) -> anyhow::Result<()> {
    let leader = cluster.member(cluster.leader().await?)?.clone();
    let scene = Scene::set(&cluster, "leader").await?;
    let stopped = Instant::now();
    while_stopped(&cluster, &leader, async {
        let new_leader = cluster.wait_for_leader(Duration::from_secs(30)).await?;
        eprintln!(
            "new leader (member {new_leader}) after {:?}",
            stopped.elapsed()
        );
        tokio::time::sleep(BROKEN_FOR).await;
        scene.check_and_hand_over(&cluster).await
    })
    .await
}

/// Runs `broken` while `member` is stopped, then starts it again and waits until the cluster is
/// whole, whatever `broken` found: the next case starts from a whole cluster.
async fn while_stopped(
    cluster: &EtcdCluster,
    member: &Member,
    broken: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    member.stop().await?;
    let result = broken.await;
    member.start().await?;
    cluster.wait_ready(Duration::from_secs(60)).await?;
    result
}

/// Each client talks to one member at a time; that member is cut off (its network endpoint
/// removed, so connections break and new ones are refused) — first the holder's, then the
/// waiter's. The client must move to another endpoint and carry on.
async fn the_member_in_use_is_cut_off(cluster: Arc<EtcdCluster>) -> anyhow::Result<()> {
    for whose in ["holder", "waiter"] {
        let scene = Scene::set(&cluster, &format!("cut-{whose}")).await?;
        let client = if whose == "holder" {
            scene.a.clone()
        } else {
            scene.b.clone()
        };
        let in_use = client.endpoint_in_use().to_owned();
        let index = cluster
            .endpoints()
            .iter()
            .position(|e| *e == in_use)
            .with_context(|| format!("{in_use} is not a member"))?;
        let member = cluster.member(index)?.clone();
        member.disconnect().await?;
        let cut_at = Instant::now();
        let result = async {
            support::eventually("the client fails over", PROMPT, || {
                let moved = client.endpoint_in_use() != in_use;
                async move { Ok(moved) }
            })
            .await?;
            eprintln!(
                "the {whose}'s client moved from {in_use} to {} after {:?}",
                client.endpoint_in_use(),
                cut_at.elapsed()
            );
            tokio::time::sleep(BROKEN_FOR).await;
            scene.check_and_hand_over(&cluster).await
        }
        .await;
        member.reconnect().await?;
        cluster.wait_ready(Duration::from_secs(60)).await?;
        result.with_context(|| format!("the {whose}'s member (member {index}) cut off"))?;
    }
    Ok(())
}

/// The holder's session lease is revoked behind its back (as an expiry would end it): its lost
/// signal fires at once, the waiter gets the lock, the old holder's late fenced write is
/// rejected, and the old holder's client recovers with a new session.
async fn the_session_lease_ends_behind_the_holders_back(
    cluster: Arc<EtcdCluster>,
) -> anyhow::Result<()> {
    let scene = Scene::set(&cluster, "revoked").await?;
    let resource = Fenced::new(Vec::new());
    resource.write(scene.lease.fencing_token(), |log| log.push("A"))?;
    let session = scene.a.session_lease().context("A has no session")?;
    let signal = scene.lease.lost();
    let mut raw = raw(&cluster.endpoints()).await?;
    let ended = Instant::now();
    raw.lease_revoke(session).await?;
    let reason = tokio::time::timeout(Duration::from_secs(2), signal)
        .await
        .context("A's lost signal did not fire")?;
    eprintln!(
        "A's lost signal fired {:?} after the revocation ({reason})",
        ended.elapsed()
    );
    let successor = tokio::time::timeout(PROMPT, scene.waiting)
        .await
        .context("B did not get the lock")???;
    resource.write(successor.fencing_token(), |log| log.push("B"))?;
    match resource.write(scene.lease.fencing_token(), |log| log.push("A, late")) {
        Err(stale) => ensure!(stale.highest == successor.fencing_token()),
        Ok(()) => bail!("A's late write was admitted after B's"),
    }
    ensure!(scene.lease.release().await? != Released::Released);
    ensure!(
        resource.read(|log| log.clone()) == ["A", "B"],
        "the resource holds a stale write"
    );
    successor.release().await?;
    let short = LockOptions::new(Duration::from_secs(5));
    let again = retry("A acquires again", || {
        scene.a.try_acquire(&scene.key, &short)
    })
    .await?
    .context("the key is busy")?;
    ensure!(
        scene.a.session_lease() != Some(session),
        "the revoked session was reused"
    );
    again.release().await?;
    let _ = scene.observer.finish().await;
    Ok(())
}

/// Two members stop, so the third has no leader and answers so; a client connecting to it
/// meanwhile waits (within its connect timeout) instead of failing at once, and is connected once
/// the members are back and have elected a leader.
async fn a_connect_during_an_election_waits_for_the_leader(
    cluster: Arc<EtcdCluster>,
) -> anyhow::Result<()> {
    let stopped = [cluster.member(1)?.clone(), cluster.member(2)?.clone()];
    for member in &stopped {
        member.stop().await?;
    }
    let result = async {
        let remaining = cluster.endpoints()[..1].to_vec();
        // The member notices the lost quorum within an election timeout (1 s by default).
        tokio::time::sleep(Duration::from_secs(3)).await;
        let started = Instant::now();
        let connecting = tokio::spawn(
            support::builder(&remaining, SESSION_TTL)
                .with_connect_timeout(Duration::from_secs(30))
                .connect(),
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        ensure!(
            !connecting.is_finished(),
            "the connect ended while the cluster had no leader: {:?}",
            connecting.await?.map(|_| ())
        );
        for member in &stopped {
            member.start().await?;
        }
        let client = Arc::new(
            connecting
                .await?
                .context("the connect made during the election")?,
        );
        eprintln!(
            "connected {:?} after the connect began (the members came back after 2 s)",
            started.elapsed()
        );
        let lease = client
            .try_acquire(&key("after-election"), &LockOptions::new(SESSION_TTL))
            .await?
            .context("the key is busy")?;
        lease.release().await?;
        anyhow::Ok(())
    }
    .await;
    for member in &stopped {
        // Started already unless the case failed before; starting a running member is a no-op.
        let _ = member.start().await;
    }
    cluster.wait_ready(Duration::from_secs(60)).await?;
    result
}
