//! `dlock leader`: who leads an election, read without campaigning; with `--watch`, each new
//! leader as it takes over.

use std::pin::pin;

use futures::StreamExt;

use crate::args::LeaderArgs;
use crate::exit::{self, Failure};
use crate::run::Signals;
use crate::view::LeaderView;

/// Prints the election's leader (or, with `--watch`, each leader) and returns the exit code.
pub async fn leader(args: LeaderArgs, trace: bool) -> Result<u8, Failure> {
    // A watch ends with SIGINT or SIGTERM; installed before connecting, like `run`'s.
    let mut signals = Signals::listen()?;
    let key = args.target.key.as_str();
    let locks = crate::connect(&args.target.url, trace).await?;
    let election = locks.election(key)?;
    let show = |leader: Option<&dlock::Leader>| {
        let view = LeaderView::new(key, leader);
        println!("{}", if args.json { view.json() } else { view.line() });
    };
    if !args.watch {
        let leader = election.leader().await?;
        show(leader.as_ref());
        return Ok(if leader.is_some() {
            exit::BUSY
        } else {
            exit::FREE
        });
    }
    let mut changes = pin!(election.observe());
    loop {
        tokio::select! {
            change = changes.next() => match change {
                Some(Ok(leader)) => show(Some(&leader)),
                Some(Err(e)) => return Err(e.into()),
                // The stream ends only after an error, which it returned first.
                None => return Ok(exit::UNAVAILABLE),
            },
            signal = signals.next() => return Ok(exit::signalled(signal)),
        }
    }
}
