//! Server-side request counts, read from the servers themselves, so that a figure such as
//! "commands per acquisition" counts what reached the server, whatever the client library sent
//! (pub/sub messages, retries, pings); and the client's CPU time, for the cost of held leases.

use std::time::Duration;

use async_trait::async_trait;
use nix::time::{clock_gettime, ClockId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long one reading of a server's counter may take.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// A counter of requests the servers have processed so far.
#[async_trait]
pub trait ServerCount: Send + Sync {
    /// Requests counted so far, summed over the servers read. Only differences between two
    /// readings mean anything; a reading's own request is left out of them (see
    /// [`ServerCount::own_per_reading`]).
    async fn total(&self) -> anyhow::Result<u64>;
    /// Requests each reading itself adds to the next one (Redis counts its `INFO`).
    fn own_per_reading(&self) -> u64;
    /// What is counted, for the report.
    fn what(&self) -> &'static str;
}

/// Counts of a run, taken before and after.
pub struct Window<'a> {
    counter: Option<&'a dyn ServerCount>,
    server: Option<u64>,
    cpu: Duration,
    started: tokio::time::Instant,
}

/// What a window counted.
#[derive(Debug, Clone, Copy)]
pub struct Counted {
    /// Server requests, where a counter was given and both readings worked.
    pub server: Option<u64>,
    /// CPU time of this process (user + system).
    pub cpu: Duration,
    pub took: Duration,
}

impl<'a> Window<'a> {
    /// Starts counting. A counter that cannot be read leaves the server count out; it never
    /// fails the workload.
    pub async fn open(counter: Option<&'a dyn ServerCount>) -> Window<'a> {
        let server = match counter {
            Some(c) => c.total().await.ok(),
            None => None,
        };
        Window {
            counter,
            server,
            cpu: cpu_time(),
            started: tokio::time::Instant::now(),
        }
    }

    pub async fn close(self) -> Counted {
        let took = self.started.elapsed();
        let cpu = cpu_time().saturating_sub(self.cpu);
        let server = match (self.counter, self.server) {
            (Some(c), Some(before)) => c
                .total()
                .await
                .ok()
                .map(|after| after.saturating_sub(before + c.own_per_reading())),
            _ => None,
        };
        Counted { server, cpu, took }
    }
}

/// User + system CPU time of this whole process so far, all threads, in nanoseconds
/// (`CLOCK_PROCESS_CPUTIME_ID`); zero where that clock cannot be read. `/proc/self/stat`, read
/// before, counts 10 ms ticks: a window in which 10,000 leases cost three ticks was off by a
/// third either way, and so was the per-lease ratio against it.
pub fn cpu_time() -> Duration {
    clock_gettime(ClockId::CLOCK_PROCESS_CPUTIME_ID).map_or(Duration::ZERO, Duration::from)
}

/// Script calls on Redis servers (`EVAL`, `EVALSHA`, `FCALL` and their read-only forms, from
/// `INFO commandstats`), summed: one server, or every Redlock master. Every request dlock sends to
/// Redis is a script, so this counts dlock's requests as the server sees them; Redis 7 also
/// counts the commands a script runs inside itself in `total_commands_processed`, which would
/// count one request several times. A peer's plain commands (rslock's `SET NX`) are not counted.
pub struct RedisCommands {
    connections: Vec<redis::aio::MultiplexedConnection>,
}

/// The commands that run a script, as `INFO commandstats` names them.
const SCRIPT_CALLS: [&str; 6] = [
    "cmdstat_eval:",
    "cmdstat_evalsha:",
    "cmdstat_eval_ro:",
    "cmdstat_evalsha_ro:",
    "cmdstat_fcall:",
    "cmdstat_fcall_ro:",
];

impl RedisCommands {
    pub async fn connect(urls: &[String]) -> anyhow::Result<RedisCommands> {
        let mut connections = Vec::with_capacity(urls.len());
        for url in urls {
            connections.push(
                redis::Client::open(url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?,
            );
        }
        Ok(RedisCommands { connections })
    }
}

#[async_trait]
impl ServerCount for RedisCommands {
    async fn total(&self) -> anyhow::Result<u64> {
        let mut sum = 0;
        for con in &self.connections {
            let mut con = con.clone();
            let info: String = tokio::time::timeout(
                READ_TIMEOUT,
                redis::cmd("INFO").arg("commandstats").query_async(&mut con),
            )
            .await??;
            sum += script_calls(&info);
        }
        Ok(sum)
    }

    fn own_per_reading(&self) -> u64 {
        // INFO is not a script.
        0
    }

    fn what(&self) -> &'static str {
        "script calls (EVAL/EVALSHA/FCALL in INFO commandstats, summed over the servers; every dlock request to Redis is one)"
    }
}

/// The script calls of an `INFO commandstats` answer (`cmdstat_evalsha:calls=12,usec=…`).
fn script_calls(info: &str) -> u64 {
    info.lines()
        .filter_map(|line| {
            let rest = SCRIPT_CALLS.iter().find_map(|p| line.strip_prefix(p))?;
            rest.strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// A ZooKeeper member's `zk_packets_received` (`mntr`): every request of every session on it,
/// pings included.
pub struct ZkPackets {
    pub endpoint: String,
}

#[async_trait]
impl ServerCount for ZkPackets {
    async fn total(&self) -> anyhow::Result<u64> {
        let answer =
            dlock_testkit::fixtures::four_letter_word(&self.endpoint, "mntr", READ_TIMEOUT).await?;
        field(&answer, "zk_packets_received")
    }

    fn own_per_reading(&self) -> u64 {
        // A four-letter word is not a session packet.
        0
    }

    fn what(&self) -> &'static str {
        "packets received by the member the clients use (mntr zk_packets_received, session pings included)"
    }
}

/// An etcd member's gRPC messages received (`grpc_server_msg_received_total` on `/metrics`,
/// which etcd serves on its client port), summed over services and methods: every unary request
/// and every message on a stream (lease keep-alives, watches).
pub struct EtcdMessages {
    /// `host:port` of the member's client port.
    pub endpoint: String,
}

#[async_trait]
impl ServerCount for EtcdMessages {
    async fn total(&self) -> anyhow::Result<u64> {
        let address = self
            .endpoint
            .trim_start_matches("http://")
            .trim_end_matches('/');
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect(address).await?;
            let request =
                format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\nConnection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).await?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await?;
            anyhow::Ok(answer)
        };
        let answer = tokio::time::timeout(READ_TIMEOUT, exchange).await??;
        let mut sum = 0.0;
        let mut found = false;
        for line in answer.lines() {
            if let Some(rest) = line.strip_prefix("grpc_server_msg_received_total") {
                if let Some(value) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
                    sum += value;
                    found = true;
                }
            }
        }
        anyhow::ensure!(
            found,
            "{address}/metrics has no grpc_server_msg_received_total"
        );
        Ok(sum as u64)
    }

    fn own_per_reading(&self) -> u64 {
        // An HTTP request for the metrics is not a gRPC message.
        0
    }

    fn what(&self) -> &'static str {
        "gRPC messages received by the member the clients use (/metrics grpc_server_msg_received_total)"
    }
}

/// The number after `name` (and an optional `:` or whitespace) on its line of `text`.
fn field(text: &str, name: &str) -> anyhow::Result<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|rest| {
            rest.trim_start_matches(':')
                .trim()
                .parse::<f64>()
                .ok()
                .map(|v| v as u64)
        })
        .ok_or_else(|| anyhow::anyhow!("no {name} in the server's answer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_calls_are_summed_from_commandstats() {
        let info = "# Commandstats\r\ncmdstat_get:calls=900,usec=1\r\ncmdstat_evalsha:calls=12,usec=30,usec_per_call=2.5\r\ncmdstat_eval:calls=3,usec=9\r\n";
        assert_eq!(script_calls(info), 15);
    }

    #[test]
    fn fields_are_read_from_mntr() {
        let mntr = "zk_version\t3.9\nzk_packets_received\t77\nzk_packets_sent\t80\n";
        assert_eq!(field(mntr, "zk_packets_received").ok(), Some(77));
        assert!(field(mntr, "zk_missing").is_err());
    }

    #[test]
    fn cpu_time_counts_the_work_done() {
        let before = cpu_time();
        let started = std::time::Instant::now();
        let mut x = 0u64;
        // 10 ms of CPU, a tick of the old clock; a clock that does not move fails after 10 s.
        while cpu_time().saturating_sub(before) < Duration::from_millis(10) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the CPU clock does not move"
            );
            for i in 0..10_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
            std::hint::black_box(x);
        }
    }
}
