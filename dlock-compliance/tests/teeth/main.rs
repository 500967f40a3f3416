//! Proof that the suite has teeth: it is run against deliberately broken lock services, and
//! every defect must be caught by at least one case, while the same service without a defect
//! passes every case.

mod broken;
mod link;
mod primitives;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use broken::{Broken, Defect, OwnWaitingLoop, Queued};
use dlock_compliance::suite::{self, Case};
use dlock_compliance::Subject;
use dlock_core::DistributedLock;
use libtest_mimic::{Arguments, Failed, Trial};
use primitives::{BrokenPrimitives, PrimitiveDefect};

/// Which lock service a subject runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    /// The plain lock, with a defect or none.
    Plain(Option<Defect>),
    /// The lock with a correct waiting line in front of it.
    CorrectQueue,
}

fn subject(service_kind: Service) -> Subject {
    let defect = match service_kind {
        Service::Plain(defect) => defect,
        Service::CorrectQueue => None,
    };
    let service = Broken::new(defect);
    let linked = service.clone();
    let replaces_silent = defect != Some(Defect::SilentConnectionKept);
    let keeps_failed_busy = defect == Some(Defect::FailedAttemptKeepsKeyBusy);
    let name = match service_kind {
        Service::Plain(defect) => defect.map_or("correct", Defect::name),
        Service::CorrectQueue => "correct queue",
    };
    let client: Arc<dyn DistributedLock> = match (service_kind, defect) {
        (Service::CorrectQueue, _) => Arc::new(Queued::new(service, None)),
        (
            _,
            Some(
                defect @ (Defect::QueueEntryOutlivesWaiter
                | Defect::QueueOutOfOrder
                | Defect::ReleaserJumpsQueue
                | Defect::CrashedWaiterBlocksQueue),
            ),
        ) => Arc::new(Queued::new(service, Some(defect))),
        (_, Some(Defect::ValidityIgnoresElapsed | Defect::DeadlineCutsFirstAttempt)) => {
            Arc::new(OwnWaitingLoop(service))
        }
        (_, Some(Defect::ReentrantPerClient)) => {
            // Each connect is a client of its own, whose tasks share its "session".
            let capabilities = service.capabilities();
            let subject = Subject::new(name, capabilities, move || {
                let client: Arc<dyn DistributedLock> = Arc::new(service.connected());
                async move { Ok(client) }
            });
            return subject.with_proxied(vec![link::echo_server()], move |addrs| {
                let inner: Arc<dyn DistributedLock> = Arc::new(linked.connected());
                async move {
                    let addr = *addrs.first().context("no address to connect to")?;
                    let client: Arc<dyn DistributedLock> = Arc::new(link::Linked::new(
                        inner,
                        addr,
                        replaces_silent,
                        keeps_failed_busy,
                    ));
                    Ok(client)
                }
            });
        }
        _ => Arc::new(service),
    };
    // A queue in front declares the fair queue.
    let capabilities = client.capabilities();
    Subject::new(name, capabilities, move || {
        let client = client.clone();
        async move { Ok(client) }
    })
    .with_proxied(vec![link::echo_server()], move |addrs| {
        let inner: Arc<dyn DistributedLock> = Arc::new(linked.clone());
        async move {
            let addr = *addrs.first().context("no address to connect to")?;
            let client: Arc<dyn DistributedLock> = Arc::new(link::Linked::new(
                inner,
                addr,
                replaces_silent,
                keeps_failed_busy,
            ));
            Ok(client)
        }
    })
}

/// The in-process service whose primitives have `defect` (or none); its lock is correct.
fn primitives_subject(defect: Option<PrimitiveDefect>) -> Subject {
    let service = BrokenPrimitives::new(defect);
    let capabilities = service.capabilities();
    let client: Arc<dyn DistributedLock> = Arc::new(service);
    let name = defect.map_or("correct primitives", PrimitiveDefect::name);
    Subject::new(name, capabilities, move || {
        let client = client.clone();
        async move { Ok(client) }
    })
}

/// Runs every applicable case against `subject` concurrently; returns the cases that failed.
fn failing_cases(subject: &Subject) -> anyhow::Result<Vec<(&'static str, String)>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let cases: Vec<Case> = suite::applicable(subject);
        let runs = cases.iter().map(|case| {
            let (case, subject) = (*case, subject.clone());
            tokio::spawn(async move { (case.name, suite::run_case(&case, &subject).await) })
        });
        let mut failed = Vec::new();
        for run in futures::future::join_all(runs).await {
            let (name, result) = run?;
            if let Err(e) = result {
                failed.push((name, format!("{e:#}")));
            }
        }
        failed.sort();
        Ok(failed)
    })
}

/// Trials run at once unless `--test-threads` says otherwise. A trial spends its time waiting on
/// the cases' timers (TTLs, waits, timeouts), not computing: the whole binary used 6 s of CPU in
/// 24 s with all 30 at once, and 20 s in 343 s with one per core. But the burst of their first
/// requests delays some: with all 30 at once one request's stamp came 65 ms late, past the 40 ms
/// the suite allows between the caller's clock reading and the request's stamp, and with 15 at
/// once beside another binary 16 ms. Twelve at once passed in every run so far.
const TRIALS_AT_ONCE: usize = 12;

fn main() {
    let mut args = Arguments::from_args();
    args.test_threads.get_or_insert(TRIALS_AT_ONCE);
    let table: Arc<Mutex<BTreeMap<&'static str, Vec<&'static str>>>> = Arc::default();
    let mut trials: Vec<Trial> = [
        (
            "teeth::correct_service_passes_every_case",
            Service::Plain(None),
        ),
        (
            "teeth::correct_queue_passes_every_case",
            Service::CorrectQueue,
        ),
    ]
    .into_iter()
    .map(|(name, service)| {
        Trial::test(name, move || {
            let failed =
                failing_cases(&subject(service)).map_err(|e| Failed::from(e.to_string()))?;
            if failed.is_empty() {
                Ok(())
            } else {
                let lines: Vec<String> = failed.iter().map(|(c, e)| format!("{c}: {e}")).collect();
                Err(format!("the correct service failed:\n{}", lines.join("\n")).into())
            }
        })
    })
    .collect();
    trials.push(Trial::test(
        "teeth::correct_primitives_pass_every_case",
        || {
            let failed = failing_cases(&primitives_subject(None))
                .map_err(|e| Failed::from(e.to_string()))?;
            if failed.is_empty() {
                Ok(())
            } else {
                let lines: Vec<String> = failed.iter().map(|(c, e)| format!("{c}: {e}")).collect();
                Err(format!("the correct primitives failed:\n{}", lines.join("\n")).into())
            }
        },
    ));
    for defect in PrimitiveDefect::ALL {
        let table = table.clone();
        let name = format!("teeth::{}", defect.name().replace([' ', '-'], "_"));
        trials.push(Trial::test(name, move || {
            let failed = failing_cases(&primitives_subject(Some(defect)))
                .map_err(|e| Failed::from(e.to_string()))?;
            let caught: Vec<&'static str> = failed.iter().map(|(case, _)| *case).collect();
            if let Ok(mut table) = table.lock() {
                table.insert(defect.name(), caught.clone());
            }
            if caught.is_empty() {
                Err(format!("no case caught the defect \"{}\"", defect.name()).into())
            } else {
                Ok(())
            }
        }));
    }
    for defect in Defect::ALL {
        let table = table.clone();
        let name = format!("teeth::{}", defect.name().replace([' ', '-'], "_"));
        trials.push(Trial::test(name, move || {
            let failed = failing_cases(&subject(Service::Plain(Some(defect))))
                .map_err(|e| Failed::from(e.to_string()))?;
            let caught: Vec<&'static str> = failed.iter().map(|(case, _)| *case).collect();
            if let Ok(mut table) = table.lock() {
                table.insert(defect.name(), caught.clone());
            }
            if caught.is_empty() {
                Err(format!("no case caught the defect \"{}\"", defect.name()).into())
            } else {
                Ok(())
            }
        }));
    }
    let conclusion = libtest_mimic::run(&args, trials);
    if let Ok(table) = table.lock() {
        if !table.is_empty() {
            println!("\nvariant → cases that caught it");
            for (variant, caught) in table.iter() {
                let caught = if caught.is_empty() {
                    "NOTHING (survived)".to_string()
                } else {
                    caught.join(", ")
                };
                println!("  {variant:<40} → {caught}");
            }
        }
    }
    conclusion.exit();
}
