//! The shared compliance suite against a real PostgreSQL, plus what is particular to it:
//! exclusion with a plain `psql` session in both directions on the documented key (for the lock,
//! the read-write lock and the semaphore), a session the server ends, a server restart, and
//! configuration errors.
//!
//! One server serves every case; the outage case and the restart case get one each, and a
//! read-only one stands for a standby. The
//! freezable client of the lost-signal and paused-holder cases reaches the shared server through
//! a [`FreezeProxy`]: freezing it silences the lock session, and the server ends it after the
//! session timeout.
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-postgres --test compliance
//! ```
//!
//! [`FreezeProxy`]: dlock_testkit::FreezeProxy

#![allow(clippy::unwrap_used)]

mod support;

#[path = "compliance/pg_cases.rs"]
mod pg_cases;

#[path = "compliance/pg_primitives.rs"]
mod pg_primitives;

use std::sync::Arc;
use std::time::Duration;

use anyhow::ensure;
use async_trait::async_trait;
use dlock_compliance::{suite, Inspect, Outage, Subject, Timing};
use dlock_core::DistributedLock;
use dlock_testkit::fixtures::{docker_opt_out, PostgresOptions, PostgresServer};
use dlock_testkit::{trials, url_target, url_via};

use support::{client, raw};

/// Counts what a namespace left on the server: rows of `dlock_holders`, and advisory locks held
/// by anyone under those rows' keys.
struct Stored {
    url: String,
}

#[async_trait]
impl Inspect for Stored {
    async fn stored(&self, namespace: &str) -> anyhow::Result<u64> {
        let raw = raw(&self.url).await?;
        let row = raw
            .query_one(
                "SELECT count(*) FROM dlock_holders WHERE starts_with(name, $1)",
                &[&namespace],
            )
            .await?;
        let rows: i64 = row.get(0);
        Ok(u64::try_from(rows).unwrap_or(0))
    }
}

/// What the backend declares for PostgreSQL.
fn declared() -> dlock_core::backend::Capabilities {
    dlock_postgres::PgLock::CAPABILITIES
}

fn subject(
    shared: &PostgresServer,
    dedicated: &PostgresServer,
    capabilities: dlock_core::backend::Capabilities,
) -> anyhow::Result<Subject> {
    let url = shared.url();
    let connect = {
        let url = url.clone();
        move || {
            let url = url.clone();
            async move {
                let locks: Arc<dyn DistributedLock> = client(&url).await?;
                Ok(locks)
            }
        }
    };
    let outage_url = dedicated.url();
    let outage = Outage::new(Arc::new(dedicated.member()?.clone()), move || {
        let url = outage_url.clone();
        async move {
            let locks: Arc<dyn DistributedLock> = client(&url).await?;
            Ok(locks)
        }
    });
    let frozen = url.clone();
    let proxied = url.clone();
    Ok(Subject::new("postgres", capabilities, connect)
        .with_timing(Timing {
            ttl: Duration::from_secs(1),
            slack: Duration::from_secs(3),
        })
        .with_outage(outage)
        .with_inspect(Arc::new(Stored { url: url.clone() }))
        .with_freezable(move || {
            let url = frozen.clone();
            async move { support::freezable_client(&url).await }
        })
        .with_proxied(vec![url_target(&url, 5432)?], move |addrs| {
            let url = proxied.clone();
            async move {
                let via = url_via(&url, addrs[0])?;
                let locks: Arc<dyn DistributedLock> = client(&via).await?;
                Ok(locks)
            }
        }))
}

fn main() {
    // One case per core, not `trials::arguments`' four: the cases bound a first answer by a 1 s
    // lease's validity, and with four at once (the client used 25 s of CPU in 55 s) three of
    // them went past it beside another test binary.
    let args = libtest_mimic::Arguments::from_args();
    if PostgresServer::needs_docker() && docker_opt_out() {
        let mut trials = suite::placeholder_trials("postgres", declared());
        trials.extend(trials::placeholders(pg_cases::names()));
        trials.extend(trials::placeholders(pg_primitives::names()));
        trials::run_ignored(&args, trials);
    }
    let runtime = trials::fixture_runtime();
    let (shared, dedicated, restarted, read_only) =
        trials::start(&runtime, "four PostgreSQL servers", async {
            tokio::try_join!(
                // Counts statements, for the case that a lock session plans them once.
                PostgresServer::start_with(
                    PostgresOptions::default()
                        .with_setting("shared_preload_libraries", "pg_stat_statements")
                        .with_setting("pg_stat_statements.track_planning", "on")
                ),
                PostgresServer::start(),
                PostgresServer::start(),
                // Takes no writes, as a standby: a client must pass it by.
                PostgresServer::start_with(
                    PostgresOptions::default().with_setting("default_transaction_read_only", "on")
                ),
            )
        });
    let (shared, restarted) = (Arc::new(shared), Arc::new(restarted));
    let read_only = Arc::new(read_only);
    // The backend declares its own capabilities, which must be its type's constant; the suite checks
    // them.
    let capabilities = runtime.block_on(client(&shared.url())).and_then(|locks| {
        let own = locks.capabilities();
        ensure!(
            own == declared(),
            "the client declares {own:?}, its type's constant {:?}",
            declared()
        );
        Ok(own)
    });
    let trials = match capabilities.and_then(|c| subject(&shared, &dedicated, c)) {
        Ok(subject) => {
            let mut trials = suite::trials(&subject);
            trials.extend(pg_cases::trials(&shared, &restarted, &read_only));
            trials.extend(pg_primitives::trials(&shared));
            trials
        }
        Err(e) => {
            eprintln!("cannot build the subject: {e:#}");
            std::process::exit(101);
        }
    };
    trials::run_then(&args, trials, &runtime, || async {
        let shared = pg_cases::unshare(shared)?;
        let restarted = pg_cases::unshare(restarted)?;
        let read_only = pg_cases::unshare(read_only)?;
        let (a, b, c, d) = tokio::join!(
            shared.shutdown(),
            dedicated.shutdown(),
            restarted.shutdown(),
            read_only.shutdown()
        );
        a.and(b).and(c).and(d)
    })
}
