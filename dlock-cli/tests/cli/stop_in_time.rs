//! The command is dead before the lock can pass, on every backend.
//!
//! A holder runs `dlock run` through a proxy; once its command is running, the proxy goes silent
//! for good (bytes dropped both ways, connections left open), so the holder can neither renew
//! nor release. A contender connected directly waits for the lock and runs a command that writes
//! the moment it starts. The holder's command behaves like a real job: on SIGTERM it keeps
//! writing for 3 s while it shuts down. Every write is stamped with the machine's clock; the
//! holder's last write must come before the contender's first.
//!
//! On the session backends the URL's `session_timeout` equals the TTL, so the server ends the
//! silent holder's session, and lets the contender in, as early as it may.
//!
//! Teeth: the same scenario with a runner that stops the command only once the lease is lost
//! (SIGTERM, then SIGKILL 10 s later, as `dlock run` did before) must show the overlap.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use dlock::LockOptions;
use dlock_testkit::{url_target, DroppingProxies, Freeze, FreezeProxy};
use libtest_mimic::Failed;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::{dlock_run, exits, finish, read, scratch, spawn, wait_for, Servers};

/// How long the holder's command keeps writing after SIGTERM.
const SHUTDOWN: &str = "3000000000";

/// A backend as the scenario needs it: the servers' addresses, and its URL for a given set of
/// addresses (the servers' own, or the proxies').
pub(crate) struct Backend {
    pub(crate) name: &'static str,
    pub(crate) targets: Vec<SocketAddr>,
    /// The URL that reaches `addrs`, with the session timeout (on a session backend) and any
    /// other parameter the scenario needs.
    pub(crate) url: Box<UrlFor>,
}

/// The URL that reaches the given addresses, for a lease of the given TTL.
type UrlFor = dyn Fn(&[SocketAddr], &str) -> String + Send + Sync;

impl Backend {
    /// One server behind a URL such as `redis://host:port` (credentials and path kept); `session`
    /// says whether it takes `session_timeout`.
    pub(crate) fn single(name: &'static str, url: &str, port: u16, session: bool) -> Self {
        let base = url.to_owned();
        Backend {
            name,
            targets: vec![url_target(url, port).expect("the fixture's URL names its server")],
            url: Box::new(move |addrs, ttl| {
                let via = dlock_testkit::url_via(&base, addrs[0]).expect("a proxied URL");
                if session {
                    format!("{via}?session_timeout={ttl}")
                } else {
                    via
                }
            }),
        }
    }

    /// Servers named by `scheme://h1,h2,…` (Redlock's masters, a ZooKeeper ensemble, etcd
    /// members), with `query` after the hosts.
    pub(crate) fn hosts(
        name: &'static str,
        scheme: &'static str,
        hosts: &[String],
        query: fn(&str) -> String,
    ) -> Self {
        Backend {
            name,
            targets: hosts
                .iter()
                .map(|h| h.parse().expect("fixture hosts are ip:port"))
                .collect(),
            url: Box::new(move |addrs, ttl| {
                let hosts: Vec<String> = addrs.iter().map(SocketAddr::to_string).collect();
                format!("{scheme}://{}?{}", hosts.join(","), query(ttl))
            }),
        }
    }
}

/// A short outage that a renewal survives does not stop the command: the holder's link stalls
/// for a second (bytes held, as TCP holds them through a blip) while its command runs with a
/// lease of 4 s; the command runs to its end and `dlock run` exits with its status.
pub(crate) fn a_short_outage_does_not_stop_the_command(
    servers: &Servers,
    backend: &Backend,
) -> Result<(), Failed> {
    let ttl = "4s";
    let trial = format!("short-outage-{}", backend.name);
    let dir = scratch(&trial);
    let log = dir.join("log");
    let key = format!("cli-{trial}-{}", std::process::id());
    let proxies = servers.handle.block_on(async {
        let mut proxies = Vec::new();
        for target in &backend.targets {
            proxies.push(FreezeProxy::start(*target).await?);
        }
        Ok::<_, std::io::Error>(proxies)
    })?;
    let addrs: Vec<SocketAddr> = proxies.iter().map(FreezeProxy::addr).collect();
    let holder = spawn(&mut dlock_run(
        &(backend.url)(&addrs, ttl),
        &key,
        &["--ttl", ttl],
        &[
            "sh",
            "-c",
            &format!(
                "echo started >> {0}; sleep 5; echo done >> {0}",
                log.display()
            ),
        ],
    ))?;
    wait_for(&log, "started")?;
    std::thread::sleep(Duration::from_millis(500));
    proxies.iter().for_each(Freeze::freeze);
    std::thread::sleep(Duration::from_secs(1));
    proxies.iter().for_each(Freeze::thaw);
    let output = finish(holder)?;
    exits(&output, 0)?;
    ensure!(
        read(&log).contains("done"),
        "{}: the command did not run to its end: {:?}",
        backend.name,
        read(&log)
    );
    Ok(())
}

/// Who runs the holder's command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Runner {
    /// `dlock run`.
    Dlock,
    /// A runner that waits for the loss of the lease, then sends SIGTERM, and SIGKILL 10 s later.
    StopsOnLoss,
}

/// What one round saw, in nanoseconds of the machine's clock.
struct Round {
    /// The holder's command got SIGTERM at this instant.
    terminated: Option<u128>,
    /// The holder's command's last write.
    last_write: u128,
    /// The contender's command's first write, just after its grant.
    granted: u128,
}

/// The round on `backend` with a lease of `ttl`: the holder's last write comes before the
/// contender's grant.
pub(crate) fn dead_before_the_lock_passes(
    servers: &Servers,
    backend: &Backend,
    ttl: &str,
) -> Result<(), Failed> {
    let round = round(servers, backend, ttl, Runner::Dlock)?;
    ensure!(
        round.terminated.is_some(),
        "{}: the holder's command never got SIGTERM",
        backend.name
    );
    ensure!(
        round.last_write < round.granted,
        "{}, ttl {ttl}: the holder's command wrote {:.3} s after the contender was granted the lock",
        backend.name,
        (round.last_write - round.granted) as f64 / 1e9
    );
    println!(
        "[stop-in-time] {}, ttl {ttl}: the holder's last write {:.3} s before the contender's grant",
        backend.name,
        (round.granted - round.last_write) as f64 / 1e9
    );
    Ok(())
}

/// Teeth: a runner that stops the command only once the lease is lost lets it overlap the
/// contender, and the round's check sees it.
pub(crate) fn stopping_on_loss_is_caught(
    servers: &Servers,
    backend: &Backend,
    ttl: &str,
) -> Result<(), Failed> {
    let round = round(servers, backend, ttl, Runner::StopsOnLoss)?;
    ensure!(
        round.last_write > round.granted,
        "{}: a runner that stops the command only on loss was not caught (last write {} ns, \
         grant {} ns)",
        backend.name,
        round.last_write,
        round.granted
    );
    Ok(())
}

fn round(servers: &Servers, backend: &Backend, ttl: &str, runner: Runner) -> Result<Round, Failed> {
    let trial = format!("stop-in-time-{}-{ttl}-{runner:?}", backend.name);
    let dir = scratch(&trial);
    let (holder_log, contender_log) = (dir.join("holder"), dir.join("contender"));
    let key = format!("cli-{trial}-{}", std::process::id());
    let proxies = servers
        .handle
        .block_on(DroppingProxies::start(&backend.targets))?;
    let silent_url = (backend.url)(&proxies.addrs(), ttl);
    let direct_url = (backend.url)(&backend.targets, ttl);

    let script = job(&holder_log);
    let holder = match runner {
        Runner::Dlock => Holder::Dlock(spawn(&mut dlock_run(
            &silent_url,
            &key,
            &["--ttl", ttl],
            &["sh", "-c", &script],
        ))?),
        Runner::StopsOnLoss => Holder::Naive(naive_runner(servers, &silent_url, &key, ttl, script)),
    };
    wait_for(&holder_log, "started")?;
    proxies.freeze();
    let contender = spawn(&mut dlock_run(
        &direct_url,
        &key,
        &["--ttl", ttl, "--wait", "60s"],
        &[
            "sh",
            "-c",
            &format!("echo granted $(date +%s%N) >> {}", contender_log.display()),
        ],
    ))?;
    let contended = finish(contender)?;
    exits(&contended, 0)?;
    match holder {
        Holder::Dlock(child) => exits(&finish(child)?, 76)?,
        Holder::Naive(thread) => thread
            .join()
            .map_err(|_| Failed::from("the naive runner panicked"))??,
    }
    drop(proxies);

    let stamps = |log: &Path, tag: &str| -> Vec<u128> {
        read(log)
            .lines()
            .filter_map(|line| line.strip_prefix(tag)?.trim().parse().ok())
            .collect()
    };
    let last_write = stamps(&holder_log, "w ").into_iter().max();
    let granted = stamps(&contender_log, "granted ").into_iter().min();
    let (Some(last_write), Some(granted)) = (last_write, granted) else {
        return Err(format!(
            "{}: missing stamps: holder {:?}, contender {:?}",
            backend.name,
            read(&holder_log),
            read(&contender_log)
        )
        .into());
    };
    Ok(Round {
        terminated: stamps(&holder_log, "term ").into_iter().next(),
        last_write,
        granted,
    })
}

/// A job that writes a stamped line every 50 ms, and on SIGTERM keeps writing for 3 s before
/// it exits, as a real job finishing its work would.
fn job(log: &Path) -> String {
    let log = log.display();
    format!(
        "stamp() {{ date +%s%N; }}; \
         trap 'echo term $(stamp) >> {log}; end=$(( $(stamp) + {SHUTDOWN} )); \
               while [ $(stamp) -lt $end ]; do echo w $(stamp) >> {log}; sleep 0.05; done; exit 0' TERM; \
         echo started >> {log}; \
         while :; do echo w $(stamp) >> {log}; sleep 0.05; done"
    )
}

enum Holder {
    Dlock(std::process::Child),
    Naive(std::thread::JoinHandle<Result<(), Failed>>),
}

/// The broken runner of the teeth: holds the lock with auto-renew, runs `script`, and stops it
/// only when the lease is lost (SIGTERM to its group, SIGKILL 10 s later).
fn naive_runner(
    servers: &Servers,
    url: &str,
    key: &str,
    ttl: &str,
    script: String,
) -> std::thread::JoinHandle<Result<(), Failed>> {
    let handle = servers.handle.clone();
    let (url, key) = (url.to_owned(), key.to_owned());
    let ttl = dlock::parse_duration(ttl).expect("a duration");
    std::thread::spawn(move || {
        let (locks, lease) = handle.block_on(async {
            let locks = dlock::connect(&url).await?;
            let lease = locks
                .acquire(&key, &LockOptions::new(ttl).with_auto_renew())
                .await?;
            Ok::<_, dlock::Error>((locks, lease))
        })?;
        let mut child = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        let group = Pid::from_raw(-i32::try_from(child.id()).expect("a pid"));
        handle.block_on(lease.lost());
        let _ = kill(group, Signal::SIGTERM);
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while child.try_wait()?.is_none() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = kill(group, Signal::SIGKILL);
        let _ = child.wait();
        drop(lease);
        drop(locks);
        Ok(())
    })
}
