//! The members a client talks to: one pinned at a time (the leader, when known), and fail-over
//! to the next.
//!
//! etcd-client can balance requests over several endpoints, but its balancer keeps choosing a
//! member that refuses connections (a refusal is instant, so that member looks idle), and its
//! streams stay on whatever connection they were opened on. So this client keeps one
//! single-endpoint connection per member and sends everything — requests, the keep-alive stream,
//! watches — to one *pinned* member. When a request to it fails in a way another member might
//! not (connection refused or reset, no answer, no leader), the next member is pinned and the
//! request is tried there, within the same overall timeout. A request that gets no answer also
//! drops the connection it went out on: a connection can go silent for good (half-open, a route
//! gone for that one flow) while a new one to the same member works, and the HTTP/2 keep-alive
//! would take seconds more to notice. A change of pinned member or of connection bumps a
//! generation counter, which the long-lived streams follow, so they move too.
//!
//! Retrying after a failure whose outcome is unknown is safe for every request this crate sends:
//! joining the queue finds its own key on a second attempt, reads and watches change nothing,
//! deletions are conditional, and a duplicate lease grant only leaves an unused lease to expire.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use etcd_client::{Client, ConnectOptions};
use tokio::sync::{watch, Mutex};
use tokio::time::Instant;

use crate::error::is_temporary;
use crate::requests::RequestError;

/// One member's connection, made on first use and again after one stopped answering.
struct Member {
    endpoint: String,
    client: ArcSwapOption<Client>,
    /// Held while a connection is made, so that concurrent requests make one.
    connecting: Mutex<()>,
}

/// The members of one client's cluster.
pub(crate) struct Endpoints {
    members: Vec<Member>,
    options: ConnectOptions,
    pinned: AtomicUsize,
    generation: watch::Sender<u64>,
    timeout: Duration,
}

impl Endpoints {
    /// Prepares connections to `endpoints`; nothing is sent yet. The first member pinned is chosen
    /// at random, so that many clients spread over the cluster.
    pub(crate) fn new(endpoints: Vec<String>, options: ConnectOptions, timeout: Duration) -> Self {
        let start = if endpoints.is_empty() {
            0
        } else {
            usize::try_from(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.subsec_nanos())
                    .unwrap_or(0),
            )
            .unwrap_or(0)
                % endpoints.len()
        };
        Endpoints {
            members: endpoints
                .into_iter()
                .map(|endpoint| Member {
                    endpoint,
                    client: ArcSwapOption::empty(),
                    connecting: Mutex::new(()),
                })
                .collect(),
            options,
            pinned: AtomicUsize::new(start),
            generation: watch::channel(0).0,
            timeout,
        }
    }

    /// The endpoint requests currently go to.
    pub(crate) fn pinned_endpoint(&self) -> &str {
        let index = self.pinned.load(Ordering::Relaxed);
        self.members
            .get(index)
            .map_or("", |member| member.endpoint.as_str())
    }

    /// A receiver that changes whenever another member is pinned.
    pub(crate) fn generation(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// The request timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// [`call_within`](Self::call_within) the request timeout.
    pub(crate) async fn call<T, F, Fut>(&self, what: &'static str, op: F) -> Result<T, RequestError>
    where
        F: FnMut(&Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_within(what, self.timeout, op).await
    }

    /// Moves away from member `index` if it is still the pinned one, and drops the connection
    /// to it if `why` is that it did not answer.
    fn failed(&self, index: usize, why: &RequestError) {
        let mut moved = false;
        if matches!(why, RequestError::Timeout { .. }) {
            if let Some(member) = self.members.get(index) {
                if member.client.swap(None).is_some() {
                    tracing::debug!(member = %member.endpoint, %why, "etcd: replacing a connection that does not answer");
                    moved = true;
                }
            }
        }
        let next = (index + 1) % self.members.len().max(1);
        if self
            .pinned
            .compare_exchange(index, next, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
            && next != index
        {
            tracing::debug!(
                from = %self.members[index].endpoint,
                to = %self.members[next].endpoint,
                %why,
                "etcd: failing over to another member"
            );
            moved = true;
        }
        if moved {
            self.generation.send_modify(|g| *g += 1);
        }
    }

    /// Pins the member that says it is the leader, if one does within the request timeout.
    pub(crate) async fn pin_leader(&self) {
        let budget = self.timeout;
        let mut asking = tokio::task::JoinSet::new();
        for index in 0..self.members.len() {
            let Ok(client) = self.client(index, budget).await else {
                continue;
            };
            let mut maintenance = client.maintenance_client();
            asking.spawn(async move {
                let status = tokio::time::timeout(budget, maintenance.status()).await;
                let status = status.ok()?.ok()?;
                let member = status.header()?.member_id();
                (member != 0 && status.leader() == member).then_some(index)
            });
        }
        while let Some(answer) = asking.join_next().await {
            if let Ok(Some(leader)) = answer {
                let before = self.pinned.swap(leader, Ordering::SeqCst);
                if before != leader {
                    tracing::debug!(leader = %self.members[leader].endpoint, "etcd: pinned the leader");
                    self.generation.send_modify(|g| *g += 1);
                }
                return;
            }
        }
    }

    /// The connection to member `index`, made (within `budget`) if there is none.
    async fn client(&self, index: usize, budget: Duration) -> Result<Arc<Client>, RequestError> {
        let member = &self.members[index];
        if let Some(client) = member.client.load_full() {
            return Ok(client);
        }
        let connect = async {
            let _connecting = member.connecting.lock().await;
            if let Some(client) = member.client.load_full() {
                return Ok(client);
            }
            // Without credentials this sends nothing; with them it authenticates.
            let client = Arc::new(
                Client::connect([member.endpoint.as_str()], Some(self.options.clone())).await?,
            );
            member.client.store(Some(client.clone()));
            Ok(client)
        };
        match tokio::time::timeout(budget, connect).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => Err(RequestError::Client(e)),
            Err(_) => Err(RequestError::Timeout {
                what: "connect",
                after: budget,
            }),
        }
    }

    /// Runs `op` against the pinned member, failing over to the next ones on failures another
    /// member might not have, all within `budget`.
    pub(crate) async fn call_within<T, F, Fut>(
        &self,
        what: &'static str,
        budget: Duration,
        mut op: F,
    ) -> Result<T, RequestError>
    where
        F: FnMut(&Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + budget;
        let count = self.members.len();
        let mut last = RequestError::Timeout {
            what,
            after: budget,
        };
        for attempt in 0..count {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            // Each member left gets an equal share of what is left, so a silent member cannot
            // use up the whole timeout while others could answer.
            let share = (deadline - now) / u32::try_from(count - attempt).unwrap_or(1);
            let index = self.pinned.load(Ordering::SeqCst) % count.max(1);
            let outcome = match self.client(index, share).await {
                Ok(client) => match tokio::time::timeout(share, op(&client)).await {
                    Ok(Ok(value)) => return Ok(value),
                    Ok(Err(e)) => RequestError::Client(e),
                    Err(_) => RequestError::Timeout { what, after: share },
                },
                Err(e) => e,
            };
            let member_trouble = match &outcome {
                RequestError::Client(e) => is_temporary(e) && !outcome.is_lease_not_found(),
                RequestError::Timeout { .. } => true,
            };
            if !member_trouble {
                return Err(outcome);
            }
            self.failed(index, &outcome);
            // A member that answered "no leader" says more than one that refused or stayed
            // silent: the election it reports is what a caller may wait out.
            if !last.is_no_leader() || outcome.is_no_leader() {
                last = outcome;
            }
        }
        Err(match last {
            RequestError::Timeout { .. } => RequestError::Timeout {
                what,
                after: budget,
            },
            other => other,
        })
    }
}
