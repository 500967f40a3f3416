//! The `dlock` binary end to end: its arguments and errors without a server, `run` and `status`
//! against a real Redis server in a container (one server for all trials, each trial on keys of
//! its own), and `status` against etcd and three Redlock masters, whose holders' tokens it can
//! tell. The primitives run across processes on Redis: `run --permits`, `run --read` and
//! `--write`, `elect` and `leader --watch`. On PostgreSQL, `run` (also `--permits`, `--read` and
//! `--write`), `status`, `list` and `unlock` run as on the others, and no command shows the URL's password, whatever it prints or fails with.
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-cli --test cli
//! ```
//!
//! With `DLOCK_TEST_NO_DOCKER=1` the server trials are reported as ignored; without Docker and
//! without that opt-out the binary fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::LockOptions;
use dlock_testkit::fixtures::{
    docker_opt_out, EtcdCluster, PostgresServer, RedisMasters, RedisServer, ZkEnsemble,
};
use dlock_testkit::trials;
use libtest_mimic::{Arguments, Failed, Trial};
use tokio::runtime::Handle;

/// Far above what any step here takes on a loaded machine; only ends a hung trial.
const PATIENCE: Duration = Duration::from_secs(60);

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(Failed::from(format!($($msg)+)));
        }
    };
}

#[path = "cli/stop_in_time.rs"]
mod stop_in_time;

fn main() {
    let args = Arguments::from_args();
    let mut trials = vec![
        Trial::test("help_for_every_command", help_for_every_command),
        Trial::test("usage_errors_are_one_line_64", usage_errors_are_one_line_64),
        Trial::test("memory_run_exports_the_token", memory_run_exports_the_token),
        Trial::test("missing_command_is_127", missing_command_is_127),
        Trial::test("unreachable_server_is_69", unreachable_server_is_69),
        Trial::test(
            "trace_shows_each_call_on_stderr",
            trace_shows_each_call_on_stderr,
        ),
        Trial::test(
            "memory_primitives_export_their_tokens",
            memory_primitives_export_their_tokens,
        ),
        Trial::test(
            "memory_leader_shows_nobody_with_0",
            memory_leader_shows_nobody_with_0,
        ),
    ];
    let server_trials: [(&str, ServerTrial); 28] = [
        ("redis_runs_never_overlap", runs_never_overlap),
        (
            "redis_busy_lock_exits_75_without_running",
            busy_lock_exits_75,
        ),
        (
            "redis_lost_lease_stops_the_command_76",
            lost_lease_stops_the_command,
        ),
        (
            "redis_lost_lease_kills_a_stubborn_command",
            lost_lease_kills_a_stubborn_command,
        ),
        (
            "redis_exit_status_passes_through",
            exit_status_passes_through,
        ),
        ("redis_signals_reach_the_command", signals_reach_the_command),
        (
            "etcd_status_names_the_holders_token",
            status_names_the_holders_token,
        ),
        (
            "etcd_an_interrupted_wait_leaves_nothing_queued",
            interrupted_wait_leaves_nothing,
        ),
        (
            "etcd_a_wait_that_runs_out_leaves_nothing_queued",
            timed_out_wait_leaves_nothing,
        ),
        (
            "redlock_status_names_the_holders_token",
            redlock_status_names_the_holders_token,
        ),
        (
            "etcd_status_json_shows_owner_and_queue",
            status_json_shows_owner_and_queue,
        ),
        ("etcd_list_shows_the_held_locks", list_shows_the_held_locks),
        (
            "etcd_unlock_force_evicts_only_when_confirmed",
            unlock_force_evicts_only_when_confirmed,
        ),
        (
            "redis_fence_ttl_from_the_url_reaches_the_counter",
            fence_ttl_from_the_url_reaches_the_counter,
        ),
        (
            "redis_run_permits_two_at_once_and_a_third_waits",
            permits_two_at_once_and_a_third_waits,
        ),
        (
            "redis_run_read_shares_and_write_waits",
            readers_share_and_a_writer_waits,
        ),
        (
            "redis_elect_hands_over_and_leader_watch_sees_both_terms",
            elect_hands_over_and_leader_watch_sees_both_terms,
        ),
        (
            "redis_lost_leadership_stops_the_command_76",
            lost_leadership_stops_the_command,
        ),
        (
            "redlock_run_permits_is_unsupported_69",
            redlock_run_permits_is_unsupported,
        ),
        (
            "redis_interrupted_campaign_runs_nothing_143",
            interrupted_campaign_runs_nothing,
        ),
        ("postgres_runs_never_overlap", postgres_runs_never_overlap),
        (
            "postgres_busy_lock_exits_75_without_running",
            postgres_busy_lock_exits_75,
        ),
        (
            "postgres_status_names_the_holders_token",
            postgres_status_names_the_holders_token,
        ),
        (
            "postgres_list_shows_the_held_locks",
            postgres_list_shows_the_held_locks,
        ),
        (
            "postgres_unlock_force_evicts_only_when_confirmed",
            postgres_unlock_force_evicts_only_when_confirmed,
        ),
        (
            "postgres_no_command_shows_the_password",
            postgres_no_command_shows_the_password,
        ),
        (
            "postgres_run_permits_two_at_once_and_a_third_waits",
            postgres_permits_two_at_once_and_a_third_waits,
        ),
        (
            "postgres_run_read_shares_and_write_waits",
            postgres_readers_share_and_a_writer_waits,
        ),
    ];

    // The command is dead before the lock can pass: each backend with a lease of 4 s and of
    // 10 s (the session backends with a session timeout of as much).
    let stop_in_time_names: Vec<(String, usize, &str)> = STOP_IN_TIME_BACKENDS
        .iter()
        .enumerate()
        .flat_map(|(i, name)| {
            ["4s", "10s"].map(|ttl| {
                (
                    format!("{name}_run_command_is_dead_before_the_lock_passes_ttl_{ttl}"),
                    i,
                    ttl,
                )
            })
        })
        .collect();
    const TEETH: &str = "redis_teeth_a_runner_that_stops_only_on_loss_is_caught";
    const QUIET: &str = "zk_other_libraries_speak_at_warn_unless_rust_log_asks";

    if (RedisServer::needs_docker()
        || RedisMasters::needs_docker()
        || EtcdCluster::needs_docker()
        || PostgresServer::needs_docker()
        || ZkEnsemble::needs_docker())
        && docker_opt_out()
    {
        for (name, _) in server_trials {
            trials.push(Trial::test(name, || Ok(())).with_ignored_flag(true));
        }
        for name in stop_in_time_names.iter().map(|(n, _, _)| n.clone()).chain(
            STOP_IN_TIME_BACKENDS
                .iter()
                .map(|b| format!("{b}_run_a_short_outage_does_not_stop_the_command")),
        ) {
            trials.push(Trial::test(name, || Ok(())).with_ignored_flag(true));
        }
        trials.push(Trial::test(TEETH, || Ok(())).with_ignored_flag(true));
        trials.push(Trial::test(QUIET, || Ok(())).with_ignored_flag(true));
        libtest_mimic::run(&args, trials).exit();
    }

    let runtime = trials::fixture_runtime();
    let (server, masters, etcd, postgres, zookeeper) = trials::start(
        &runtime,
        "Redis, 3 Redlock masters, etcd, PostgreSQL and ZooKeeper",
        async {
            tokio::try_join!(
                RedisServer::start(),
                RedisMasters::start(3),
                EtcdCluster::start(1),
                PostgresServer::start(),
                ZkEnsemble::start(1)
            )
        },
    );
    let master_hosts: Vec<String> = masters
        .urls()
        .iter()
        .map(|u| u.trim_start_matches("redis://").to_owned())
        .collect();
    let etcd_hosts: Vec<String> = etcd
        .endpoints()
        .iter()
        .map(|e| e.trim_start_matches("http://").to_owned())
        .collect();
    let redis = Arc::new(Servers {
        url: server.url(),
        etcd_url: format!("etcd://{}", etcd_hosts.join(",")),
        // The per-node timeout of the Redlock trials: far above a round trip through Docker's
        // port mapping on a loaded machine.
        redlock_url: format!("redlock://{}?request_timeout=200ms", master_hosts.join(",")),
        postgres_url: postgres.url(),
        handle: runtime.handle().clone(),
    });
    for (name, test) in server_trials {
        let redis = redis.clone();
        trials.push(Trial::test(name, move || test(&redis)));
    }
    let zk_hosts = zookeeper.endpoints();
    let backends: Arc<[stop_in_time::Backend; 5]> = Arc::new([
        stop_in_time::Backend::single("redis", &redis.url, 6379, false),
        stop_in_time::Backend::hosts("redlock", "redlock", &master_hosts, |_| {
            "request_timeout=200ms".to_owned()
        }),
        stop_in_time::Backend::hosts("zk", "zk", &zk_hosts, |ttl| {
            format!("session_timeout={ttl}")
        }),
        stop_in_time::Backend::hosts("etcd", "etcd", &etcd_hosts, |ttl| {
            format!("session_timeout={ttl}")
        }),
        stop_in_time::Backend::single("postgres", &redis.postgres_url, 5432, true),
    ]);
    for (name, i, ttl) in stop_in_time_names {
        let (servers, backends) = (redis.clone(), backends.clone());
        trials.push(Trial::test(name, move || {
            stop_in_time::dead_before_the_lock_passes(&servers, &backends[i], ttl)
        }));
    }
    for (i, name) in STOP_IN_TIME_BACKENDS.iter().enumerate() {
        let (servers, backends) = (redis.clone(), backends.clone());
        trials.push(Trial::test(
            format!("{name}_run_a_short_outage_does_not_stop_the_command"),
            move || stop_in_time::a_short_outage_does_not_stop_the_command(&servers, &backends[i]),
        ));
    }
    let (servers, teeth_backends) = (redis.clone(), backends.clone());
    trials.push(Trial::test(TEETH, move || {
        stop_in_time::stopping_on_loss_is_caught(&servers, &teeth_backends[0], "4s")
    }));
    let zk_url = format!("zk://{}", zk_hosts.join(","));
    trials.push(Trial::test(QUIET, move || {
        other_libraries_speak_at_warn(&zk_url)
    }));
    trials::run_then(&args, trials, &runtime, || async {
        remove_scratch();
        let (a, b, c, d, e) = tokio::join!(
            server.shutdown(),
            masters.shutdown(),
            etcd.shutdown(),
            postgres.shutdown(),
            zookeeper.shutdown()
        );
        a.and(b).and(c).and(d).and(e)
    })
}

/// The backends of the stop-in-time trials, in the order of their `Backend`s in `main`.
const STOP_IN_TIME_BACKENDS: [&str; 5] = ["redis", "redlock", "zk", "etcd", "postgres"];

/// A trial against the shared server.
type ServerTrial = fn(&Servers) -> Result<(), Failed>;

/// The shared servers and a runtime to talk to them from the test threads.
struct Servers {
    /// The Redis server, which all `run` trials use.
    url: String,
    /// A one-member etcd cluster, for a backend whose holders' tokens `status` can tell.
    etcd_url: String,
    /// Three Redlock masters, whose holders' tokens `status` can tell too.
    redlock_url: String,
    /// A PostgreSQL server; the URL carries the fixture's password.
    postgres_url: String,
    handle: Handle,
}

impl Servers {
    /// Deletes a Redis key, as an operator (or a data loss) would.
    fn delete(&self, key: &str) -> Result<(), Failed> {
        let url = self.url.clone();
        let key = key.to_owned();
        self.handle
            .block_on(async move {
                let client = redis::Client::open(url)?;
                let mut con = client.get_multiplexed_async_connection().await?;
                redis::cmd("DEL")
                    .arg(&key)
                    .query_async::<i64>(&mut con)
                    .await
            })
            .map(drop)
            .map_err(|e| Failed::from(format!("DEL failed: {e}")))
    }
}

/// The binary, with no `DLOCK_URL` from the environment of the test run.
fn dlock() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dlock"));
    command.env_remove("DLOCK_URL");
    command
}

/// `dlock run --url URL --key KEY OPTIONS… -- COMMAND…`.
fn dlock_run(url: &str, key: &str, options: &[&str], command: &[&str]) -> Command {
    let mut run = dlock();
    run.args(["run", "--url", url, "--key", key])
        .args(options)
        .arg("--")
        .args(command);
    run
}

/// [`dlock_run`], run to its end.
fn dlock_run_to_end(url: &str, key: &str, options: &[&str], command: &[&str]) -> Output {
    run_to_end(&mut dlock_run(url, key, options, command))
}

/// `dlock status --url URL --key KEY`, run to its end.
fn dlock_status(url: &str, key: &str) -> Output {
    run_to_end(dlock().args(["status", "--url", url, "--key", key]))
}

/// Starts `command` in the background, its output captured for [`finish`].
fn spawn(command: &mut Command) -> Result<Child, Failed> {
    Ok(command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?)
}

fn run_to_end(command: &mut Command) -> Output {
    command
        .stdin(Stdio::null())
        .output()
        .expect("the dlock binary runs")
}

/// The ZooKeeper client logs every session it establishes at INFO. `dlock` shows other
/// libraries' events only from WARN up, so that its standard error stays readable beside the
/// command's, unless `RUST_LOG` asks for more.
fn other_libraries_speak_at_warn(zk_url: &str) -> Result<(), Failed> {
    let key = "quiet-logs";
    let quiet = run_to_end(
        dlock()
            .env_remove("RUST_LOG")
            .args(["status", "--url", zk_url, "--key", key]),
    );
    exits(&quiet, 0)?;
    ensure!(
        !text(&quiet.stderr).contains("zookeeper_client"),
        "without RUST_LOG, stderr shows the ZooKeeper client's events: {}",
        text(&quiet.stderr)
    );
    let asked = run_to_end(
        dlock()
            .env("RUST_LOG", "zookeeper_client=info")
            .args(["status", "--url", zk_url, "--key", key]),
    );
    exits(&asked, 0)?;
    ensure!(
        text(&asked.stderr).contains("zookeeper_client"),
        "with RUST_LOG=zookeeper_client=info, stderr shows none of the ZooKeeper client's events: {}",
        text(&asked.stderr)
    );
    Ok(())
}

/// `dlock status` on `url` finds `key` free: exit 0 and "KEY: free". `when` says at what point
/// of the test, for the failure message.
fn ensure_free(url: &str, key: &str, when: &str) -> Result<(), Failed> {
    let output = dlock_status(url, key);
    ensure!(
        code(&output) == 0 && text(&output.stdout) == format!("{key}: free\n"),
        "status {when}: {output:?}"
    );
    Ok(())
}

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The prefix of this run's scratch directories.
fn scratch_prefix() -> String {
    format!("dlock-cli-{}-", std::process::id())
}

/// A fresh scratch directory for one trial, removed by [`remove_scratch`] after the run.
fn scratch(trial: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{}{trial}", scratch_prefix()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Removes this run's scratch directories.
fn remove_scratch() {
    let prefix = scratch_prefix();
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Waits until `path` contains `needle`.
fn wait_for(path: &Path, needle: &str) -> Result<(), Failed> {
    let until = Instant::now() + PATIENCE;
    while Instant::now() < until {
        if read(path).contains(needle) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!(
        "{} never contained {needle:?}: {:?}",
        path.display(),
        read(path)
    )
    .into())
}

/// Waits for a spawned dlock to exit, killing it if it does not within [`PATIENCE`].
fn finish(mut child: Child) -> Result<Output, Failed> {
    let until = Instant::now() + PATIENCE;
    while Instant::now() < until {
        if child.try_wait()?.is_some() {
            return Ok(child.wait_with_output()?);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let output = child.wait_with_output()?;
    Err(format!(
        "dlock did not exit within {PATIENCE:?}: {}",
        text(&output.stderr)
    )
    .into())
}

/// Checks dlock's exit code, showing its stderr if it is not `expected`.
/// Fails unless the command's stderr mentions `needle`.
fn stderr_says(output: &Output, needle: &str) -> Result<(), Failed> {
    let stderr = text(&output.stderr);
    ensure!(stderr.contains(needle), "stderr: {stderr}");
    Ok(())
}

fn exits(output: &Output, expected: i32) -> Result<(), Failed> {
    ensure!(
        code(output) == expected,
        "exited {} instead of {expected}: {}",
        code(output),
        text(&output.stderr)
    );
    Ok(())
}

/// Checks that stderr is exactly one line starting with `dlock:` and mentioning `needle`.
fn one_line_error(output: &Output, needle: &str) -> Result<(), Failed> {
    let stderr = text(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    ensure!(
        lines.len() == 1 && lines[0].starts_with("dlock: ") && lines[0].contains(needle),
        "expected one line mentioning {needle:?}, got {stderr:?}"
    );
    Ok(())
}

fn help_for_every_command() -> Result<(), Failed> {
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["status", "--help"],
        &["elect", "--help"],
        &["leader", "--help"],
    ] {
        let output = run_to_end(dlock().args(args));
        let stdout = text(&output.stdout);
        ensure!(code(&output) == 0, "{args:?} exited {}", code(&output));
        ensure!(
            stdout.contains("Exit codes:") && stdout.contains("75") && stdout.contains("76"),
            "{args:?} does not list the exit codes: {stdout}"
        );
    }
    let run_help = text(&run_to_end(dlock().args(["run", "--help"])).stdout);
    for flag in [
        "--url",
        "--key",
        "--ttl",
        "--wait",
        "--grace",
        "--permits",
        "--read",
        "--write",
        "DLOCK_FENCING_TOKEN",
    ] {
        ensure!(run_help.contains(flag), "run --help lacks {flag}");
    }
    let elect_help = text(&run_to_end(dlock().args(["elect", "--help"])).stdout);
    for flag in [
        "--url",
        "--key",
        "--value",
        "--ttl",
        "--wait",
        "--grace",
        "DLOCK_FENCING_TOKEN",
    ] {
        ensure!(elect_help.contains(flag), "elect --help lacks {flag}");
    }
    let leader_help = text(&run_to_end(dlock().args(["leader", "--help"])).stdout);
    for flag in ["--url", "--key", "--watch", "--json"] {
        ensure!(leader_help.contains(flag), "leader --help lacks {flag}");
    }
    // The URL may come from DLOCK_URL; its value (a password, perhaps) is never shown.
    let output = run_to_end(
        dlock()
            .env("DLOCK_URL", "redis://u:hunter2@h")
            .args(["run", "--help"]),
    );
    ensure!(
        !text(&output.stdout).contains("hunter2"),
        "help shows DLOCK_URL's value"
    );
    Ok(())
}

fn usage_errors_are_one_line_64() -> Result<(), Failed> {
    let run_k = ["run", "--url", "memory://", "--key", "k"];
    let with = |flags: &[&'static str]| -> Vec<&'static str> {
        run_k
            .iter()
            .chain(flags)
            .chain(&["--", "true"])
            .copied()
            .collect()
    };
    let primitive_cases: [(Vec<&str>, &str); 9] = [
        // A grace that cannot fit in the lease: named with the TTL it does not fit in.
        (
            with(&["--ttl", "4s", "--grace", "3s"]),
            "--grace 3s does not fit in --ttl 4s",
        ),
        (
            vec![
                "elect",
                "--url",
                "memory://",
                "--key",
                "e",
                "--value",
                "v",
                "--ttl",
                "2s",
                "--grace",
                "1500ms",
                "--",
                "true",
            ],
            "--grace 1s 500ms does not fit in --ttl 2s",
        ),
        (with(&["--read", "--write"]), "--write"),
        (with(&["--permits", "2", "--read"]), "--permits"),
        (with(&["--permits", "0"]), "--permits"),
        (with(&["--permits", "10001"]), "--permits"),
        (
            vec!["elect", "--url", "memory://", "--key", "e", "--", "true"],
            "--value",
        ),
        (
            vec![
                "elect",
                "--url",
                "memory://",
                "--key",
                "e",
                "--value",
                "",
                "--",
                "true",
            ],
            "value",
        ),
        (vec!["leader", "--url", "memory://", "--key", ""], "key"),
    ];
    for (args, needle) in &primitive_cases {
        let output = run_to_end(dlock().args(args));
        ensure!(code(&output) == 64, "{args:?} exited {}", code(&output));
        one_line_error(&output, needle)
            .map_err(|e| format!("{args:?}: {}", e.message().unwrap_or_default()))?;
    }
    let cases: [(&[&str], &str); 7] = [
        (&["bogus"], "bogus"),
        (&["run", "--url", "memory://", "--key", "k"], "COMMAND"),
        (
            &[
                "run",
                "--url",
                "memory://",
                "--key",
                "k",
                "--ttl",
                "10",
                "--",
                "true",
            ],
            "--ttl",
        ),
        (&["run", "--key", "k", "--", "true"], "--url"),
        (
            &[
                "run",
                "--url",
                "redis://u:hunter2@h?colour=red",
                "--key",
                "k",
                "--",
                "true",
            ],
            "unknown parameter `colour`",
        ),
        (
            &["status", "--url", "ftp://u:hunter2@h", "--key", "k"],
            "unknown scheme",
        ),
        (&["status", "--url", "memory://", "--key", ""], "key"),
    ];
    for (args, needle) in cases {
        let output = run_to_end(dlock().args(args));
        ensure!(code(&output) == 64, "{args:?} exited {}", code(&output));
        one_line_error(&output, needle)
            .map_err(|e| format!("{args:?}: {}", e.message().unwrap_or_default()))?;
        ensure!(
            !text(&output.stderr).contains("hunter2"),
            "{args:?} shows the password"
        );
    }
    Ok(())
}

fn memory_run_exports_the_token() -> Result<(), Failed> {
    let output = dlock_run_to_end(
        "memory://",
        "jobs/a",
        &[],
        &["sh", "-c", "echo \"$DLOCK_KEY $DLOCK_FENCING_TOKEN\""],
    );
    exits(&output, 0)?;
    ensure!(
        text(&output.stdout) == "jobs/a 1\n",
        "printed {:?}",
        text(&output.stdout)
    );
    ensure_free("memory://", "k", "after the run")
}

fn missing_command_is_127() -> Result<(), Failed> {
    let output = dlock_run_to_end("memory://", "k", &[], &["/nonexistent/command"]);
    exits(&output, 127)?;
    one_line_error(&output, "/nonexistent/command")
}

fn unreachable_server_is_69() -> Result<(), Failed> {
    let output = dlock_run_to_end(
        "redis://u:hunter2@127.0.0.1:1?connect_timeout=300ms",
        "k",
        &[],
        &["true"],
    );
    exits(&output, 69)?;
    one_line_error(&output, "unavailable")?;
    ensure!(
        !text(&output.stderr).contains("hunter2"),
        "the password shows"
    );
    Ok(())
}

/// Three `dlock run` on one key, each appending a begin and an end line around a pause: the
/// lines must come in begin/end pairs of one holder each, with increasing fencing tokens.
fn runs_never_overlap(redis: &Servers) -> Result<(), Failed> {
    runs_never_overlap_on(&redis.url, "overlap")
}

/// [`runs_never_overlap`] on PostgreSQL.
fn postgres_runs_never_overlap(servers: &Servers) -> Result<(), Failed> {
    runs_never_overlap_on(&servers.postgres_url, "postgres-overlap")
}

/// Three `dlock run` on one key of `url`, as [`runs_never_overlap`] says; `trial` names the
/// scratch directory and the key.
fn runs_never_overlap_on(url: &str, trial: &str) -> Result<(), Failed> {
    let dir = scratch(trial);
    let log = dir.join("log");
    let script = format!(
        "echo \"begin $DLOCK_FENCING_TOKEN\" >> {0}; sleep 0.3; echo \"end $DLOCK_FENCING_TOKEN\" >> {0}",
        log.display()
    );
    let key = format!("cli-{trial}-{}", std::process::id());
    let options = ["--ttl", "5s", "--wait", "60s"];
    let children = (0..3)
        .map(|_| spawn(&mut dlock_run(url, &key, &options, &["sh", "-c", &script])))
        .collect::<Result<Vec<Child>, Failed>>()?;
    for child in children {
        let output = finish(child)?;
        ensure!(
            code(&output) == 0,
            "a run exited {}: {}",
            code(&output),
            text(&output.stderr)
        );
    }
    let lines: Vec<String> = read(&log).lines().map(str::to_owned).collect();
    ensure!(lines.len() == 6, "expected 6 lines, got {lines:?}");
    let mut last_token = 0u64;
    for pair in lines.chunks(2) {
        let begin = pair[0].strip_prefix("begin ");
        let end = pair[1].strip_prefix("end ");
        ensure!(
            begin.is_some() && begin == end,
            "runs overlapped (not a begin/end pair of one holder): {lines:?}"
        );
        let token: u64 = begin.unwrap_or_default().parse()?;
        ensure!(
            token > last_token,
            "fencing tokens did not increase: {lines:?}"
        );
        last_token = token;
    }
    Ok(())
}

fn busy_lock_exits_75(redis: &Servers) -> Result<(), Failed> {
    busy_lock_exits_75_on(redis, &redis.url, "busy", ", expires in ")
}

/// [`busy_lock_exits_75`] on PostgreSQL, whose lock lives as long as its session: `status`
/// shows no remaining TTL.
fn postgres_busy_lock_exits_75(servers: &Servers) -> Result<(), Failed> {
    busy_lock_exits_75_on(servers, &servers.postgres_url, "postgres-busy", "")
}

/// A held key of `url`: `run --wait 0` and `--wait 300ms` exit 75 without running the command;
/// `status` exits 75 and shows the holder's record, its token, then `after_token`.
fn busy_lock_exits_75_on(
    redis: &Servers,
    url: &str,
    trial: &str,
    after_token: &str,
) -> Result<(), Failed> {
    let dir = scratch(trial);
    let marker = dir.join("ran");
    let key = format!("cli-{trial}-{}", std::process::id());
    let url = url.to_owned();
    let (locks, lease) = redis.handle.block_on(async {
        let locks = dlock::connect(&url).await?;
        let lease = locks
            .acquire(&key, &LockOptions::new(Duration::from_secs(60)))
            .await?;
        Ok::<_, dlock::Error>((locks, lease))
    })?;

    for wait in ["0", "300ms"] {
        let touch = marker.display().to_string();
        let output = dlock_run_to_end(&url, &key, &["--wait", wait], &["touch", &touch]);
        ensure!(
            code(&output) == 75,
            "--wait {wait} exited {}",
            code(&output)
        );
        one_line_error(&output, "busy")?;
        ensure!(
            !marker.exists(),
            "the command ran although the lock was busy"
        );
    }

    let output = dlock_status(&url, &key);
    let stdout = text(&output.stdout);
    ensure!(
        code(&output) == 75,
        "status of a held lock exited {}",
        code(&output)
    );
    // The owner record beside the key names the holder and its token; the TTL Redis tells.
    let pid = format!("(pid {}) for ", std::process::id());
    let token = format!("(fencing token {}){after_token}", lease.fencing_token());
    ensure!(
        stdout.starts_with(&format!("{key}: held by "))
            && stdout.contains(&pid)
            && stdout.contains(&token),
        "status printed {stdout:?}, expected …{pid}…{token}…"
    );

    released_then_free(redis, &url, &key, locks, lease)
}

/// Starts `dlock run` with `script` (which must write `started` to `log` first), deletes the
/// lock key so the next renewal finds the lease lost, and returns dlock's output.
fn run_and_lose(
    redis: &Servers,
    trial: &str,
    script: &str,
    grace: &str,
) -> Result<(Output, PathBuf), Failed> {
    let dir = scratch(trial);
    let log = dir.join("log");
    let script = script.replace("LOG", &log.display().to_string());
    let key = format!("cli-{trial}-{}", std::process::id());
    let child = spawn(&mut dlock_run(
        &redis.url,
        &key,
        &["--ttl", "1500ms", "--grace", grace],
        &["sh", "-c", &script],
    ))?;
    wait_for(&log, "started")?;
    redis.delete(&key)?;
    Ok((finish(child)?, log))
}

fn lost_lease_stops_the_command(redis: &Servers) -> Result<(), Failed> {
    let script = "trap 'echo terminated >> LOG; exit 0' TERM; echo started >> LOG; \
                  while :; do sleep 0.1; done";
    let (output, log) = run_and_lose(redis, "lost", script, "700ms")?;
    exits(&output, 76)?;
    ensure!(
        read(&log).contains("terminated"),
        "the command got no SIGTERM: {:?}",
        read(&log)
    );
    stderr_says(&output, "is lost")
}

fn lost_lease_kills_a_stubborn_command(redis: &Servers) -> Result<(), Failed> {
    let script = "trap '' TERM; echo $$ > LOG.pid; echo started >> LOG; \
                  while :; do sleep 0.1; done";
    let (output, log) = run_and_lose(redis, "stubborn", script, "500ms")?;
    exits(&output, 76)?;
    let pid = read(&log.with_extension("pid")).trim().to_owned();
    ensure!(!pid.is_empty(), "the command did not write its pid");
    ensure!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the command (pid {pid}) is still running"
    );
    stderr_says(&output, "SIGKILL")
}

fn exit_status_passes_through(redis: &Servers) -> Result<(), Failed> {
    let key = format!("cli-status-{}", std::process::id());
    for (script, expected) in [
        (format!("test \"$DLOCK_KEY\" = {key} && exit 7"), 7),
        ("exit 0".to_owned(), 0),
        ("kill -9 $$".to_owned(), 137),
    ] {
        let output = dlock_run_to_end(&redis.url, &key, &["--wait", "30s"], &["sh", "-c", &script]);
        ensure!(
            code(&output) == expected,
            "{script:?} exited {}, expected {expected}",
            code(&output)
        );
    }
    // Released after each run.
    ensure_free(&redis.url, &key, "after the runs (the lock was left held)")
}

fn signals_reach_the_command(redis: &Servers) -> Result<(), Failed> {
    let dir = scratch("signals");
    let log = dir.join("log");
    let key = format!("cli-signals-{}", std::process::id());
    let script = format!(
        "trap 'echo got-term >> {0}; exit 3' TERM; echo started >> {0}; while :; do sleep 0.1; done",
        log.display()
    );
    let child = spawn(&mut dlock_run(
        &redis.url,
        &key,
        &[],
        &["sh", "-c", &script],
    ))?;
    wait_for(&log, "started")?;
    sigterm(&child)?;
    let output = finish(child)?;
    exits(&output, 3)?;
    ensure!(
        read(&log).contains("got-term"),
        "the command got no SIGTERM"
    );
    ensure_free(
        &redis.url,
        &key,
        "after the signalled run (the lock was left held)",
    )
}

/// `status` on etcd, which can tell the holder's token: held with the token the lease has
/// (exit 75), then free (exit 0) after the release. Looking takes nothing: the holder keeps it.
fn status_names_the_holders_token(servers: &Servers) -> Result<(), Failed> {
    status_shows_holder_then_free(servers, &servers.etcd_url, "etcd", "")
}

/// `status` on PostgreSQL: the holder's token from `dlock_holders` beside its advisory lock.
fn postgres_status_names_the_holders_token(servers: &Servers) -> Result<(), Failed> {
    status_shows_holder_then_free(servers, &servers.postgres_url, "postgres", "")
}

/// Releases the holder's `lease` and drops its handle; `status` on `url` then finds `key` free
/// (exit 0): nothing the test did left the lock held.
fn released_then_free(
    servers: &Servers,
    url: &str,
    key: &str,
    locks: dlock::Locks,
    lease: dlock::Lease,
) -> Result<(), Failed> {
    servers.handle.block_on(lease.release())?;
    drop(locks);
    ensure_free(url, key, "after the holder's release")
}

/// Fails if the command of a `dlock run` left its `marker`: it ran without the lock.
fn never_ran(marker: &str) -> Result<(), Failed> {
    ensure!(
        !Path::new(marker).exists(),
        "the command ran without the lock"
    );
    Ok(())
}

/// Sends SIGTERM to a child process, as a service manager stopping it would.
fn sigterm(child: &Child) -> Result<(), Failed> {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id())?);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
    Ok(())
}

/// Holds `key` through the library on `url`: the handle and the lease.
fn hold(servers: &Servers, url: &str, key: &str) -> Result<(dlock::Locks, dlock::Lease), Failed> {
    Ok(servers.handle.block_on(async {
        let locks = dlock::connect(url).await?;
        let lease = locks
            .acquire(key, &LockOptions::new(Duration::from_secs(60)))
            .await?;
        Ok::<_, dlock::Error>((locks, lease))
    })?)
}

/// `status` on `url` while a lease holds the key: exit 75 and `KEY: held (fencing token N)` then
/// `after_token`; the holder keeps its lease; after the release, exit 0 and `KEY: free`.
fn status_shows_holder_then_free(
    servers: &Servers,
    url: &str,
    backend: &str,
    after_token: &str,
) -> Result<(), Failed> {
    let key = format!("cli-{backend}-status-{}", std::process::id());
    let (locks, lease) = hold(servers, url, &key)?;
    let output = dlock_status(url, &key);
    exits(&output, 75)?;
    let printed = text(&output.stdout);
    let token = format!("(fencing token {}){after_token}", lease.fencing_token());
    ensure!(
        printed.starts_with(&format!("{key}: held by "))
            && printed.contains(&format!("(pid {})", std::process::id()))
            && printed.contains(&token),
        "status printed {printed:?}, expected the holder's record and {token:?}"
    );
    ensure!(
        lease.is_held(),
        "looking took the lock from its holder: {:?}",
        lease.state()
    );
    released_then_free(servers, url, &key, locks, lease)
}

/// SIGTERM to a `dlock run` waiting for a busy lock: it exits with 143 without running the
/// command, and withdraws its place in etcd's queue, so the lock is free once the holder
/// releases (a left-over contender key would hold it until its session expired).
fn interrupted_wait_leaves_nothing(servers: &Servers) -> Result<(), Failed> {
    let dir = scratch("interrupted");
    let marker = dir.join("ran").display().to_string();
    let key = format!("cli-etcd-interrupted-{}", std::process::id());
    let (locks, lease) = hold(servers, &servers.etcd_url, &key)?;
    let waiter = queued_waiter(servers, &key, "60s", &marker)?;
    sigterm(&waiter)?;
    let output = finish(waiter)?;
    exits(&output, 143)?;
    never_ran(&marker)?;
    released_then_free(servers, &servers.etcd_url, &key, locks, lease)
}

/// Starts `dlock run --wait <wait>` of `touch <marker>` on etcd's `key` and gives it time to
/// connect and queue up behind the holder (generous on a loaded machine).
fn queued_waiter(servers: &Servers, key: &str, wait: &str, marker: &str) -> Result<Child, Failed> {
    let waiter = spawn(&mut dlock_run(
        &servers.etcd_url,
        key,
        &["--wait", wait],
        &["touch", marker],
    ))?;
    std::thread::sleep(Duration::from_secs(2));
    Ok(waiter)
}

/// `dlock run --wait` that runs out behind a holder exits 75 only after withdrawing its place in
/// etcd's queue: a waiter queued behind it holds as soon as the holder releases, not when the
/// exited process's session expires (10 s).
fn timed_out_wait_leaves_nothing(servers: &Servers) -> Result<(), Failed> {
    let dir = scratch("timed-out");
    let marker = dir.join("ran").display().to_string();
    let key = format!("cli-etcd-timed-out-{}", std::process::id());
    let url = servers.etcd_url.clone();
    let (holder, behind) = servers.handle.block_on(async {
        Ok::<_, dlock::Error>((dlock::connect(&url).await?, dlock::connect(&url).await?))
    })?;
    let lease = servers
        .handle
        .block_on(holder.acquire(&key, &LockOptions::new(Duration::from_secs(60))))?;
    let waiter = queued_waiter(servers, &key, "4s", &marker)?;
    // The next waiter queues behind it.
    let next = {
        let key = key.clone();
        servers.handle.spawn(async move {
            let lease = behind
                .acquire(&key, &LockOptions::new(Duration::from_secs(60)))
                .await?;
            Ok::<_, dlock::Error>((Instant::now(), lease))
        })
    };
    let output = finish(waiter)?;
    exits(&output, 75)?;
    never_ran(&marker)?;
    let released = Instant::now();
    servers.handle.block_on(lease.release())?;
    let (held, next) = servers.handle.block_on(next)??;
    let gap = held.saturating_duration_since(released);
    ensure!(
        gap <= Duration::from_secs(1),
        "the waiter behind the exited command held {gap:?} after the release"
    );
    servers.handle.block_on(next.release())?;
    Ok(())
}

/// `status` on Redlock reads every master: held with the lease's token and its remaining TTL
/// (exit 75), then free (exit 0) after the release; the holder keeps the lock meanwhile.
fn redlock_status_names_the_holders_token(servers: &Servers) -> Result<(), Failed> {
    status_shows_holder_then_free(servers, &servers.redlock_url, "redlock", ", expires in ")
}

/// `fence_ttl` in the URL reaches the server: after a `dlock run`, the key's counter expires in
/// the fence TTL (a day here) rather than never.
fn fence_ttl_from_the_url_reaches_the_counter(redis: &Servers) -> Result<(), Failed> {
    let key = format!("cli-fence-ttl-{}", std::process::id());
    let url = format!("{}?fence_ttl=1d", redis.url);
    let output = dlock_run_to_end(&url, &key, &[], &["true"]);
    exits(&output, 0)?;
    let fence = format!("{{{key}}}:dlock:fence");
    let server = redis.url.clone();
    let pttl: i64 = redis
        .handle
        .block_on(async move {
            let client = redis::Client::open(server)?;
            let mut con = client.get_multiplexed_async_connection().await?;
            redis::cmd("PTTL").arg(&fence).query_async(&mut con).await
        })
        .map_err(|e| Failed::from(format!("PTTL failed: {e}")))?;
    let day: i64 = 24 * 3600 * 1000;
    // Generous: the grant was moments ago on a possibly loaded machine.
    ensure!(
        pttl <= day && pttl > day - 60_000,
        "the counter's PTTL is {pttl} ms, expected about a day"
    );
    Ok(())
}

/// `status --json` on etcd while a labelled holder holds the key and a second client waits: one
/// JSON object with the holder's token, owner record (this process, its label) and the queue.
fn status_json_shows_owner_and_queue(servers: &Servers) -> Result<(), Failed> {
    let key = format!("cli-etcd-json-{}", std::process::id());
    let url = format!("{}?owner=cli-holder", servers.etcd_url);
    let (locks, lease) = hold(servers, &url, &key)?;
    let waiter_url = format!("{}?owner=cli-waiter", servers.etcd_url);
    let waiting = {
        let (key, url) = (key.clone(), waiter_url.clone());
        servers.handle.spawn(async move {
            let locks = dlock::connect(&url).await?;
            let opts = LockOptions::new(Duration::from_secs(60)).with_wait(PATIENCE);
            let lease = locks.acquire(&key, &opts).await?;
            lease.release().await?;
            Ok::<_, dlock::Error>(())
        })
    };
    let deadline = Instant::now() + PATIENCE;
    let json = loop {
        let output = run_to_end(dlock().args([
            "status",
            "--json",
            "--url",
            &servers.etcd_url,
            "--key",
            &key,
        ]));
        exits(&output, 75)?;
        let json: serde_json::Value = serde_json::from_slice(&output.stdout)?;
        if json["waiting"] == 1 || Instant::now() > deadline {
            break json;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    ensure!(
        json["key"] == key.as_str() && json["state"] == "held",
        "status --json printed {json}"
    );
    let holder = &json["holder"];
    ensure!(
        holder["fencing"] == lease.fencing_token().0
            && holder["owner"]["label"] == "cli-holder"
            && holder["owner"]["pid"] == std::process::id()
            && holder["expires_in_ms"].is_null(),
        "the holder shows as {holder}"
    );
    ensure!(
        json["waiting"] == 1 && json["queue"][0]["owner"]["label"] == "cli-waiter",
        "the queue shows as {json}"
    );
    servers.handle.block_on(lease.release())?;
    servers.handle.block_on(waiting)??;
    drop(locks);
    ensure_free(&servers.etcd_url, &key, "after the holder and the waiter")
}

/// `list PREFIX` on etcd: a table row and a `--json` entry for each held lock under the prefix,
/// none for a lock outside it.
fn list_shows_the_held_locks(servers: &Servers) -> Result<(), Failed> {
    list_shows_the_held_locks_on(servers, &servers.etcd_url, "etcd")
}

/// [`list_shows_the_held_locks`] on PostgreSQL.
fn postgres_list_shows_the_held_locks(servers: &Servers) -> Result<(), Failed> {
    list_shows_the_held_locks_on(servers, &servers.postgres_url, "postgres")
}

/// `list PREFIX` on `base` (a URL without query parameters), as [`list_shows_the_held_locks`]
/// says.
fn list_shows_the_held_locks_on(
    servers: &Servers,
    base: &str,
    backend: &str,
) -> Result<(), Failed> {
    let prefix = format!("cli-{backend}-list-{}/", std::process::id());
    let url = format!("{base}?owner=cli-lister");
    let (locks, a) = hold(servers, &url, &format!("{prefix}a"))?;
    let b = servers.handle.block_on(locks.acquire(
        &format!("{prefix}b"),
        &LockOptions::new(Duration::from_secs(60)),
    ))?;
    let outside = servers.handle.block_on(locks.acquire(
        &format!("cli-{backend}-list-{}-outside", std::process::id()),
        &LockOptions::new(Duration::from_secs(60)),
    ))?;
    let output = run_to_end(dlock().args(["list", "--url", base, &prefix]));
    exits(&output, 0)?;
    let printed = text(&output.stdout);
    let lines: Vec<&str> = printed.lines().collect();
    ensure!(
        lines.len() == 3
            && lines[0].starts_with("KEY")
            && lines[1].starts_with(&format!("{prefix}a "))
            && lines[1].contains(&a.fencing_token().to_string())
            && lines[1].contains("  cli-lister on ")
            && lines[2].starts_with(&format!("{prefix}b ")),
        "list printed {printed:?}"
    );
    let output = run_to_end(dlock().args(["list", "--json", "--url", base, &prefix]));
    exits(&output, 0)?;
    let json: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let keys: Vec<&str> = json
        .as_array()
        .map(|all| all.iter().filter_map(|l| l["key"].as_str()).collect())
        .unwrap_or_default();
    ensure!(
        keys == [format!("{prefix}a"), format!("{prefix}b")]
            && json[1]["holder"]["fencing"] == b.fencing_token().0
            && json[1]["holder"]["owner"]["label"] == "cli-lister",
        "list --json printed {json}"
    );
    for lease in [a, b, outside] {
        servers.handle.block_on(lease.release())?;
    }
    drop(locks);
    Ok(())
}

/// `unlock --force` on etcd: it shows the holder and asks; "n" (or no answer) changes nothing
/// (exit 1), "y" evicts (exit 0): the holder's lease turns lost and the next holder gets a
/// greater token.
fn unlock_force_evicts_only_when_confirmed(servers: &Servers) -> Result<(), Failed> {
    unlock_force_evicts_on(servers, &servers.etcd_url, "etcd")
}

/// [`unlock_force_evicts_only_when_confirmed`] on PostgreSQL, where evicting ends the holder's
/// lock session (`pg_terminate_backend`).
fn postgres_unlock_force_evicts_only_when_confirmed(servers: &Servers) -> Result<(), Failed> {
    unlock_force_evicts_on(servers, &servers.postgres_url, "postgres")
}

/// `unlock --force` on `base` (a URL without query parameters), as
/// [`unlock_force_evicts_only_when_confirmed`] says.
fn unlock_force_evicts_on(servers: &Servers, base: &str, backend: &str) -> Result<(), Failed> {
    let key = format!("cli-{backend}-unlock-{}", std::process::id());
    let url = format!("{base}?owner=stuck-job");
    let (locks, lease) = hold(servers, &url, &key)?;
    let unlock = |answer: &str| -> Result<Output, Failed> {
        let mut child = dlock()
            .args(["unlock", "--force", "--url", base, "--key", &key])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write as _;
            stdin.write_all(answer.as_bytes())?;
        }
        Ok(child.wait_with_output()?)
    };
    let declined = unlock("n\n")?;
    exits(&declined, 1)?;
    let printed = text(&declined.stdout);
    ensure!(
        printed.starts_with(&format!("{key}: held by stuck-job on "))
            && printed.contains("not confirmed; nothing changed")
            && text(&declined.stderr).contains("[y/N]"),
        "a declined unlock printed {printed:?} / {:?}",
        text(&declined.stderr)
    );
    ensure!(lease.is_held(), "a declined unlock ended the lease");
    let evicted = unlock("y\n")?;
    exits(&evicted, 0)?;
    ensure!(
        text(&evicted.stdout).contains(&format!("{key}: evicted")),
        "a confirmed unlock printed {:?}",
        text(&evicted.stdout)
    );
    let lost = servers
        .handle
        .block_on(async { tokio::time::timeout(PATIENCE, lease.lost()).await });
    ensure!(lost.is_ok(), "the evicted lease did not turn lost");
    let (next_locks, next) = hold(servers, base, &key)?;
    ensure!(
        next.fencing_token() > lease.fencing_token(),
        "the next holder's token {} is not above the evicted {}",
        next.fencing_token(),
        lease.fencing_token()
    );
    drop((locks, lease));
    released_then_free(servers, base, &key, next_locks, next)
}

/// `--trace` puts one span per lock call on standard error, with its outcome and token, and
/// leaves standard output as it was.
fn trace_shows_each_call_on_stderr() -> Result<(), Failed> {
    let output = run_to_end(dlock().args([
        "--trace",
        "run",
        "--url",
        "memory://",
        "--key",
        "traced",
        "--",
        "true",
    ]));
    exits(&output, 0)?;
    let log = text(&output.stderr);
    for span in ["dlock.acquire{key=traced", "dlock.release{key=traced"] {
        ensure!(log.contains(span), "no {span}… span on stderr: {log:?}");
    }
    ensure!(
        log.contains("outcome=\"acquired\"") && log.contains("fencing=1"),
        "the acquire span lacks its outcome or token: {log:?}"
    );
    ensure!(
        text(&output.stdout).is_empty(),
        "stdout: {:?}",
        text(&output.stdout)
    );
    Ok(())
}

/// In-process, each primitive runs its command with its lease's token and key, and passes the
/// command's status through: a permit, a read, a write, a leadership.
fn memory_primitives_export_their_tokens() -> Result<(), Failed> {
    let print = [
        "sh",
        "-c",
        "echo \"$DLOCK_KEY $DLOCK_FENCING_TOKEN\"; exit 3",
    ];
    for flags in [&["--permits", "2"][..], &["--read"], &["--write"]] {
        let output = dlock_run_to_end("memory://", "jobs/p", flags, &print);
        exits(&output, 3)?;
        ensure!(
            text(&output.stdout) == "jobs/p 1\n",
            "{flags:?} printed {:?}",
            text(&output.stdout)
        );
    }
    let output = run_to_end(
        dlock()
            .args([
                "elect",
                "--url",
                "memory://",
                "--key",
                "jobs/e",
                "--value",
                "a:1",
                "--",
            ])
            .args(print),
    );
    exits(&output, 3)?;
    ensure!(
        text(&output.stdout) == "jobs/e 1\n",
        "elect printed {:?}",
        text(&output.stdout)
    );
    let output = run_to_end(dlock().args([
        "elect",
        "--url",
        "memory://",
        "--key",
        "e",
        "--value",
        "v",
        "--",
        "/nonexistent/command",
    ]));
    exits(&output, 127)?;
    one_line_error(&output, "/nonexistent/command")
}

/// `leader` where nobody leads: `KEY: no leader` and exit 0, as `status` does for a free lock;
/// `--json` prints the same as an object with a null leader; 141 where it cannot print.
fn memory_leader_shows_nobody_with_0() -> Result<(), Failed> {
    let output = run_to_end(dlock().args(["leader", "--url", "memory://", "--key", "e"]));
    exits(&output, 0)?;
    ensure!(
        text(&output.stdout) == "e: no leader\n",
        "leader printed {:?}",
        text(&output.stdout)
    );
    let output = run_to_end(dlock().args(["leader", "--json", "--url", "memory://", "--key", "e"]));
    exits(&output, 0)?;
    let json: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    ensure!(
        json == serde_json::json!({"key": "e", "leader": null}),
        "leader --json printed {json}"
    );
    // Output that cannot be written (a reader gone, a full disk) ends it as SIGPIPE would, not
    // with a panic.
    let output = dlock()
        .args(["leader", "--url", "memory://", "--key", "e"])
        .stdout(std::fs::File::create("/dev/full")?)
        .output()?;
    exits(&output, 141)?;
    ensure!(output.stderr.is_empty(), "stderr: {}", text(&output.stderr));
    Ok(())
}

/// A shell loop that waits until `gate` exists (the test creates it to let the command end),
/// or at most about twice [`PATIENCE`], so that no command outlives a failed trial for long.
fn until_exists(gate: &Path) -> String {
    format!(
        "i=0; while [ ! -e {} ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done",
        gate.display()
    )
}

/// The processes a trial started. Those still running when it ends — a trial that failed half
/// way — get SIGTERM, which `dlock` passes on to its command, then SIGKILL.
#[derive(Default)]
struct Running(Vec<Option<Child>>);

impl Running {
    /// Starts `command` (as [`spawn`]); the number names it for [`finish`](Self::finish).
    fn start(&mut self, command: &mut Command) -> Result<usize, Failed> {
        self.0.push(Some(spawn(command)?));
        Ok(self.0.len() - 1)
    }

    /// Starts `command` with its standard output going to the file `out`, to be read while it
    /// runs.
    fn start_to(&mut self, command: &mut Command, out: &Path) -> Result<usize, Failed> {
        let child = command
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(out)?)
            .stderr(Stdio::piped())
            .spawn()?;
        self.0.push(Some(child));
        Ok(self.0.len() - 1)
    }

    /// Sends `signal` to process `which`.
    fn signal(&self, which: usize, signal: nix::sys::signal::Signal) -> Result<(), Failed> {
        let child = self.0[which]
            .as_ref()
            .ok_or("the process has already finished")?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id())?);
        nix::sys::signal::kill(pid, signal)?;
        Ok(())
    }

    /// The process id of process `which`.
    fn pid(&self, which: usize) -> u32 {
        self.0[which].as_ref().map_or(0, Child::id)
    }

    /// Waits for process `which` to exit (as [`finish`]).
    fn finish(&mut self, which: usize) -> Result<Output, Failed> {
        let child = self.0[which]
            .take()
            .ok_or("the process has already finished")?;
        finish(child)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let left: Vec<Child> = self.0.iter_mut().filter_map(Option::take).collect();
        for child in &left {
            let _ = sigterm(child);
        }
        let until = Instant::now() + Duration::from_secs(10);
        for mut child in left {
            while Instant::now() < until && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Creates `gate`, letting the commands that wait for it end.
fn open_gate(gate: &Path) -> Result<(), Failed> {
    std::fs::write(gate, "")?;
    Ok(())
}

/// The lines of `path` that start with `prefix`, without it.
fn lines_after(path: &Path, prefix: &str) -> Vec<String> {
    read(path)
        .lines()
        .filter_map(|line| line.strip_prefix(prefix).map(str::to_owned))
        .collect()
}

/// Waits until `path` has `count` lines starting with `prefix`.
fn wait_for_lines(path: &Path, prefix: &str, count: usize) -> Result<(), Failed> {
    let until = Instant::now() + PATIENCE;
    while Instant::now() < until {
        if lines_after(path, prefix).len() >= count {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!(
        "{} never had {count} {prefix:?} lines: {:?}",
        path.display(),
        read(path)
    )
    .into())
}

/// Three `dlock run --permits 2` on one semaphore: two run at once, the third waits until one
/// of them ends; a fourth that does not wait is busy (75), and one that names another number of
/// permits is refused (64); neither runs its command. Every holder has a token of its own.
fn permits_two_at_once_and_a_third_waits(servers: &Servers) -> Result<(), Failed> {
    permits_two_at_once_and_a_third_waits_on(&servers.url, "permits")
}

/// [`permits_two_at_once_and_a_third_waits`] on PostgreSQL's semaphore.
fn postgres_permits_two_at_once_and_a_third_waits(servers: &Servers) -> Result<(), Failed> {
    permits_two_at_once_and_a_third_waits_on(&servers.postgres_url, "postgres-permits")
}

/// [`permits_two_at_once_and_a_third_waits`] on `url`; `trial` names the scratch directory and
/// the key.
fn permits_two_at_once_and_a_third_waits_on(url: &str, trial: &str) -> Result<(), Failed> {
    let dir = scratch(trial);
    let (log, go) = (dir.join("log"), dir.join("go"));
    let script = format!(
        "echo \"+ $DLOCK_FENCING_TOKEN\" >> {0}; {1}; echo \"- $DLOCK_FENCING_TOKEN\" >> {0}",
        log.display(),
        until_exists(&go)
    );
    let key = format!("cli-{trial}-{}", std::process::id());
    let options = ["--permits", "2", "--ttl", "5s", "--wait", "60s"];
    let mut running = Running::default();
    let holders = (0..3)
        .map(|_| running.start(&mut dlock_run(url, &key, &options, &["sh", "-c", &script])))
        .collect::<Result<Vec<usize>, Failed>>()?;
    wait_for_lines(&log, "+ ", 2)?;
    // Time for a third permit to be handed out, were there one.
    std::thread::sleep(Duration::from_secs(1));
    ensure!(
        lines_after(&log, "+ ").len() == 2,
        "three hold a permit of two: {:?}",
        read(&log)
    );
    let marker = dir.join("ran").display().to_string();
    let output = dlock_run_to_end(
        url,
        &key,
        &["--permits", "2", "--wait", "0"],
        &["touch", &marker],
    );
    exits(&output, 75)?;
    one_line_error(&output, "busy")?;
    let output = dlock_run_to_end(
        url,
        &key,
        &["--permits", "3", "--wait", "0"],
        &["touch", &marker],
    );
    exits(&output, 64)?;
    one_line_error(&output, "in use with other settings")?;
    never_ran(&marker)?;
    open_gate(&go)?;
    for holder in holders {
        exits(&running.finish(holder)?, 0)?;
    }
    // At most two between their + and - lines at any time; three tokens of their own.
    let (mut inside, mut most) = (0, 0);
    for line in read(&log).lines() {
        if line.starts_with("+ ") {
            inside += 1;
            most = most.max(inside);
        } else {
            inside -= 1;
        }
    }
    let tokens: BTreeSet<String> = lines_after(&log, "+ ").into_iter().collect();
    ensure!(
        most == 2 && tokens.len() == 3 && read(&log).lines().count() == 6,
        "the permits' log: {:?}",
        read(&log)
    );
    Ok(())
}

/// Two `dlock run --read` hold one read-write lock at once; a `run --write` waits for both to
/// end, and while it waits, a new reader is held back (busy, 75) rather than let in before it.
/// The plain lock of the same name is another thing: free meanwhile. The writer's token is
/// greater than both readers'.
fn readers_share_and_a_writer_waits(servers: &Servers) -> Result<(), Failed> {
    readers_share_and_a_writer_waits_on(&servers.url, "rw", Plain::Separate)
}

/// [`readers_share_and_a_writer_waits`] on PostgreSQL's read-write lock, whose write side is the
/// plain lock of the name (DistributedLock's mapping): busy while the readers hold.
fn postgres_readers_share_and_a_writer_waits(servers: &Servers) -> Result<(), Failed> {
    readers_share_and_a_writer_waits_on(&servers.postgres_url, "postgres-rw", Plain::WriteSide)
}

/// What the plain lock of a read-write lock's name is on a backend.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Plain {
    /// Another lock, free while the read-write lock is held.
    Separate,
    /// The write side itself, so busy while readers hold.
    WriteSide,
}

/// [`readers_share_and_a_writer_waits`] on `url`; `trial` names the scratch directory and the
/// key, `plain` what the plain lock of the name is there.
fn readers_share_and_a_writer_waits_on(url: &str, trial: &str, plain: Plain) -> Result<(), Failed> {
    let dir = scratch(trial);
    let (log, go) = (dir.join("log"), dir.join("go"));
    let reader = format!(
        "echo \"r+ $DLOCK_FENCING_TOKEN\" >> {0}; {1}; echo \"r- $DLOCK_FENCING_TOKEN\" >> {0}",
        log.display(),
        until_exists(&go)
    );
    let key = format!("cli-{trial}-{}", std::process::id());
    let mut running = Running::default();
    let readers = (0..2)
        .map(|_| {
            running.start(&mut dlock_run(
                url,
                &key,
                &["--read", "--ttl", "5s", "--wait", "60s"],
                &["sh", "-c", &reader],
            ))
        })
        .collect::<Result<Vec<usize>, Failed>>()?;
    wait_for_lines(&log, "r+ ", 2)?;
    let writer_script = format!("echo \"w $DLOCK_FENCING_TOKEN\" >> {}", log.display());
    let writer = running.start(&mut dlock_run(
        url,
        &key,
        &["--write", "--ttl", "5s", "--wait", "60s"],
        &["sh", "-c", &writer_script],
    ))?;
    // Once the writer waits, a reader that does not wait is turned away.
    let until = Instant::now() + PATIENCE;
    loop {
        let output = dlock_run_to_end(url, &key, &["--read", "--wait", "0"], &["true"]);
        if code(&output) == 75 {
            one_line_error(&output, "busy")?;
            break;
        }
        exits(&output, 0)?;
        ensure!(Instant::now() < until, "no reader was ever held back");
        std::thread::sleep(Duration::from_millis(50));
    }
    ensure!(
        lines_after(&log, "w ").is_empty(),
        "the writer ran beside readers: {:?}",
        read(&log)
    );
    // `run` without --read or --write takes the plain lock: nobody holds it, or it is the
    // write side the readers keep out.
    let expected = match plain {
        Plain::Separate => 0,
        Plain::WriteSide => 75,
    };
    exits(
        &dlock_run_to_end(url, &key, &["--wait", "0"], &["true"]),
        expected,
    )?;
    open_gate(&go)?;
    for reader in readers {
        exits(&running.finish(reader)?, 0)?;
    }
    exits(&running.finish(writer)?, 0)?;
    let lines: Vec<String> = read(&log).lines().map(str::to_owned).collect();
    ensure!(
        lines.len() == 5 && lines[4].starts_with("w "),
        "the writer did not run alone, last: {lines:?}"
    );
    let tokens = |prefix: &str| -> Result<Vec<u64>, Failed> {
        lines_after(&log, prefix)
            .iter()
            .map(|t| t.parse::<u64>().map_err(Failed::from))
            .collect()
    };
    let (read_tokens, write_tokens) = (tokens("r+ ")?, tokens("w ")?);
    ensure!(
        read_tokens[0] != read_tokens[1],
        "the readers share a token: {lines:?}"
    );
    ensure!(
        write_tokens
            .iter()
            .all(|w| read_tokens.iter().all(|r| w > r)),
        "the writer's token is not above the readers': {lines:?}"
    );
    Ok(())
}

/// `dlock elect` a, then b: b waits while a's command runs and takes over as soon as it ends
/// (a resigns); `leader` names a with its term meanwhile (exit 75), and nobody once both ended
/// (exit 0). Two `leader --watch`, text and `--json`, print a then b, one line each, with
/// increasing terms — the terms the commands saw in DLOCK_FENCING_TOKEN.
fn elect_hands_over_and_leader_watch_sees_both_terms(servers: &Servers) -> Result<(), Failed> {
    let dir = scratch("elect");
    let (log, watched, watched_json) = (dir.join("log"), dir.join("watch"), dir.join("watch.json"));
    let key = format!("cli-elect-{}", std::process::id());
    let url = servers.url.as_str();
    let leader = || {
        let mut leader = dlock();
        leader.args(["leader", "--url", url, "--key", &key]);
        leader
    };
    let mut running = Running::default();
    let watch = running.start_to(leader().arg("--watch"), &watched)?;
    let watch_json = running.start_to(leader().args(["--watch", "--json"]), &watched_json)?;
    let mut candidate = |value: &str, gate: &Path| -> Result<usize, Failed> {
        let script = format!(
            "echo \"{value} $DLOCK_FENCING_TOKEN\" >> {}; {}",
            log.display(),
            until_exists(gate)
        );
        running.start(dlock().args([
            "elect", "--url", url, "--key", &key, "--value", value, "--ttl", "5s", "--wait", "60s",
            "--", "sh", "-c", &script,
        ]))
    };
    let (go_a, go_b) = (dir.join("go-a"), dir.join("go-b"));
    let a = candidate("a", &go_a)?;
    wait_for_lines(&log, "a ", 1)?;
    let b = candidate("b", &go_b)?;
    let term_a = lines_after(&log, "a ").concat();
    let output = run_to_end(&mut leader());
    exits(&output, 75)?;
    // The leader's owner record is the `elect` process's.
    let shown = format!("{key}: led by \"a\" (term {term_a}), owner ");
    let owner = format!(" (pid {})\n", running.pid(a));
    ensure!(
        text(&output.stdout).starts_with(&shown) && text(&output.stdout).ends_with(&owner),
        "leader printed {:?}, expected {shown:?}…{owner:?}",
        text(&output.stdout)
    );
    let output = run_to_end(leader().arg("--json"));
    exits(&output, 75)?;
    let json: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    ensure!(
        json["key"] == key.as_str()
            && json["leader"]["value"] == "a"
            && json["leader"]["term"].as_u64() == term_a.parse().ok()
            && json["leader"]["owner"]["pid"] == running.pid(a),
        "leader --json printed {json}"
    );
    wait_for(&watched, "\"a\"")?;
    wait_for(&watched_json, "\"a\"")?;
    ensure!(
        lines_after(&log, "b ").is_empty(),
        "b led beside a: {:?}",
        read(&log)
    );
    open_gate(&go_a)?;
    exits(&running.finish(a)?, 0)?;
    wait_for_lines(&log, "b ", 1)?;
    let term_b = lines_after(&log, "b ").concat();
    wait_for(&watched, "\"b\"")?;
    wait_for(&watched_json, "\"b\"")?;
    open_gate(&go_b)?;
    exits(&running.finish(b)?, 0)?;
    // A watch ends with SIGTERM or SIGINT, as the shell's convention says.
    use nix::sys::signal::Signal;
    for (watcher, signal, code) in [
        (watch, Signal::SIGTERM, 143),
        (watch_json, Signal::SIGINT, 130),
    ] {
        running.signal(watcher, signal)?;
        exits(&running.finish(watcher)?, code)?;
    }
    let lines: Vec<String> = read(&watched).lines().map(str::to_owned).collect();
    ensure!(
        lines.len() == 2
            && lines[0].starts_with(&format!("{key}: led by \"a\" (term {term_a})"))
            && lines[1].starts_with(&format!("{key}: led by \"b\" (term {term_b})")),
        "leader --watch printed {lines:?}"
    );
    let seen: Vec<(String, u64)> = read(&watched_json)
        .lines()
        .map(|line| {
            let json: serde_json::Value = serde_json::from_str(line)?;
            let leader = &json["leader"];
            Ok((
                leader["value"].as_str().unwrap_or_default().to_owned(),
                leader["term"].as_u64().unwrap_or_default(),
            ))
        })
        .collect::<Result<_, serde_json::Error>>()?;
    ensure!(
        seen == [
            ("a".to_owned(), term_a.parse()?),
            ("b".to_owned(), term_b.parse()?)
        ] && seen[0].1 < seen[1].1,
        "leader --watch --json printed {:?} (terms a {term_a}, b {term_b})",
        read(&watched_json)
    );
    let output = run_to_end(&mut leader());
    exits(&output, 0)?;
    ensure!(
        text(&output.stdout) == format!("{key}: no leader\n"),
        "leader after both resigned printed {:?}",
        text(&output.stdout)
    );
    Ok(())
}

/// A leader whose election vanishes from the server (its database flushed, as a data loss
/// would) learns it at its next renewal: the command gets SIGTERM and `elect` exits with 76.
fn lost_leadership_stops_the_command(servers: &Servers) -> Result<(), Failed> {
    // A database of its own, so that flushing it touches no other trial's keys.
    let url = format!("{}/7", servers.url);
    let dir = scratch("lost-leader");
    let log = dir.join("log");
    let script = format!(
        "trap 'echo terminated >> {0}; exit 0' TERM; echo started >> {0}; while :; do sleep 0.1; done",
        log.display()
    );
    let key = format!("cli-lost-leader-{}", std::process::id());
    let mut running = Running::default();
    let child = running.start(dlock().args([
        "elect", "--url", &url, "--key", &key, "--value", "v", "--ttl", "1500ms", "--grace",
        "700ms", "--", "sh", "-c", &script,
    ]))?;
    wait_for(&log, "started")?;
    let flushed = servers.handle.block_on(async {
        let client = redis::Client::open(url.as_str())?;
        let mut con = client.get_multiplexed_async_connection().await?;
        redis::cmd("FLUSHDB").query_async::<()>(&mut con).await
    });
    flushed.map_err(|e| Failed::from(format!("FLUSHDB failed: {e}")))?;
    let output = running.finish(child)?;
    exits(&output, 76)?;
    ensure!(
        read(&log).contains("terminated"),
        "the command got no SIGTERM: {:?}",
        read(&log)
    );
    stderr_says(&output, &format!("the leadership of {key:?} is lost"))
}

/// Redlock serves no semaphore (N + 1 holders could each hold a majority of the masters):
/// `run --permits` says so in one line and exits 69 without running the command.
fn redlock_run_permits_is_unsupported(servers: &Servers) -> Result<(), Failed> {
    let dir = scratch("redlock-permits");
    let marker = dir.join("ran").display().to_string();
    let key = format!("cli-redlock-permits-{}", std::process::id());
    let output = dlock_run_to_end(
        &servers.redlock_url,
        &key,
        &["--permits", "2"],
        &["touch", &marker],
    );
    exits(&output, 69)?;
    one_line_error(
        &output,
        "unsupported by the redlock backend: a semaphore by quorum",
    )?;
    never_ran(&marker)
}

/// SIGTERM to an `elect` waiting while another candidate leads: it exits with 143 without
/// running the command, and leaves no candidacy behind: once the leader resigns, nobody leads.
/// A `leader --watch` started meanwhile prints the leader it finds, and only that one.
fn interrupted_campaign_runs_nothing(servers: &Servers) -> Result<(), Failed> {
    let dir = scratch("interrupted-campaign");
    let marker = dir.join("ran").display().to_string();
    let key = format!("cli-interrupted-campaign-{}", std::process::id());
    let url = servers.url.clone();
    let (locks, leadership) = servers.handle.block_on(async {
        let locks = dlock::connect(&url).await?;
        let opts = LockOptions::new(Duration::from_secs(60));
        let leadership = locks.election(&key)?.campaign("holder", &opts).await?;
        Ok::<_, dlock::Error>((locks, leadership))
    })?;
    let mut running = Running::default();
    // A watch started while someone leads prints that leader first.
    let watched = dir.join("watch");
    let watch = running.start_to(
        dlock().args(["leader", "--watch", "--url", &url, "--key", &key]),
        &watched,
    )?;
    wait_for(
        &watched,
        &format!("{key}: led by \"holder\" (term {}", leadership.term()),
    )?;
    let candidate = running.start(dlock().args([
        "elect", "--url", &url, "--key", &key, "--value", "waiter", "--wait", "60s", "--", "touch",
        &marker,
    ]))?;
    // Time to connect and start campaigning (generous on a loaded machine).
    std::thread::sleep(Duration::from_secs(2));
    running.signal(candidate, nix::sys::signal::Signal::SIGTERM)?;
    exits(&running.finish(candidate)?, 143)?;
    never_ran(&marker)?;
    running.signal(watch, nix::sys::signal::Signal::SIGTERM)?;
    exits(&running.finish(watch)?, 143)?;
    ensure!(
        read(&watched).lines().count() == 1,
        "the watch printed {:?}",
        read(&watched)
    );
    servers.handle.block_on(leadership.resign())?;
    drop(locks);
    let output = run_to_end(dlock().args(["leader", "--url", &url, "--key", &key]));
    exits(&output, 0)?;
    ensure!(
        text(&output.stdout) == format!("{key}: no leader\n"),
        "after the leader resigned, leader printed {:?}",
        text(&output.stdout)
    );
    Ok(())
}

/// Every command on PostgreSQL, with the password in `--url` and in `DLOCK_URL`, with
/// `--trace`, held, free, refused (a wrong password, an unknown parameter, a primitive the
/// backend may not serve) and unreachable: the password shows in no output and no error.
fn postgres_no_command_shows_the_password(servers: &Servers) -> Result<(), Failed> {
    let url = servers.postgres_url.clone();
    let Some(password) = dlock_testkit::fixtures::postgres::password_of(&url) else {
        eprintln!("the PostgreSQL server's URL has no password: nothing to look for");
        return Ok(());
    };
    let wrong_password = "hunter2-Wrong";
    let wrong = url.replacen(&format!(":{password}@"), &format!(":{wrong_password}@"), 1);
    ensure!(
        wrong != url,
        "could not swap the password in the fixture's URL"
    );
    let unreachable =
        format!("postgres://postgres:{password}@127.0.0.1:1/postgres?connect_timeout=300ms");
    let dir = scratch("postgres-secrets");
    let marker = dir.join("ran").display().to_string();
    let key = format!("cli-postgres-secrets-{}", std::process::id());
    let (locks, lease) = hold(servers, &format!("{url}?owner=secret-holder"), &key)?;
    let free_key = format!("{key}-free");
    let held: &[&[&str]] = &[
        &["status", "--key", &key],
        &["status", "--json", "--key", &key],
        &["list", "cli-postgres-secrets-"],
        &["list", "--json", "cli-postgres-secrets-"],
        &["run", "--key", &key, "--wait", "0", "--", "touch", &marker],
        &["--trace", "run", "--key", &free_key, "--", "true"],
        &["--trace", "status", "--key", &free_key],
        &["unlock", "--force", "--key", &free_key],
        &["run", "--key", &free_key, "--permits", "2", "--", "true"],
        &["run", "--key", &free_key, "--read", "--", "true"],
        &[
            "elect", "--key", &free_key, "--value", "me", "--wait", "0", "--", "true",
        ],
        &["leader", "--key", &free_key],
    ];
    let mut outputs = Vec::new();
    for args in held {
        for target in [&url, &wrong, &unreachable] {
            // Once in --url, once from DLOCK_URL.
            let mut with_flag = dlock();
            with_flag.args(*args).args(["--url", target.as_str()]);
            outputs.push((format!("{args:?} --url"), run_to_end(&mut with_flag)));
            let mut from_env = dlock();
            from_env.env("DLOCK_URL", target.as_str()).args(*args);
            outputs.push((format!("{args:?} DLOCK_URL"), run_to_end(&mut from_env)));
        }
    }
    // A refused URL, whose error quotes it.
    for bad in [
        format!("{url}?colour=red"),
        format!("{url}?sslmode=sometimes"),
        format!(
            "{}/a/b",
            url.rsplit_once('/').map_or(url.as_str(), |(base, _)| base)
        ),
    ] {
        let output = run_to_end(dlock().args(["status", "--key", &key, "--url", &bad]));
        exits(&output, 64)?;
        outputs.push((format!("status --url {bad:?}"), output));
    }
    for (what, output) in &outputs {
        for secret in [password.as_str(), wrong_password] {
            ensure!(
                !text(&output.stdout).contains(secret) && !text(&output.stderr).contains(secret),
                "{what} shows a password: {} / {}",
                text(&output.stdout),
                text(&output.stderr)
            );
        }
    }
    // The commands did what they say: the holder shows, the wrong password is refused.
    ensure!(
        code(&outputs[0].1) == 75 && text(&outputs[0].1.stdout).contains("secret-holder"),
        "status printed {:?}",
        outputs[0].1
    );
    let refused = &outputs[3].1;
    ensure!(
        code(refused) == 69 && text(&refused.stderr).contains("password authentication failed"),
        "the wrong password: {refused:?}"
    );
    ensure!(
        outputs
            .iter()
            .any(|(_, o)| text(&o.stderr).contains("postgres:***@")),
        "no error shows the URL without its password"
    );
    never_ran(&marker)?;
    released_then_free(servers, &url, &key, locks, lease)
}
