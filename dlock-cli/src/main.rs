//! `dlock`: run a command while holding a distributed lock (or a semaphore permit, or one side
//! of a read-write lock), run one while leading an election, show who holds a lock or leads an
//! election, list the held locks, or evict a stuck holder.
//!
//! ```sh
//! dlock run --url redis://localhost:6379 --key nightly-report --ttl 30s --wait 0 -- ./report.sh
//! dlock run --url redis://localhost:6379 --key crawlers --permits 4 -- ./crawl.sh
//! dlock run --url redis://localhost:6379 --key config --read -- ./render.sh
//! dlock elect --url redis://localhost:6379 --key scheduler --value "$HOSTNAME" -- ./schedule.sh
//! dlock leader --url redis://localhost:6379 --key scheduler [--watch] [--json]
//! dlock status --url redis://localhost:6379 --key nightly-report [--json]
//! dlock list --url redis://localhost:6379 [PREFIX] [--json]
//! dlock unlock --force --url redis://localhost:6379 --key nightly-report [--yes]
//! ```
//!
//! See `dlock --help` for the commands and the exit codes; the lock service is named by a URL as
//! for `dlock::connect`, also taken from `DLOCK_URL`.

mod args;
mod elect;
mod exit;
mod grace;
mod leader;
mod list;
mod run;
mod status;
mod unlock;
mod view;

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::Parser;

use crate::args::{Cli, Command};
use crate::exit::Failure;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(usage(&e)),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("dlock: cannot start: {e}");
            return ExitCode::from(exit::UNAVAILABLE);
        }
    };
    log_to_stderr(cli.trace);
    let trace = cli.trace;
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(args, trace).await,
            Command::Elect(args) => elect::elect(args, trace).await,
            Command::Leader(args) => leader::leader(args, trace).await,
            Command::Status(args) => status::status(args, trace).await,
            Command::List(args) => list::list(args, trace).await,
            Command::Unlock(args) => unlock::unlock(args, trace).await,
        }
    });
    ExitCode::from(outcome.unwrap_or_else(|failure: Failure| {
        eprintln!("{failure}");
        failure.code
    }))
}

/// Connects to `url`, inside the tracing layer with `--trace`.
async fn connect(url: &str, trace: bool) -> dlock::Result<dlock::Locks> {
    let builder = dlock::builder(url);
    if trace {
        builder.with_tracing().connect().await
    } else {
        builder.connect().await
    }
}

/// dlock's own events on standard error (the command's own output stays on standard output): at
/// INFO (an eviction, a Sentinel failover, a Redlock master held back after a restart), or at
/// DEBUG with `--trace` (a span per lock call). Other libraries' only at WARN: their INFO lines
/// (the ZooKeeper client logs every connection) would bury dlock's and the command's.
/// `RUST_LOG` (`target=level,…`) says otherwise.
fn log_to_stderr(trace: bool) {
    use tracing::Level;
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let dlock = if trace { Level::DEBUG } else { Level::INFO };
    let quiet = || {
        Targets::new()
            .with_default(Level::WARN)
            .with_target("dlock", dlock)
    };
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) => directives.parse().unwrap_or_else(|e| {
            eprintln!(
                "dlock: RUST_LOG={directives:?} is not `target=level,…` ({e}); using the default"
            );
            quiet()
        }),
        Err(_) => quiet(),
    };
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE),
        )
        .with(filter)
        .try_init();
}

/// Help and version go to standard output with status 0; a usage error is one line on standard
/// error with status 64.
fn usage(error: &clap::Error) -> u8 {
    match error.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = error.print();
            0
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = error.print();
            exit::USAGE
        }
        _ => {
            // clap's first paragraph, on one line (the usage and hints after it are dropped).
            let rendered = error.render().to_string();
            let first: Vec<&str> = rendered
                .lines()
                .map(str::trim)
                .skip_while(|line| line.is_empty())
                .take_while(|line| !line.is_empty())
                .collect();
            let first = first.join(" ");
            let first = first.trim_start_matches("error: ");
            eprintln!(
                "{}",
                Failure::new(exit::USAGE, format!("{first} (see dlock --help)"))
            );
            exit::USAGE
        }
    }
}
