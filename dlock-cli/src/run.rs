//! `dlock run`: hold a lock (or a semaphore permit, or one side of a read-write lock) for as
//! long as a command runs, and stop the command before the lease can pass to another client.
//!
//! The command's supervision — spawning it with its token, passing on signals, stopping it in
//! time (see [`grace`]) — is shared with `dlock elect`.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use dlock::{Error, Expiring, Lease, LeaseWatch, LockOptions, Locks};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

use crate::args::RunArgs;
use crate::exit::{self, Failure};
use crate::grace::{self, KILL_MARGIN};

/// How long an interrupted wait lets the background clean-up of the dropped acquire run.
const CLEANUP_GRACE: Duration = Duration::from_secs(1);

/// What `run` holds while the command runs.
#[derive(Debug, Clone, Copy)]
enum Hold {
    /// The lock KEY.
    Lock,
    /// One of the N permits of the semaphore KEY.
    Permit(u32),
    /// The read side of the read-write lock KEY.
    Read,
    /// The write side of the read-write lock KEY.
    Write,
}

impl Hold {
    fn of(args: &RunArgs) -> Self {
        match (args.permits, args.read, args.write) {
            (Some(permits), _, _) => Hold::Permit(permits),
            (None, true, _) => Hold::Read,
            (None, false, true) => Hold::Write,
            (None, false, false) => Hold::Lock,
        }
    }

    /// What is busy, for the message of exit 75.
    fn describe(self, key: &str) -> String {
        match self {
            Hold::Lock => format!("the lock {key:?}"),
            Hold::Permit(permits) => format!("the semaphore {key:?} ({permits} permits)"),
            Hold::Read => format!("the read-write lock {key:?} (to read)"),
            Hold::Write => format!("the read-write lock {key:?} (to write)"),
        }
    }
}

/// Runs `args.command` under the lock and returns the exit code.
pub async fn run(args: RunArgs, trace: bool) -> Result<u8, Failure> {
    // Installed first, so that a SIGINT or SIGTERM while waiting for the lock ends the wait
    // cleanly (and releases whatever was granted) instead of killing dlock on the spot.
    let mut signals = Signals::listen()?;

    let key = args.target.key.as_str();
    let hold = Hold::of(&args);
    let locks = crate::connect(&args.target.url, trace).await?;
    let options = options(&locks, args.ttl, args.wait);
    let grace = grace::for_ttl(args.grace, options.ttl)?;

    let lease = match signals
        .unless_stopped(take(&locks, key, hold, &options))
        .await?
    {
        Ok(lease) => lease,
        Err(code) => return Ok(code),
    };
    let grace = match grace::fit(grace, args.grace.is_some(), lease.remaining()) {
        Ok(grace) => grace,
        Err(failure) => {
            report_release(key, lease.release().await);
            return Err(failure);
        }
    };
    let token = lease.fencing_token().to_string();
    let mut child = match spawn(
        &args.command,
        &[("DLOCK_FENCING_TOKEN", &token), ("DLOCK_KEY", key)],
    ) {
        Ok(child) => child,
        Err(failure) => {
            report_release(key, lease.release().await);
            return Err(failure);
        }
    };
    let what = format!("the lease on {key:?}");
    let ended = supervise(&mut child, &lease.watch(), &mut signals, grace, &what).await;
    report_release(key, lease.release().await);
    ended.code()
}

/// The URL's defaults with `--ttl` and `--wait` over them, renewed while the command runs.
pub(crate) fn options(locks: &Locks, ttl: Option<Duration>, wait: Option<Duration>) -> LockOptions {
    let mut options = locks.options().clone();
    if let Some(ttl) = ttl {
        options.ttl = ttl;
    }
    if let Some(wait) = wait {
        options.wait = Some(wait);
    }
    options.with_auto_renew()
}

/// Takes what `hold` names: once for `--wait 0`, otherwise waiting as the options say. Still
/// busy at the end is the busy failure, without running anything.
async fn take(
    locks: &Locks,
    key: &str,
    hold: Hold,
    options: &LockOptions,
) -> Result<Lease, Failure> {
    let once = options.wait == Some(Duration::ZERO);
    let taken = match hold {
        Hold::Lock if once => locks.try_acquire(key, options).await,
        Hold::Lock => locks.acquire(key, options).await.map(Some),
        Hold::Permit(permits) => {
            let semaphore = locks.semaphore(key, permits)?;
            if once {
                semaphore.try_acquire(options).await
            } else {
                semaphore.acquire(options).await.map(Some)
            }
        }
        Hold::Read | Hold::Write => {
            let rw = locks.rw(key)?;
            match (hold, once) {
                (Hold::Read, true) => rw.try_read(options).await,
                (Hold::Read, false) => rw.read(options).await.map(Some),
                (_, true) => rw.try_write(options).await,
                (_, false) => rw.write(options).await.map(Some),
            }
        }
    };
    busy_unless_taken(taken, || format!("{} is busy", hold.describe(key)))
}

/// A taken lease, or the busy failure (exit 75, saying `busy`) for a busy answer or a wait that
/// ran out.
pub(crate) fn busy_unless_taken<T>(
    taken: dlock::Result<Option<T>>,
    busy: impl FnOnce() -> String,
) -> Result<T, Failure> {
    match taken {
        Ok(Some(taken)) => Ok(taken),
        Ok(None) => Err(Failure::new(exit::BUSY, busy())),
        Err(Error::Timeout { waited, .. }) => Err(Failure::new(
            exit::BUSY,
            format!("{} (waited {})", busy(), humantime::format_duration(waited)),
        )),
        Err(e) => Err(e.into()),
    }
}

/// SIGINT and SIGTERM, caught from before the wait for the lock until dlock exits.
pub(crate) struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    /// Catches SIGINT and SIGTERM from now on.
    pub(crate) fn listen() -> Result<Self, Failure> {
        Ok(Signals {
            interrupt: listen(SignalKind::interrupt())?,
            terminate: listen(SignalKind::terminate())?,
        })
    }

    /// The next SIGINT or SIGTERM.
    pub(crate) async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.interrupt.recv() => Signal::SIGINT,
            _ = self.terminate.recv() => Signal::SIGTERM,
        }
    }

    /// Waits for `taking` unless a signal comes first: then `taking` is dropped, its clean-up
    /// (dlock-core's and the backend's) withdraws in the background whatever it had queued or
    /// been granted, and dlock gives that a moment before answering the exit code of the
    /// signal, so that nothing is left to its TTL or session timeout.
    pub(crate) async fn unless_stopped<T>(
        &mut self,
        taking: impl Future<Output = Result<T, Failure>>,
    ) -> Result<Result<T, u8>, Failure> {
        let signal = tokio::select! {
            taken = taking => return taken.map(Ok),
            signal = self.next() => signal,
        };
        tokio::time::sleep(CLEANUP_GRACE).await;
        Ok(Err(exit::signalled(signal)))
    }
}

fn listen(kind: SignalKind) -> Result<tokio::signal::unix::Signal, Failure> {
    signal(kind)
        .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("cannot listen for signals: {e}")))
}

/// Starts `command` with `env` added, in a process group of its own, so that stopping it stops
/// whatever it started too; a command that cannot start is its failure (126 or 127).
pub(crate) fn spawn(command: &[OsString], env: &[(&str, &str)]) -> Result<Child, Failure> {
    let Some((program, args)) = command.split_first() else {
        return Err(Failure::new(exit::USAGE, "no command to run"));
    };
    Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .process_group(0)
        .spawn()
        .map_err(|e| {
            let code = if e.kind() == io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
            let shown = program.to_string_lossy();
            Failure::new(code, format!("cannot run {shown:?}: {e}"))
        })
}

/// How a supervised command ended.
pub(crate) enum Ended {
    /// It exited by itself (or of a signal passed on to it).
    Exited(io::Result<ExitStatus>),
    /// The lease was lost, or could not be confirmed in time; the command was stopped.
    Stopped,
}

impl Ended {
    /// dlock's exit code: the command's, or 76 when it was stopped for its lease.
    pub(crate) fn code(self) -> Result<u8, Failure> {
        match self {
            Ended::Exited(status) => status.map(code_of).map_err(|e| {
                Failure::new(exit::UNAVAILABLE, format!("lost track of the command: {e}"))
            }),
            Ended::Stopped => Ok(exit::LOST),
        }
    }
}

/// Waits for `child`, passing SIGINT and SIGTERM on to it, while `lease` stays valid for more
/// than `grace`. When no renewal has confirmed the lease `grace` before its validity deadline,
/// or the lease is lost, says so (naming `what`, e.g. `the lease on "k"`) and stops the command
/// before the lease can pass: SIGTERM now, SIGKILL [`KILL_MARGIN`] before the deadline (or
/// `grace` after SIGTERM, if that comes first: a lease taken over early keeps its deadline).
pub(crate) async fn supervise(
    child: &mut Child,
    lease: &LeaseWatch,
    signals: &mut Signals,
    grace: Duration,
    what: &str,
) -> Ended {
    loop {
        tokio::select! {
            status = child.wait() => return Ended::Exited(status),
            signal = signals.next() => forward(child, signal),
            end = lease.expiring(grace) => {
                let until = match end {
                    Expiring::Lost(reason) => {
                        eprintln!("dlock: {what} is lost ({reason}); stopping the command");
                        lease.valid_until()
                    }
                    Expiring::Soon { until } => {
                        let left = until.saturating_duration_since(Instant::now());
                        eprintln!(
                            "dlock: {what} could not be renewed and is valid for {} more; \
                             stopping the command before it can pass",
                            grace::show(left)
                        );
                        until
                    }
                    _ => lease.valid_until(),
                };
                let kill_at = (Instant::now() + grace)
                    .min(until.checked_sub(KILL_MARGIN).unwrap_or(until));
                stop(child, kill_at).await;
                return Ended::Stopped;
            }
        }
    }
}

/// Sends `signal` to the child's process group (the command and whatever it started), if the
/// child is still running.
fn forward(child: &Child, signal: Signal) {
    if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
        // The child may have exited a moment ago; then there is nobody left to tell.
        let _ = kill(Pid::from_raw(-pid), signal);
    }
}

/// SIGTERM, then SIGKILL if the child has not exited by `kill_at`.
async fn stop(child: &mut Child, kill_at: Instant) {
    let sent = Instant::now();
    forward(child, Signal::SIGTERM);
    if tokio::time::timeout_at(kill_at, child.wait())
        .await
        .is_err()
    {
        eprintln!(
            "dlock: the command did not exit within {} of SIGTERM, and the lease could pass; \
             sending SIGKILL",
            grace::show(sent.elapsed())
        );
        forward(child, Signal::SIGKILL);
        // The command itself too, should it have left its group.
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}

/// Reports (does not fail on) a release that did not free the lock: the command's outcome is
/// what the caller asked for.
pub(crate) fn report_release(key: &str, released: dlock::Result<dlock::Released>) {
    match released {
        Ok(dlock::Released::Released) => {}
        Ok(other) => eprintln!("dlock: releasing {key:?} found it {other:?}"),
        Err(e) => eprintln!("{}", Failure::from(e)),
    }
}

/// The shell's convention: the exit status, or 128 + the signal that ended the command.
fn code_of(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => u8::try_from((128 + signal) & 0xff).unwrap_or(1),
        (None, None) => 1,
    }
}
