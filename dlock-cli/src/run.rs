//! `dlock run`: hold a lock for as long as a command runs, and stop the command if the lock is
//! lost.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use dlock::{DistributedLockExt, Error, Lease, Locks};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::args::RunArgs;
use crate::exit::{self, Failure};

/// How long an interrupted wait lets the background clean-up of the dropped acquire run.
const CLEANUP_GRACE: Duration = Duration::from_secs(1);

/// Runs `args.command` under the lock and returns the exit code.
pub async fn run(args: RunArgs, trace: bool) -> Result<u8, Failure> {
    // Installed first, so that a SIGINT or SIGTERM while waiting for the lock ends the wait
    // cleanly (and releases whatever was granted) instead of killing dlock on the spot.
    let mut interrupt = listen(SignalKind::interrupt())?;
    let mut terminate = listen(SignalKind::terminate())?;

    let key = args.target.key.as_str();
    let locks = crate::connect(&args.target.url, trace).await?;
    let mut options = locks.options().clone();
    if let Some(ttl) = args.ttl {
        options.ttl = ttl;
    }
    if let Some(wait) = args.wait {
        options.wait = Some(wait);
    }
    let options = options.with_auto_renew();

    let waited = tokio::select! {
        lease = take(&locks, key, &options) => Waited::Held(Box::new(lease?)),
        _ = interrupt.recv() => Waited::Interrupted(Signal::SIGINT),
        _ = terminate.recv() => Waited::Interrupted(Signal::SIGTERM),
    };
    let lease = match waited {
        Waited::Held(lease) => *lease,
        Waited::Interrupted(signal) => {
            // The acquire was dropped: its clean-up (dlock-core's and the backend's) withdraws
            // whatever it had queued or been granted, in the background. Give that a moment before the process ends, so the
            // lock is not left to its TTL or session timeout.
            tokio::time::sleep(CLEANUP_GRACE).await;
            return Ok(128 + signal as u8);
        }
    };

    let mut child = match Command::new(&args.command[0])
        .args(&args.command[1..])
        .env("DLOCK_FENCING_TOKEN", lease.fencing_token().to_string())
        .env("DLOCK_KEY", key)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            release(lease).await;
            let code = if e.kind() == io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
            let shown = args.command[0].to_string_lossy();
            return Err(Failure::new(code, format!("cannot run {shown:?}: {e}")));
        }
    };

    let lost = lease.lost();
    tokio::pin!(lost);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            _ = interrupt.recv() => forward(&child, Signal::SIGINT),
            _ = terminate.recv() => forward(&child, Signal::SIGTERM),
            reason = &mut lost => {
                eprintln!(
                    "dlock: the lease on {key:?} is lost ({reason}); stopping the command"
                );
                stop(&mut child, args.grace).await;
                release(lease).await;
                return Ok(exit::LOST);
            }
        }
    };
    release(lease).await;
    let status = status
        .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("lost track of the command: {e}")))?;
    Ok(code_of(status))
}

/// How waiting for the lock ended.
enum Waited {
    /// The lock is ours.
    Held(Box<Lease>),
    /// dlock was told to stop first.
    Interrupted(Signal),
}

/// Takes the lock: once for `--wait 0`, otherwise waiting as the options say. A lock still busy
/// at the end is the busy failure, without running anything.
async fn take(locks: &Locks, key: &str, options: &dlock::LockOptions) -> Result<Lease, Failure> {
    let busy = || Failure::new(exit::BUSY, format!("the lock {key:?} is busy"));
    if options.wait == Some(Duration::ZERO) {
        return locks.try_acquire(key, options).await?.ok_or_else(busy);
    }
    match locks.acquire(key, options).await {
        Ok(lease) => Ok(lease),
        Err(Error::Timeout { waited, .. }) => Err(Failure::new(
            exit::BUSY,
            format!(
                "the lock {key:?} is busy (waited {})",
                humantime::format_duration(waited)
            ),
        )),
        Err(e) => Err(e.into()),
    }
}

fn listen(kind: SignalKind) -> Result<tokio::signal::unix::Signal, Failure> {
    signal(kind)
        .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("cannot listen for signals: {e}")))
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

/// Releases the lease, reporting (not failing on) a release that did not free the lock: the
/// command's outcome is what the caller asked for.
async fn release(lease: Lease) {
    let key = lease.key().to_owned();
    match lease.release().await {
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
