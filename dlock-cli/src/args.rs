//! The command line, as clap reads it.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::exit;

/// Run a command while holding a distributed lock, show who holds one, list the held locks, or
/// evict a stuck holder.
///
/// The lock service is named by a URL, as for dlock::connect: memory://, redis://host:6379,
/// rediss://…, redis+sentinel://h1:26379,h2:26379/mymaster, zk://h1:2181,h2:2181/chroot,
/// etcd://h1:2379,h2:2379, with options as query
/// parameters (?ttl=30s&prefix=…). Durations are written 500ms, 30s, 2m.
#[derive(Debug, Parser)]
#[command(name = "dlock", version, after_help = exit::TABLE)]
pub struct Cli {
    /// Trace every lock call (one span each, with key, backend, outcome, wait and fencing token)
    /// and the backend's own events on standard error; also tracing=true in the URL.
    #[arg(long, global = true)]
    pub trace: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Take the lock, run COMMAND while holding it (renewing it), release it.
    ///
    /// The command sees the lease's fencing token in DLOCK_FENCING_TOKEN and the key in
    /// DLOCK_KEY; pass the token to the resource you write to, so it can reject a holder whose
    /// lease already ended. SIGINT and SIGTERM sent to dlock are passed on to the command. If the
    /// lease is lost (the service cannot be reached for longer than the lease is valid, or the
    /// lock was taken away), the command gets SIGTERM, then SIGKILL after --grace, and dlock exits
    /// with 76. Otherwise dlock exits with the command's status.
    #[command(after_help = exit::TABLE)]
    Run(RunArgs),
    /// Show who holds the lock and who waits for it, without taking it.
    ///
    /// Prints the holder (its owner record: label, host and pid; how long it has held the lock;
    /// its fencing token and remaining TTL where the backend can tell), how many wait, and each
    /// queued waiter in order where the backend queues them. Exits with 0 when the lock is free,
    /// 75 when it is held, and 3 when the backend cannot tell without taking the lock (which
    /// status never does) or its servers disagree (Redlock masters of which no quorum shows one
    /// holder or none).
    #[command(after_help = exit::TABLE)]
    Status(StatusArgs),
    /// List the held locks whose names start with PREFIX (all without one): name, fencing
    /// token, age and owner.
    ///
    /// Lists the locks dlock clients took (they leave an owner record); a peer library's locks
    /// on the same server are not listed.
    #[command(after_help = exit::TABLE)]
    List(ListArgs),
    /// Evict the lock's current holder (needs --force): shows who it is, asks for confirmation
    /// unless --yes, then removes it.
    ///
    /// Only the holder shown is evicted: if the lock changed hands in between, nothing changes
    /// (exit 75). The next holder gets a greater fencing token, so a resource that checks tokens
    /// rejects the evicted holder's late writes, and the evicted holder's lease turns lost at
    /// its next renewal. Exits with 0 when the holder was evicted or the lock was free.
    #[command(after_help = exit::TABLE)]
    Unlock(UnlockArgs),
}

/// `dlock status`'s arguments.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Which lock.
    #[command(flatten)]
    pub target: Target,
    /// Print one JSON object instead of text (for scripts).
    #[arg(long)]
    pub json: bool,
}

/// `dlock list`'s arguments.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// The lock service's URL, as for `status`.
    #[arg(long, env = "DLOCK_URL", hide_env_values = true)]
    pub url: String,
    /// List only the locks whose names start with this.
    #[arg(default_value = "")]
    pub prefix: String,
    /// Print one JSON array instead of a table (for scripts).
    #[arg(long)]
    pub json: bool,
}

/// `dlock unlock`'s arguments.
#[derive(Debug, Args)]
pub struct UnlockArgs {
    /// Which lock.
    #[command(flatten)]
    pub target: Target,
    /// Required: say that you mean to remove another process's lock.
    #[arg(long, required = true)]
    pub force: bool,
    /// Do not ask for confirmation.
    #[arg(long)]
    pub yes: bool,
}

/// Which lock.
#[derive(Debug, Args)]
pub struct Target {
    /// The lock service's URL: any form dlock::connect takes (see the README's table), e.g.
    /// redis://localhost:6379, redis+sentinel://s1:26379/mymaster or
    /// etcd+https://h1:2379?ca=/etc/etcd/ca.pem. Put a URL with a password in DLOCK_URL instead:
    /// other users can read a process's arguments.
    #[arg(long, env = "DLOCK_URL", hide_env_values = true)]
    pub url: String,
    /// The lock's name (1 to 1024 bytes).
    #[arg(long)]
    pub key: String,
}

/// `dlock run`'s arguments.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Which lock.
    #[command(flatten)]
    pub target: Target,
    /// How long the service keeps the lock if dlock goes silent; renewed every third of it
    /// while the command runs. Default: the URL's ttl parameter, else 30s.
    #[arg(long, value_parser = dlock::parse_duration)]
    pub ttl: Option<Duration>,
    /// How long to wait for a busy lock; 0 tries once. Default: the URL's wait parameter, else
    /// wait until the lock is free.
    #[arg(long, value_parser = dlock::parse_duration)]
    pub wait: Option<Duration>,
    /// How long the command has to exit after SIGTERM, once the lease is lost, before SIGKILL.
    #[arg(long, value_parser = dlock::parse_duration, default_value = "10s")]
    pub grace: Duration,
    /// The command and its arguments (after --).
    #[arg(required = true, trailing_var_arg = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}
