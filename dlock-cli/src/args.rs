//! The command line, as clap reads it.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::exit;

/// Run a command while holding a distributed lock, or show who holds one.
///
/// The lock service is named by a URL, as for dlock::connect: memory://, redis://host:6379,
/// rediss://…, redis+sentinel://h1:26379,h2:26379/mymaster, zk://h1:2181,h2:2181/chroot,
/// etcd://h1:2379,h2:2379, with options as query
/// parameters (?ttl=30s&prefix=…). Durations are written 500ms, 30s, 2m.
#[derive(Debug, Parser)]
#[command(name = "dlock", version, after_help = exit::TABLE)]
pub struct Cli {
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
    /// Show whether the lock is held, and by which fencing token where the backend can tell.
    ///
    /// Prints one line and exits with 0 when the lock is free, 75 when it is held, and 3 when
    /// the backend cannot tell without taking the lock (which status never does) or its servers
    /// disagree (Redlock masters of which no quorum shows one holder or none).
    #[command(after_help = exit::TABLE)]
    Status(Target),
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
