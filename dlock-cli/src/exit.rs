//! The exit codes of `dlock`, and the one-line failures that carry them.
//!
//! The codes follow sysexits(3) where one fits, so that `dlock run` drops into scripts written
//! for `flock -E 75`, and the shell's conventions for commands that cannot run or die by signal.

use std::fmt;

use dlock::Error;

/// The help text's table of exit codes (also in `dlock-cli/README.md`).
pub const TABLE: &str = "\
Exit codes:
  (child's)  run, elect: the command's own exit status; 128+N if it died of
             signal N
  0          status: the lock is free; leader: nobody leads; list: listed;
             unlock: evicted, or free
  1          unlock: not confirmed, nothing changed
  3          status: the backend cannot tell without taking the lock, or its
             servers disagree
  64         usage: bad arguments, URL, parameter or duration; run --permits:
             another N than the semaphore's holders use (EX_USAGE)
  69         the lock service is unavailable, failed, or does not serve the
             primitive asked for (EX_UNAVAILABLE)
  75         run: the lock is busy (every permit held, a writer or readers in
             the way) and the wait ended, the command did not run;
             elect: another candidate leads and the wait ended, the command
             did not run; status: the lock is held; leader: someone leads
             (EX_TEMPFAIL, as with flock -E 75); unlock: the lock changed
             hands since it was shown, nothing changed
  76         run: the lease was lost, or could not be renewed in time, while
             the command ran; elect: the same for the leadership; the
             command was stopped before the lock could pass (SIGTERM
             --grace before the lease ends, SIGKILL just before)
  126        run, elect: the command could not be executed
  127        run, elect: the command was not found
  128+N      run, elect: dlock got signal N while waiting (nothing ran);
             leader --watch: ended by signal N; leader: 141 (as SIGPIPE)
             when its output cannot be written";

/// `status`: the lock is free; `leader`: nobody leads.
pub const FREE: u8 = 0;
/// `unlock`: the eviction was not confirmed; nothing changed.
pub const NOT_CONFIRMED: u8 = 1;
/// `status`: the backend cannot look at a lock without taking it, or its servers disagree.
pub const UNKNOWN: u8 = 3;
/// Bad arguments, URL, query parameter or duration (EX_USAGE).
pub const USAGE: u8 = 64;
/// The lock service could not be reached or failed (EX_UNAVAILABLE).
pub const UNAVAILABLE: u8 = 69;
/// The lock is busy: `run` or `elect` gave up waiting, `status` found it held, `leader` found a
/// leader (EX_TEMPFAIL).
pub const BUSY: u8 = 75;
/// `run`, `elect`: the lease or leadership was lost while the command ran, and the command was
/// stopped.
pub const LOST: u8 = 76;
/// `run`, `elect`: the command exists but could not be executed.
pub const CANNOT_EXECUTE: u8 = 126;
/// `run`, `elect`: the command was not found.
pub const NOT_FOUND: u8 = 127;

/// The shell's convention for a process ended by `signal`: 128 + its number.
pub fn signalled(signal: nix::sys::signal::Signal) -> u8 {
    128 + signal as u8
}

/// Why `dlock` stops early: an exit code and a message for one line of standard error.
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub code: u8,
    message: String,
}

impl Failure {
    /// A failure with `code` and `message`.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        let code = match &error {
            Error::InvalidInput { .. } | Error::Mismatch { .. } => USAGE,
            Error::Timeout { .. } => BUSY,
            _ => UNAVAILABLE,
        };
        Failure::new(code, error.to_string())
    }
}

impl fmt::Display for Failure {
    /// One line, whatever the underlying error's text holds.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let one_line: Vec<&str> = self.message.split_whitespace().collect();
        write!(f, "dlock: {}", one_line.join(" "))
    }
}
