//! Auto-renew, written once for every backend on top of its ownership-checked extend.
//!
//! One scheduler per backend handle renews all of that handle's auto-renewed leases: it sleeps
//! until the earliest renewal is due, then renews every lease due by then (or soon after) in one
//! [`extend_many`](DistributedLock::extend_many) call, and publishes each outcome on that lease's
//! state channel. 10,000 renewing leases thus cost one timer and one batch per tick, not 10,000
//! timers and 10,000 requests. The scheduler lives while some lease is registered with it and
//! stops with the last one.
//!
//! Renewal lifecycle bugs are a classic source of double holders (renewal outliving unlock,
//! watchdogs dead after reconnect), so the rules are few and strict: a lease leaves the schedule on
//! release and on drop; a renewal never re-creates a lock (extend is ownership checked); a renewal
//! that cannot be confirmed before the deadline leaves the lease lost, never held; a failed
//! renewal makes the lease uncertain and is retried a few times per interval; renewal stops at
//! `max_hold`; and a lost lease is never renewed again.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::{apply_extension, Lease};
use crate::backend::Extension;
use crate::backend::{DistributedLock, ExtendRequest, LeaseRef};
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::options::AutoRenew;
use crate::state::{self, StatusSender};
use crate::token::{FencingToken, OwnerToken};

/// A lease due within this fraction of its interval is renewed with the batch that is being sent
/// anyway. Renewing a little early is always safe (the deadline is measured from the request), and
/// it lets leases taken at slightly different times fall into one batch from their second renewal
/// on.
const EARLY_FRACTION: u32 = 8;

/// Puts `lease` on the schedule of its backend's scheduler (starting one on the current runtime
/// if there is none), renewed as `config` says. The lease stays on it until the returned handle
/// is dropped.
pub(crate) fn schedule(lease: &Lease, config: AutoRenew) -> Scheduled {
    let scheduler = Scheduler::for_backend(lease.backend());
    let interval = config.interval_for(lease.ttl());
    let acquired_at = lease.acquired_at();
    let entry = Entry {
        next: acquired_at + interval,
        interval,
        validity: lease.drift().validity(lease.ttl()),
        stop_at: config.max_hold.map(|m| acquired_at + m),
        key: lease.lock_key().clone(),
        owner: lease.owner(),
        fencing: lease.fencing_token(),
        ttl: lease.ttl(),
        status: lease.status_sender(),
    };
    let id = {
        let mut book = scheduler.book();
        let id = book.next_id;
        book.next_id += 1;
        book.idle.insert((entry.next, id));
        book.entries.insert(id, entry);
        id
    };
    scheduler.changed.notify_one();
    Scheduled { scheduler, id }
}

/// A lease's place on its scheduler; dropping it takes the lease off the schedule.
pub(crate) struct Scheduled {
    scheduler: Arc<Scheduler>,
    id: u64,
}

impl Drop for Scheduled {
    fn drop(&mut self) {
        let mut book = self.scheduler.book();
        if let Some(entry) = book.entries.remove(&self.id) {
            book.idle.remove(&(entry.next, self.id));
        }
    }
}

/// One lease on the schedule: only what each tick needs, since there may be many.
struct Entry {
    key: LockKey,
    owner: OwnerToken,
    fencing: FencingToken,
    ttl: Duration,
    status: StatusSender,
    next: Instant,
    interval: Duration,
    validity: Duration,
    stop_at: Option<Instant>,
}

#[derive(Default)]
struct Book {
    entries: HashMap<u64, Entry>,
    /// The entries without a renewal in flight, by when they are due: a wake looks at the
    /// leases due by then only, not at every lease on the schedule. An entry whose renewal is
    /// on the wire is not in it, so it is not sent again until that renewal answers.
    idle: BTreeSet<(Instant, u64)>,
    next_id: u64,
}

/// The renewal scheduler of one backend handle.
struct Scheduler {
    backend: Arc<dyn DistributedLock>,
    book: Mutex<Book>,
    /// Woken when the schedule changes (a lease joins, a batch answers).
    changed: Arc<Notify>,
    task: OnceLock<AbortHandle>,
}

/// The live schedulers, by the address of their backend handle.
type Registry = Mutex<HashMap<usize, Weak<Scheduler>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

impl Scheduler {
    /// The scheduler of this backend handle, started if there is none (or if the runtime that ran
    /// the previous one has shut down).
    fn for_backend(backend: &Arc<dyn DistributedLock>) -> Arc<Scheduler> {
        // The address identifies the handle while its scheduler (which holds the handle) lives.
        let address = Arc::as_ptr(backend).cast::<()>() as usize;
        let mut schedulers = registry().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(live) = schedulers.get(&address).and_then(Weak::upgrade) {
            if live.task.get().is_some_and(|task| !task.is_finished()) {
                return live;
            }
        }
        schedulers.retain(|_, scheduler| scheduler.strong_count() > 0);
        let scheduler = Arc::new(Scheduler {
            backend: backend.clone(),
            book: Mutex::new(Book::default()),
            changed: Arc::new(Notify::new()),
            task: OnceLock::new(),
        });
        let task = tokio::spawn(run(Arc::downgrade(&scheduler), scheduler.changed.clone()));
        let _ = scheduler.task.set(task.abort_handle());
        schedulers.insert(address, Arc::downgrade(&scheduler));
        scheduler
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        // The book stays consistent whatever panicked while holding it: entries are whole.
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the leases due at `now` off the schedule's idle set and says when to wake next.
    ///
    /// Nothing is taken unless some lease is due now: only then are the leases due within the
    /// early window taken along. (Taking them whenever the scheduler wakes would let each
    /// batch's answer pull in the next sliver of leases, a chain of tiny batches.) The idle set
    /// is walked in due order and only as far as the first lease outside its early window.
    fn take_due(&self, now: Instant) -> (Vec<Due>, Option<Instant>) {
        let mut book = self.book();
        let Book { entries, idle, .. } = &mut *book;
        match idle.first() {
            None => return (Vec::new(), None),
            Some(&(first, _)) if first > now => return (Vec::new(), Some(first)),
            Some(_) => {}
        }
        let mut due = Vec::new();
        while let Some(&(next, id)) = idle.first() {
            let Some(entry) = entries.get_mut(&id) else {
                idle.pop_first();
                continue;
            };
            if next > now + entry.interval / EARLY_FRACTION {
                return (due, Some(next));
            }
            idle.pop_first();
            if entry.stop_at.is_some_and(|stop| now >= stop) {
                tracing::debug!(key = %entry.key, "maximum hold time reached: renewal stops, the lease runs out");
                entries.remove(&id);
                continue;
            }
            if entry.status.borrow().at(now).is_lost() {
                state::record_expiry(&entry.status, now);
                entries.remove(&id);
                continue;
            }
            due.push(Due {
                id,
                key: entry.key.clone(),
                owner: entry.owner,
                fencing: entry.fencing,
                ttl: entry.ttl,
                deadline: entry.status.borrow().until(),
            });
        }
        (due, None)
    }

    /// Renews `due` in one batch and applies each answer to its lease.
    async fn renew(self: Arc<Self>, due: Vec<Due>) {
        let requests: Vec<ExtendRequest<'_>> = due
            .iter()
            .map(|d| ExtendRequest {
                lease: LeaseRef {
                    key: &d.key,
                    owner: d.owner,
                    fencing: Some(d.fencing),
                },
                ttl: d.ttl,
            })
            .collect();
        // An answer after every deadline of the batch is useless: the leases are lost by then.
        let last_deadline = due.iter().map(|d| d.deadline).max();
        let sent = Instant::now();
        let batch = self.backend.extend_many(&requests);
        let answers = match last_deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, batch).await.ok(),
            None => Some(batch.await),
        };
        let now = Instant::now();
        let mut book = self.book();
        let Some(answers) = answers else {
            for d in &due {
                if let Some(entry) = book.entries.remove(&d.id) {
                    state::record_expiry(&entry.status, now);
                }
            }
            return;
        };
        let mut answers = answers.into_iter();
        let Book { entries, idle, .. } = &mut *book;
        for d in &due {
            let answer = answers.next().unwrap_or_else(|| Err(missing_answer()));
            // A lease released meanwhile has left the book; its answer no longer matters.
            let Some(entry) = entries.get_mut(&d.id) else {
                continue;
            };
            if entry.apply(sent, answer) {
                idle.insert((entry.next, d.id));
            } else {
                entries.remove(&d.id);
            }
        }
        drop(book);
        self.changed.notify_one();
    }
}

impl Entry {
    /// Applies one renewal's answer; false when the lease is over and leaves the schedule.
    fn apply(&mut self, sent: Instant, answer: Result<Extension>) -> bool {
        // A validity shortened by the clock watch is renewed again before half of it is gone.
        let interval = match answer {
            Ok(Extension::ClockAhead(by)) => {
                self.interval.min(self.validity.saturating_sub(by) / 2)
            }
            _ => self.interval,
        };
        match apply_extension(&self.status, &self.key, sent, self.validity, answer) {
            Ok(()) => {
                self.next = sent + interval;
                true
            }
            Err(Error::Lost { .. } | Error::NotOwner { .. }) => false,
            Err(error) => {
                let now = Instant::now();
                if self.status.borrow().at(now).is_lost() {
                    return false;
                }
                tracing::warn!(key = %self.key, %error, "renewal failed; the lease is uncertain");
                // Retry well before the deadline, a few times per interval.
                self.next = now + (self.interval / 4).max(Duration::from_millis(1));
                true
            }
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        if let Some(task) = self.task.get() {
            task.abort();
        }
    }
}

/// A lease taken off the idle set for one batch.
struct Due {
    id: u64,
    key: LockKey,
    owner: OwnerToken,
    fencing: FencingToken,
    ttl: Duration,
    deadline: Instant,
}

fn missing_answer() -> Error {
    Error::backend(
        "dlock-core",
        true,
        "the backend's extend_many gave fewer answers than requests",
    )
}

/// The scheduler's loop: sleep until the earliest renewal is due or the schedule changes, then
/// send what is due as one batch. Holds the scheduler only while working, so the last lease
/// leaving drops it (which aborts this task).
async fn run(scheduler: Weak<Scheduler>, changed: Arc<Notify>) {
    loop {
        let notified = changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let wake = {
            let Some(scheduler) = scheduler.upgrade() else {
                return;
            };
            let (due, wake) = scheduler.take_due(Instant::now());
            if !due.is_empty() {
                tokio::spawn(scheduler.clone().renew(due));
            }
            wake
        };
        match wake {
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = &mut notified => {}
                }
            }
            None => notified.await,
        }
    }
}
