//! Every request to etcd, bounded in time and sent to the pinned member.
//!
//! While no member is reachable a request would otherwise wait for a connection indefinitely, so
//! each runs under the client's request timeout (see [`Endpoints`]), and its failure keeps enough
//! detail to tell "the session lease is gone" from "no answer".

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::Error;
use etcd_client::{
    DeleteOptions, DeleteResponse, GetOptions, GetResponse, LeaseGrantResponse,
    LeaseKeepAliveStream, LeaseKeeper, Txn, TxnResponse, WatchOptions, WatchStream,
};
use tokio::sync::watch;

use crate::endpoints::Endpoints;
use crate::error::{from_client, is_lease_not_found, timed_out};

/// Why a request failed.
#[derive(Debug)]
pub(crate) enum RequestError {
    /// The server or the transport answered with an error.
    Client(etcd_client::Error),
    /// No answer arrived in time.
    Timeout { what: &'static str, after: Duration },
}

impl RequestError {
    /// Whether the server said the lease named in the request does not exist.
    pub(crate) fn is_lease_not_found(&self) -> bool {
        matches!(self, RequestError::Client(e) if is_lease_not_found(e))
    }

    /// Whether a member answered that the cluster has no leader.
    pub(crate) fn is_no_leader(&self) -> bool {
        matches!(self, RequestError::Client(e) if crate::error::is_no_leader(e))
    }
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::Client(e) => fmt::Display::fmt(e, f),
            RequestError::Timeout { what, after } => {
                write!(f, "etcd {what}: no answer within {after:?}")
            }
        }
    }
}

impl From<RequestError> for Error {
    fn from(error: RequestError) -> Self {
        match error {
            RequestError::Client(e) => from_client(e),
            RequestError::Timeout { what, after } => timed_out(what, after),
        }
    }
}

/// The requests this crate sends, through one client's [`Endpoints`].
#[derive(Clone)]
pub(crate) struct Requests {
    endpoints: Arc<Endpoints>,
}

impl Requests {
    pub(crate) fn new(endpoints: Endpoints) -> Self {
        Requests {
            endpoints: Arc::new(endpoints),
        }
    }

    /// The members and which one is in use.
    pub(crate) fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    /// Changes whenever requests move to another member; long-lived streams follow it.
    pub(crate) fn generation(&self) -> watch::Receiver<u64> {
        self.endpoints.generation()
    }

    /// The request timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.endpoints.timeout()
    }

    /// One transaction.
    pub(crate) async fn txn(&self, txn: Txn) -> Result<TxnResponse, RequestError> {
        self.endpoints
            .call("txn", |client| {
                let (mut kv, txn) = (client.kv_client(), txn.clone());
                async move { kv.txn(txn).await }
            })
            .await
    }

    /// One delete, outside a transaction: where no condition is needed, it costs the members
    /// less than a transaction does (measured on etcd 3.4 with 64 tasks; see `docs/performance.md`).
    pub(crate) async fn delete(
        &self,
        key: Vec<u8>,
        options: DeleteOptions,
    ) -> Result<DeleteResponse, RequestError> {
        self.endpoints
            .call("delete", |client| {
                let mut kv = client.kv_client();
                let (key, options) = (key.clone(), options.clone());
                async move { kv.delete(key, Some(options)).await }
            })
            .await
    }

    /// One range read (for reads in pages, which a transaction cannot continue).
    pub(crate) async fn get(
        &self,
        key: Vec<u8>,
        options: GetOptions,
    ) -> Result<GetResponse, RequestError> {
        self.endpoints
            .call("range", |client| {
                let mut kv = client.kv_client();
                let (key, options) = (key.clone(), options.clone());
                async move { kv.get(key, Some(options)).await }
            })
            .await
    }

    /// Authenticates again with the pinned member and replaces the client's token, for streams
    /// the server refused because their token expired (unary requests do this by themselves).
    pub(crate) async fn refresh_token(&self) -> Result<(), RequestError> {
        self.endpoints
            .call("authenticate", |client| {
                let client = client.clone();
                async move { client.refresh_token().await }
            })
            .await
    }

    /// Opens a watch; returns once the server has answered the stream's creation.
    pub(crate) async fn watch(
        &self,
        key: Vec<u8>,
        options: WatchOptions,
    ) -> Result<WatchStream, RequestError> {
        self.endpoints
            .call("watch", |client| {
                let mut watch = client.watch_client();
                let (key, options) = (key.clone(), options.clone());
                async move { watch.watch(key, Some(options)).await }
            })
            .await
    }

    /// Grants a lease of `seconds`, within `budget`.
    pub(crate) async fn lease_grant(
        &self,
        seconds: i64,
        budget: Duration,
    ) -> Result<LeaseGrantResponse, RequestError> {
        self.endpoints
            .call_within("lease grant", budget, |client| {
                let mut lease = client.lease_client();
                async move { lease.grant(seconds, None).await }
            })
            .await
    }

    /// Revokes lease `id`.
    pub(crate) async fn lease_revoke(&self, id: i64, budget: Duration) -> Result<(), RequestError> {
        self.endpoints
            .call_within("lease revoke", budget, |client| {
                let mut lease = client.lease_client();
                async move { lease.revoke(id).await.map(|_| ()) }
            })
            .await
    }

    /// Opens a keep-alive stream for lease `id` (which sends the first keep-alive and waits for
    /// its answer), within `budget`.
    pub(crate) async fn lease_keep_alive(
        &self,
        id: i64,
        budget: Duration,
    ) -> Result<(LeaseKeeper, LeaseKeepAliveStream), RequestError> {
        self.endpoints
            .call_within("lease keep-alive", budget, |client| {
                let mut lease = client.lease_client();
                async move { lease.keep_alive(id).await }
            })
            .await
    }
}
