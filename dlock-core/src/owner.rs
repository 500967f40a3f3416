//! Who holds a lock: the owner record every grant leaves next to the lock ([`OwnerRecord`]).

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The longest application label accepted, in bytes.
pub const MAX_LABEL_LEN: usize = 128;

/// The process that takes locks through one client: its host, process id and optional label.
/// Each backend keeps one and stamps a fresh [`OwnerRecord`] from it for every grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    host: String,
    pid: u32,
    label: Option<String>,
}

impl Default for Owner {
    fn default() -> Self {
        Owner::this_process()
    }
}

impl Owner {
    /// This process, without a label.
    pub fn this_process() -> Self {
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        Owner {
            host,
            pid: std::process::id(),
            label: None,
        }
    }

    /// This owner with the application label `label` (1 to [`MAX_LABEL_LEN`] bytes, printable:
    /// no control characters), so that operators can tell services apart on a shared host.
    pub fn with_label(mut self, label: impl Into<String>) -> Result<Self> {
        let label = label.into();
        check_label(&label)?;
        self.label = Some(label);
        Ok(self)
    }

    /// This process, with the application label `label` when one is given: what a backend's
    /// builder makes of its `owner=` setting (checked as [`with_label`](Self::with_label) does).
    pub fn labelled(label: Option<String>) -> Result<Self> {
        match label {
            Some(label) => Owner::this_process().with_label(label),
            None => Ok(Owner::this_process()),
        }
    }

    /// The application label, if one was given.
    pub fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// A record of this owner taking a lock now.
    pub fn record(&self) -> OwnerRecord {
        OwnerRecord {
            host: self.host.clone(),
            pid: self.pid,
            label: self.label.clone(),
            since: SystemTime::now(),
        }
    }
}

/// Checks an application label: 1 to [`MAX_LABEL_LEN`] bytes, no control characters.
pub fn check_label(label: &str) -> Result<()> {
    if label.is_empty() || label.len() > MAX_LABEL_LEN {
        return Err(Error::invalid(
            "owner",
            format!(
                "the label must be 1 to {MAX_LABEL_LEN} bytes, not {}",
                label.len()
            ),
        ));
    }
    if label.chars().any(char::is_control) {
        return Err(Error::invalid(
            "owner",
            "the label must not contain control characters",
        ));
    }
    Ok(())
}

/// Who holds a lock: the owner record every grant leaves next to the lock on the server.
///
/// When a lock is stuck, the first question is who took it. The owner token (a random number)
/// cannot answer it, so every backend also writes a small record of the taking process next to
/// the lock — the Redis companion key, the etcd key's value, the ZooKeeper node's data — where
/// peers' tools (`redis-cli get`, `etcdctl get`, `zkCli get`) and [`inspect`] read it back.
///
/// The record is one line of JSON, the same on every backend:
///
/// ```text
/// {"host":"web-1","pid":4242,"label":"billing","since":"2026-11-26T03:40:00.123Z"}
/// ```
///
/// | field | what |
/// |---|---|
/// | `host` | the host name of the taking process (as the operating system reports it) |
/// | `pid` | its process id |
/// | `label` | the application label given to the client (`owner=` in the URL, `with_owner` on a builder); absent when none was given |
/// | `since` | when the lock was requested, on the taking host's wall clock (RFC 3339, UTC, milliseconds) |
///
/// `since` comes from the taking host's clock, so an age computed from it on another host is off
/// by the difference between the two clocks; it is for people, never for safety.
///
/// [`inspect`]: crate::DistributedLock::inspect
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRecord {
    /// The taking process's host name.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// Its application label, if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// When it requested the lock, on its own wall clock.
    #[serde(with = "rfc3339")]
    pub since: SystemTime,
}

impl OwnerRecord {
    /// The record as the one line of JSON stored on the server.
    pub fn to_json(&self) -> String {
        // Serializing strings, an integer and a time cannot fail; an empty object is never
        // written, but is what a failure would leave rather than a panic.
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }

    /// Reads a record back from what the server holds. Anything else — a peer's data (kazoo's
    /// identifier, Curator's IP address, `etcdctl lock`'s empty value) or a damaged record — is
    /// `None`: not every holder is a dlock client.
    pub fn parse(data: &[u8]) -> Option<OwnerRecord> {
        serde_json::from_slice(data).ok()
    }

    /// How long ago the lock was taken, by this host's clock against the taker's; `None` if the
    /// taker's clock is ahead of ours.
    pub fn age(&self) -> Option<Duration> {
        SystemTime::now().duration_since(self.since).ok()
    }
}

impl fmt::Display for OwnerRecord {
    /// `billing on web-1 (pid 4242)`, or `web-1 (pid 4242)` without a label.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(label) = &self.label {
            write!(f, "{label} on ")?;
        }
        write!(f, "{} (pid {})", self.host, self.pid)
    }
}

/// `since` as RFC 3339 text with milliseconds, as operators read it.
mod rfc3339 {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(time: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_rfc3339_millis(*time))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_rfc3339_weak(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_through_its_json() {
        let owner = Owner::this_process().with_label("billing").unwrap();
        let record = owner.record();
        let json = record.to_json();
        assert!(json.starts_with(r#"{"host":"#), "{json}");
        assert!(json.contains(r#""label":"billing""#), "{json}");
        let back = OwnerRecord::parse(json.as_bytes()).unwrap();
        assert_eq!(back.host, record.host);
        assert_eq!(back.pid, std::process::id());
        assert_eq!(back.label.as_deref(), Some("billing"));
        let skew = record
            .since
            .duration_since(back.since)
            .unwrap_or_else(|e| e.duration());
        assert!(skew < Duration::from_millis(1), "{skew:?}");
        assert!(back.age().is_some());
    }

    #[test]
    fn the_documented_format_is_read() {
        let line =
            r#"{"host":"web-1","pid":4242,"label":"billing","since":"2026-11-26T03:40:00.123Z"}"#;
        let record = OwnerRecord::parse(line.as_bytes()).unwrap();
        assert_eq!(record.to_string(), "billing on web-1 (pid 4242)");
        assert_eq!(record.to_json(), line);
        let unlabelled = r#"{"host":"web-1","pid":1,"since":"2026-11-26T03:40:00Z"}"#;
        let record = OwnerRecord::parse(unlabelled.as_bytes()).unwrap();
        assert_eq!(record.to_string(), "web-1 (pid 1)");
        assert!(!record.to_json().contains("label"));
    }

    #[test]
    fn peers_data_is_not_a_record() {
        for data in [
            &b""[..],
            b"10.0.0.7",
            b"my-identifier",
            b"{}",
            b"{\"host\":1}",
        ] {
            assert_eq!(OwnerRecord::parse(data), None, "{data:?}");
        }
    }

    #[test]
    fn bad_labels_are_rejected() {
        for label in [String::new(), "x".repeat(MAX_LABEL_LEN + 1), "a\nb".into()] {
            let error = Owner::this_process().with_label(label).unwrap_err();
            assert!(error.to_string().contains("owner"), "{error}");
        }
        assert!(Owner::this_process()
            .with_label("x".repeat(MAX_LABEL_LEN))
            .is_ok());
    }
}
