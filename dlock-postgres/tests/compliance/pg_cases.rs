//! PostgreSQL-specific cases, beyond the shared suite: exclusion with a plain `psql` session in
//! both directions on the documented advisory key, in both key spaces; a session the server
//! ends (`pg_terminate_backend`) and a server restart or crash, with fenced writes; a client
//! whose locks fill more than one session; grants held up on the server; tasks of one
//! client; clients that meet while the tables are created; the queue's announcements, heard by
//! the next waiter's client only, and none for waiters that wait in the lock manager, which a
//! release nobody announces wakes too; eviction, which ends the holder's whole session;
//! configuration errors.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use dlock_core::inspect::Eviction;
use dlock_core::{
    Admin, Backoff, DistributedLock, DistributedLockExt, Error, Fenced, LockOptions, LostReason,
};
use dlock_postgres::{advisory_key, AdvisoryKey, LOCKS_PER_SESSION};
use dlock_testkit::case;
use dlock_testkit::fixtures::PostgresServer;
use dlock_testkit::trials::{self, Case};
use libtest_mimic::Trial;
use tokio::time::Instant;

use crate::support::{builder, client, raw, raw_listener, NAMESPACE, SESSION_TIMEOUT};

/// Upper bound for one whole case.
const TRIAL_BUDGET: Duration = Duration::from_secs(120);

/// What the cases need: the shared server, and the one the restart case may restart.
#[derive(Clone)]
pub struct Env {
    server: Arc<PostgresServer>,
    restarted: Arc<PostgresServer>,
    /// A server that takes no writes (`default_transaction_read_only`), as a standby.
    read_only: Arc<PostgresServer>,
}

fn cases() -> Vec<(&'static str, Case<Env>)> {
    vec![
        case!(psql_holds_and_dlock_waits),
        case!(dlock_holds_and_psql_is_refused),
        case!(names_map_to_distributedlocks_keys_in_both_spaces),
        case!(a_terminated_session_loses_its_leases_at_once),
        case!(a_client_past_a_sessions_share_of_locks_opens_another),
        case!(a_held_up_grant_keeps_its_session_in_use),
        case!(an_idle_client_keeps_its_session_open),
        case!(a_grant_counts_its_ttl_from_before_its_session_opened),
        case!(a_held_up_grant_gets_a_lease_with_its_session_timeout_ahead),
        case!(a_restart_or_crash_loses_the_leases_and_tokens_keep_growing),
        case!(tasks_of_one_client_exclude_each_other),
        case!(grants_and_releases_of_many_tasks_share_statements),
        case!(a_shared_statement_that_fails_gives_every_key_back),
        case!(a_client_that_waited_for_the_layout_leaves_the_tables_alone),
        case!(a_lock_session_plans_its_grant_and_release_once),
        case!(a_release_is_announced_to_the_heads_client_only),
        case!(seated_waiters_are_woken_in_turn_and_nothing_is_announced),
        case!(a_dropped_seated_waiter_lets_the_one_behind_move_up),
        case!(waiters_past_the_seats_are_announced_and_served_in_turn),
        case!(eviction_ends_the_holders_session),
        case!(bad_configuration_fails_fast_and_shows_no_password),
        case!(of_several_hosts_the_one_that_takes_writes_is_used),
    ]
}

/// The trial names, for a run that opted out of Docker.
pub fn names() -> Vec<String> {
    trials::names("postgres", &cases())
}

/// The trials against the shared server (and the restartable one).
pub fn trials(
    server: &Arc<PostgresServer>,
    restarted: &Arc<PostgresServer>,
    read_only: &Arc<PostgresServer>,
) -> Vec<Trial> {
    let env = Env {
        server: server.clone(),
        restarted: restarted.clone(),
        read_only: read_only.clone(),
    };
    trials::cases("postgres", &cases(), &env, TRIAL_BUDGET)
}

/// The server back from the trials' shared handle, to remove it.
pub fn unshare(
    server: Arc<PostgresServer>,
) -> Result<PostgresServer, dlock_testkit::fixtures::FixtureError> {
    Arc::try_unwrap(server).map_err(|_| {
        dlock_testkit::fixtures::FixtureError::Config("a trial still holds the server".into())
    })
}

fn name(case: &str) -> String {
    format!("{NAMESPACE}{case}/{}", rand_suffix())
}

fn rand_suffix() -> u64 {
    dlock_core::OwnerToken::random().as_u128() as u64
}

/// `key`'s arguments for `pg_try_advisory_lock` and friends in psql.
fn sql_args(key: AdvisoryKey) -> String {
    match key {
        AdvisoryKey::Single(k) => format!("{k}"),
        AdvisoryKey::Pair(h, l) => format!("{h}, {l}"),
    }
}

fn opts(ttl: Duration) -> LockOptions {
    LockOptions::new(ttl)
}

/// A psql session holds the name's key with `pg_advisory_lock`: dlock is refused, waits, and
/// takes the lock once psql lets it go, a release nobody announces. A waiter on a waiting
/// connection, whose backoff is ten seconds, takes it within half a second, three times in a row:
/// the lock manager woke it. One without (`waiting_connections=0`) finds it by polling at its
/// backoff, within three seconds.
async fn psql_holds_and_dlock_waits(env: Env) -> anyhow::Result<()> {
    let name = name("psql-holds");
    let AdvisoryKey::Single(key) = advisory_key(&name) else {
        bail!("{name} should hash into the bigint space");
    };
    let seated = client(&env.server.url()).await?;
    let polling = Arc::new(
        builder(&env.server.url())?
            .with_waiting_connections(0)
            .connect()
            .await?,
    );
    let rounds = [
        (
            &seated,
            without_polling(Duration::from_secs(20)),
            Duration::from_millis(500),
        ),
        (
            &seated,
            without_polling(Duration::from_secs(20)),
            Duration::from_millis(500),
        ),
        (
            &seated,
            without_polling(Duration::from_secs(20)),
            Duration::from_millis(500),
        ),
        (
            &polling,
            opts(Duration::from_secs(5)).with_wait(Duration::from_secs(20)),
            Duration::from_secs(3),
        ),
    ];
    for (round, (locks, options, within)) in rounds.into_iter().enumerate() {
        let holder = env.server.hold_advisory_lock(key).await?;
        holder.wait_granted(Duration::from_secs(10)).await?;
        ensure!(
            locks
                .try_acquire(&name, &opts(Duration::from_secs(5)))
                .await?
                .is_none(),
            "round {round}: dlock took a key psql holds"
        );
        let waiting = waiting_for(locks, &name, options);
        tokio::time::sleep(Duration::from_millis(500)).await;
        ensure!(
            !waiting.is_finished(),
            "round {round}: dlock's waiter did not wait for psql"
        );
        let released = Instant::now();
        holder.release().await?;
        let who = format!("round {round}: the waiter");
        taken_within(waiting, released, within, &who)
            .await?
            .release()
            .await?;
    }
    Ok(())
}

/// dlock holds a name; psql's `pg_try_advisory_lock` on the documented key is refused until
/// dlock releases.
async fn dlock_holds_and_psql_is_refused(env: Env) -> anyhow::Result<()> {
    let name = name("dlock-holds");
    let args = sql_args(advisory_key(&name));
    let locks = client(&env.server.url()).await?;
    let lease = locks.acquire(&name, &opts(Duration::from_secs(10))).await?;
    let tried = env
        .server
        .psql(&format!("SELECT pg_try_advisory_lock({args})"))
        .await?;
    ensure!(tried == "f", "psql took a key dlock holds: {tried:?}");
    lease.release().await?;
    let tried = env
        .server
        .psql(&format!("SELECT pg_try_advisory_lock({args})"))
        .await?;
    ensure!(
        tried == "t",
        "psql could not take the released key: {tried:?}"
    );
    Ok(())
}

/// Short ASCII names land in the pair space, 16 hex digits are their number, others are hashed
/// (DistributedLock's rules): `pg_locks` shows dlock's holds exactly there.
async fn names_map_to_distributedlocks_keys_in_both_spaces(env: Env) -> anyhow::Result<()> {
    let locks = client(&env.server.url()).await?;
    let number = format!("{:016x}", rand_suffix() >> 1);
    for (name, space) in [("job", 2), (number.as_str(), 1), ("reports/daily/eu", 1)] {
        let key = advisory_key(name);
        let (classid, objid, objsubid) = key.in_pg_locks();
        ensure!(objsubid == space, "{name:?} maps to {key}");
        let lease = locks.acquire(name, &opts(Duration::from_secs(10))).await?;
        let shown = env
            .server
            .psql(&format!(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
                 AND classid = {classid} AND objid = {objid} AND objsubid = {objsubid}"
            ))
            .await?;
        let tried = env
            .server
            .psql(&format!("SELECT pg_try_advisory_lock({})", sql_args(key)))
            .await?;
        lease.release().await?;
        ensure!(
            shown == "1",
            "pg_locks shows {shown} holds of {name:?} as {key}"
        );
        ensure!(
            tried == "f",
            "psql took {name:?}'s key {key} while dlock held it"
        );
    }
    if let AdvisoryKey::Single(k) = advisory_key(&number) {
        ensure!(
            format!("{k:016x}") == number,
            "16 hex digits are not their own number"
        );
    }
    Ok(())
}

/// An operator ends the holder's session with `pg_terminate_backend`: the lease turns lost at
/// once (not at its TTL), another client takes the lock with a greater token, and the fence
/// refuses the old holder's late write.
async fn a_terminated_session_loses_its_leases_at_once(env: Env) -> anyhow::Result<()> {
    let name = name("terminated");
    let holder = client(&env.server.url()).await?;
    let other = client(&env.server.url()).await?;
    let lease = holder
        .acquire(&name, &opts(Duration::from_secs(30)).with_auto_renew())
        .await?;
    let other_name = format!("{name}/other");
    let _also_held = holder
        .acquire(&other_name, &opts(Duration::from_secs(30)))
        .await?;
    let resource = Fenced::new(Vec::<&str>::new());
    resource.write(lease.fencing_token(), |log| log.push("before"))?;
    let pid = holder.session_pid().await.context("the holder's session")?;
    terminate(&env.server.url(), pid).await?;
    let watch = lease.watch();
    let reason = tokio::time::timeout(Duration::from_secs(1), watch.lost())
        .await
        .context("the lease was not lost within 1 s of its session's end")?;
    ensure!(
        reason == LostReason::SessionEnded,
        "the lease was lost for {reason}"
    );
    let successor = other.acquire(&name, &opts(Duration::from_secs(10))).await?;
    ensure!(
        successor.fencing_token() > lease.fencing_token(),
        "the successor's token {} is not above {}",
        successor.fencing_token(),
        lease.fencing_token()
    );
    resource.write(successor.fencing_token(), |log| log.push("successor"))?;
    ensure!(
        resource
            .write(lease.fencing_token(), |log| log.push("late"))
            .is_err(),
        "the fence took the terminated holder's write"
    );
    successor.release().await?;
    // The holder's client opens a new session for its next lock.
    let again = holder
        .acquire(&name, &opts(Duration::from_secs(10)))
        .await?;
    again.release().await?;
    Ok(())
}

/// A client that holds more than [`LOCKS_PER_SESSION`] locks holds the rest in a second
/// session. Auto-renew keeps the leases of both sessions past their TTL; ending the second
/// session loses its leases only; the full one closes once its locks are given back.
async fn a_client_past_a_sessions_share_of_locks_opens_another(env: Env) -> anyhow::Result<()> {
    use futures::{StreamExt, TryStreamExt};
    let prefix = name("many");
    let holder = client(&env.server.url()).await?;
    let first = holder.session_pid().await.context("the first session")?;
    let count = LOCKS_PER_SESSION + 100;
    let leases: Vec<_> = futures::stream::iter(0..count)
        .map(|i| {
            let (holder, name) = (holder.clone(), format!("{prefix}/{i}"));
            let opts = opts(Duration::from_secs(3)).with_auto_renew();
            async move { holder.acquire(&name, &opts).await }
        })
        .buffer_unordered(16)
        .try_collect()
        .await?;
    let second = holder.session_pid().await.context("the second session")?;
    ensure!(second != first, "{count} locks were taken in one session");
    let raw = raw(&env.server.url()).await?;
    let (in_first, in_second) = (
        advisory_locks_of(&raw, first).await?,
        advisory_locks_of(&raw, second).await?,
    );
    ensure!(
        in_first >= LOCKS_PER_SESSION && in_first + in_second == count,
        "the sessions hold {in_first} and {in_second} of {count} locks"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    let renewed = leases.iter().filter(|l| l.state().is_held()).count();
    ensure!(
        renewed == count,
        "{renewed} of {count} auto-renewed leases are held past their 3 s TTL"
    );
    terminate(&env.server.url(), second).await?;
    let settling = Instant::now() + Duration::from_secs(3);
    let lost = loop {
        let lost = leases.iter().filter(|l| !l.state().is_held()).count();
        if lost >= in_second || Instant::now() > settling {
            break lost;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    ensure!(
        lost == in_second,
        "{lost} leases were lost with the session that held {in_second}"
    );
    let kept = leases.into_iter().filter(|l| l.state().is_held());
    futures::stream::iter(kept)
        .map(|lease| lease.release())
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    // The next lock goes to a new session; the first one, emptied, closes.
    let next = holder
        .acquire(&format!("{prefix}/next"), &opts(Duration::from_secs(10)))
        .await?;
    let open = "SELECT count(*) FROM pg_stat_activity WHERE pid = $1";
    let what = "the emptied full session closing";
    until_count(&raw, open, &first, 0, Duration::from_secs(5), what).await?;
    next.release().await?;
    Ok(())
}

/// A restart (every session ends, the data stays) and a crash (recovery from the WAL; the
/// unlogged table is emptied): held leases turn lost, and the next tokens are still greater.
async fn a_restart_or_crash_loses_the_leases_and_tokens_keep_growing(
    env: Env,
) -> anyhow::Result<()> {
    let server = &env.restarted;
    let member = server.member()?;
    let locks = client(&server.url()).await?;
    let mut last = 0;
    for crash in [false, true] {
        let name = name(if crash { "crash" } else { "restart" });
        let lease = locks
            .acquire(&name, &opts(Duration::from_secs(30)).with_auto_renew())
            .await?;
        ensure!(lease.fencing_token().0 > last, "tokens went back");
        if crash {
            member.kill().await?;
            member.start().await?;
        } else {
            member.restart_keep_data().await?;
        }
        member.wait_ready().await?;
        let watch = lease.watch();
        tokio::time::timeout(SESSION_TIMEOUT * 2, watch.lost())
            .await
            .with_context(|| {
                format!(
                    "the lease outlived the {}",
                    if crash { "crash" } else { "restart" }
                )
            })?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let next = loop {
            match locks.acquire(&name, &opts(Duration::from_secs(10))).await {
                Ok(next) => break next,
                Err(e) if e.is_temporary() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e).context("acquire after the server came back"),
            }
        };
        ensure!(
            next.fencing_token() > lease.fencing_token(),
            "after the {}, token {} is not above {}",
            if crash { "crash" } else { "restart" },
            next.fencing_token(),
            lease.fencing_token()
        );
        last = next.fencing_token().0;
        next.release().await?;
    }
    Ok(())
}

/// Every lock of a client lives in one session, where advisory locks are re-entrant: the client
/// itself must refuse a second task, and hand the key over when the first releases.
async fn tasks_of_one_client_exclude_each_other(env: Env) -> anyhow::Result<()> {
    let name = name("one-client");
    let locks = client(&env.server.url()).await?;
    let first = locks.acquire(&name, &opts(Duration::from_secs(10))).await?;
    let first_token = first.fencing_token();
    ensure!(
        locks
            .try_acquire(&name, &opts(Duration::from_secs(10)))
            .await?
            .is_none(),
        "a second task of the same client took the key"
    );
    let waiting = {
        let (locks, name) = (locks.clone(), name.clone());
        tokio::spawn(async move {
            let opts = opts(Duration::from_secs(10)).with_wait(Duration::from_secs(10));
            let lease = locks.acquire(&name, &opts).await;
            (lease, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    first.release().await?;
    let (second, granted) = waiting.await?;
    let second = second?;
    ensure!(
        granted - released < Duration::from_millis(500),
        "the local waiter took {:?} after the release",
        granted - released
    );
    ensure!(second.fencing_token() > first_token, "tokens did not grow");
    second.release().await?;
    Ok(())
}

/// Grants and releases of many tasks of one client go together as one statement while one is
/// on its way (see the crate's `batch` module), and every key keeps what it had alone: two
/// clients of 32 tasks each, on 8 names shared by both, never hold a name twice at once, each
/// name's tokens grow in the order of its holders, and every waiter is served (none waits out
/// its 30 s). The statements that carried many keys are counted by `pg_stat_statements`, on a
/// database of its own.
async fn grants_and_releases_of_many_tasks_share_statements(env: Env) -> anyhow::Result<()> {
    let url = env.server.url();
    on_own_database(&url, "dlock_together", |url| async move {
        shared_statements(&url).await
    })
    .await
}

async fn shared_statements(url: &str) -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    const NAMES: usize = 8;
    const TASKS: usize = 32;
    const CYCLES: usize = 15;
    let stats = raw(url).await?;
    stats
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await?;
    // Half the names are short enough for the pair space, half are hashed into the bigint one.
    let names: Arc<Vec<String>> = Arc::new(
        (0..NAMES)
            .map(|i| match i % 2 {
                0 => format!("t{:08}", rand_suffix() % 100_000_000),
                _ => name("together"),
            })
            .collect(),
    );
    let held: Arc<Vec<AtomicBool>> = Arc::new((0..NAMES).map(|_| AtomicBool::new(false)).collect());
    let last: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new(vec![0; NAMES]));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let locks = client(url).await?;
        for task in 0..TASKS {
            let (locks, names, held, last) =
                (locks.clone(), names.clone(), held.clone(), last.clone());
            tasks.push(tokio::spawn(async move {
                let opts = opts(Duration::from_secs(10)).with_wait(Duration::from_secs(30));
                for cycle in 0..CYCLES {
                    let i = (task + cycle) % NAMES;
                    let lease = locks.acquire(&names[i], &opts).await?;
                    ensure!(
                        !held[i].swap(true, Ordering::SeqCst),
                        "{} was granted while held",
                        names[i]
                    );
                    {
                        let mut last = last.lock().unwrap();
                        let token = lease.fencing_token().0;
                        ensure!(
                            token > last[i],
                            "{}: token {token} after {}",
                            names[i],
                            last[i]
                        );
                        last[i] = token;
                    }
                    tokio::task::yield_now().await;
                    held[i].store(false, Ordering::SeqCst);
                    lease.release().await?;
                }
                anyhow::Ok(())
            }));
        }
    }
    for task in tasks {
        task.await??;
    }
    shared_releases_of_readers_and_permits(url).await?;
    let rows = stats
        .query(
            "SELECT CASE WHEN query LIKE '%INSERT INTO dlock_holders%' THEN 'grants'
                 ELSE 'releases' END, sum(calls)::bigint, sum(rows)::bigint
             FROM pg_stat_statements
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                 AND query LIKE 'WITH r AS MATERIALIZED%'
             GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await?;
    let counted: Vec<(String, i64, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    ensure!(
        counted.len() == 2 && counted.iter().all(|(_, calls, rows)| *rows > *calls),
        "expected grants and releases sent several to a statement, found {counted:?}"
    );
    Ok(())
}

/// Many read holds of one read-write lock and every permit of one semaphore, given back at
/// once (their releases share statements), leave nothing held: another client's writer and all
/// of the semaphore's permits are granted at once after.
async fn shared_releases_of_readers_and_permits(url: &str) -> anyhow::Result<()> {
    const READERS: usize = 16;
    const PERMITS: u32 = 8;
    let rw_name = format!("r{:08}", rand_suffix() % 100_000_000);
    let semaphore_name = name("together-semaphore");
    let locks = client(url).await?;
    let (rw, semaphore) = (
        locks.rw(&rw_name)?,
        locks.semaphore(&semaphore_name, PERMITS)?,
    );
    let mut reads = Vec::new();
    for _ in 0..READERS {
        reads.push(
            rw.try_read(&opts(Duration::from_secs(10)))
                .await?
                .context("a read hold")?,
        );
    }
    let mut permits = Vec::new();
    for _ in 0..PERMITS {
        let permit = semaphore
            .try_acquire(&opts(Duration::from_secs(10)))
            .await?;
        permits.push(permit.context("a permit")?);
    }
    let (read_releases, permit_releases) = futures::future::join(
        futures::future::join_all(reads.into_iter().map(|r| r.release())),
        futures::future::join_all(permits.into_iter().map(|p| p.release())),
    )
    .await;
    for released in read_releases.into_iter().chain(permit_releases) {
        ensure!(
            released? == dlock_core::Released::Released,
            "a hold was not held at its release"
        );
    }
    let other = client(url).await?;
    let writer = other
        .rw(&rw_name)?
        .try_write(&opts(Duration::from_secs(5)))
        .await?
        .context("a read hold was kept after its release")?;
    writer.release().await?;
    let semaphore = other.semaphore(&semaphore_name, PERMITS)?;
    let mut taken = Vec::new();
    for _ in 0..PERMITS {
        let permit = semaphore.try_acquire(&opts(Duration::from_secs(5))).await?;
        taken.push(permit.context("a permit was kept after its release")?);
    }
    for permit in taken {
        permit.release().await?;
    }
    Ok(())
}

/// A statement of many grants that fails after taking some of their keys (session locks
/// outlive a failed statement) fails each of its grants, and each gives its key back: no key
/// stays held by the client's session, and another client takes every one at once. The failure
/// is a trigger that refuses one name's row, on a database of its own; rounds of 16 tries go at
/// once until one of them shared the refused name's statement and failed with it.
async fn a_shared_statement_that_fails_gives_every_key_back(env: Env) -> anyhow::Result<()> {
    let url = env.server.url();
    on_own_database(&url, "dlock_failed_together", |url| async move {
        failed_together(&url).await
    })
    .await
}

async fn failed_together(url: &str) -> anyhow::Result<()> {
    const TRIES: usize = 16;
    let locks = client(url).await?;
    let refused = name("refused");
    // The layout first, then the trigger on it.
    locks
        .acquire(&name("layout"), &opts(Duration::from_secs(5)))
        .await?
        .release()
        .await?;
    let look = raw(url).await?;
    look.batch_execute(&format!(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
             IF NEW.name = '{refused}' THEN RAISE EXCEPTION 'refused'; END IF;
             RETURN NEW; END $$;
         CREATE TRIGGER refuse BEFORE INSERT ON dlock_holders
             FOR EACH ROW EXECUTE FUNCTION refuse();"
    ))
    .await?;
    let names: Vec<String> = (0..TRIES).map(|_| name("beside-refused")).collect();
    let mut shared_a_failure = false;
    for _round in 0..20 {
        // The first try goes alone; those behind it, the refused name last, go together.
        let tries = names
            .iter()
            .cloned()
            .chain(std::iter::once(refused.clone()));
        let attempts = futures::future::join_all(tries.map(|name| {
            let locks = locks.clone();
            async move {
                let lease = locks
                    .try_acquire(&name, &opts(Duration::from_secs(10)))
                    .await;
                (name, lease)
            }
        }))
        .await;
        for (name, lease) in attempts {
            match lease {
                Ok(Some(lease)) => {
                    lease.release().await?;
                }
                Ok(None) => bail!("{name} was busy, and nobody holds it"),
                Err(e) if !e.to_string().contains("refused") => {
                    bail!("{name}: {e}, not the trigger's refusal")
                }
                Err(_) if name == refused => {}
                Err(_) => shared_a_failure = true,
            }
        }
        if shared_a_failure {
            break;
        }
    }
    ensure!(
        shared_a_failure,
        "no try shared the refused name's statement in 20 rounds"
    );
    let pid = locks.session_pid().await.context("no lock session")?;
    let by = Instant::now() + Duration::from_secs(5);
    loop {
        let held = advisory_locks_of(&look, pid).await?;
        if held == 0 {
            break;
        }
        ensure!(
            Instant::now() < by,
            "the client's session still holds {held} advisory locks 5 s after the failure"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let other = client(url).await?;
    for name in &names {
        let lease = other
            .try_acquire(name, &opts(Duration::from_secs(5)))
            .await?
            .with_context(|| format!("{name} was kept after the failed statement"))?;
        lease.release().await?;
    }
    Ok(())
}

/// How many advisory locks the server process `pid` holds.
async fn advisory_locks_of(look: &tokio_postgres::Client, pid: i32) -> anyhow::Result<usize> {
    let row = look
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = $1",
            &[&pid],
        )
        .await?;
    Ok(row.get::<_, i64>(0) as usize)
}

/// A lock session that runs a statement is not idle, however long the statement takes: while a
/// grant on it is held up past half the session timeout, the client's next lock goes to the same
/// session (behind it) rather than to a new one, and once the hold-up ends both locks are held,
/// renewed, and given back on the server at their release. (The client used to take the session
/// for idle and open another: with many grants queued on one connection, a client's locks spread
/// over a session more than needed, and a lease whose grant was under way on the replaced
/// session could not find it again.) The grant is held up by a transaction that locks
/// `dlock_holders`, on a database of its own.
async fn a_held_up_grant_keeps_its_session_in_use(env: Env) -> anyhow::Result<()> {
    let url = env.server.url();
    on_own_database(&url, "dlock_held_up", |url| async move {
        held_up_grant_keeps_its_session(&url).await
    })
    .await
}

async fn held_up_grant_keeps_its_session(url: &str) -> anyhow::Result<()> {
    let holder = Arc::new(
        builder(url)?
            .with_request_timeout(Duration::from_secs(10))
            .connect()
            .await?,
    );
    // The TTL counts from before the grant was held up, so it outlasts the hold-up; renewals
    // (pings of the session) keep the leases from then on.
    let renewed = |ttl| {
        let mut options = opts(ttl);
        options.auto_renew = Some(dlock_core::AutoRenew {
            interval: Some(Duration::from_millis(250)),
            ..Default::default()
        });
        options
    };
    holder
        .acquire(&name("warm"), &opts(Duration::from_secs(5)))
        .await?
        .release()
        .await?;
    let first = holder.session_pid().await.context("the first session")?;
    let blocker = raw(url).await?;
    blocker
        .batch_execute("BEGIN; LOCK TABLE dlock_holders IN ACCESS EXCLUSIVE MODE")
        .await?;
    let spawn_acquire = |name: String| {
        let holder = holder.clone();
        tokio::spawn(async move {
            holder
                .acquire(&name, &renewed(Duration::from_secs(10)))
                .await
        })
    };
    let slow = spawn_acquire(name("slow"));
    tokio::time::sleep(SESSION_TIMEOUT / 2 + Duration::from_millis(300)).await;
    let next = spawn_acquire(name("next"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    blocker.batch_execute("COMMIT").await?;
    let (slow, next) = (slow.await??, next.await??);
    let second = holder.session_pid().await.context("the session after")?;
    ensure!(
        second == first,
        "a session running a held-up grant was taken for idle: the next lock went to another"
    );
    tokio::time::sleep(SESSION_TIMEOUT * 2).await;
    ensure!(
        slow.state().is_held() && next.state().is_held(),
        "the held-up lease is {:?}, the next one {:?}",
        slow.state(),
        next.state()
    );
    let look = raw(url).await?;
    let held = advisory_locks_of(&look, first).await?;
    ensure!(
        held == 2,
        "the session holds {held} locks, not the two granted on it"
    );
    for lease in [slow, next] {
        ensure!(
            lease.release().await? == dlock_core::Released::Released,
            "a lock granted on the session was not released"
        );
    }
    let held = advisory_locks_of(&look, first).await?;
    ensure!(
        held == 0,
        "the session still holds {held} locks after their release"
    );
    Ok(())
}

/// A client left idle for twice its session timeout keeps its lock session: the next acquire
/// goes out on it rather than opening (and authenticating) a new connection within the lease's
/// validity. (An idle session used to be left to the server's idle timeout, so a client's first
/// acquire after a quiet spell opened a new one, and on a loaded machine that took longer than a
/// 1 s lease's validity.)
async fn an_idle_client_keeps_its_session_open(env: Env) -> anyhow::Result<()> {
    let holder = client(&env.server.url()).await?;
    let first = holder.session_pid().await.context("the first session")?;
    tokio::time::sleep(SESSION_TIMEOUT * 2).await;
    let lease = holder
        .acquire(&name("idle"), &opts(Duration::from_secs(5)))
        .await?;
    let second = holder.session_pid().await.context("the session after")?;
    lease.release().await?;
    ensure!(
        second == first,
        "the idle client's session (server process {first}) was replaced by {second}"
    );
    Ok(())
}

/// Ends the session of server process `pid`, as an operator does, and checks that it ended.
async fn terminate(url: &str, pid: i32) -> anyhow::Result<()> {
    let ended: bool = raw(url)
        .await?
        .query_one("SELECT pg_terminate_backend($1, 5000)", &[&pid])
        .await?
        .get(0);
    ensure!(ended, "pg_terminate_backend({pid}) answered false");
    Ok(())
}

/// Ends the client's lock session on the server, and waits until the client has seen it end.
async fn end_session(locks: &dlock_postgres::PgLock, url: &str) -> anyhow::Result<()> {
    let pid = locks.session_pid().await.context("no lock session")?;
    terminate(url, pid).await?;
    let by = Instant::now() + Duration::from_secs(5);
    while locks.session_pid().await == Some(pid) {
        ensure!(
            Instant::now() < by,
            "the client did not see its session end within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// A waiting acquire whose session takes long to open counts its TTL from before it sought the
/// session, as its lease does: once the lease's validity ends, the server has given the lock back
/// (or does within the slack) and refuses to extend it. (The TTL used to count from the granting
/// statement, so the server kept the lock, and extended it, for as long past the lease's
/// validity as the session took to open.) The client needs a new session because its first was
/// ended on the server; the new one is held up by a transaction that locks `dlock_holders`, on a
/// database of its own.
async fn a_grant_counts_its_ttl_from_before_its_session_opened(env: Env) -> anyhow::Result<()> {
    let url = env.server.url();
    on_own_database(&url, "dlock_slow_session", |url| async move {
        ttl_from_before_the_session(&url).await
    })
    .await
}

async fn ttl_from_before_the_session(url: &str) -> anyhow::Result<()> {
    let ttl = Duration::from_secs(2);
    let holder = Arc::new(
        builder(url)?
            .with_request_timeout(Duration::from_secs(10))
            .connect()
            .await?,
    );
    let other = client(url).await?;
    // The next lock needs a new session.
    end_session(&holder, url).await?;
    let blocker = raw(url).await?;
    blocker
        .batch_execute("BEGIN; LOCK TABLE dlock_holders IN ACCESS EXCLUSIVE MODE")
        .await?;
    let key = name("slow-session");
    let acquiring = {
        let (holder, key) = (holder.clone(), key.clone());
        tokio::spawn(async move {
            holder
                .acquire(&key, &opts(ttl).with_wait(Duration::from_secs(10)))
                .await
        })
    };
    tokio::time::sleep(ttl / 2).await;
    blocker.batch_execute("COMMIT").await?;
    let lease = acquiring.await??;
    tokio::time::sleep_until(lease.valid_until() + Duration::from_millis(200)).await;
    let lock_key = dlock_core::backend::LockKey::new(lease.key())?;
    let late = dlock_core::backend::LeaseRef {
        key: &lock_key,
        owner: lease.owner(),
        fencing: Some(lease.fencing_token()),
    };
    let answer = holder.extend(&late, ttl).await?;
    ensure!(
        answer != dlock_core::backend::Extension::Extended,
        "the server extended a lock past its lease's validity"
    );
    let free_by = Instant::now() + Duration::from_secs(1);
    loop {
        if let Some(next) = other.try_acquire(&key, &opts(ttl)).await? {
            next.release().await?;
            break;
        }
        ensure!(
            Instant::now() < free_by,
            "the server still holds the lock a second past its lease's validity"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// A grant held up on the server for most of the session timeout `T`, by a client that holds no
/// other lock (so nothing pings its session meanwhile: an idle session is pinged, a busy one
/// not), gets a lease that is held and stays valid for about `T` after the grant, and is still
/// held on the server later: the grant's answer says how long the server worked on it, and the
/// server's idle timer started only then. (The session used to be confirmed as of the grant's
/// sending alone, so such a lease's session bound was already past, or nearly, when the grant
/// landed, and the fresh lease was lost at once.) The grant is held up for 0.85 `T` twice: by a row lock on the row it writes (a wait while the
/// statement runs), then by a table lock on `dlock_holders` (a wait before it runs), on a
/// database of its own.
async fn a_held_up_grant_gets_a_lease_with_its_session_timeout_ahead(
    env: Env,
) -> anyhow::Result<()> {
    let url = env.server.url();
    on_own_database(&url, "dlock_slow_grant", |url| async move {
        slow_grant_keeps_its_lease(&url).await
    })
    .await
}

async fn slow_grant_keeps_its_lease(url: &str) -> anyhow::Result<()> {
    let hold_up = SESSION_TIMEOUT * 85 / 100;
    let ttl = Duration::from_secs(30);
    let locks = Arc::new(
        builder(url)?
            .with_request_timeout(Duration::from_secs(10))
            .connect()
            .await?,
    );
    let blocker = raw(url).await?;
    for table_lock in [false, true] {
        let what = if table_lock {
            "a table lock"
        } else {
            "a row lock"
        };
        // The session has just answered, so it takes the grant, which is prepared on it: the
        // table lock holds the grant up as it is bound.
        locks
            .acquire(&name("warm"), &opts(ttl))
            .await?
            .release()
            .await?;
        let key = name("slow-grant");
        if table_lock {
            blocker
                .batch_execute("BEGIN; LOCK TABLE dlock_holders IN SHARE ROW EXCLUSIVE MODE")
                .await?;
        } else {
            // A row left behind by a holder whose session ended, which the grant overwrites.
            blocker
                .execute(
                    "INSERT INTO dlock_holders
                         (name, kind, holder, token, owner, pid, key1, key2, space)
                     VALUES ($1, 'lock', '', 0, '', 0, 0, 0, 0)",
                    &[&key],
                )
                .await?;
            blocker.batch_execute("BEGIN").await?;
            blocker
                .execute(
                    "SELECT 1 FROM dlock_holders
                     WHERE name = $1 AND kind = 'lock' AND holder = '' FOR UPDATE",
                    &[&key],
                )
                .await?;
        }
        let started = Instant::now();
        let commit = async {
            tokio::time::sleep(hold_up).await;
            blocker.batch_execute("COMMIT").await
        };
        let options = opts(ttl);
        let (lease, committed) = tokio::join!(locks.acquire(&key, &options), commit);
        committed?;
        let lease = lease?;
        let granted = Instant::now();
        let took = granted - started;
        let valid_for = lease.valid_until().saturating_duration_since(granted);
        let state = lease.state();
        eprintln!(
            "held up by {what}: the grant took {took:?} (session timeout {SESSION_TIMEOUT:?}); \
             the lease was {state:?} and valid for {valid_for:?} after it"
        );
        ensure!(
            took >= hold_up - Duration::from_millis(100),
            "{what} did not hold the grant up: it took {took:?}"
        );
        ensure!(
            state.is_held(),
            "held up by {what}, the fresh lease is {state:?}"
        );
        ensure!(
            valid_for >= SESSION_TIMEOUT / 2,
            "held up by {what}, the lease was valid for {valid_for:?} after its grant, not \
             {:?} or more",
            SESSION_TIMEOUT / 2
        );
        tokio::time::sleep(SESSION_TIMEOUT).await;
        ensure!(
            lease.state().is_held(),
            "held up by {what}, the lease is {:?} a session timeout after its grant",
            lease.state()
        );
        ensure!(
            lease.release().await? == dlock_core::Released::Released,
            "held up by {what}, the lock was not held on the server a session timeout after \
             its grant"
        );
    }
    Ok(())
}

/// The guard that clients creating dlock's tables take, one at a time.
const LAYOUT_GUARD: &str = "dlock-postgres: creating dlock_fencing and dlock_holders";

/// A client that finds the tables missing waits for the one creating them, then finds them
/// complete and touches nothing: a grant under way, which holds `dlock_holders`, does not hold
/// it up. (It used to alter `dlock_holders` all the same, and that deadlocked with the grants of
/// the clients that came first.) On a database of its own, where the tables do not exist yet.
async fn a_client_that_waited_for_the_layout_leaves_the_tables_alone(
    env: Env,
) -> anyhow::Result<()> {
    let url = env.server.url();
    on_own_database(&url, "dlock_layout", |url| async move {
        waited_for_the_layout(&url).await
    })
    .await
}

/// Runs `case` with the URL of a database of its own on the server at `url` (named `prefix`
/// and a random suffix), and drops the database after it.
async fn on_own_database<F, Fut>(url: &str, prefix: &str, case: F) -> anyhow::Result<()>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let admin = raw(url).await?;
    let database = format!("{prefix}_{}", rand_suffix());
    admin
        .batch_execute(&format!("CREATE DATABASE {database}"))
        .await?;
    let outcome = case(with_database(url, &database)).await;
    admin
        .batch_execute(&format!("DROP DATABASE {database} WITH (FORCE)"))
        .await?;
    outcome
}

async fn waited_for_the_layout(url: &str) -> anyhow::Result<()> {
    let guard = sql_args(advisory_key(LAYOUT_GUARD));
    let guard_holder = raw(url).await?;
    guard_holder
        .batch_execute(&format!("SELECT pg_advisory_lock({guard})"))
        .await?;
    // Another client's creation, not committed yet: a new client does not see the tables.
    let creator = raw(url).await?;
    creator
        .batch_execute(
            "BEGIN;
             CREATE SEQUENCE dlock_fencing;
             CREATE UNLOGGED TABLE dlock_holders (name text NOT NULL, kind text NOT NULL,
                 holder text NOT NULL, token bigint NOT NULL, owner text NOT NULL,
                 pid integer NOT NULL, key1 bigint NOT NULL, key2 bigint NOT NULL,
                 space smallint NOT NULL, PRIMARY KEY (name, kind, holder));
             CREATE UNLOGGED TABLE dlock_waiters (key text NOT NULL, waiter text NOT NULL,
                 tag text NOT NULL, arrival timestamptz NOT NULL, until timestamptz NOT NULL,
                 PRIMARY KEY (key, waiter));
             CREATE INDEX dlock_waiters_order ON dlock_waiters (key, arrival, waiter);",
        )
        .await?;
    let connecting = {
        let url = url.to_owned();
        tokio::spawn(async move { client(&url).await })
    };
    let waiting_for_guard = Instant::now() + Duration::from_secs(10);
    loop {
        let row = guard_holder
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
                     AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[],
            )
            .await?;
        if row.get::<_, i64>(0) > 0 {
            break;
        }
        ensure!(
            !connecting.is_finished() && Instant::now() < waiting_for_guard,
            "the new client did not wait for the guard of the tables' creation"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    creator.batch_execute("COMMIT").await?;
    // A grant under way holds dlock_holders as this transaction does.
    let granting = raw(url).await?;
    granting
        .batch_execute("BEGIN; LOCK TABLE dlock_holders IN ROW EXCLUSIVE MODE")
        .await?;
    guard_holder
        .batch_execute(&format!("SELECT pg_advisory_unlock({guard})"))
        .await?;
    let locks = tokio::time::timeout(Duration::from_secs(10), connecting)
        .await
        .context("the client that waited for the tables did not connect within 10 s")??
        .context("the client that waited for the tables")?;
    granting.batch_execute("COMMIT").await?;
    let lease = locks
        .acquire(&name("after-layout"), &opts(Duration::from_secs(5)))
        .await?;
    lease.release().await?;
    Ok(())
}

/// A lock session plans its grant and its release once, not at every call (see the crate's
/// `session` module: planning took four times the grant's execution). Counted by
/// `pg_stat_statements` (which the shared server loads) on a database of its own, where no other
/// case runs.
async fn a_lock_session_plans_its_grant_and_release_once(env: Env) -> anyhow::Result<()> {
    let url = env.server.url();
    on_own_database(&url, "dlock_plans", |url| async move {
        planned_once(&url).await
    })
    .await
}

async fn planned_once(url: &str) -> anyhow::Result<()> {
    const CYCLES: i64 = 30;
    let stats = raw(url).await?;
    stats
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await?;
    let locks = client(url).await?;
    let key = name("planned-once");
    for _ in 0..CYCLES {
        let lease = locks.acquire(&key, &opts(Duration::from_secs(5))).await?;
        lease.release().await?;
    }
    let rows = stats
        .query(
            "SELECT CASE WHEN query LIKE 'WITH now AS%' THEN 'the grant' ELSE 'the release' END,
                 calls, plans FROM pg_stat_statements
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                 AND (query LIKE 'WITH now AS%' OR query LIKE 'WITH gone AS%')",
            &[],
        )
        .await?;
    let counted: Vec<(String, i64, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    ensure!(
        counted.len() == 2,
        "expected the grant and the release among the statements, found {counted:?}"
    );
    for (statement, calls, plans) in counted {
        ensure!(
            calls >= CYCLES && (1..=3).contains(&plans),
            "{statement}: planned {plans} times for {calls} calls"
        );
    }
    Ok(())
}

/// `url` with its database replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let authority = url.find("://").map_or(0, |i| i + 3);
    let path = url[authority..].find('/').map(|i| authority + i);
    let query = url[authority..].find('?').map(|i| authority + i);
    match (path, query) {
        (Some(p), Some(q)) if p < q => format!("{}/{database}{}", &url[..p], &url[q..]),
        (Some(p), None) => format!("{}/{database}", &url[..p]),
        (_, Some(q)) => format!("{}/{database}{}", &url[..q], &url[q..]),
        (None, None) => format!("{url}/{database}"),
    }
}

/// The notifications `rx` receives within `within`.
async fn heard(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
    within: Duration,
) -> Vec<(String, String)> {
    let until = Instant::now() + within;
    let mut heard = Vec::new();
    while let Ok(Some(message)) = tokio::time::timeout_at(until, rx.recv()).await {
        heard.push(message);
    }
    heard
}

/// The notifications about the key with release payload `payload` that `rx` receives within
/// 300 ms (other cases' releases are heard too).
async fn heard_about(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
    payload: &str,
) -> Vec<(String, String)> {
    let named = format!("{payload} ");
    heard(rx, Duration::from_millis(300))
        .await
        .into_iter()
        .filter(|(_, p)| p == payload || p.starts_with(&named))
        .collect()
}

/// H holds and W (another client, with no waiting connection) waits: W's entry in
/// `dlock_waiters` carries its client's tag (and inspect counts it), and H's release is heard once, on that client's
/// wake channel, naming W, and not on `dlock_release`; W's release, with nobody queued, is heard
/// on `dlock_release`. The queue is empty once W holds.
async fn a_release_is_announced_to_the_heads_client_only(env: Env) -> anyhow::Result<()> {
    let name = name("announced");
    let payload = advisory_key(&name).to_string();
    let (listening, mut rx) = raw_listener(&env.server.url()).await?;
    listening.batch_execute("LISTEN dlock_release").await?;
    let look = raw(&env.server.url()).await?;
    let holder = client(&env.server.url()).await?;
    let waiter = Arc::new(
        builder(&env.server.url())?
            .with_waiting_connections(0)
            .connect()
            .await?,
    );
    let held = holder
        .acquire(&name, &opts(Duration::from_secs(10)))
        .await?;
    let waiting = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move {
            let opts = opts(Duration::from_secs(10)).with_wait(Duration::from_secs(10));
            waiter.acquire(&name, &opts).await
        })
    };
    let queued_by = Instant::now() + Duration::from_secs(5);
    let rows = loop {
        let rows = look
            .query(
                "SELECT tag, waiter FROM dlock_waiters WHERE key = $1",
                &[&payload],
            )
            .await?;
        if !rows.is_empty() || Instant::now() > queued_by {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    ensure!(
        rows.len() == 1,
        "{} queue entries for one waiter",
        rows.len()
    );
    let (tag, queued): (String, String) = (rows[0].get(0), rows[0].get(1));
    let shown = match holder.holding(&name).await? {
        dlock_core::inspect::Holding::Held(h) => h.waiting,
        _ => None,
    };
    ensure!(shown == Some(1), "inspect shows {shown:?} waiters for one");
    ensure!(
        tag.len() == 16 && tag.chars().all(|c| c.is_ascii_hexdigit()),
        "the entry's tag {tag:?} is not 16 hex digits"
    );
    listening
        .batch_execute(&format!("LISTEN dlock_release_{tag}"))
        .await?;
    let before = heard(&mut rx, Duration::from_millis(100)).await;
    held.release().await?;
    let lease = waiting.await??;
    let about_key = heard_about(&mut rx, &payload).await;
    let expected = (
        format!("dlock_release_{tag}"),
        format!("{payload} {queued}"),
    );
    ensure!(
        about_key == vec![expected.clone()],
        "the release was heard as {about_key:?}, expected only {expected:?} (before it: {before:?})"
    );
    let left: i64 = look
        .query_one(
            "SELECT count(*) FROM dlock_waiters WHERE key = $1",
            &[&payload],
        )
        .await?
        .get(0);
    ensure!(left == 0, "{left} queue entries left once the waiter holds");
    lease.release().await?;
    let about_key = heard_about(&mut rx, &payload).await;
    ensure!(
        about_key == vec![("dlock_release".to_string(), payload.clone())],
        "with nobody queued, the release was heard as {about_key:?}"
    );
    Ok(())
}

/// Options whose backoff is longer than any wait below: a waiter that polled at its backoff
/// would miss every bound, so each hand-off within it was a wake.
fn without_polling(wait: Duration) -> LockOptions {
    opts(Duration::from_secs(30))
        .with_wait(wait)
        .with_retry(Backoff {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(10),
            multiplier: 1.0,
            jitter: 0.0,
        })
}

/// An acquire under way, answering with the lease and when it answered.
type WaitingFor = tokio::task::JoinHandle<(Result<dlock_core::Lease, Error>, Instant)>;

/// A spawned acquire of `name` on `locks` with `options`.
fn waiting_for(
    locks: &Arc<dlock_postgres::PgLock>,
    name: &str,
    options: LockOptions,
) -> WaitingFor {
    let (locks, name) = (locks.clone(), name.to_owned());
    tokio::spawn(async move {
        let lease = locks.acquire(&name, &options).await;
        (lease, Instant::now())
    })
}

/// The lease `waiter` took, if it took it less than `within` after a release at `released`.
async fn taken_within(
    waiter: WaitingFor,
    released: Instant,
    within: Duration,
    who: &str,
) -> anyhow::Result<dlock_core::Lease> {
    let (lease, granted) = waiter.await?;
    let lease = lease.with_context(|| format!("{who} after the release"))?;
    ensure!(
        granted - released < within,
        "{who} took {:?} after the release",
        granted - released
    );
    Ok(lease)
}

/// How many live entries the queue of the key with release payload `payload` has.
async fn queued(look: &tokio_postgres::Client, payload: &str) -> anyhow::Result<i64> {
    Ok(look
        .query_one(
            "SELECT count(*) FROM dlock_waiters WHERE key = $1 AND until > clock_timestamp()",
            &[&payload],
        )
        .await?
        .get(0))
}

/// Checks that the queue of `payload` is empty, then releases `lease`.
async fn queue_empty_then_release(
    look: &tokio_postgres::Client,
    payload: &str,
    lease: dlock_core::Lease,
) -> anyhow::Result<()> {
    ensure!(
        queued(look, payload).await? == 0,
        "entries left in the queue"
    );
    lease.release().await?;
    Ok(())
}

/// Polls the count `sql` answers for `arg` (its `$1`) until it is `n`, for up to `within`;
/// the error says `what` was awaited and the last count.
async fn until_count(
    look: &tokio_postgres::Client,
    sql: &str,
    arg: &(dyn tokio_postgres::types::ToSql + Sync),
    n: i64,
    within: Duration,
    what: &str,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let count: i64 = look.query_one(sql, &[arg]).await?.get(0);
        if count == n {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{what} not within {within:?} (count {count}, awaited {n})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls until the queue of `payload` has `n` live entries.
async fn until_queued(look: &tokio_postgres::Client, payload: &str, n: i64) -> anyhow::Result<()> {
    let sql = "SELECT count(*) FROM dlock_waiters WHERE key = $1 AND until > clock_timestamp()";
    let what = format!("the queue holding {n} waiters");
    until_count(look, sql, &payload, n, Duration::from_secs(10), &what).await
}

/// What [`two_waiting`] sets up.
struct Queued {
    look: tokio_postgres::Client,
    held: dlock_core::Lease,
    w1: WaitingFor,
    w2: WaitingFor,
    _clients: [Arc<dlock_postgres::PgLock>; 3],
}

/// H (a client of its own) holds `name`; W1 and then W2 (one client each, with waiting
/// connections) wait for it without polling, in that order in the queue of `payload`, and
/// wait in the lock manager: within ten seconds, their entries carry no wake tag.
async fn two_waiting(env: &Env, name: &str, payload: &str) -> anyhow::Result<Queued> {
    let look = raw(&env.server.url()).await?;
    let holder = client(&env.server.url()).await?;
    let (first, second) = (
        client(&env.server.url()).await?,
        client(&env.server.url()).await?,
    );
    let held = holder.acquire(name, &opts(Duration::from_secs(30))).await?;
    let w1 = waiting_for(&first, name, without_polling(Duration::from_secs(30)));
    until_queued(&look, payload, 1).await?;
    let w2 = waiting_for(&second, name, without_polling(Duration::from_secs(30)));
    until_queued(&look, payload, 2).await?;
    // Both wait in the lock manager once their entries carry no wake tag.
    let quiet = "SELECT count(*) FROM dlock_waiters WHERE key = $1 AND tag = ''";
    let what = "both waiters' entries without a wake tag";
    until_count(&look, quiet, &payload, 2, Duration::from_secs(10), what).await?;
    Ok(Queued {
        look,
        held,
        w1,
        w2,
        _clients: [holder, first, second],
    })
}

/// H holds; W1 and then W2 (clients of their own, with waiting connections) wait, with a backoff
/// longer than the case. Their entries carry no wake tag, so no release can be announced to
/// them. H's release reaches W1 and W1's reaches W2, each within a second (a waiter that waited
/// for its backoff would take ten), and nothing about the key is heard on `dlock_release`.
async fn seated_waiters_are_woken_in_turn_and_nothing_is_announced(env: Env) -> anyhow::Result<()> {
    let name = name("seated");
    let payload = advisory_key(&name).to_string();
    let (listening, mut rx) = raw_listener(&env.server.url()).await?;
    listening.batch_execute("LISTEN dlock_release").await?;
    let Queued {
        look,
        held,
        w1,
        w2,
        _clients,
    } = two_waiting(&env, &name, &payload).await?;
    let released = Instant::now();
    held.release().await?;
    let lease = taken_within(w1, released, Duration::from_secs(1), "the first waiter").await?;
    ensure!(!w2.is_finished(), "the second waiter took a held lock");
    let released = Instant::now();
    lease.release().await?;
    let lease = taken_within(w2, released, Duration::from_secs(1), "the second waiter").await?;
    let about_key = heard_about(&mut rx, &payload).await;
    ensure!(
        about_key.is_empty(),
        "hand-offs to seated waiters were announced: {about_key:?}"
    );
    queue_empty_then_release(&look, &payload, lease).await
}

/// H holds; W1 heads the queue and W2 waits behind it, both seated. W1's acquire is dropped:
/// H's release then reaches W2 within two seconds (the dropped seat's wait ends within a
/// second), and once W2 holds, the queue is empty.
async fn a_dropped_seated_waiter_lets_the_one_behind_move_up(env: Env) -> anyhow::Result<()> {
    let name = name("seat-dropped");
    let payload = advisory_key(&name).to_string();
    let Queued {
        look,
        held,
        w1,
        w2,
        _clients,
    } = two_waiting(&env, &name, &payload).await?;
    w1.abort();
    ensure!(
        w1.await.is_err_and(|e| e.is_cancelled()),
        "W1 was not dropped"
    );
    // Dropping withdraws W1's entry in the background.
    until_queued(&look, &payload, 1).await?;
    let released = Instant::now();
    held.release().await?;
    let lease = taken_within(w2, released, Duration::from_secs(2), "W2").await?;
    queue_empty_then_release(&look, &payload, lease).await
}

/// A client with a single waiting connection has two tasks waiting for a key another client
/// holds, with a client of a third between them in the queue; backoffs are longer than the case.
/// The first task takes the seat and waits in the lock manager, the third-party waiter has a
/// seat of its own, and the second task, past its client's seats, waits for an announced release
/// (its entry carries the client's wake tag). Each release reaches the next in line within a
/// second, in arrival order, while the others still wait; then the queue is empty.
async fn waiters_past_the_seats_are_announced_and_served_in_turn(env: Env) -> anyhow::Result<()> {
    let name = name("past-seats");
    let payload = advisory_key(&name).to_string();
    let look = raw(&env.server.url()).await?;
    let holder = client(&env.server.url()).await?;
    let between = client(&env.server.url()).await?;
    let one_seat = Arc::new(
        builder(&env.server.url())?
            .with_waiting_connections(1)
            .connect()
            .await?,
    );
    let mut lease = holder
        .acquire(&name, &opts(Duration::from_secs(30)))
        .await?;
    let mut waiters = Vec::new();
    for (n, locks) in [&one_seat, &between, &one_seat].into_iter().enumerate() {
        waiters.push(waiting_for(
            locks,
            &name,
            without_polling(Duration::from_secs(30)),
        ));
        until_queued(&look, &payload, n as i64 + 1).await?;
    }
    let loud = "SELECT count(*) FROM dlock_waiters WHERE key = $1 AND tag <> ''";
    let what = "one entry with a wake tag, past its client's seat";
    until_count(&look, loud, &payload, 1, Duration::from_secs(10), what).await?;
    let mut waiters = waiters.into_iter();
    while let Some(next) = waiters.next() {
        let released = Instant::now();
        lease.release().await?;
        lease = taken_within(next, released, Duration::from_secs(1), "the next in line").await?;
        ensure!(
            waiters.as_slice().iter().all(|w| !w.is_finished()),
            "a waiter took a held lock"
        );
    }
    queue_empty_then_release(&look, &payload, lease).await
}

/// Evicting a holder ends its session: every lock of that client ends with it (as documented),
/// and each of its leases turns lost.
async fn eviction_ends_the_holders_session(env: Env) -> anyhow::Result<()> {
    let (a, b) = (name("evicted-a"), name("evicted-b"));
    let holder = client(&env.server.url()).await?;
    let operator: Arc<dyn DistributedLock> = client(&env.server.url()).await?;
    let first = holder.acquire(&a, &opts(Duration::from_secs(30))).await?;
    let second = holder.acquire(&b, &opts(Duration::from_secs(30))).await?;
    let answer = Admin::new(&operator)
        .force_unlock(&a, Some(first.fencing_token()))
        .await?;
    ensure!(
        matches!(answer, Eviction::Evicted(_)),
        "evicting: {answer:?}"
    );
    for (lease, which) in [(&first, "evicted"), (&second, "other")] {
        let watch = lease.watch();
        tokio::time::timeout(Duration::from_secs(2), watch.lost())
            .await
            .with_context(|| format!("the {which} lease of the evicted client is not lost"))?;
    }
    ensure!(
        operator
            .try_acquire(&b, &opts(Duration::from_secs(5)))
            .await?
            .is_some(),
        "the evicted client's other lock is still held"
    );
    Ok(())
}

/// A wrong password, an unreachable port and an incomplete TLS setting fail within bounds, with
/// errors that never show the password.
async fn bad_configuration_fails_fast_and_shows_no_password(env: Env) -> anyhow::Result<()> {
    let url = env.server.url();
    let secret = "not-the-password-4f9a";
    let (_, rest) = url
        .split_once('@')
        .context("the fixture URL has credentials")?;
    let wrong = format!("postgres://postgres:{secret}@{rest}");
    let started = Instant::now();
    let error = client(&wrong)
        .await
        .err()
        .context("a wrong password connected")?;
    let shown = format!("{error:#} {error:?}");
    ensure!(
        !shown.contains(secret),
        "the error shows the password: {shown}"
    );
    ensure!(
        started.elapsed() < Duration::from_secs(10),
        "a refused login took {:?}",
        started.elapsed()
    );
    if let Some(e) = error.downcast_ref::<Error>() {
        ensure!(
            !e.is_temporary(),
            "a refused login is reported as temporary: {e}"
        );
    }
    let closed = "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable";
    let started = Instant::now();
    let error = builder(closed)?
        .with_connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .err()
        .context("a closed port connected")?;
    ensure!(
        error.is_temporary(),
        "a closed port is not temporary: {error}"
    );
    ensure!(
        started.elapsed() < Duration::from_secs(5),
        "a closed port took {:?}",
        started.elapsed()
    );
    let incomplete = dlock_postgres::PgLock::connect(&format!("{url}?sslmode=verify-full"))
        .await
        .err();
    ensure!(
        matches!(
            incomplete,
            Some(Error::InvalidInput {
                field: "sslrootcert",
                ..
            })
        ),
        "verify-full without a root certificate: {incomplete:?}"
    );
    Ok(())
}

/// `host:port` of a fixture's URL.
fn host_port(url: &str) -> anyhow::Result<String> {
    let (_, rest) = url
        .split_once('@')
        .context("the fixture URL has credentials")?;
    Ok(rest.split('/').next().unwrap_or(rest).to_string())
}

/// Given a host that takes no writes (a standby) before the primary, the client connects to the
/// primary, as libpq's `target_session_attrs=read-write` does; given the standby alone, it fails
/// rather than lock where it cannot write.
async fn of_several_hosts_the_one_that_takes_writes_is_used(env: Env) -> anyhow::Result<()> {
    let url = env.server.url();
    let (credentials, _) = url
        .split_once('@')
        .context("the fixture URL has credentials")?;
    let standby = host_port(&env.read_only.url())?;
    let primary = host_port(&url)?;
    let both = format!("{credentials}@{standby},{primary}/postgres?sslmode=disable");
    let locks = client(&both).await?;
    let name = name("several-hosts");
    let lease = locks.acquire(&name, &opts(Duration::from_secs(10))).await?;
    let pid = locks.session_pid().await.context("no lock session")?;
    let on_primary = env
        .server
        .psql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}"
        ))
        .await?;
    ensure!(
        on_primary == "1",
        "the lock session {pid} is not on the primary"
    );
    lease.release().await?;
    let alone = format!("{credentials}@{standby}/postgres?sslmode=disable");
    let refused = builder(&alone)?
        .with_connect_timeout(Duration::from_secs(5))
        .connect()
        .await;
    ensure!(
        refused.is_err(),
        "a client locked on a server that takes no writes"
    );
    Ok(())
}
