//! The fault cases, in the order they run.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use dlock_core::{
    DistributedLockExt, Fenced, Lease, LeaseState, LockOptions, LostReason, Released,
};
use dlock_testkit::case;
use dlock_testkit::fixtures::{four_letter_word, Member, ZkEnsemble};
use dlock_testkit::trials::{self, Case};
use dlock_zk::ZkLock;
use libtest_mimic::Trial;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::support::{client, raw, url, SHORT_SESSION, TRIAL_BUDGET};

/// Session timeout of clients that must survive a leader election: the most a 500 ms tick
/// allows (20 ticks).
const LONG_SESSION: Duration = Duration::from_secs(10);

/// How long the ensemble may take to elect a leader and serve again.
const ELECTION: Duration = Duration::from_secs(60);

/// What every case gets: the ensemble, the runtime that owns its Docker connection (fault
/// controls run there, not on the case's own runtime), and a lock parent emptied at start-up.
#[derive(Clone)]
pub struct Ctx {
    ensemble: Arc<ZkEnsemble>,
    fixtures: tokio::runtime::Handle,
    emptied: Arc<Emptied>,
}

/// A lock parent whose last contender left at `at`.
#[derive(Debug)]
pub struct Emptied {
    pub parent: String,
    pub at: Instant,
}

const PREFIX: &str = "zookeeper-ensemble";

fn cases() -> Vec<(&'static str, Case<Ctx>)> {
    vec![
        case!(follower_stops_and_locks_keep_working),
        case!(leader_stops_and_the_lease_survives_the_election),
        case!(cut_off_holder_loses_its_session_and_is_fenced),
        case!(fifty_waiters_and_one_release_wake_exactly_one),
        case!(empty_parents_are_removed_by_the_server),
    ]
}

pub fn names() -> Vec<String> {
    trials::names(PREFIX, &cases())
}

/// Takes and releases a lock, leaving an empty parent for the server's container sweep, which
/// runs once a minute from the server's start: by the time the other cases are done, a sweep
/// has run or is near.
pub async fn empty_a_parent(ensemble: &ZkEnsemble) -> anyhow::Result<Emptied> {
    let lock = client(&url(&ensemble.connect_string()), LONG_SESSION).await?;
    let k = key("swept");
    lock.acquire(&k, &long()).await?.release().await?;
    Ok(Emptied {
        parent: lock.lock_path(&k)?,
        at: Instant::now(),
    })
}

pub fn trials(
    ensemble: &Arc<ZkEnsemble>,
    fixtures: tokio::runtime::Handle,
    emptied: Emptied,
) -> Vec<Trial> {
    let cx = Ctx {
        ensemble: ensemble.clone(),
        fixtures,
        emptied: Arc::new(emptied),
    };
    trials::cases(PREFIX, &cases(), &cx, TRIAL_BUDGET)
}

impl Ctx {
    fn endpoints(&self) -> Vec<String> {
        self.ensemble.endpoints()
    }

    fn all(&self) -> String {
        url(&self.ensemble.connect_string())
    }

    /// Runs a fault control on the fixtures' runtime.
    async fn fault<F, Fut>(&self, member: usize, what: &'static str, f: F) -> anyhow::Result<()>
    where
        F: FnOnce(Member) -> Fut,
        Fut: Future<Output = dlock_testkit::fixtures::Result<()>> + Send + 'static,
    {
        let member = self.ensemble.member(member)?.clone();
        let task = self.fixtures.spawn(f(member));
        task.await?.with_context(|| format!("{what} member"))
    }

    async fn leader(&self) -> anyhow::Result<usize> {
        let ensemble = self.ensemble.clone();
        Ok(self
            .fixtures
            .spawn(async move { ensemble.wait_for_leader(ELECTION).await })
            .await??)
    }

    async fn wait_ready(&self) -> anyhow::Result<()> {
        let ensemble = self.ensemble.clone();
        Ok(self
            .fixtures
            .spawn(async move { ensemble.wait_ready(ELECTION).await })
            .await??)
    }

    /// The member whose server serves session `id` (from `cons`).
    async fn serving(&self, id: i64) -> Option<usize> {
        let needle = format!("sid={id:#x}");
        for (i, endpoint) in self.endpoints().iter().enumerate() {
            if let Ok(answer) = four_letter_word(endpoint, "cons", Duration::from_secs(2)).await {
                if answer.contains(&needle) {
                    return Some(i);
                }
            }
        }
        None
    }
}

fn key(name: &str) -> String {
    format!("faults/{:016x}/{name}", rand::random::<u64>())
}

fn long() -> LockOptions {
    LockOptions::new(Duration::from_secs(120))
}

/// Records every state a lease passes through, with when.
struct StateLog {
    seen: Arc<Mutex<Vec<(Duration, LeaseState)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl StateLog {
    fn start(lease: &Lease) -> StateLog {
        let watch = lease.watch();
        let seen: Arc<Mutex<Vec<(Duration, LeaseState)>>> = Arc::default();
        let log = seen.clone();
        let start = Instant::now();
        let task = tokio::spawn(async move {
            let mut last: Option<LeaseState> = None;
            loop {
                let state = watch.state();
                let kind = std::mem::discriminant(&state);
                if last.map(|l| std::mem::discriminant(&l)) != Some(kind) {
                    log.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((start.elapsed(), state));
                    last = Some(state);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        StateLog { seen, task }
    }

    fn states(&self) -> Vec<(Duration, LeaseState)> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `held@0ms → uncertain@362ms → held@818ms`: each state and when it began.
    fn summary(&self) -> String {
        self.states()
            .iter()
            .map(|(at, state)| {
                let name = match state {
                    LeaseState::Held { .. } => "held".to_owned(),
                    LeaseState::Uncertain { .. } => "uncertain".to_owned(),
                    LeaseState::Lost(reason) => format!("lost ({reason})"),
                };
                format!("{name}@{}ms", at.as_millis())
            })
            .collect::<Vec<_>>()
            .join(" → ")
    }

    fn saw_uncertain(&self) -> bool {
        self.states()
            .iter()
            .any(|(_, s)| matches!(s, LeaseState::Uncertain { .. }))
    }

    fn saw_lost(&self) -> bool {
        self.states().iter().any(|(_, s)| s.is_lost())
    }
}

/// Waits up to 20 s for `lease` to count as held again (its session recovered); fails with
/// `failure` and the states seen as soon as it is lost, or when the time is up.
async fn held_again(lease: &Lease, states: &StateLog, failure: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !lease.is_held() {
        ensure!(
            Instant::now() < deadline && !lease.state().is_lost(),
            "{failure}: {}",
            states.summary()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

impl Drop for StateLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A client whose server is a follower: built until the ensemble places it on one.
async fn client_on_a_follower(cx: &Ctx, session: Duration) -> anyhow::Result<(Arc<ZkLock>, usize)> {
    let leader = cx.leader().await?;
    for _ in 0..10 {
        let lock = client(&cx.all(), session).await?;
        let id = lock.session_id().context("no session")?;
        if let Some(member) = cx.serving(id).await {
            if member != leader {
                return Ok((lock, member));
            }
        }
    }
    bail!("ten clients in a row landed on the leader")
}

/// A follower stops: the holder on it moves to another member within its session, its lease
/// stays valid, and locks keep working for everyone.
async fn follower_stops_and_locks_keep_working(cx: Ctx) -> anyhow::Result<()> {
    let (holder, follower) = client_on_a_follower(&cx, LONG_SESSION).await?;
    let session = holder.session_id();
    let other = client(&cx.all(), LONG_SESSION).await?;
    let k = key("held-across-follower-stop");
    let lease = holder.acquire(&k, &long()).await?;
    let states = StateLog::start(&lease);
    let stopped_at = Instant::now();
    cx.fault(follower, "stop", |m| async move { m.stop().await })
        .await?;
    // Locks work while the follower is down.
    let deadline = Instant::now() + Duration::from_secs(30);
    let probe = loop {
        match other
            .try_acquire(&key("during-follower-stop"), &long())
            .await
        {
            Ok(Some(lease)) => break lease,
            Ok(None) => bail!("a fresh key was busy"),
            Err(e) if Instant::now() > deadline => bail!("no lock while a follower is down: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    probe.release().await?;
    ensure!(
        other.try_acquire(&k, &long()).await?.is_none(),
        "the held lock was free while a follower was down"
    );
    // The holder reconnected to another member in the same session.
    held_again(
        &lease,
        &states,
        "the lease did not recover after the follower stopped",
    )
    .await?;
    ensure!(
        holder.session_id() == session,
        "the holder's session changed"
    );
    ensure!(
        !states.saw_lost(),
        "the lease was lost: {}",
        states.summary()
    );
    eprintln!(
        "follower {follower} stopped; holder's lease: {} (recovered {:.2?} after the stop)",
        states.summary(),
        stopped_at.elapsed()
    );
    ensure!(lease.release().await? == Released::Released);
    let next = other
        .acquire(&k, &long().with_wait(Duration::from_secs(10)))
        .await?;
    next.release().await?;
    cx.fault(follower, "start", |m| async move { m.start().await })
        .await?;
    cx.wait_ready().await
}

/// The leader stops: every client is disconnected while the rest elect a new leader; the
/// holder's lease is uncertain meanwhile, and held again once its session resumes; locks work
/// again after the election.
async fn leader_stops_and_the_lease_survives_the_election(cx: Ctx) -> anyhow::Result<()> {
    let leader = cx.leader().await?;
    let holder = client(&cx.all(), LONG_SESSION).await?;
    let session = holder.session_id();
    let other = client(&cx.all(), LONG_SESSION).await?;
    let k = key("held-across-election");
    let lease = holder.acquire(&k, &long()).await?;
    let token = lease.fencing_token();
    let states = StateLog::start(&lease);
    let stopped_at = Instant::now();
    cx.fault(leader, "stop", |m| async move { m.stop().await })
        .await?;
    let new_leader = cx.leader().await?;
    ensure!(new_leader != leader, "the stopped member still leads");
    let elected = stopped_at.elapsed();
    // Locks work again after the election.
    let deadline = Instant::now() + Duration::from_secs(30);
    let probe = loop {
        match other.try_acquire(&key("after-election"), &long()).await {
            Ok(Some(lease)) => break lease,
            Ok(None) => bail!("a fresh key was busy"),
            Err(e) if Instant::now() > deadline => bail!("no lock after the election: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let working = stopped_at.elapsed();
    ensure!(
        probe.fencing_token() > token,
        "a token after the election ({}) is not above one before ({token})",
        probe.fencing_token()
    );
    probe.release().await?;
    held_again(&lease, &states, "the lease did not survive the election").await?;
    ensure!(
        holder.session_id() == session,
        "the holder's session did not survive"
    );
    ensure!(
        states.saw_uncertain(),
        "the lease never turned uncertain while its server was gone: {}",
        states.summary()
    );
    ensure!(
        !states.saw_lost(),
        "the lease was lost: {}",
        states.summary()
    );
    ensure!(
        other.try_acquire(&k, &long()).await?.is_none(),
        "the lock was free after the election"
    );
    eprintln!(
        "leader {leader} stopped: new leader {new_leader} after {elected:.2?}, locks worked again \
         after {working:.2?}; holder's lease: {}",
        states.summary()
    );
    ensure!(lease.release().await? == Released::Released);
    cx.fault(leader, "start", |m| async move { m.start().await })
        .await?;
    cx.wait_ready().await
}

/// The holder's server is cut off from everyone for longer than the session timeout: the
/// session expires, the holder's lost signal fires, another client acquires after about the
/// session timeout, and the old holder's fenced writes are rejected.
async fn cut_off_holder_loses_its_session_and_is_fenced(cx: Ctx) -> anyhow::Result<()> {
    let leader = cx.leader().await?;
    let follower = (leader + 1) % 3;
    let endpoints = cx.endpoints();
    let pinned = url(&endpoints[follower]);
    let others: Vec<String> = (0..3)
        .filter(|i| *i != follower)
        .map(|i| endpoints[i].clone())
        .collect();
    let holder = client(&pinned, SHORT_SESSION).await?;
    let other = client(&url(&others.join(",")), LONG_SESSION).await?;
    let k = key("cut-off");
    let resource = Arc::new(Fenced::new(Vec::<&'static str>::new()));
    let lease = holder.acquire(&k, &long()).await?;
    let old = lease.fencing_token();
    resource.write(old, |log| log.push("old holder, before the cut"))?;
    let lost = {
        let watch = lease.watch();
        tokio::spawn(async move {
            let reason = watch.lost().await;
            (reason, Instant::now())
        })
    };
    let states = StateLog::start(&lease);
    let cut_at = Instant::now();
    cx.fault(
        follower,
        "disconnect",
        |m| async move { m.disconnect().await },
    )
    .await?;
    let successor = other
        .acquire(&k, &long().with_wait(Duration::from_secs(60)))
        .await
        .context("another client never acquired after the session timeout")?;
    let taken_at = Instant::now();
    let new = successor.fencing_token();
    resource.write(new, |log| log.push("successor"))?;
    // The signal task records when the signal fired; on a loaded machine it may be scheduled
    // late, so it gets a few seconds to report, and the lease's own deadline may stand in.
    let Ok(joined) = tokio::time::timeout(Duration::from_secs(3), lost).await else {
        bail!(
            "another client holds the lock but the cut-off holder's lost signal has not fired: {}",
            states.summary()
        );
    };
    let (reason, lost_at) = joined?;
    ensure!(
        lost_at <= taken_at || lease.valid_until() <= taken_at,
        "the lost signal ({reason}) fired {:?} after the successor took the lock",
        lost_at - taken_at
    );
    ensure!(
        matches!(reason, LostReason::Expired | LostReason::SessionEnded),
        "lost because {reason}"
    );
    let gap = taken_at - cut_at;
    ensure!(
        gap >= SHORT_SESSION / 2,
        "the successor took the lock {gap:?} after the cut, well before the session timeout"
    );
    ensure!(new > old, "token {new} of the successor is not above {old}");
    match resource.write(old, |log| log.push("old holder, after the cut")) {
        Err(stale) => ensure!(stale.presented == old && stale.highest == new, "{stale}"),
        Ok(()) => bail!("the fence admitted the cut-off holder's token {old} after {new}"),
    }
    eprintln!(
        "holder cut off: lost signal ({reason}) {:.2?} and successor {gap:.2?} after the cut \
         (session timeout {SHORT_SESSION:?}); lease: {}",
        lost_at - cut_at,
        states.summary()
    );
    cx.fault(
        follower,
        "reconnect",
        |m| async move { m.reconnect().await },
    )
    .await?;
    cx.wait_ready().await?;
    ensure!(
        lease.release().await? != Released::Released,
        "the cut-off lease released the successor's lock"
    );
    ensure!(successor.release().await? == Released::Released);
    // The old holder's client works again, in a new session.
    let again = holder
        .try_acquire(&k, &long())
        .await?
        .context("the key is busy after the successor released")?;
    again.release().await?;
    ensure!(holder.stats().sessions_opened == 2, "{:?}", holder.stats());
    Ok(())
}

/// Fifty waiters queue behind one holder (on five clients spread over the ensemble); the
/// release wakes exactly one of them, and every later release exactly one more.
async fn fifty_waiters_and_one_release_wake_exactly_one(cx: Ctx) -> anyhow::Result<()> {
    const CLIENTS: usize = 5;
    const PER_CLIENT: usize = 10;
    const WAITERS: usize = CLIENTS * PER_CLIENT;
    let holder = client(&cx.all(), LONG_SESSION).await?;
    let observer = raw::connect(&cx.ensemble.connect_string()).await?;
    let k = key("herd");
    let parent = holder.lock_path(&k)?;
    let lease = holder.acquire(&k, &long()).await?;
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(client(&cx.all(), LONG_SESSION).await?);
    }
    let (acquired_tx, mut acquired) = mpsc::unbounded_channel();
    let mut releases: Vec<Option<tokio::sync::oneshot::Sender<()>>> = Vec::new();
    for (c, lock) in clients.iter().enumerate() {
        for t in 0..PER_CLIENT {
            let (lock, k, acquired_tx) = (lock.clone(), k.clone(), acquired_tx.clone());
            let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
            releases.push(Some(release_tx));
            tokio::spawn(async move {
                let result = lock
                    .acquire(&k, &long().with_wait(Duration::from_secs(120)))
                    .await;
                match result {
                    Ok(lease) => {
                        let _ = acquired_tx.send(Ok((
                            c * PER_CLIENT + t,
                            lease.fencing_token(),
                            Instant::now(),
                        )));
                        let _ = release_rx.await;
                        let _ = lease.release().await;
                    }
                    Err(e) => {
                        let _ = acquired_tx.send(Err(e));
                    }
                }
            });
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let queued = raw::children(&observer, &parent).await?.len();
        if queued == WAITERS + 1 {
            break;
        }
        ensure!(Instant::now() < deadline, "only {queued} contenders queued");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Each waiter watches only its predecessor: fifty watches on fifty distinct nodes, plus the
    // holder's watch on its own node (which tells its lease of an eviction).
    let expected = WAITERS + 1;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut watches = 0;
        for endpoint in cx.endpoints() {
            let answer = four_letter_word(&endpoint, "wchs", Duration::from_secs(2)).await?;
            watches += answer
                .lines()
                .find_map(|l| l.strip_prefix("Total watches:"))
                .and_then(|n| n.trim().parse::<usize>().ok())
                .unwrap_or(0);
        }
        if watches == expected {
            break;
        }
        ensure!(
            Instant::now() < deadline && watches < expected,
            "{watches} watches on the ensemble for {WAITERS} waiters and the holder"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let wakeups = |clients: &[Arc<ZkLock>]| clients.iter().map(|c| c.stats().wakeups).sum::<u64>();
    ensure!(wakeups(&clients) == 0, "waiters woke before any release");
    let released_at = Instant::now();
    lease.release().await?;
    let first = tokio::time::timeout(Duration::from_secs(10), acquired.recv())
        .await
        .context("no waiter acquired within 10 s of the release")?
        .context("waiters gone")??;
    let mut handoffs = vec![first.2 - released_at];
    tokio::time::sleep(Duration::from_secs(1)).await;
    ensure!(
        acquired.try_recv().is_err(),
        "a second waiter acquired while the first held the lock"
    );
    ensure!(
        wakeups(&clients) == 1,
        "one release woke {} waiters",
        wakeups(&clients)
    );
    // Hand the lock down the queue: each release wakes exactly one more.
    let mut order = vec![first];
    while order.len() < WAITERS {
        let Some((index, token, _)) = order.last().copied() else {
            break;
        };
        let released = Instant::now();
        if let Some(release) = releases[index].take() {
            let _ = release.send(());
        }
        let next = tokio::time::timeout(Duration::from_secs(10), acquired.recv())
            .await
            .context("the queue stalled")?
            .context("waiters gone")??;
        handoffs.push(next.2 - released);
        ensure!(next.1 > token, "token {} after {token}", next.1);
        order.push(next);
    }
    if let Some((index, _, _)) = order.last().copied() {
        if let Some(release) = releases[index].take() {
            let _ = release.send(());
        }
    }
    ensure!(
        wakeups(&clients) == WAITERS as u64,
        "{WAITERS} hand-overs woke {} waiters",
        wakeups(&clients)
    );
    handoffs.sort();
    eprintln!(
        "hand-over latency over {} releases: median {:.2?}, max {:.2?}",
        handoffs.len(),
        handoffs[handoffs.len() / 2],
        handoffs[handoffs.len() - 1]
    );
    Ok(())
}

/// Lock parents are container nodes: after the last contender leaves, the server's container
/// sweep (once a minute from its start) deletes the parent.
async fn empty_parents_are_removed_by_the_server(cx: Ctx) -> anyhow::Result<()> {
    let observer = raw::connect(&cx.ensemble.connect_string()).await?;
    let parent = &cx.emptied.parent;
    // A sweep a minute after the server started, plus generous slack for a loaded machine.
    let deadline = cx.emptied.at + Duration::from_secs(100);
    loop {
        match raw::stat(&observer, parent).await? {
            None => break,
            Some(stat) => ensure!(
                Instant::now() < deadline,
                "the empty parent is still there {:?} after its last contender left \
                 ({} children): not a container node?",
                cx.emptied.at.elapsed(),
                stat.num_children
            ),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "the server removed the empty parent {:.2?} after its last contender left",
        cx.emptied.at.elapsed()
    );
    Ok(())
}
