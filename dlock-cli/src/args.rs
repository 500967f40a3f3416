//! The command line, as clap reads it.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::exit;

/// Run a command while holding a distributed lock (or a semaphore permit, or one side of a
/// read-write lock), run it while leading an election, show who holds a lock or leads an
/// election, list the held locks, or evict a stuck holder.
///
/// The lock service is named by a URL, as for dlock::connect: memory://, redis://host:6379,
/// rediss://…, redis+sentinel://h1:26379,h2:26379/mymaster, zk://h1:2181,h2:2181/chroot,
/// etcd://h1:2379,h2:2379, postgres://user@db:5432/app?sslmode=require, with options as query
/// parameters (?ttl=30s&prefix=…). Durations are written 500ms, 30s, 2m.
#[derive(Debug, Parser)]
#[command(name = "dlock", version, after_help = exit::TABLE)]
pub struct Cli {
    /// Trace every lock call (one span each, with key, backend, outcome, wait and fencing token)
    /// and the backend's own events on standard error; also tracing=true in the URL. Without it,
    /// dlock's events at INFO and other libraries' at WARN; RUST_LOG=target=level,… overrides.
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
    /// With --permits N it takes one of the N permits of the semaphore KEY instead, so that up
    /// to N commands run at once; with --read or --write, the read or the write side of the
    /// read-write lock KEY (any number of readers, or one writer). Without these, run takes the
    /// plain lock KEY, which is independent of the semaphore and the read-write lock of the same
    /// name (except on postgres://, where the write side is the lock KEY, as DistributedLock
    /// maps them, so a writer and the plain lock exclude each other). The command sees the lease's fencing token in DLOCK_FENCING_TOKEN and the key in
    /// DLOCK_KEY; pass the token to the resource you write to, so it can reject a holder whose
    /// lease already ended. The command runs in a process group of its own; SIGINT and SIGTERM
    /// sent to dlock are passed on to that group. If no renewal has confirmed the lease --grace
    /// before its validity ends (the service cannot be reached), the command gets SIGTERM, and
    /// SIGKILL just before the lease ends, so it is dead before another client can be granted
    /// the lock; if the lease is lost early (the lock was taken away), the command gets SIGTERM
    /// and SIGKILL after --grace at most. Either way dlock exits with 76. Otherwise dlock exits
    /// with the command's status.
    #[command(after_help = exit::TABLE)]
    Run(RunArgs),
    /// Campaign in the election KEY with --value, run COMMAND while leading (renewing the
    /// leadership), resign when it ends.
    ///
    /// Waits until no other candidate leads (up to --wait), then runs the command; it sees its
    /// term (the leadership's fencing token, greater for every later leader) in
    /// DLOCK_FENCING_TOKEN and the election's name in DLOCK_KEY. When the command ends, dlock
    /// resigns at once, so the next candidate takes over, and exits with the command's status.
    /// SIGINT and SIGTERM sent to dlock are passed on to the command's process group. If the
    /// leadership cannot be renewed, the command is stopped before another candidate can take
    /// over (SIGTERM --grace before the leadership ends, SIGKILL just before), or at once (SIGKILL
    /// after --grace at most) if it is lost early, and dlock exits with 76.
    #[command(after_help = exit::TABLE)]
    Elect(ElectArgs),
    /// Show who leads the election KEY: the leader's value and term.
    ///
    /// Exits with 0 when nobody leads and 75 when someone does, as status does for a free and
    /// a held lock. With --watch, prints the current leader (if any) and then each new leader as
    /// it takes over, one line each, in increasing term order, until interrupted.
    #[command(after_help = exit::TABLE)]
    Leader(LeaderArgs),
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

/// `dlock elect`'s arguments.
#[derive(Debug, Args)]
pub struct ElectArgs {
    /// Which election.
    #[command(flatten)]
    pub target: ElectionTarget,
    /// What this candidate publishes while it leads, for `dlock leader` and other observers (its
    /// address, say): 1 to 1024 bytes.
    #[arg(long)]
    pub value: String,
    /// How long the service keeps the leadership if dlock goes silent; renewed every third of it
    /// while the command runs. Default: the URL's ttl parameter, else 30s.
    #[arg(long, value_parser = dlock::parse_duration)]
    pub ttl: Option<Duration>,
    /// How long to wait while another candidate leads; 0 tries once. Default: the URL's wait
    /// parameter, else wait until this candidate leads.
    #[arg(long, value_parser = dlock::parse_duration)]
    pub wait: Option<Duration>,
    /// How long before the leadership's validity ends the command gets SIGTERM, unless a renewal
    /// has confirmed it by then; SIGKILL follows just before it ends. Default: a third of the
    /// TTL, at most 10s; at most half the TTL.
    #[arg(long, value_parser = dlock::parse_duration)]
    pub grace: Option<Duration>,
    /// The command and its arguments (after --).
    #[arg(required = true, trailing_var_arg = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// `dlock leader`'s arguments.
#[derive(Debug, Args)]
pub struct LeaderArgs {
    /// Which election.
    #[command(flatten)]
    pub target: ElectionTarget,
    /// Keep watching: print each new leader as it takes over, until interrupted.
    #[arg(long)]
    pub watch: bool,
    /// Print a JSON object (one line per leader with --watch) instead of text (for scripts).
    #[arg(long)]
    pub json: bool,
}

/// Which election.
#[derive(Debug, Args)]
pub struct ElectionTarget {
    /// The lock service's URL, as for `run`.
    #[arg(long, env = "DLOCK_URL", hide_env_values = true)]
    pub url: String,
    /// The election's name (1 to 1024 bytes).
    #[arg(long)]
    pub key: String,
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
    /// The lock service's URL: any form dlock::connect takes (see docs/urls.md), e.g.
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
    /// How long before the lease's validity ends the command gets SIGTERM, unless a renewal has
    /// confirmed the lease by then; SIGKILL follows just before it ends, when another client
    /// could be granted the lock. Default: a third of the TTL, at most 10s; at most half the TTL.
    #[arg(long, value_parser = dlock::parse_duration)]
    pub grace: Option<Duration>,
    /// Run under one of the N permits of the semaphore KEY instead of the lock: up to N
    /// commands hold a permit at once. Every client of KEY must pass the same N (1 to 10000);
    /// while the semaphore is in use, another N is refused (exit 64).
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=i64::from(dlock::MAX_PERMITS)),
        conflicts_with_all = ["read", "write"]
    )]
    pub permits: Option<u32>,
    /// Run under the read side of the read-write lock KEY: shared with other --read runs, never
    /// with a --write run, and held back while a --write run waits.
    #[arg(long, conflicts_with = "write")]
    pub read: bool,
    /// Run under the write side of the read-write lock KEY: alone, after every reader has left.
    /// (Without --read or --write, run takes the plain lock KEY, another thing than the
    /// read-write lock of that name.)
    #[arg(long)]
    pub write: bool,
    /// The command and its arguments (after --).
    #[arg(required = true, trailing_var_arg = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}
