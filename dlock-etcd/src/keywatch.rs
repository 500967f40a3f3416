//! One watch stream per client on the keys it holds, so that a holder learns at once when its
//! key is deleted.
//!
//! Keep-alives reveal a lease that is gone only at the next keep-alive, and never reveal a key
//! deleted by someone else while the lease lives on (an operator's `etcdctl del`, or etcd's
//! server-side `Unlock` given our key): the next contender then holds the lock while we still
//! believe we do. So every held key is watched for its deletion, on one shared stream (a watch
//! per key would cost a stream per lock).
//!
//! Each watch starts from "now" (a watch from a past revision is served by etcd's catch-up loop,
//! up to 100 ms late), and when the server has created it the holder is told the revision it
//! covers from ([`Alarm::Armed`]) and checks its key once: a deletion before that revision is
//! found by the check, one after it by the watch. The stream is reopened when it breaks or the
//! client moves to another member, and every watch is armed again.

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{
    EventType, WatchFilterType, WatchOptions, WatchRequestSender, WatchResponseStream,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::error::is_token_refused;
use crate::requests::Requests;

/// What a watch on a held key reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Alarm {
    /// The watch (re)started: every deletion after this store revision will be reported; one
    /// before it must be looked for.
    Armed(i64),
    /// The key was deleted.
    Deleted,
    /// The server cancelled the watch: whether the key still exists must be checked, and the key
    /// watched again.
    Unsure,
}

enum Command {
    Watch {
        id: i64,
        key: Vec<u8>,
        alarms: mpsc::UnboundedSender<Alarm>,
    },
    Cancel {
        id: i64,
    },
}

/// The shared watch of one client.
pub(crate) struct KeyWatch {
    commands: mpsc::UnboundedSender<Command>,
    next_id: std::sync::atomic::AtomicI64,
    task: JoinHandle<()>,
}

impl Drop for KeyWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One key's watch; dropping it cancels the watch.
pub(crate) struct Subscription {
    id: i64,
    commands: mpsc::UnboundedSender<Command>,
    /// What the watch reports; ends after `Deleted` or `Unsure`.
    pub(crate) alarms: mpsc::UnboundedReceiver<Alarm>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Cancel { id: self.id });
    }
}

impl KeyWatch {
    /// Starts the (lazily connected) watch task on the current runtime.
    pub(crate) fn start(requests: Requests) -> Self {
        let (commands, rx) = mpsc::unbounded_channel();
        KeyWatch {
            commands,
            next_id: std::sync::atomic::AtomicI64::new(1),
            task: tokio::spawn(run(requests, rx)),
        }
    }

    /// Watches `key` for its deletion.
    pub(crate) fn subscribe(&self, key: Vec<u8>) -> Subscription {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (alarms_tx, alarms) = mpsc::unbounded_channel();
        let _ = self.commands.send(Command::Watch {
            id,
            key,
            alarms: alarms_tx,
        });
        Subscription {
            id,
            commands: self.commands.clone(),
            alarms,
        }
    }
}

struct Entry {
    key: Vec<u8>,
    alarms: mpsc::UnboundedSender<Alarm>,
}

fn options(id: i64) -> WatchOptions {
    WatchOptions::new()
        .with_watch_id(id)
        .with_filters([WatchFilterType::NoPut])
}

type Stream = (WatchRequestSender, WatchResponseStream);

/// Opens a stream carrying every entry's watch (each reports `Armed` once created).
async fn open(requests: &Requests, entries: &HashMap<i64, Entry>) -> Option<Stream> {
    let mut all = entries.iter();
    let (&id, first) = all.next()?;
    let stream = requests.watch(first.key.clone(), options(id)).await.ok()?;
    let (mut sender, responses) = stream.split();
    for (&id, entry) in all {
        sender
            .watch(entry.key.clone(), Some(options(id)))
            .await
            .ok()?;
    }
    Some((sender, responses))
}

async fn next_message(
    stream: &mut Option<Stream>,
) -> Option<Result<etcd_client::WatchResponse, etcd_client::Error>> {
    match stream {
        Some((_, responses)) => responses.message().await.transpose(),
        None => std::future::pending().await,
    }
}

async fn run(requests: Requests, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut entries: HashMap<i64, Entry> = HashMap::new();
    let mut stream: Option<Stream> = None;
    let mut backoff = Duration::from_millis(50);
    let mut generation = requests.generation();
    // Watches refused in a row for an expired token.
    let mut refusals = 0u32;
    loop {
        if stream.is_none() && !entries.is_empty() {
            generation.borrow_and_update();
            stream = open(&requests, &entries).await;
            if stream.is_none() {
                // Commands wait in the channel meanwhile.
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            } else {
                backoff = Duration::from_millis(50);
            }
        }
        tokio::select! {
            command = commands.recv() => match command {
                None => return,
                Some(Command::Watch { id, key, alarms }) => {
                    if let Some((sender, _)) = stream.as_mut() {
                        if sender.watch(key.clone(), Some(options(id))).await.is_err() {
                            stream = None;
                        }
                    }
                    entries.insert(id, Entry { key, alarms });
                }
                Some(Command::Cancel { id }) => {
                    if entries.remove(&id).is_some() {
                        if let Some((sender, _)) = stream.as_mut() {
                            if sender.cancel(id).await.is_err() {
                                stream = None;
                            }
                        }
                    }
                }
            },
            message = next_message(&mut stream) => match message {
                Some(Ok(response)) => {
                    let id = response.watch_id();
                    if response.canceled() && is_token_refused(response.cancel_reason()) {
                        // The stream carries the token it was opened with, which expired:
                        // authenticate again and reopen it, with every watch armed anew.
                        tracing::debug!("etcd key watch: the auth token expired; authenticating again");
                        let _ = requests.refresh_token().await;
                        stream = None;
                        // Opening succeeds whatever the token, so pause here: a refresh that
                        // keeps failing (a changed password) must not spin.
                        refusals = refusals.saturating_add(1);
                        let pause = Duration::from_millis(50) * 2u32.pow(refusals.min(5));
                        tokio::time::sleep(pause).await;
                    } else if response.canceled() {
                        if let Some(entry) = entries.remove(&id) {
                            let _ = entry.alarms.send(Alarm::Unsure);
                        }
                    } else if response
                        .events()
                        .iter()
                        .any(|event| event.event_type() == EventType::Delete)
                    {
                        if let Some(entry) = entries.remove(&id) {
                            let _ = entry.alarms.send(Alarm::Deleted);
                        }
                    } else if response.created() {
                        refusals = 0;
                        let at = response.header().map_or(0, |h| h.revision());
                        if let Some(entry) = entries.get(&id) {
                            let _ = entry.alarms.send(Alarm::Armed(at));
                        }
                    }
                }
                // Broken: reopen with every watch from its original revision.
                _ => stream = None,
            },
            // The client moved to another member: move the watches too.
            _ = generation.changed() => stream = None,
        }
    }
}
