//! How `status` and `list` show a lock, and `leader` an election's leader: one line (and a line per queued waiter) for people,
//! one JSON object for scripts (`--json`).
//!
//! The JSON object of a lock:
//!
//! ```text
//! {"key":"invoices/42","state":"held",
//!  "holder":{"fencing":7,"expires_in_ms":1500,"age_ms":12000,
//!            "owner":{"host":"web-1","pid":4242,"label":"billing","since":"2026-11-26T03:40:00.123Z"}},
//!  "waiting":1,"queue":[{"owner":null}]}
//! ```
//!
//! `state` is `free`, `held` or `unknown`; `holder` is present only when held. A field the
//! backend cannot tell is `null` (`fencing`, `expires_in_ms`, `owner`, `waiting`); `age_ms`
//! comes from the owner record's `since`, on the taker's clock.

use dlock::{Holder, Holding, Leader, OwnerRecord};
use serde::Serialize;

/// One lock as `--json` shows it.
#[derive(Debug, Serialize)]
pub struct LockView<'a> {
    key: &'a str,
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    holder: Option<HolderView<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    waiting: Option<Option<usize>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    queue: Option<Vec<WaiterView<'a>>>,
}

#[derive(Debug, Serialize)]
struct HolderView<'a> {
    fencing: Option<u64>,
    expires_in_ms: Option<u128>,
    age_ms: Option<u128>,
    owner: Option<&'a OwnerRecord>,
}

#[derive(Debug, Serialize)]
struct WaiterView<'a> {
    owner: Option<&'a OwnerRecord>,
}

impl<'a> LockView<'a> {
    /// `key` as `holding` found it.
    pub fn new(key: &'a str, holding: &'a Holding) -> Self {
        match holding {
            Holding::Held(holder) => LockView::held(key, holder),
            Holding::Free => LockView::bare(key, "free"),
            _ => LockView::bare(key, "unknown"),
        }
    }

    /// `key`, held by `holder`.
    pub fn held(key: &'a str, holder: &'a Holder) -> Self {
        LockView {
            key,
            state: "held",
            holder: Some(HolderView {
                fencing: holder.fencing.map(|t| t.0),
                expires_in_ms: holder.expires_in.map(|d| d.as_millis()),
                age_ms: holder
                    .owner
                    .as_ref()
                    .and_then(OwnerRecord::age)
                    .map(|d| d.as_millis()),
                owner: holder.owner.as_ref(),
            }),
            waiting: Some(holder.waiting),
            queue: Some(
                holder
                    .queue
                    .iter()
                    .map(|w| WaiterView {
                        owner: w.owner.as_ref(),
                    })
                    .collect(),
            ),
        }
    }

    fn bare(key: &'a str, state: &'static str) -> Self {
        LockView {
            key,
            state,
            holder: None,
            waiting: None,
            queue: None,
        }
    }

    /// The object as one line of JSON.
    pub fn json(&self) -> String {
        // Strings, integers and a record of strings and integers always serialize.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The lines `status` prints for a held lock: the holder, then each queued waiter in order.
pub fn held_lines(key: &str, holder: &Holder) -> Vec<String> {
    let mut lines = vec![format!("{key}: held {holder}")];
    for (place, waiter) in holder.queue.iter().enumerate() {
        let who = waiter
            .owner
            .as_ref()
            .map_or_else(|| "an unrecorded owner".to_owned(), ToString::to_string);
        lines.push(format!("  waiting {}: {who}", place + 1));
    }
    lines
}

/// The table `list` prints: name, token, age and owner of each held lock.
pub fn table(rows: &[(&str, &Holder)]) -> Vec<String> {
    let width = rows
        .iter()
        .map(|(key, _)| key.len())
        .max()
        .unwrap_or(0)
        .max(3);
    let mut lines = vec![format!(
        "{:<width$}  {:>8}  {:>8}  OWNER",
        "KEY", "TOKEN", "AGE"
    )];
    for (key, holder) in rows {
        let token = holder.fencing.map_or("?".to_owned(), |t| t.to_string());
        let age = holder
            .owner
            .as_ref()
            .and_then(OwnerRecord::age)
            .map_or("?".to_owned(), |d| format!("{}s", d.as_secs()));
        let owner = holder
            .owner
            .as_ref()
            .map_or("(no owner record)".to_owned(), ToString::to_string);
        lines.push(format!("{key:<width$}  {token:>8}  {age:>8}  {owner}"));
    }
    lines
}

/// An election's leader as `leader` shows it: one line for people, one JSON object for scripts.
///
/// ```text
/// {"key":"scheduler","leader":{"value":"10.0.0.7:8080","term":12,
///  "owner":{"host":"web-1","pid":4242,"since":"2026-11-26T03:40:00.123Z"}}}
/// {"key":"scheduler","leader":null}
/// ```
///
/// A field the backend cannot tell is `null` (`value`, `term`, `owner`).
#[derive(Debug, Serialize)]
pub struct LeaderView<'a> {
    key: &'a str,
    leader: Option<LeaderFields<'a>>,
}

#[derive(Debug, Serialize)]
struct LeaderFields<'a> {
    value: Option<&'a str>,
    term: Option<u64>,
    owner: Option<&'a OwnerRecord>,
}

impl<'a> LeaderView<'a> {
    /// `key`'s leader, or nobody.
    pub fn new(key: &'a str, leader: Option<&'a Leader>) -> Self {
        LeaderView {
            key,
            leader: leader.map(|leader| LeaderFields {
                value: leader.value.as_deref(),
                term: leader.term.map(|t| t.0),
                owner: leader.owner.as_ref(),
            }),
        }
    }

    /// `scheduler: led by "10.0.0.7:8080" (term 12), owner web-1 (pid 4242)`, or
    /// `scheduler: no leader`. The value is quoted, so that one leader is always one line.
    pub fn line(&self) -> String {
        let key = self.key;
        let Some(leader) = &self.leader else {
            return format!("{key}: no leader");
        };
        let value = leader.value.map_or_else(
            || "a leader without a value".to_owned(),
            |v| format!("{v:?}"),
        );
        let term = leader
            .term
            .map_or_else(|| "term unknown".to_owned(), |t| format!("term {t}"));
        match leader.owner {
            Some(owner) => format!("{key}: led by {value} ({term}), owner {owner}"),
            None => format!("{key}: led by {value} ({term})"),
        }
    }

    /// The object as one line of JSON.
    pub fn json(&self) -> String {
        // Strings, integers and a record of strings and integers always serialize.
        serde_json::to_string(self).unwrap_or_default()
    }
}
