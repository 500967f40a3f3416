//! `--grace`: how long before the lease's validity deadline a command that `run` or `elect`
//! supervises is asked to stop, when no renewal has confirmed the lease by then.
//!
//! The grace comes out of the lease, not after it: the command gets SIGTERM `grace` before the
//! deadline and SIGKILL [`KILL_MARGIN`] before it, so it is dead before another client can be
//! granted the lock, whatever its shutdown takes. A renewal lands every third of the TTL and
//! moves the deadline out again, so a holder whose renewals succeed never comes within the grace;
//! one that cannot renew (a silent link, a server gone) is stopped in time.

use std::time::Duration;

use crate::exit::{self, Failure};

/// How long before the validity deadline a command still running after SIGTERM gets SIGKILL:
/// room for the signal to land and for a timer that fires late on a loaded machine. The deadline
/// itself is already conservative: measured from before the granting request or the renewal was
/// sent, less the drift allowance.
pub(crate) const KILL_MARGIN: Duration = Duration::from_millis(250);

/// The longest default grace: a job that needs more says so with `--grace`.
const MAX_DEFAULT: Duration = Duration::from_secs(10);

/// The grace for a lease of `ttl`: `explicit` if it fits, else a third of the TTL, at most 10 s.
///
/// An explicit grace over half the TTL is a usage error: the first renewal, a third of the TTL
/// in, must have time to land before the stop would begin, or every command would be stopped.
pub(crate) fn for_ttl(explicit: Option<Duration>, ttl: Duration) -> Result<Duration, Failure> {
    match explicit {
        Some(grace) if grace > ttl / 2 => Err(Failure::new(
            exit::USAGE,
            format!(
                "--grace {} does not fit in --ttl {}: the command is stopped before the lease can \
                 pass, so the grace may be at most half the TTL ({})",
                show(grace),
                show(ttl),
                show(ttl / 2)
            ),
        )),
        Some(grace) => Ok(grace),
        None => Ok((ttl / 3).min(MAX_DEFAULT)),
    }
}

/// Checks `grace` against the validity the lease had when it was granted, `window`: a lease in a
/// session (ZooKeeper, etcd, PostgreSQL) can be bounded by the session's timeout rather than the
/// TTL. A grace of two thirds of the window or more would stop the command before the first
/// keep-alive could confirm the lease. A default grace shrinks to a third of the window; an
/// explicit one that does not fit is a usage error.
pub(crate) fn fit(grace: Duration, explicit: bool, window: Duration) -> Result<Duration, Failure> {
    if grace < window * 2 / 3 {
        return Ok(grace);
    }
    if !explicit {
        return Ok(window / 3);
    }
    Err(Failure::new(
        exit::USAGE,
        format!(
            "--grace {} does not fit in the lease's validity of {} (its session bounds it below \
             the TTL): the grace must be under two thirds of it",
            show(grace),
            show(window)
        ),
    ))
}

/// A duration as the command line writes it, rounded to milliseconds.
pub(crate) fn show(duration: Duration) -> humantime::FormattedDuration {
    let millis = Duration::from_millis(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX));
    humantime::format_duration(millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn the_default_is_a_third_of_the_ttl_at_most_ten_seconds() {
        assert_eq!(for_ttl(None, 3 * S).unwrap(), S);
        assert_eq!(for_ttl(None, 30 * S).unwrap(), 10 * S);
        assert_eq!(for_ttl(None, 600 * S).unwrap(), 10 * S);
    }

    #[test]
    fn an_explicit_grace_fits_in_half_the_ttl() {
        assert_eq!(for_ttl(Some(2 * S), 4 * S).unwrap(), 2 * S);
        let failure = for_ttl(Some(3 * S), 4 * S).unwrap_err();
        assert_eq!(failure.code, exit::USAGE);
        assert_eq!(
            failure.to_string(),
            "dlock: --grace 3s does not fit in --ttl 4s: the command is stopped before the lease \
             can pass, so the grace may be at most half the TTL (2s)"
        );
    }

    #[test]
    fn a_session_shorter_than_the_ttl_shrinks_the_default_and_refuses_an_explicit_grace() {
        let window = 3 * S;
        assert_eq!(fit(S, false, window).unwrap(), S);
        assert_eq!(fit(10 * S, false, window).unwrap(), S);
        assert_eq!(fit(S, true, window).unwrap(), S);
        let failure = fit(2 * S, true, window).unwrap_err();
        assert_eq!(failure.code, exit::USAGE);
        assert!(
            failure.to_string().contains("--grace 2s") && failure.to_string().contains("3s"),
            "{failure}"
        );
    }
}
