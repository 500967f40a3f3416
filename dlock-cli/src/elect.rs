//! `dlock elect`: campaign in an election, run a command while leading, resign when it ends,
//! and stop the command if the leadership is lost.

use std::time::Duration;

use dlock::{Leadership, Locks};

use crate::args::ElectArgs;
use crate::exit::Failure;
use crate::grace;
use crate::run::{busy_unless_taken, options, report_release, spawn, supervise, Signals};

/// Campaigns, runs `args.command` while leading, resigns; returns the exit code.
pub async fn elect(args: ElectArgs, trace: bool) -> Result<u8, Failure> {
    // As for `run`: a signal while campaigning ends the campaign cleanly.
    let mut signals = Signals::listen()?;

    let key = args.target.key.as_str();
    // Checked before connecting, so a bad value is a usage error whatever the server does.
    dlock::core::backend::check_value(&args.value)?;
    let locks = crate::connect(&args.target.url, trace).await?;
    let options = options(&locks, args.ttl, args.wait);
    let grace = grace::for_ttl(args.grace, options.ttl)?;

    let campaign = campaign(&locks, key, &args.value, &options);
    let leadership = match signals.unless_stopped(campaign).await? {
        Ok(leadership) => leadership,
        Err(code) => return Ok(code),
    };
    let grace = match grace::fit(grace, args.grace.is_some(), leadership.lease().remaining()) {
        Ok(grace) => grace,
        Err(failure) => {
            report_release(key, leadership.resign().await);
            return Err(failure);
        }
    };
    let term = leadership.term().to_string();
    let env = [("DLOCK_FENCING_TOKEN", term.as_str()), ("DLOCK_KEY", key)];
    let mut child = match spawn(&args.command, &env) {
        Ok(child) => child,
        Err(failure) => {
            report_release(key, leadership.resign().await);
            return Err(failure);
        }
    };
    let what = format!("the leadership of {key:?}");
    let ended = supervise(&mut child, &leadership.watch(), &mut signals, grace, &what).await;
    report_release(key, leadership.resign().await);
    ended.code()
}

/// Leads `key`: at once or not at all for `--wait 0`, otherwise waiting as the options say.
/// Another leader still there at the end is the busy failure, without running anything.
async fn campaign(
    locks: &Locks,
    key: &str,
    value: &str,
    options: &dlock::LockOptions,
) -> Result<Leadership, Failure> {
    let election = locks.election(key)?;
    let won = if options.wait == Some(Duration::ZERO) {
        election.try_campaign(value, options).await
    } else {
        election.campaign(value, options).await.map(Some)
    };
    busy_unless_taken(won, || format!("another candidate leads {key:?}"))
}
