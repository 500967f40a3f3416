//! The shared cases, run against every backend.
//!
//! Each case is a plain async function over a [`Ctx`]: it makes independent clients through the
//! [`Subject`], works in a fresh random key namespace, and fails with a message that says what
//! was expected and what was observed. Backend differences are data (the subject's
//! [`Capabilities`](dlock_core::backend::Capabilities) and [`Timing`](crate::Timing)), never copies of a
//! case: a case that needs fencing or a server to stop is simply not generated where it cannot
//! apply. [`trials`] turns the cases into named libtest-mimic trials, one per case, so they are
//! counted and filterable like ordinary tests.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use dlock_core::backend::{FencingGuarantee, Primitive};
use dlock_core::{DistributedLock, DistributedLockExt, Error, Lease, LockOptions, Released};
use libtest_mimic::{Failed, Trial};
use tokio::time::Instant;

use crate::subject::Subject;

mod acquiring;
mod cancel;
mod exclusion;
mod expiry;
mod fairness;
mod fencing;
mod input;
mod keys;
mod lost;
mod one_client;
mod operator;
mod outage;
mod ownership;
mod primitives;
mod queue;
mod silent;

pub use silent::{RECOVERY, REPLACED};

/// What a case needs from the subject beyond the lock API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Nothing: every backend runs it.
    Nothing,
    /// Fencing tokens that the backend promises to order.
    Fencing,
    /// A dedicated server the case may stop and start.
    Outage,
    /// Clients whose links go through proxies the case can silence
    /// ([`Subject::with_proxied`]).
    Proxy,
    /// A backend that declares the semaphore.
    Semaphore,
    /// A backend that declares the read-write lock.
    ReadWrite,
    /// A backend that declares the election.
    Election,
    /// A backend that serves waiters in arrival order
    /// ([`Capabilities::fair_queue`](dlock_core::backend::Capabilities::fair_queue)).
    FairQueue,
    /// A backend whose releases wake waiters
    /// ([`Capabilities::notifies_waiters`](dlock_core::backend::Capabilities::notifies_waiters)).
    Notifications,
}

type CaseFuture = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// One case of the suite.
#[derive(Clone, Copy)]
pub struct Case {
    /// The case's name, used in the trial name.
    pub name: &'static str,
    /// What it needs.
    pub needs: Needs,
    run: fn(Ctx) -> CaseFuture,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case")
            .field("name", &self.name)
            .field("needs", &self.needs)
            .finish()
    }
}

/// The [`Case`]s named `module::function`, each group with what its cases need, in the order
/// given.
macro_rules! cases {
    ($($needs:ident: [$($module:ident::$name:ident),+ $(,)?]),+ $(,)?) => {
        vec![$($(Case {
            name: stringify!($name),
            needs: Needs::$needs,
            run: |cx| Box::pin($module::$name(cx)),
        }),+),+]
    };
}

/// Every case, in a stable order.
pub fn cases() -> Vec<Case> {
    cases![
        Nothing: [
            exclusion::mutual_exclusion_under_contention,
            exclusion::independent_keys_do_not_block_each_other,
            exclusion::tasks_of_one_client_exclude_each_other,
            one_client::calls_out_together_are_each_answered_as_alone,
            acquiring::try_acquire_answers_busy_fast,
            acquiring::acquire_respects_its_deadline,
            acquiring::release_frees_promptly_for_a_waiter,
            acquiring::zero_wait_takes_a_free_key,
            queue::a_timed_out_waiter_leaves_nothing_in_the_queue,
            queue::a_dropped_waiter_leaves_nothing_in_the_queue,
            acquiring::validity_is_measured_from_before_the_request,
            ownership::stale_lease_cannot_release_or_extend,
            ownership::foreign_owner_cannot_release_or_extend,
            ownership::extend_many_answers_each_lease_like_extend,
            expiry::abandoned_lock_is_acquirable_after_its_ttl,
            expiry::extend_prolongs_the_lease,
            expiry::extend_after_expiry_fails_as_lost,
        ],
        Fencing: [
            fencing::fencing_tokens_increase_across_holders,
            fencing::paused_holders_write_is_rejected_by_the_fence,
        ],
        Nothing: [
            lost::lost_signal_fires_when_the_lease_ends_behind_the_holders_back,
            lost::auto_renew_keeps_the_lock_and_stops_after_release,
            cancel::dropped_acquire_leaves_nothing_held,
            cancel::dropped_lease_is_released_promptly,
            keys::unusual_keys_work_and_do_not_collide,
            input::invalid_input_is_rejected_and_leaves_no_state,
            operator::holding_names_the_holder_and_its_owner,
            operator::list_shows_the_held_locks_under_a_prefix,
            operator::forced_unlock_fences_out_the_evicted_holder,
            primitives::primitives_are_served_as_declared,
            primitives::acquire_all_does_not_deadlock,
            primitives::acquire_all_takes_every_key_or_none,
        ],
        Semaphore: [
            primitives::semaphore_grants_exactly_its_permits,
            primitives::semaphore_never_exceeds_its_permits,
            primitives::semaphore_refuses_another_number_of_permits,
            primitives::crashed_permit_returns_after_its_ttl,
            primitives::abandoned_permit_waiters_leave_nothing,
        ],
        ReadWrite: [
            primitives::readers_share_and_a_writer_excludes,
            primitives::no_reader_overlaps_a_writer,
            primitives::a_waiting_writer_is_not_starved_by_readers,
            primitives::abandoned_rw_waiters_leave_nothing,
        ],
        Election: [
            primitives::one_leader_per_term_and_observers_agree,
            primitives::resigning_hands_over_at_once,
            primitives::a_leader_that_stops_renewing_is_lost,
            primitives::abandoned_campaigns_leave_no_candidacy,
        ],
        FairQueue: [
            fairness::waiters_are_served_in_arrival_order,
            fairness::waiters_of_one_client_are_served_in_arrival_order,
            fairness::a_releaser_that_asks_again_queues_behind_the_waiters,
            fairness::a_crashed_queued_waiter_does_not_block_the_queue,
            fairness::many_waiters_exclude_each_other_with_growing_tokens,
        ],
        Notifications: [acquiring::a_release_wakes_a_waiter_that_does_not_poll],
        Outage: [outage::server_outage_gives_errors_not_hangs_then_recovers],
        Proxy: [
            silent::silent_link_fails_in_bounded_time_then_recovers,
            silent::a_dead_connection_is_replaced,
        ],
    ]
}

/// The cases that apply to `subject`.
pub fn applicable(subject: &Subject) -> Vec<Case> {
    cases()
        .into_iter()
        .filter(|case| match case.needs {
            Needs::Nothing => true,
            Needs::Fencing => subject.capabilities.fencing != FencingGuarantee::None,
            Needs::Outage => subject.outage.is_some(),
            Needs::Proxy => subject.proxied.is_some(),
            Needs::Semaphore => subject.capabilities.primitives.semaphore,
            Needs::ReadWrite => subject.capabilities.primitives.read_write,
            Needs::Election => subject.capabilities.primitives.election,
            Needs::FairQueue => subject.capabilities.fair_queue,
            Needs::Notifications => subject.capabilities.notifies_waiters,
        })
        .collect()
}

/// The longest a single case may take before it counts as hung.
pub const CASE_BUDGET: Duration = Duration::from_secs(120);

/// Runs one case against `subject` on the current runtime, bounded by [`CASE_BUDGET`].
pub async fn run_case(case: &Case, subject: &Subject) -> anyhow::Result<()> {
    let cx = Ctx::new(subject.clone());
    match tokio::time::timeout(CASE_BUDGET, (case.run)(cx)).await {
        Ok(result) => result,
        Err(_) => anyhow::bail!("hung: did not finish within {CASE_BUDGET:?}"),
    }
}

/// Runs one case on a runtime of its own (what a trial does).
pub fn run_case_blocking(case: &Case, subject: &Subject) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run_case(case, subject))
}

/// One named trial per applicable case: `<subject>::<case>`.
pub fn trials(subject: &Subject) -> Vec<Trial> {
    applicable(subject)
        .into_iter()
        .map(|case| {
            let subject = subject.clone();
            Trial::test(format!("{}::{}", subject.name, case.name), move || {
                run_case_blocking(&case, &subject).map_err(|e| Failed::from(format!("{e:#}")))
            })
        })
        .collect()
}

/// The trials of a subject named `name` that declares `capabilities` and nothing more, for a
/// run that opted out of Docker: it lists the names and reports them ignored, so the subject
/// never connects.
pub fn placeholder_trials(
    name: &str,
    capabilities: dlock_core::backend::Capabilities,
) -> Vec<Trial> {
    trials(&Subject::new(name, capabilities, || async {
        bail!("DLOCK_TEST_NO_DOCKER=1")
    }))
}

/// What a case works with: the subject, a key namespace of its own, and helpers.
#[derive(Clone)]
pub struct Ctx {
    subject: Subject,
    namespace: String,
}

impl Ctx {
    fn new(subject: Subject) -> Self {
        let namespace = format!("dlock-suite/{:016x}/", rand::random::<u64>());
        Ctx { subject, namespace }
    }

    /// A key inside this case's namespace.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.namespace)
    }

    /// The case's namespace prefix.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// A new independent client of the subject.
    pub async fn client(&self) -> anyhow::Result<Arc<dyn DistributedLock>> {
        self.subject.client().await
    }

    /// `N` new independent clients of the subject: the holder, the contender, the bystander
    /// a case plays against each other.
    pub(crate) async fn clients<const N: usize>(
        &self,
    ) -> anyhow::Result<[Arc<dyn DistributedLock>; N]> {
        let mut clients = Vec::with_capacity(N);
        for _ in 0..N {
            clients.push(self.client().await?);
        }
        clients
            .try_into()
            .map_err(|_| anyhow::anyhow!("could not make {N} clients"))
    }

    /// The subject.
    pub fn subject(&self) -> &Subject {
        &self.subject
    }

    /// The short TTL of the subject's timing.
    pub fn ttl(&self) -> Duration {
        self.subject.timing.ttl
    }

    /// The slack allowed on timing assertions.
    pub fn slack(&self) -> Duration {
        self.subject.timing.slack
    }

    /// Options with the given TTL and no wait limit.
    pub fn opts(&self, ttl: Duration) -> LockOptions {
        LockOptions::new(ttl)
    }

    /// A TTL long enough never to run out during a case.
    pub fn long_ttl(&self) -> Duration {
        Duration::from_secs(60)
    }

    /// Whether the subject promises ordered fencing tokens.
    pub fn fenced(&self) -> bool {
        self.subject.capabilities.fencing != FencingGuarantee::None
    }

    /// Fails with `what` unless `client` finds `key` held: one `try_acquire` that gets nothing.
    pub(crate) async fn ensure_busy(
        &self,
        client: &Arc<dyn DistributedLock>,
        key: &str,
        what: &str,
    ) -> anyhow::Result<()> {
        let lease = client.try_acquire(key, &self.opts(self.ttl())).await?;
        ensure!(lease.is_none(), "{what}");
        Ok(())
    }

    /// `client` takes a fresh key `name` of this case for the long TTL; returns the key and
    /// the lease.
    pub(crate) async fn hold(
        &self,
        client: &Arc<dyn DistributedLock>,
        name: &str,
    ) -> anyhow::Result<(String, Lease)> {
        let key = self.key(name);
        let lease = client.acquire(&key, &self.opts(self.long_ttl())).await?;
        Ok((key, lease))
    }

    /// `lease` still holds `key` at the end of a case: `other` finds it busy (else fails with
    /// `busy`), and releasing `lease` finds it held (else fails with `release`).
    pub(crate) async fn release_still_held(
        &self,
        lease: Lease,
        other: &Arc<dyn DistributedLock>,
        key: &str,
        busy: &str,
        release: &str,
    ) -> anyhow::Result<()> {
        self.ensure_busy(other, key, busy).await?;
        release_held(lease, release).await
    }

    /// `client`'s view of each primitive the subject declares, of one permits count, one side
    /// and one candidate value, with the primitive's name: what a fault case checks beside the
    /// lock.
    pub(crate) fn declared_views(
        &self,
        client: &Arc<dyn DistributedLock>,
        candidate: &str,
    ) -> anyhow::Result<Vec<(&'static str, Arc<dyn DistributedLock>)>> {
        let declared = self.subject().capabilities.primitives;
        let mut views = Vec::new();
        for primitive in [
            Primitive::semaphore(2),
            Primitive::Write,
            Primitive::candidate(candidate),
        ] {
            if declared.serves(&primitive) {
                views.push((primitive.name(), client.primitive(&primitive)?));
            }
        }
        Ok(views)
    }

    /// Takes the free `key` with `client` and releases it: the service works (before a fault,
    /// so that a failure later is the fault's).
    pub(crate) async fn take_and_release(
        &self,
        client: &Arc<dyn DistributedLock>,
        key: &str,
    ) -> anyhow::Result<()> {
        client
            .try_acquire(key, &self.opts(self.ttl()))
            .await?
            .context("a free key was busy")?
            .release()
            .await?;
        Ok(())
    }

    /// `client` takes `key` within the slack after `since` (a release, a dropped lease or
    /// acquire), which is all it waits; fails with `what` and the time it took otherwise.
    pub(crate) async fn acquire_promptly(
        &self,
        client: &Arc<dyn DistributedLock>,
        key: &str,
        since: Instant,
        what: &str,
    ) -> anyhow::Result<Lease> {
        let lease = client
            .acquire(key, &self.opts(self.long_ttl()).with_wait(self.slack()))
            .await?;
        let gap = since.elapsed();
        ensure!(gap <= self.slack(), "{what}: free only {gap:?} later");
        Ok(lease)
    }
}

/// Releases `lease`, failing with `what` unless the release found it still held.
pub(crate) async fn release_held(lease: Lease, what: &str) -> anyhow::Result<()> {
    ensure!(lease.release().await? == Released::Released, "{what}");
    Ok(())
}

/// Fails unless a waiting acquire ended in [`Error::Timeout`]; `taken` says what it means that
/// it got the lock instead.
pub(crate) fn expect_timeout(result: Result<Lease, Error>, taken: &str) -> anyhow::Result<()> {
    match result {
        Err(Error::Timeout { .. }) => Ok(()),
        Err(other) => bail!("expected a timeout, got {other}"),
        Ok(_) => bail!("{taken}"),
    }
}
