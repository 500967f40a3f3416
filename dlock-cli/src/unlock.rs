//! `dlock unlock --force`: evict a stuck holder, after showing who it is.
//!
//! The eviction names the holder's fencing token as shown, so a lock that changed hands between
//! the showing and the confirmation is left alone. The next holder gets a greater token, so a
//! resource behind a fence rejects the evicted holder's late writes.

use std::io::{BufRead, Write};

use dlock::{Eviction, Holding};

use crate::args::UnlockArgs;
use crate::exit::{self, Failure};
use crate::view::held_lines;

/// Shows the holder, asks (unless `--yes`), evicts; returns the exit code that says what
/// happened.
pub async fn unlock(args: UnlockArgs, trace: bool) -> Result<u8, Failure> {
    let locks = crate::connect(&args.target.url, trace).await?;
    let key = args.target.key.as_str();
    let holder = match locks.holding(key).await? {
        Holding::Held(holder) => holder,
        Holding::Free => {
            println!("{key}: free; nothing to unlock");
            return Ok(exit::FREE);
        }
        _ => {
            println!("{key}: unknown (the servers disagree on who holds it); nothing changed");
            return Ok(exit::UNKNOWN);
        }
    };
    for line in held_lines(key, &holder) {
        println!("{line}");
    }
    if !args.yes && !confirmed(key)? {
        println!("{key}: not confirmed; nothing changed");
        return Ok(exit::NOT_CONFIRMED);
    }
    match locks.admin().force_unlock(key, holder.fencing).await? {
        Eviction::Evicted(_) => {
            println!("{key}: evicted; the next holder gets a greater fencing token");
            Ok(exit::FREE)
        }
        Eviction::Free => {
            println!("{key}: the holder left before the eviction; nothing changed");
            Ok(exit::FREE)
        }
        Eviction::Changed(now) => {
            println!("{key}: changed hands since it was shown; nothing changed");
            for line in held_lines(key, &now) {
                println!("{line}");
            }
            Ok(exit::BUSY)
        }
        _ => Ok(exit::UNKNOWN),
    }
}

/// Asks on standard error and reads one answer from standard input; only `y` or `yes` confirm
/// (an empty answer or the end of input does not).
fn confirmed(key: &str) -> Result<bool, Failure> {
    eprint!("Evict this holder of {key}? Its lease turns lost and its fenced writes are rejected. [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Failure::new(exit::USAGE, format!("cannot read the confirmation: {e}")))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES"))
}
