//! What the PostgreSQL test binaries share: clients with test timings, a freezable client, and
//! a raw connection to look at the server's side.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use dlock_core::DistributedLock;
use dlock_postgres::PgLock;
use dlock_testkit::{url_target, url_via, Freeze, FreezeProxy};

/// The session timeout of the test clients: the server ends a silent client's session (and frees
/// its locks) this long after it last heard from it.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(2);

/// The lock names of the test clients start with this.
pub const NAMESPACE: &str = "dlock-test/";

/// A client of the server at `url` with test timings.
pub async fn client(url: &str) -> anyhow::Result<Arc<PgLock>> {
    Ok(Arc::new(builder(url)?.connect().await?))
}

/// The builder of [`client`], for other settings.
pub fn builder(url: &str) -> anyhow::Result<dlock_postgres::PgLockBuilder> {
    Ok(dlock_postgres::PgLockBuilder::from_url(url)?
        .with_session_timeout(SESSION_TIMEOUT)
        .with_request_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(10)))
}

/// A client whose link to the server goes through a proxy that can freeze it.
pub async fn freezable_client(
    url: &str,
) -> anyhow::Result<(Arc<dyn DistributedLock>, Arc<dyn Freeze>)> {
    let proxy = FreezeProxy::start(url_target(url, 5432)?).await?;
    let locks = client(&url_via(url, proxy.addr())?).await?;
    Ok((locks, Arc::new(proxy)))
}

/// A plain driver connection, to look at the server's side.
pub async fn raw(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let config: tokio_postgres::Config = url.parse().context("the fixture's URL")?;
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// A plain driver connection that hears notifications: each one as (channel, payload).
pub async fn raw_listener(
    url: &str,
) -> anyhow::Result<(
    tokio_postgres::Client,
    tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
)> {
    use futures::StreamExt;
    let config: tokio_postgres::Config = url.parse().context("the fixture's URL")?;
    let (client, mut connection) = config.connect(tokio_postgres::NoTls).await?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                if tx
                    .send((n.channel().to_string(), n.payload().to_string()))
                    .is_err()
                {
                    return;
                }
            }
        }
    });
    Ok((client, rx))
}
