//! The shared cases, run against every backend.
//!
//! Each case is a plain async function over a [`Ctx`]: it makes independent clients through the
//! [`Subject`], works in a fresh random key namespace, and fails with a message that says what
//! was expected and what was observed. Backend differences are data (the subject's
//! [`Capabilities`](dlock_core::Capabilities) and [`Timing`](crate::Timing)), never copies of a
//! case: a case that needs fencing or a server to stop is simply not generated where it cannot
//! apply. [`trials`] turns the cases into named libtest-mimic trials, one per case, so they are
//! counted and filterable like ordinary tests.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{DistributedLock, FencingGuarantee, LockOptions};
use libtest_mimic::{Failed, Trial};

use crate::subject::Subject;

mod acquiring;
mod cancel;
mod exclusion;
mod expiry;
mod fencing;
mod input;
mod keys;
mod lost;
mod outage;
mod ownership;
mod queue;
mod silent;

pub use silent::RECOVERY;

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

macro_rules! case {
    ($module:ident :: $name:ident, $needs:expr) => {
        Case {
            name: stringify!($name),
            needs: $needs,
            run: |cx| Box::pin($module::$name(cx)),
        }
    };
}

/// Every case, in a stable order.
pub fn cases() -> Vec<Case> {
    use Needs::*;
    vec![
        case!(exclusion::mutual_exclusion_under_contention, Nothing),
        case!(exclusion::independent_keys_do_not_block_each_other, Nothing),
        case!(acquiring::try_acquire_answers_busy_fast, Nothing),
        case!(acquiring::acquire_respects_its_deadline, Nothing),
        case!(acquiring::release_frees_promptly_for_a_waiter, Nothing),
        case!(acquiring::zero_wait_takes_a_free_key, Nothing),
        case!(
            queue::a_timed_out_waiter_leaves_nothing_in_the_queue,
            Nothing
        ),
        case!(queue::a_dropped_waiter_leaves_nothing_in_the_queue, Nothing),
        case!(
            acquiring::validity_is_measured_from_before_the_request,
            Nothing
        ),
        case!(ownership::stale_lease_cannot_release_or_extend, Nothing),
        case!(ownership::foreign_owner_cannot_release_or_extend, Nothing),
        case!(
            ownership::extend_many_answers_each_lease_like_extend,
            Nothing
        ),
        case!(expiry::abandoned_lock_is_acquirable_after_its_ttl, Nothing),
        case!(expiry::extend_prolongs_the_lease, Nothing),
        case!(expiry::extend_after_expiry_fails_as_lost, Nothing),
        case!(fencing::fencing_tokens_increase_across_holders, Fencing),
        case!(
            fencing::paused_holders_write_is_rejected_by_the_fence,
            Fencing
        ),
        case!(
            lost::lost_signal_fires_when_the_lease_ends_behind_the_holders_back,
            Nothing
        ),
        case!(
            lost::auto_renew_keeps_the_lock_and_stops_after_release,
            Nothing
        ),
        case!(cancel::dropped_acquire_leaves_nothing_held, Nothing),
        case!(cancel::dropped_lease_is_released_promptly, Nothing),
        case!(keys::unusual_keys_work_and_do_not_collide, Nothing),
        case!(
            input::invalid_input_is_rejected_and_leaves_no_state,
            Nothing
        ),
        case!(
            outage::server_outage_gives_errors_not_hangs_then_recovers,
            Outage
        ),
        case!(
            silent::silent_link_fails_in_bounded_time_then_recovers,
            Proxy
        ),
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
}
