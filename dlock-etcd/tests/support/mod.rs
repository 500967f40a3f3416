//! What the etcd test binaries share: clients, a raw etcd client for checking the server's side,
//! a freezable client, `etcdctl` inside a member's container, and the runtime fixtures start on.

#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bollard::exec::{CreateExecOptions, StartExecResults};
use dlock_core::backend::LockKey;
use dlock_core::DistributedLock;
use dlock_etcd::EtcdLock;
use dlock_testkit::{Freeze, FreezeProxy};
use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The namespace the test clients use.
pub const NAMESPACE: &str = "dlock-test/";

/// Upper bound for one whole etcd-specific trial, to end a hung one.
pub const TRIAL_BUDGET: Duration = Duration::from_secs(120);

/// `N` independent clients of `endpoints` (each with its own session of `session_ttl`), shared
/// as the cases hand them to tasks.
pub async fn clients<const N: usize>(
    endpoints: &[String],
    session_ttl: Duration,
) -> anyhow::Result<[Arc<EtcdLock>; N]> {
    let mut clients = Vec::with_capacity(N);
    for _ in 0..N {
        clients.push(Arc::new(client(endpoints, session_ttl).await?));
    }
    clients
        .try_into()
        .map_err(|_| anyhow::anyhow!("not {N} clients"))
}

/// A client of `endpoints` with test timings: a short session TTL, so that the server frees the
/// locks of a frozen client within a few seconds.
pub async fn client(endpoints: &[String], session_ttl: Duration) -> anyhow::Result<EtcdLock> {
    Ok(builder(endpoints, session_ttl).connect().await?)
}

/// A client like [`client`]'s whose owner records carry `label`.
pub async fn labelled_client(
    endpoints: &[String],
    session_ttl: Duration,
    label: &str,
) -> anyhow::Result<Arc<EtcdLock>> {
    Ok(Arc::new(
        builder(endpoints, session_ttl)
            .with_owner(label)
            .connect()
            .await?,
    ))
}

/// The builder behind [`client`], for a test that connects in its own way (retrying, say).
pub fn builder(endpoints: &[String], session_ttl: Duration) -> dlock_etcd::EtcdLockBuilder {
    EtcdLock::builder()
        .with_endpoints(endpoints.iter().cloned())
        .with_prefix(NAMESPACE)
        .with_session_timeout(session_ttl)
        .with_request_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(10))
}

/// A raw etcd client, to look at and tamper with the server's state.
pub async fn raw(endpoints: &[String]) -> anyhow::Result<etcd_client::Client> {
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(5));
    Ok(etcd_client::Client::connect(endpoints, Some(options)).await?)
}

/// The contender keys (key, value, create revision, lease) stored for lock `key`.
pub async fn contenders(
    raw: &etcd_client::Client,
    locks: &EtcdLock,
    key: &str,
) -> anyhow::Result<Vec<(String, String, i64, i64)>> {
    let prefix = format!("{}/", locks.layout().lock_name(&LockKey::new(key)?));
    keys_under(raw, &prefix).await
}

/// The keys under `prefix`: (key, value, create revision, lease), oldest first.
pub async fn keys_under(
    raw: &etcd_client::Client,
    prefix: &str,
) -> anyhow::Result<Vec<(String, String, i64, i64)>> {
    let options = etcd_client::GetOptions::new().with_prefix().with_sort(
        etcd_client::SortTarget::Create,
        etcd_client::SortOrder::Ascend,
    );
    let response = raw.clone().get(prefix, Some(options)).await?;
    response
        .kvs()
        .iter()
        .map(|kv| {
            Ok((
                kv.key_str()?.to_owned(),
                kv.value_str()?.to_owned(),
                kv.create_revision(),
                kv.lease(),
            ))
        })
        .collect()
}

/// How many keys the server stores under `prefix`.
pub async fn count(raw: &mut etcd_client::Client, prefix: &str) -> anyhow::Result<u64> {
    let options = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    let response = raw.get(prefix, Some(options)).await?;
    Ok(u64::try_from(response.count()).unwrap_or(0))
}

/// Polls `check` every 50 ms until it holds, for at most `within`.
pub async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + within;
    loop {
        if check().await? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("{what}: not within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits up to `within` until the number of contender keys stored for lock `key` is `wanted`
/// of it; `what` names the wait in the error.
pub async fn contenders_until(
    what: &str,
    within: Duration,
    raw: &etcd_client::Client,
    locks: &EtcdLock,
    key: &str,
    wanted: impl Fn(usize) -> bool,
) -> anyhow::Result<()> {
    let wanted = &wanted;
    eventually(what, within, || async move {
        Ok(wanted(contenders(raw, locks, key).await?.len()))
    })
    .await
}

/// A client that reaches `endpoint` (`127.0.0.1:PORT`) through a freezable proxy.
pub async fn freezable_client(
    endpoint: &str,
    session_ttl: Duration,
) -> anyhow::Result<(Arc<dyn DistributedLock>, Arc<dyn Freeze>)> {
    let target = endpoint
        .trim_start_matches("http://")
        .parse()
        .context("fixture endpoint")?;
    let proxy = FreezeProxy::start(target).await?;
    let locks = client(&[format!("http://{}", proxy.addr())], session_ttl).await?;
    Ok((Arc::new(locks), Arc::new(proxy)))
}

/// A command running inside a container (`docker exec`), with its output collected.
pub struct Exec {
    output: JoinHandle<String>,
}

impl Exec {
    /// Starts `cmd` in `container`.
    pub async fn start(container: &str, cmd: Vec<String>) -> anyhow::Result<Exec> {
        let docker = dlock_testkit::fixtures::connect_docker().await?;
        let exec = docker
            .create_exec(
                container,
                CreateExecOptions {
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    env: Some(vec!["ETCDCTL_API=3".to_owned()]),
                    cmd: Some(cmd),
                    ..Default::default()
                },
            )
            .await?;
        let StartExecResults::Attached { mut output, .. } =
            docker.start_exec(&exec.id, None).await?
        else {
            bail!("docker exec did not attach");
        };
        let output = tokio::spawn(async move {
            let mut text = String::new();
            while let Some(Ok(chunk)) = output.next().await {
                text.push_str(&chunk.to_string());
            }
            text
        });
        Ok(Exec { output })
    }

    /// Waits for the command to end and returns what it printed.
    pub async fn finish(self, within: Duration) -> anyhow::Result<String> {
        Ok(tokio::time::timeout(within, self.output)
            .await
            .context("the command did not end in time")??)
    }
}

/// `etcdctl` inside a member's container, talking to that member.
pub fn etcdctl(args: &[&str]) -> Vec<String> {
    let mut cmd = vec![
        "etcdctl".to_owned(),
        "--endpoints=http://127.0.0.1:2379".to_owned(),
    ];
    cmd.extend(args.iter().map(|a| (*a).to_owned()));
    cmd
}
