//! Looking at the server directly, with the plain client library.

use std::time::Duration;

use zookeeper_client as zk;

/// A plain client of `hosts` (`host:port,…`).
pub async fn connect(hosts: &str) -> anyhow::Result<zk::Client> {
    Ok(zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(hosts)
        .await?)
}

/// The children of `path`; none if it does not exist.
pub async fn children(client: &zk::Client, path: &str) -> anyhow::Result<Vec<String>> {
    match client.list_children(path).await {
        Ok(children) => Ok(children),
        Err(zk::Error::NoNode) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// The stat of `path`, if it exists.
pub async fn stat(client: &zk::Client, path: &str) -> anyhow::Result<Option<zk::Stat>> {
    Ok(client.check_stat(path).await?)
}
