//! `dlock leader`: who leads an election, read without campaigning; with `--watch`, each new
//! leader as it takes over.

use std::io::Write;
use std::pin::pin;

use futures::StreamExt;
use nix::sys::signal::Signal;

use crate::args::LeaderArgs;
use crate::exit::{self, Failure};
use crate::run::Signals;
use crate::view::LeaderView;

/// Prints the election's leader (or, with `--watch`, each leader) and returns the exit code.
pub async fn leader(args: LeaderArgs, trace: bool) -> Result<u8, Failure> {
    // A watch ends with SIGINT or SIGTERM, caught from before connecting, like `run`'s; a
    // single look leaves them to end dlock as usual.
    let mut signals = if args.watch {
        Some(Signals::listen()?)
    } else {
        None
    };
    let key = args.target.key.as_str();
    let locks = crate::connect(&args.target.url, trace).await?;
    let election = locks.election(key)?;
    // A reader that went away (`dlock leader --watch | head -1`) ends the watch as SIGPIPE would,
    // rather than a panic of println!.
    let show = |leader: Option<&dlock::Leader>| -> Result<(), u8> {
        let view = LeaderView::new(key, leader);
        let line = if args.json { view.json() } else { view.line() };
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .map_err(|_| exit::signalled(Signal::SIGPIPE))
    };
    let Some(signals) = signals.as_mut() else {
        let leader = election.leader().await?;
        if let Err(code) = show(leader.as_ref()) {
            return Ok(code);
        }
        return Ok(if leader.is_some() {
            exit::BUSY
        } else {
            exit::FREE
        });
    };
    let mut changes = pin!(election.observe());
    loop {
        tokio::select! {
            change = changes.next() => match change {
                Some(Ok(leader)) => {
                    if let Err(code) = show(Some(&leader)) {
                        return Ok(code);
                    }
                }
                Some(Err(e)) => return Err(e.into()),
                // The stream ends only after an error, which it returned first.
                None => return Ok(exit::UNAVAILABLE),
            },
            signal = signals.next() => return Ok(exit::signalled(signal)),
        }
    }
}
