//! `dlock run`: hold a lock (or a semaphore permit, or one side of a read-write lock) for as
//! long as a command runs, and stop the command if the lease is lost.
//!
//! The command's supervision — spawning it with its token, passing on signals, stopping it when
//! the lease is lost — is shared with `dlock elect`.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use dlock::{DistributedLockExt, Error, Lease, LockOptions, Locks, LostReason};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::args::RunArgs;
use crate::exit::{self, Failure};

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

    let lease = match signals
        .unless_stopped(take(&locks, key, hold, &options))
        .await?
    {
        Ok(lease) => lease,
        Err(code) => return Ok(code),
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
    let ended = supervise(&mut child, lease.lost(), &mut signals, args.grace, &what).await;
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

/// Starts `command` with `env` added; a command that cannot start is its failure (126 or 127).
pub(crate) fn spawn(command: &[OsString], env: &[(&str, &str)]) -> Result<Child, Failure> {
    let Some((program, args)) = command.split_first() else {
        return Err(Failure::new(exit::USAGE, "no command to run"));
    };
    Command::new(program)
        .args(args)
        .envs(env.iter().copied())
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
    /// The lease was lost first; the command was stopped.
    Lost,
}

impl Ended {
    /// dlock's exit code: the command's, or 76 when the lease was lost.
    pub(crate) fn code(self) -> Result<u8, Failure> {
        match self {
            Ended::Exited(status) => status.map(code_of).map_err(|e| {
                Failure::new(exit::UNAVAILABLE, format!("lost track of the command: {e}"))
            }),
            Ended::Lost => Ok(exit::LOST),
        }
    }
}

/// Waits for `child`, passing SIGINT and SIGTERM on to it; if `lost` completes first, says so
/// (naming `what`, e.g. `the lease on "k"`) and stops the command: SIGTERM, then SIGKILL after
/// `grace`.
pub(crate) async fn supervise(
    child: &mut Child,
    lost: impl Future<Output = LostReason>,
    signals: &mut Signals,
    grace: Duration,
    what: &str,
) -> Ended {
    tokio::pin!(lost);
    loop {
        tokio::select! {
            status = child.wait() => return Ended::Exited(status),
            signal = signals.next() => forward(child, signal),
            reason = &mut lost => {
                eprintln!("dlock: {what} is lost ({reason}); stopping the command");
                stop(child, grace).await;
                return Ended::Lost;
            }
        }
    }
}

/// Sends `signal` to the child, if it is still running.
fn forward(child: &Child, signal: Signal) {
    if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
        // The child may have exited a moment ago; then there is nobody left to tell.
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

/// SIGTERM, then SIGKILL if the child has not exited after `grace`.
async fn stop(child: &mut Child, grace: Duration) {
    forward(child, Signal::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        eprintln!(
            "dlock: the command did not exit within {} of SIGTERM; sending SIGKILL",
            humantime::format_duration(grace)
        );
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
