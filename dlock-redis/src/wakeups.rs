//! Release notifications: one pub/sub connection per client wakes the tasks waiting for a lock.
//!
//! The release script publishes on the lock's release channel (see [`crate::protocol::keys`]); this module
//! subscribes to the channels that tasks of this client are waiting on and wakes them. It works on
//! a default server configuration (no keyspace notifications needed).
//!
//! * **One subscriber connection per client**, opened on first need and shared by every waiting
//!   task, driven by one background task (the *listener*) that also owns every `SUBSCRIBE` and
//!   `UNSUBSCRIBE`, so they reach the server in the order they were decided.
//! * **One wake-up per release, for one task, sent to one client**: a lock's release names the
//!   owner token of the waiter at the head of the lock's queue (see
//!   [`scripts::RELEASE`](crate::protocol::scripts::RELEASE)) on that waiter's client's own wake
//!   channel: the release channel followed by the client's wake tag ([`Wakeups::tag`],
//!   [`keys::wake_channel`](crate::protocol::keys::wake_channel)). A task registered with that
//!   owner token ([`Wakeups::register`]) is woken, and no other; no other client even receives
//!   the message, so a release costs the same however many clients wait. An empty message on the
//!   release channel itself (a release with nobody queued, a primitive's release) wakes the task
//!   of this client registered without an owner that has waited longest (`Notify::notify_one`):
//!   only one contender can win anyway. A wake-up that comes while its task is between two
//!   attempts is kept (a `Notify` permit), not lost.
//! * **A lost message only costs latency**: waiters also come back by themselves (the head of a
//!   queue at the holder's expiry, every queued waiter to refresh its entry, a primitive's waiter
//!   after its backoff), so a release during a reconnection, a release by a foreign client (which
//!   does not publish), or an expiry (which nobody publishes) is found by the next attempt.
//!
//! Public so that dlock-redlock can listen to each of its masters ([`Wakeups::for_server`]).
//! * **A silent connection is replaced**: while subscribed, the listener sends `PING` every
//!   [`HEALTH_CHECK_EVERY`]; no answer within the request timeout (like a `SUBSCRIBE` or
//!   `UNSUBSCRIBE` without one) ends the connection and the listener opens a new one, waiters
//!   polling meanwhile. Without it, a connection whose peer stopped answering without closing it
//!   (a dropped route, a server that forgot it) would keep the subscriptions and deliver nothing.
//! * **Subscriptions outlive their waiters a little**: a channel nobody waits on is unsubscribed by
//!   a periodic sweep, not at once, so a hot key is not resubscribed between every two waits.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;

use dlock_core::Result;

use crate::connection::Target;
use crate::protocol::keys;
use crate::url::Endpoint;

/// How often the subscriber connection is checked with a `PING`.
const HEALTH_CHECK_EVERY: Duration = Duration::from_secs(5);
/// How often channels without waiters are unsubscribed.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// The first pause after a failed connection attempt; doubled up to [`MAX_RETRY_PAUSE`].
const MIN_RETRY_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between connection attempts while tasks wait.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(2);
/// The pause after the server refused a subscription (e.g. no permission for the channels):
/// that does not pass by itself, and waiters poll meanwhile.
const REFUSED_PAUSE: Duration = Duration::from_secs(30);

/// Release notifications of one Redis server (or Sentinel service, or cluster): one subscriber
/// connection, shared by every task that waits on any channel of it. Dropping it stops the
/// listener and closes its connection.
pub struct Wakeups {
    shared: Arc<Shared>,
    requests: mpsc::UnboundedSender<()>,
    /// The wake tag: names this client's queue entries and its wake channels.
    tag: Arc<str>,
}

/// What the listener and the waiting tasks share.
struct Shared {
    channels: Mutex<HashMap<String, Arc<Channel>>>,
    status: watch::Sender<Status>,
}

/// The listener's connection, as waiting tasks see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Status {
    /// Incremented with every new subscriber connection; 0 before the first.
    epoch: u64,
    /// The last connection attempt failed or the connection broke: do not wait for a
    /// subscription, poll.
    down: bool,
}

/// One release channel that tasks of this client wait on.
struct Channel {
    /// Wakes tasks registered without an owner, one per empty message.
    notify: Arc<Notify>,
    /// The tasks registered with an owner token: a message naming it wakes that task only.
    owners: Mutex<HashMap<String, Arc<Notify>>>,
    /// Registered waiting tasks.
    users: AtomicUsize,
    /// The epoch of the connection on which the subscription was confirmed; 0 for none.
    subscribed_in: AtomicU64,
}

/// A waiting task's hold on a channel: wake-ups for it are delivered while this lives.
pub struct Registration {
    channel: Arc<Channel>,
    notify: Arc<Notify>,
    owner: Option<String>,
}

impl Registration {
    /// A future that completes at the next wake-up of this registration.
    ///
    /// With an owner token, a wake-up that arrives while no such future waits is kept and
    /// completes the next one, so a message between an attempt and the wait is not lost.
    /// Without one, create the future and [`enable`](tokio::sync::futures::Notified::enable) it
    /// *before* the attempt it follows up on.
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(owner) = &self.owner {
            let mut owners = self.channel.owners();
            if owners
                .get(owner)
                .is_some_and(|n| Arc::ptr_eq(n, &self.notify))
            {
                owners.remove(owner);
            }
        }
        self.channel.users.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Channel {
    fn new() -> Self {
        Channel {
            notify: Arc::new(Notify::new()),
            owners: Mutex::new(HashMap::new()),
            users: AtomicUsize::new(1),
            subscribed_in: AtomicU64::new(0),
        }
    }

    fn owners(&self) -> MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        // Every critical section leaves the map consistent before anything can panic.
        self.owners.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Delivers a message: to the task registered with the owner token it names, or to the
    /// longest waiting task without one if it names nobody.
    fn wake(&self, payload: &[u8]) {
        if payload.is_empty() {
            self.notify.notify_one();
            return;
        }
        let Ok(owner) = std::str::from_utf8(payload) else {
            return;
        };
        if let Some(notify) = self.owners().get(owner) {
            notify.notify_one();
        }
    }
}

impl Wakeups {
    /// Starts listening to the release channels of the server `endpoint` (the way dlock-redlock
    /// listens to each master), on the current tokio runtime, for a client with the wake tag
    /// `tag` ([`new_tag`](Self::new_tag); dlock-redlock gives all its masters one, so that its
    /// requests are the same on each). It opens no connection until a task registers; it
    /// reconnects by itself, waiters polling meanwhile.
    pub fn for_server(
        endpoint: &Endpoint,
        connect_timeout: Duration,
        request_timeout: Duration,
        tag: Arc<str>,
    ) -> Result<Self> {
        Ok(Self::start(
            Target::Server(Box::new(endpoint.client()?)),
            connect_timeout,
            request_timeout,
            endpoint.redacted().to_owned(),
            tag,
        ))
    }

    /// A new wake tag: 16 random hex digits.
    pub fn new_tag() -> Arc<str> {
        format!("{:016x}", rand::random::<u64>()).into()
    }

    /// This client's wake tag: its waiters' queue entries carry it, and the releases that name
    /// them are announced on their wake channels
    /// ([`keys::wake_channel`](crate::protocol::keys::wake_channel)).
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// Starts the listener on the current runtime. It opens no connection until a task waits.
    pub(crate) fn start(
        target: Target,
        connect_timeout: Duration,
        request_timeout: Duration,
        endpoint: String,
        tag: Arc<str>,
    ) -> Self {
        let listener = move |Feed { shared, requests }| {
            Listener {
                shared,
                target,
                connect_timeout,
                request_timeout,
                endpoint,
                requests,
                epoch: 0,
                generation: 0,
                refused: false,
            }
            .run()
        };
        Wakeups::start_with(listener, tag)
    }

    /// Registers a waiting task on the release channel `channel` and asks the listener to
    /// subscribe. With `owner` (the hex owner token the task waits with), only a message naming
    /// that owner on this client's wake channel of `channel` wakes it (a release whose queue it
    /// heads); without, empty messages on `channel` itself do.
    pub fn register(&self, channel: &str, owner: Option<&str>) -> Registration {
        let listened = self.listened(channel, owner);
        let channel: &str = &listened;
        let (channel, new) = {
            let mut channels = self.shared.channels();
            match channels.get(channel) {
                Some(existing) => {
                    existing.users.fetch_add(1, Ordering::AcqRel);
                    (existing.clone(), false)
                }
                None => {
                    let created = Arc::new(Channel::new());
                    channels.insert(channel.to_owned(), created.clone());
                    (created, true)
                }
            }
        };
        if new {
            // Fails only when the listener is gone, i.e. never while `self` lives; the waiter
            // then polls.
            let _ = self.requests.send(());
        }
        self.registration(channel, owner)
    }

    /// [`register`](Self::register), but only if `channel` is subscribed on the live connection
    /// already (a hot lock's channel): then a message that follows at once is delivered, and a
    /// waiter needs no new attempt after registering. `None` otherwise, subscribing nothing.
    ///
    /// The check and the registration are one step under the channels' lock, so the listener's
    /// sweep of idle channels cannot unsubscribe the channel in between (which would leave the
    /// waiter counting on a subscription that is gone, and miss its wake-up).
    pub fn register_if_subscribed(
        &self,
        channel: &str,
        owner: Option<&str>,
    ) -> Option<Registration> {
        let status = *self.shared.status.borrow();
        let listened = self.listened(channel, owner);
        let channel: &str = &listened;
        let channel = {
            let channels = self.shared.channels();
            let existing = channels.get(channel).filter(|c| {
                status.epoch != 0
                    && !status.down
                    && c.subscribed_in.load(Ordering::Acquire) == status.epoch
            })?;
            existing.users.fetch_add(1, Ordering::AcqRel);
            existing.clone()
        };
        Some(self.registration(channel, owner))
    }

    /// The channel a task waiting on the release channel `channel` listens to, if not that one:
    /// with an owner, this client's wake channel.
    fn listened<'c>(&self, channel: &'c str, owner: Option<&str>) -> Cow<'c, str> {
        match owner {
            Some(_) => Cow::Owned(keys::wake_channel(channel, &self.tag)),
            None => Cow::Borrowed(channel),
        }
    }

    /// The registration of a task counted among `channel`'s users.
    fn registration(&self, channel: Arc<Channel>, owner: Option<&str>) -> Registration {
        let notify = match owner {
            Some(owner) => {
                let notify = Arc::new(Notify::new());
                channel.owners().insert(owner.to_owned(), notify.clone());
                notify
            }
            None => channel.notify.clone(),
        };
        Registration {
            channel,
            notify,
            owner: owner.map(str::to_owned),
        }
    }

    /// Waits until the registration's channel is subscribed on the live connection, the
    /// connection is known to be down, or `until` — whichever comes first, and tells whether it
    /// is subscribed. Never fails: without a subscription the waiter polls.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn subscribed(&self, registration: &Registration, until: Instant) -> bool {
        let mut status = self.shared.status.subscribe();
        loop {
            {
                let now = *status.borrow_and_update();
                let confirmed = registration.channel.subscribed_in.load(Ordering::Acquire);
                if now.epoch != 0 && confirmed == now.epoch && !now.down {
                    return true;
                }
                if now.down {
                    return false;
                }
            }
            match tokio::time::timeout_at(until, status.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return false,
            }
        }
    }
}

impl Wakeups {
    /// Completes once the registration's channel is no longer subscribed on a live connection
    /// (the connection broke or was replaced): messages may have been missed from then on, and
    /// a waiter should look for itself and poll until [`subscribed`](Self::subscribed) again.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn unsubscribed(&self, registration: &Registration) {
        let mut status = self.shared.status.subscribe();
        loop {
            {
                let now = *status.borrow_and_update();
                let confirmed = registration.channel.subscribed_in.load(Ordering::Acquire);
                if now.down || now.epoch == 0 || confirmed != now.epoch {
                    return;
                }
            }
            if status.changed().await.is_err() {
                return;
            }
        }
    }
}

impl Shared {
    /// Forgets the channels nobody waits on and returns them, to unsubscribe.
    fn take_idle(&self) -> Vec<String> {
        let mut channels = self.channels();
        let idle: Vec<String> = channels
            .iter()
            .filter(|(_, c)| c.users.load(Ordering::Acquire) == 0)
            .map(|(name, _)| name.clone())
            .collect();
        for name in &idle {
            channels.remove(name);
        }
        idle
    }

    fn channels(&self) -> MutexGuard<'_, HashMap<String, Arc<Channel>>> {
        // Every critical section leaves the map consistent before anything can panic.
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wake(&self, channel: &str, payload: &[u8]) {
        let entry = self.channels().get(channel).cloned();
        if let Some(entry) = entry {
            entry.wake(payload);
        }
    }

    fn set_status(&self, epoch: u64, down: bool) {
        self.status.send_modify(|s| {
            s.epoch = epoch;
            s.down = down;
        });
    }
}

/// The background task that owns the subscriber connection.
struct Listener {
    shared: Arc<Shared>,
    /// The server to subscribe on; with Sentinel, the listener follows the primary.
    target: Target,
    connect_timeout: Duration,
    request_timeout: Duration,
    /// The redacted URL, for logs.
    endpoint: String,
    requests: mpsc::UnboundedReceiver<()>,
    epoch: u64,
    /// The [`Target::generation`] of the server the connection is on.
    generation: u64,
    /// The server refused the last subscription.
    refused: bool,
}

/// Why the listener left its connection.
enum Ended {
    /// The client was dropped: stop.
    Shutdown,
    /// The connection broke or a request on it failed: reconnect.
    Broken,
}

impl Listener {
    async fn run(mut self) {
        let mut pause = MIN_RETRY_PAUSE;
        loop {
            if self.shared.channels().is_empty() && self.requests.recv().await.is_none() {
                return;
            }
            if let Some((sink, stream)) = self.connect().await {
                pause = MIN_RETRY_PAUSE;
                match self.serve(sink, stream).await {
                    Ended::Shutdown => return,
                    Ended::Broken => tracing::debug!(
                        endpoint = %self.endpoint,
                        "release notifications: connection lost; waiters poll meanwhile"
                    ),
                }
            }
            // Down (never connected, or broken): waiters poll until a new connection is up.
            self.shared.set_status(self.epoch, true);
            let wait = if self.refused { REFUSED_PAUSE } else { pause };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                request = self.requests.recv() => {
                    if request.is_none() {
                        return;
                    }
                }
            }
            pause = (pause * 2).min(MAX_RETRY_PAUSE);
        }
    }

    /// Opens a subscriber connection and subscribes every channel tasks wait on.
    async fn connect(&mut self) -> Option<(PubSubSink, PubSubStream)> {
        self.generation = self.target.generation();
        let client = self.target.client();
        let opened = tokio::time::timeout(self.connect_timeout, client.get_async_pubsub()).await;
        let pubsub = match opened {
            Ok(Ok(pubsub)) => pubsub,
            Ok(Err(error)) => {
                tracing::debug!(endpoint = %self.endpoint, %error, "release notifications: cannot connect");
                self.target.suspect();
                return None;
            }
            Err(_) => {
                tracing::debug!(endpoint = %self.endpoint, "release notifications: connect timed out");
                self.target.suspect();
                return None;
            }
        };
        let (mut sink, stream) = pubsub.split();
        self.epoch += 1;
        let wanted: Vec<(String, Arc<Channel>)> = self
            .shared
            .channels()
            .iter()
            .map(|(name, channel)| (name.clone(), channel.clone()))
            .collect();
        if !self.subscribe(&mut sink, wanted).await {
            return None;
        }
        self.shared.set_status(self.epoch, false);
        Some((sink, stream))
    }

    /// Subscribes `channels` on `sink` and marks them confirmed; false if the connection failed.
    async fn subscribe(
        &mut self,
        sink: &mut PubSubSink,
        channels: Vec<(String, Arc<Channel>)>,
    ) -> bool {
        if channels.is_empty() {
            return true;
        }
        let names: Vec<&str> = channels.iter().map(|(name, _)| name.as_str()).collect();
        match tokio::time::timeout(self.request_timeout, sink.subscribe(&names)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                let refused = error.code() == Some("NOPERM");
                if refused && !self.refused {
                    tracing::warn!(endpoint = %self.endpoint, %error, "release notifications refused by the server; waiters poll");
                } else {
                    tracing::debug!(endpoint = %self.endpoint, %error, "release notifications: SUBSCRIBE failed");
                }
                self.refused = refused;
                return false;
            }
            Err(_) => {
                tracing::debug!(endpoint = %self.endpoint, "release notifications: SUBSCRIBE timed out");
                return false;
            }
        }
        self.refused = false;
        for (_, channel) in &channels {
            channel.subscribed_in.store(self.epoch, Ordering::Release);
        }
        // Wake the tasks waiting for their subscription.
        self.shared.set_status(self.epoch, false);
        true
    }

    /// Delivers messages and handles requests until the connection breaks or the client is gone.
    async fn serve(&mut self, mut sink: PubSubSink, mut stream: PubSubStream) -> Ended {
        let mut sweep = tokio::time::interval_at(Instant::now() + SWEEP_EVERY, SWEEP_EVERY);
        let mut health =
            tokio::time::interval_at(Instant::now() + HEALTH_CHECK_EVERY, HEALTH_CHECK_EVERY);
        loop {
            tokio::select! {
                message = stream.next() => match message {
                    Some(message) => self
                        .shared
                        .wake(message.get_channel_name(), message.get_payload_bytes()),
                    None => return Ended::Broken,
                },
                request = self.requests.recv() => {
                    if request.is_none() {
                        return Ended::Shutdown;
                    }
                    // Coalesce every request that is already queued into one SUBSCRIBE.
                    while let Ok(()) = self.requests.try_recv() {}
                    let pending = self.unconfirmed();
                    if !self.subscribe(&mut sink, pending).await {
                        return Ended::Broken;
                    }
                }
                _ = sweep.tick() => {
                    if !self.sweep(&mut sink).await {
                        return Ended::Broken;
                    }
                }
                _ = self.target.moved(self.generation) => {
                    tracing::debug!(endpoint = %self.endpoint, "release notifications: the primary moved");
                    return Ended::Broken;
                }
                _ = health.tick() => {
                    let answer = tokio::time::timeout(self.request_timeout, sink.ping::<redis::Value>());
                    if !matches!(answer.await, Ok(Ok(_))) {
                        tracing::debug!(endpoint = %self.endpoint, "release notifications: PING got no answer");
                        return Ended::Broken;
                    }
                }
            }
        }
    }

    /// The channels wanted but not yet subscribed on this connection.
    fn unconfirmed(&self) -> Vec<(String, Arc<Channel>)> {
        self.shared
            .channels()
            .iter()
            .filter(|(_, c)| c.subscribed_in.load(Ordering::Acquire) != self.epoch)
            .map(|(name, channel)| (name.clone(), channel.clone()))
            .collect()
    }

    /// Forgets and unsubscribes the channels nobody waits on; false if the connection failed.
    async fn sweep(&self, sink: &mut PubSubSink) -> bool {
        let idle = self.shared.take_idle();
        if idle.is_empty() {
            return true;
        }
        matches!(
            tokio::time::timeout(self.request_timeout, sink.unsubscribe(&idle)).await,
            Ok(Ok(()))
        )
    }
}

impl Wakeups {
    /// Starts a listener of another kind on the waiting tasks' shared state — a cluster's, which
    /// subscribes each channel on its shard (see [`crate::cluster`]). It opens no connection
    /// until a task waits.
    pub(crate) fn start_with<F, Fut>(listener: F, tag: Arc<str>) -> Self
    where
        F: FnOnce(Feed) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let shared = Arc::new(Shared {
            channels: Mutex::new(HashMap::new()),
            status: watch::Sender::new(Status {
                epoch: 0,
                down: false,
            }),
        });
        let (requests, rx) = mpsc::unbounded_channel();
        tokio::spawn(listener(Feed {
            shared: shared.clone(),
            requests: rx,
        }));
        Wakeups {
            shared,
            requests,
            tag,
        }
    }
}

/// What a listener started with [`Wakeups::start_with`] works on: the channels tasks wait on,
/// their confirmations, and the requests to subscribe new ones.
pub(crate) struct Feed {
    shared: Arc<Shared>,
    /// One message per newly registered channel; `None` once the client is gone.
    pub(crate) requests: mpsc::UnboundedReceiver<()>,
}

impl Feed {
    /// Whether any task waits (or waited recently) on a channel.
    pub(crate) fn has_channels(&self) -> bool {
        !self.shared.channels().is_empty()
    }

    /// Delivers a message of `channel` (see [`Wakeups::register`]).
    pub(crate) fn wake(&self, channel: &str, payload: &[u8]) {
        self.shared.wake(channel, payload);
    }

    /// Publishes the listener's state: `down` makes waiters poll instead of waiting for a
    /// subscription to be confirmed.
    pub(crate) fn set_status(&self, epoch: u64, down: bool) {
        self.shared.set_status(epoch, down);
    }

    /// The channels wanted but not confirmed in `epoch`.
    pub(crate) fn unconfirmed(&self, epoch: u64) -> Vec<String> {
        self.shared
            .channels()
            .iter()
            .filter(|(_, c)| c.subscribed_in.load(Ordering::Acquire) != epoch)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Marks `names` subscribed in `epoch`.
    pub(crate) fn confirm(&self, names: &[&str], epoch: u64) {
        let channels = self.shared.channels();
        for name in names {
            if let Some(channel) = channels.get(*name) {
                channel.subscribed_in.store(epoch, Ordering::Release);
            }
        }
    }

    /// Marks `name` as no longer subscribed; true if a task still wants it.
    pub(crate) fn unconfirm(&self, name: &str) -> bool {
        match self.shared.channels().get(name) {
            Some(channel) => {
                channel.subscribed_in.store(0, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// Forgets the channels nobody waits on and returns them, to unsubscribe.
    pub(crate) fn take_idle(&self) -> Vec<String> {
        self.shared.take_idle()
    }
}
