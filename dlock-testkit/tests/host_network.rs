//! The fixtures on the host's network (`DLOCK_TEST_NETWORK=host`, what `dlock-bench` measures
//! on): each server listens on loopback ports of its own, members of a cluster find each other
//! there, and a fixture that cannot run there says so instead of starting on a bridge.
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-testkit --test host_network
//! ```

#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::time::Duration;

use anyhow::ensure;
use dlock_testkit::fixtures::{
    docker_opt_out, EtcdCluster, Member, PostgresServer, RedisCluster, RedisMasters, ZkEnsemble,
    NETWORK_ENV,
};
use dlock_testkit::trials;
use libtest_mimic::{Arguments, Trial};
use tokio::net::TcpStream;
use zookeeper_client as zk;

/// Upper bound for one whole trial, only to end a hung one.
const TRIAL_TIMEOUT: Duration = Duration::from_secs(300);

fn main() {
    // Before any thread starts: every fixture of this process runs on the host's network.
    std::env::set_var(NETWORK_ENV, "host");
    let args = Arguments::from_args();
    let trials = vec![
        trial("redis_masters_on_loopback", redis_masters),
        trial("zookeeper_ensemble_forms_on_loopback", zookeeper_ensemble),
        trial("etcd_cluster_forms_on_loopback", etcd_cluster),
        trial("postgres_server_on_loopback", postgres_server),
        trial("a_redis_cluster_refuses_the_host_network", redis_cluster),
    ];
    libtest_mimic::run(&args, trials).exit();
}

fn trial<F, Fut>(name: &'static str, body: F) -> Trial
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let ignored = docker_opt_out();
    trials::trial(name, TRIAL_TIMEOUT, move || async move {
        ensure!(!ignored, "DLOCK_TEST_NO_DOCKER=1: this trial needs Docker");
        body().await
    })
    .with_ignored_flag(ignored)
}

/// Every member runs on the host's network and its port answers on loopback; no other address
/// of this machine answers it, so a server without a password is not reachable from outside.
async fn on_loopback_only(members: &[Member]) -> anyhow::Result<()> {
    let other = other_address()?;
    for member in members {
        ensure!(
            member.on_host_network(),
            "{member:?} is not on the host's network"
        );
        TcpStream::connect(member.endpoint()).await?;
        let elsewhere = format!("{other}:{}", member.host_port());
        ensure!(
            TcpStream::connect(&elsewhere).await.is_err(),
            "{elsewhere} answers: the server listens beyond loopback"
        );
    }
    Ok(())
}

/// An address of this machine other than loopback: the one it would send from towards an
/// address off the machine (a UDP socket's `connect` only picks the route; nothing is sent).
/// Tried towards a documentation address, then into Docker's default bridge network (on
/// `docker0`, which a machine with a Docker engine has unless configured otherwise), then a
/// private address.
fn other_address() -> anyhow::Result<std::net::IpAddr> {
    for towards in ["192.0.2.1:9", "172.17.255.254:9", "10.255.255.254:9"] {
        let socket = std::net::UdpSocket::bind("0.0.0.0:0")?;
        if socket.connect(towards).is_err() {
            continue;
        }
        let address = socket.local_addr()?.ip();
        if !address.is_loopback() && !address.is_unspecified() {
            return Ok(address);
        }
    }
    anyhow::bail!("no route off this machine: it has no address but loopback to test with")
}

async fn redis_masters() -> anyhow::Result<()> {
    let masters = RedisMasters::start(3).await?;
    on_loopback_only(masters.members()?).await?;
    for (i, url) in masters.urls().iter().enumerate() {
        let mut con = redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        // Independent servers: each holds only what was written to it.
        let _: () = redis::cmd("SET")
            .arg("host")
            .arg(i)
            .query_async(&mut con)
            .await?;
        let got: usize = redis::cmd("GET").arg("host").query_async(&mut con).await?;
        ensure!(got == i, "master {i} read {got}");
    }
    Ok(())
}

async fn zookeeper_ensemble() -> anyhow::Result<()> {
    let ensemble = ZkEnsemble::start(3).await?;
    on_loopback_only(ensemble.members()?).await?;
    // One leader means the members reached each other on their loopback peer ports.
    ensemble.leader().await?;
    let endpoints = ensemble.endpoints();
    let first = zk::Client::connect(&endpoints[0]).await?;
    first
        .create(
            "/host",
            b"1",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await?;
    let last = zk::Client::connect(&endpoints[2]).await?;
    last.sync("/host").await?;
    let (data, _) = last.get_data("/host").await?;
    ensure!(
        data == b"1",
        "a write on member 1 read {data:?} on member 3"
    );
    Ok(())
}

async fn etcd_cluster() -> anyhow::Result<()> {
    let cluster = EtcdCluster::start(3).await?;
    on_loopback_only(cluster.members()?).await?;
    let endpoints = cluster.endpoints();
    let mut first = etcd_client::Client::connect([&endpoints[0]], None).await?;
    first.put("host", "1", None).await?;
    let mut last = etcd_client::Client::connect([&endpoints[2]], None).await?;
    let got = last.get("host", None).await?;
    ensure!(
        got.kvs().first().map(|kv| kv.value()) == Some(b"1".as_slice()),
        "a write on member 1 read {got:?} on member 3"
    );
    ensure!(
        last.member_list().await?.members().len() == 3,
        "not three members"
    );
    Ok(())
}

async fn postgres_server() -> anyhow::Result<()> {
    let server = PostgresServer::start().await?;
    on_loopback_only(std::slice::from_ref(server.member()?)).await?;
    // Over TCP on the server's own port, as a client on the host connects.
    let port = server.member()?.host_port();
    let answer = server
        .psql_with(
            &format!("host=127.0.0.1 port={port} user=postgres dbname=postgres"),
            "SELECT 41 + 1",
        )
        .await?;
    ensure!(answer == "42", "SELECT answered {answer:?}");
    Ok(())
}

async fn redis_cluster() -> anyhow::Result<()> {
    let refused = RedisCluster::start(3).await;
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    ensure!(
        message.contains(NETWORK_ENV),
        "a Redis cluster on the host's network: {message:?}"
    );
    Ok(())
}
