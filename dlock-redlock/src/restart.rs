//! The "delayed restart" rule: a master that (re)started less than the longest TTL ago does not
//! count towards a quorum.
//!
//! A master that restarts without its data (no persistence, or `appendfsync everysec` losing the
//! last second) forgets the locks it granted. If it took part in quorums at once, a second client
//! could win a majority that includes it while the first holder's lease is still valid. Redlock's
//! author therefore asks that a restarted master stay out for at least the longest TTL in use:
//! by then every lock it had granted has expired anyway.
//!
//! A restarted server always means a new connection (the old one breaks with the process), so the
//! client checks every connection it opens with `INFO server`: `uptime_in_seconds` says how long
//! ago the server process started, whether this client saw it before or not, and `run_id` tells a
//! restart this client had a connection across (logged). A master whose uptime is below the
//! window is excluded until the window has passed since its start. Uptime is counted in whole
//! seconds, rounded down, so the exclusion errs on the long side.

use std::time::Duration;

use tokio::time::Instant;

/// What `INFO server` says about a server process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerInfo {
    /// A random id of the server process, new at every start.
    pub(crate) run_id: String,
    /// Whole seconds since the process started.
    pub(crate) uptime: Duration,
}

impl ServerInfo {
    /// Reads `run_id` and `uptime_in_seconds` from the text of `INFO server`.
    pub(crate) fn parse(info: &str) -> Option<ServerInfo> {
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let run_id = field("run_id")?.to_owned();
        let uptime = Duration::from_secs(field("uptime_in_seconds")?.parse().ok()?);
        Some(ServerInfo { run_id, uptime })
    }
}

/// One master's restart history as this client knows it.
#[derive(Debug, Default)]
pub(crate) struct RestartWatch {
    run_id: Option<String>,
    excluded_until: Option<Instant>,
}

/// What a new connection revealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// The same server process as before (or the first one this client sees).
    Same,
    /// A different process than on the previous connection: the server restarted.
    Restarted,
}

impl RestartWatch {
    /// Records what a connection opened at `now` found. With a `window` (the delayed-restart
    /// rule), a server that started less than `window` ago is excluded until `window` has passed
    /// since its start.
    pub(crate) fn saw(
        &mut self,
        info: &ServerInfo,
        now: Instant,
        window: Option<Duration>,
    ) -> Seen {
        let seen = match &self.run_id {
            Some(previous) if *previous != info.run_id => Seen::Restarted,
            _ => Seen::Same,
        };
        self.run_id = Some(info.run_id.clone());
        if let Some(window) = window {
            if info.uptime < window {
                let until = now + (window - info.uptime);
                self.excluded_until = Some(self.excluded_until.map_or(until, |u| u.max(until)));
            }
        }
        seen
    }

    /// Whether the master may count towards a quorum at `now`.
    pub(crate) fn counts_at(&self, now: Instant) -> bool {
        self.excluded_until.is_none_or(|until| now >= until)
    }

    /// When the exclusion ends, if the master is excluded at `now`.
    pub(crate) fn excluded_until(&self, now: Instant) -> Option<Instant> {
        self.excluded_until.filter(|until| now < *until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\ntcp_port:6379\r\nuptime_in_seconds:42\r\nuptime_in_days:0\r\n";

    #[test]
    fn info_server_is_parsed() {
        let info = ServerInfo::parse(INFO).unwrap();
        assert_eq!(info.run_id, "abc123");
        assert_eq!(info.uptime, Duration::from_secs(42));
        assert_eq!(ServerInfo::parse("# Server\r\nrun_id:x\r\n"), None);
        assert_eq!(
            ServerInfo::parse("run_id:x\r\nuptime_in_seconds:soon\r\n"),
            None
        );
    }

    #[test]
    fn a_young_server_is_excluded_for_the_rest_of_the_window() {
        let now = Instant::now();
        let mut watch = RestartWatch::default();
        let young = ServerInfo {
            run_id: "a".into(),
            uptime: Duration::from_secs(3),
        };
        assert_eq!(
            watch.saw(&young, now, Some(Duration::from_secs(10))),
            Seen::Same
        );
        assert!(!watch.counts_at(now));
        assert!(!watch.counts_at(now + Duration::from_secs(6)));
        assert!(watch.counts_at(now + Duration::from_secs(7)));
        assert_eq!(
            watch.excluded_until(now),
            Some(now + Duration::from_secs(7))
        );
        assert_eq!(watch.excluded_until(now + Duration::from_secs(8)), None);
    }

    #[test]
    fn an_old_server_or_no_rule_counts_at_once() {
        let now = Instant::now();
        let old = ServerInfo {
            run_id: "a".into(),
            uptime: Duration::from_secs(3600),
        };
        let mut watch = RestartWatch::default();
        watch.saw(&old, now, Some(Duration::from_secs(10)));
        assert!(watch.counts_at(now));
        let young = ServerInfo {
            run_id: "a".into(),
            uptime: Duration::ZERO,
        };
        let mut unruled = RestartWatch::default();
        unruled.saw(&young, now, None);
        assert!(unruled.counts_at(now));
    }

    #[test]
    fn a_new_run_id_is_a_restart_and_exclusions_never_shrink() {
        let now = Instant::now();
        let window = Some(Duration::from_secs(10));
        let mut watch = RestartWatch::default();
        let first = ServerInfo {
            run_id: "a".into(),
            uptime: Duration::ZERO,
        };
        assert_eq!(watch.saw(&first, now, window), Seen::Same);
        let second = ServerInfo {
            run_id: "b".into(),
            uptime: Duration::from_secs(9),
        };
        assert_eq!(watch.saw(&second, now, window), Seen::Restarted);
        assert!(!watch.counts_at(now + Duration::from_secs(5)));
    }
}
