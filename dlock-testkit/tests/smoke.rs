//! Smoke test of the fixtures themselves, with the raw client crates: each trial starts one
//! fixture, talks to it, injects the faults the compliance suite relies on, and checks that a
//! client on the host observes them.
//!
//! Run with the images from `scripts/test-images`:
//!
//! ```sh
//! eval "$(scripts/test-images)"
//! cargo test -p dlock-testkit --test smoke
//! ```
//!
//! With `DLOCK_TEST_NO_DOCKER=1` the container-backed trials are reported as ignored; without
//! Docker and without the opt-out they fail with a message saying so.

#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::ensure;
use dlock_testkit::certs::TestCerts;
use dlock_testkit::fixtures::{
    docker_opt_out, four_letter_word, AdvisoryLockHolder, EtcdCluster, PostgresOptions,
    PostgresServer, PostgresTlsFiles, RedisMasters, RedisOptions, RedisServer, ZkEnsemble,
    ZkOptions,
};
use dlock_testkit::trials;
use libtest_mimic::{Arguments, Trial};
use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;
use tokio::time::timeout;
use zookeeper_client as zk;

/// Upper bound for one whole trial; far above the normal run time, only to end a hung trial
/// (which drops, and so removes, its fixture).
const TRIAL_TIMEOUT: Duration = Duration::from_secs(600);

/// How long a client waits for an answer that must come (a healthy server, generously).
const ANSWER: Duration = Duration::from_secs(10);

/// How long a request to a frozen server is given before we call it "timed out".
const FROZEN: Duration = Duration::from_secs(1);

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        trial("redis_single", RedisServer::needs_docker(), redis_single),
        trial(
            "redis_persistence",
            RedisServer::needs_docker(),
            redis_persistence,
        ),
        trial(
            "redlock_masters",
            RedisMasters::needs_docker(),
            redlock_masters,
        ),
        trial(
            "zookeeper_ensemble",
            ZkEnsemble::needs_docker(),
            zookeeper_ensemble,
        ),
        trial("etcd_cluster", EtcdCluster::needs_docker(), etcd_cluster),
        trial(
            "postgres_server",
            PostgresServer::needs_docker(),
            postgres_server,
        ),
        trial(
            "postgres_advisory_lock_sessions",
            PostgresServer::needs_docker(),
            postgres_advisory_lock_sessions,
        ),
        trial("postgres_tls", PostgresServer::needs_docker(), postgres_tls),
    ];
    libtest_mimic::run(&args, trials).exit();
}

/// A trial with its own runtime; ignored when it needs Docker and the run opted out.
fn trial<F, Fut>(name: &'static str, needs_docker: bool, body: F) -> Trial
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let ignored = needs_docker && docker_opt_out();
    trials::trial(name, TRIAL_TIMEOUT, move || async move {
        anyhow::ensure!(!ignored, "DLOCK_TEST_NO_DOCKER=1: this trial needs Docker");
        body().await
    })
    .with_ignored_flag(ignored)
}

async fn redis_connect(url: &str) -> anyhow::Result<MultiplexedConnection> {
    // No client-side response timeout: the tests decide with tokio timeouts what "no answer" is.
    let config = AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(Some(ANSWER));
    let client = redis::Client::open(url)?;
    Ok(client
        .get_multiplexed_async_connection_with_config(&config)
        .await?)
}

async fn redis_get(
    con: &mut MultiplexedConnection,
    key: &str,
) -> redis::RedisResult<Option<String>> {
    redis::cmd("GET").arg(key).query_async(con).await
}

async fn redis_set(
    con: &mut MultiplexedConnection,
    key: &str,
    value: &str,
) -> redis::RedisResult<()> {
    redis::cmd("SET").arg(key).arg(value).query_async(con).await
}

async fn redis_single() -> anyhow::Result<()> {
    let started = Instant::now();
    let server = RedisServer::start().await?;
    eprintln!("[timing] RedisServer::start: {:.2?}", started.elapsed());
    let url = server.url();
    let mut con = redis_connect(&url).await?;
    redis_set(&mut con, "smoke", "1").await?;
    ensure!(
        redis_get(&mut con, "smoke").await? == Some("1".into()),
        "GET after SET"
    );
    if !server.supports_faults() {
        return Ok(());
    }
    let member = server.member()?;

    member.pause().await?;
    let frozen = timeout(FROZEN, redis_get(&mut con, "smoke")).await;
    ensure!(
        frozen.is_err(),
        "GET to a paused Redis answered: {frozen:?}"
    );
    member.unpause().await?;
    let thawed = timeout(ANSWER, redis_get(&mut con, "smoke")).await??;
    ensure!(
        thawed == Some("1".into()),
        "GET after unpause gave {thawed:?}"
    );

    member.disconnect().await?;
    let cut_off = timeout(ANSWER, async {
        let mut con = redis_connect(&url).await?;
        redis_get(&mut con, "smoke")
            .await
            .map_err(anyhow::Error::from)
    })
    .await;
    // Docker drops the published port with the network endpoint: refused at once, not a hang.
    ensure!(
        matches!(cut_off, Ok(Err(_))),
        "a disconnected Redis must refuse connections, got {cut_off:?}"
    );
    let old = timeout(ANSWER, redis_get(&mut con, "smoke")).await;
    ensure!(
        matches!(old, Ok(Err(_))),
        "an established connection must break on disconnect, got {old:?}"
    );
    member.reconnect().await?;
    let mut con = redis_connect(&url).await?;
    let back = timeout(ANSWER, redis_get(&mut con, "smoke")).await??;
    ensure!(
        back == Some("1".into()),
        "GET after reconnect gave {back:?}"
    );

    member.restart_wipe_data().await?;
    ensure!(
        server.url() == url,
        "URL changed across a wipe: {url} -> {}",
        server.url()
    );
    let mut con = redis_connect(&url).await?;
    let wiped = timeout(ANSWER, redis_get(&mut con, "smoke")).await??;
    ensure!(wiped.is_none(), "key survived restart_wipe_data: {wiped:?}");
    redis_set(&mut con, "smoke", "2").await?;
    ensure!(
        redis_get(&mut con, "smoke").await? == Some("2".into()),
        "GET after wipe"
    );

    let stopping = Instant::now();
    server.shutdown().await?;
    eprintln!("[timing] RedisServer::shutdown: {:.2?}", stopping.elapsed());
    Ok(())
}

/// `key` read through a new connection (the old one died with the server), within [`ANSWER`].
async fn redis_get_anew(url: &str, key: &str) -> anyhow::Result<Option<String>> {
    let mut con = redis_connect(url).await?;
    Ok(timeout(ANSWER, redis_get(&mut con, key)).await??)
}

async fn redis_persistence() -> anyhow::Result<()> {
    let server = RedisServer::start_with(RedisOptions::default().with_persistence(true)).await?;
    let url = server.url();
    let mut con = redis_connect(&url).await?;
    redis_set(&mut con, "kept", "1").await?;
    if !server.supports_faults() {
        return Ok(());
    }
    let member = server.member()?;
    member.kill().await?;
    member.start().await?;
    let after_crash = redis_get_anew(&url, "kept").await?;
    ensure!(
        after_crash == Some("1".into()),
        "fsync=always lost a key in a crash: {after_crash:?}"
    );
    member.restart_keep_data().await?;
    let after_restart = redis_get_anew(&url, "kept").await?;
    ensure!(
        after_restart == Some("1".into()),
        "restart_keep_data lost a key: {after_restart:?}"
    );
    member.restart_wipe_data().await?;
    let after_wipe = redis_get_anew(&url, "kept").await?;
    ensure!(
        after_wipe.is_none(),
        "restart_wipe_data kept a key: {after_wipe:?}"
    );
    Ok(())
}

async fn redlock_masters() -> anyhow::Result<()> {
    let started = Instant::now();
    let masters = RedisMasters::start(RedisMasters::DEFAULT_COUNT).await?;
    eprintln!("[timing] RedisMasters::start(5): {:.2?}", started.elapsed());
    let urls = masters.urls();
    ensure!(urls.len() == 5, "expected 5 masters, got {urls:?}");
    for url in &urls {
        let mut con = redis_connect(url).await?;
        redis_set(&mut con, "smoke", url).await?;
    }
    if !masters.supports_faults() {
        return Ok(());
    }

    let (first, second) = (masters.member(0)?, masters.member(1)?);
    tokio::try_join!(first.stop(), second.stop())?;
    let mut answered = Vec::new();
    for url in &urls {
        let outcome = timeout(FROZEN * 2, async {
            let mut con = redis_connect(url).await?;
            redis_get(&mut con, "smoke")
                .await
                .map_err(anyhow::Error::from)
        })
        .await;
        answered.push(matches!(outcome, Ok(Ok(Some(ref v))) if v == url));
    }
    ensure!(
        answered == [false, false, true, true, true],
        "with masters 0 and 1 stopped, answers were {answered:?}"
    );

    tokio::try_join!(first.start(), second.start())?;
    for (i, url) in urls.iter().enumerate() {
        let mut con = redis_connect(url).await?;
        let value = timeout(ANSWER, redis_get(&mut con, "smoke")).await??;
        // Without persistence a restart loses every key: the case Redlock's delayed restart is for.
        let expected = (i >= 2).then(|| url.clone());
        ensure!(value == expected, "master {i} after restart: {value:?}");
    }
    Ok(())
}

async fn zookeeper_ensemble() -> anyhow::Result<()> {
    let started = Instant::now();
    let options = ZkOptions::default().with_tick_time(Duration::from_millis(500));
    let ensemble = ZkEnsemble::start_with(3, options).await?;
    eprintln!("[timing] ZkEnsemble::start(3): {:.2?}", started.elapsed());

    let connect = |cs: String| async move {
        zk::Client::connector()
            .with_session_timeout(Duration::from_secs(6))
            .connect(&cs)
            .await
    };
    let client = connect(ensemble.connect_string()).await?;
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    client.create("/smoke", b"1", &persistent).await?;
    let (data, _) = client.get_data("/smoke").await?;
    ensure!(data == b"1", "get_data gave {data:?}");
    drop(client);
    if !ensemble.supports_faults() {
        return Ok(());
    }

    let leader = ensemble.leader().await?;
    let stopped_at = Instant::now();
    ensemble.member(leader)?.stop().await?;
    let new_leader = ensemble.wait_for_leader(Duration::from_secs(60)).await?;
    ensure!(
        new_leader != leader,
        "leader {leader} still leads after stop"
    );
    eprintln!(
        "[timing] ZooKeeper re-election after stopping the leader: {:.2?}",
        stopped_at.elapsed()
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let attempt = timeout(ANSWER, async {
            let client = connect(ensemble.connect_string()).await?;
            match client
                .create("/smoke-after-failover", b"2", &persistent)
                .await
            {
                Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
                Err(e) => Err(e),
            }
        })
        .await;
        match attempt {
            Ok(Ok(())) => break,
            other if Instant::now() > deadline => {
                anyhow::bail!("no create after failover within 60 s: {other:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    ensemble.member(leader)?.start().await?;
    ensemble.wait_ready(Duration::from_secs(120)).await?;

    let follower = (ensemble.leader().await? + 1) % 3;
    let member = ensemble.member(follower)?;
    let endpoint = member.endpoint();
    member.pause().await?;
    let frozen = four_letter_word(&endpoint, "srvr", FROZEN).await;
    ensure!(
        matches!(&frozen, Err(e) if e.kind() == std::io::ErrorKind::TimedOut),
        "srvr to a paused member: {frozen:?}"
    );
    member.unpause().await?;
    // It answers again at once; whether it still serves depends on whether the pause outlasted
    // syncLimit (2 ticks), after which it rejoins the leader first.
    four_letter_word(&endpoint, "srvr", ANSWER).await?;
    ensemble.wait_ready(Duration::from_secs(60)).await?;
    Ok(())
}

async fn etcd_connect(endpoints: &[String]) -> anyhow::Result<etcd_client::Client> {
    let options = etcd_client::ConnectOptions::new().with_connect_timeout(ANSWER);
    Ok(etcd_client::Client::connect(endpoints, Some(options)).await?)
}

async fn etcd_cluster() -> anyhow::Result<()> {
    let started = Instant::now();
    let cluster = EtcdCluster::start(3).await?;
    eprintln!("[timing] EtcdCluster::start(3): {:.2?}", started.elapsed());
    let endpoints = cluster.endpoints();
    let mut client = etcd_connect(&endpoints).await?;
    client.put("smoke", "1", None).await?;
    let got = client.get("smoke", None).await?;
    ensure!(
        got.kvs().first().map(|kv| kv.value()) == Some(b"1".as_slice()),
        "get after put: {got:?}"
    );
    drop(client);
    if !cluster.supports_faults() {
        return Ok(());
    }

    let leader = cluster.leader().await?;
    let stopped = (leader + 1) % 3;
    let used = (leader + 2) % 3;
    cluster.member(stopped)?.stop().await?;
    let mut client = etcd_connect(&endpoints[used..=used]).await?;
    timeout(ANSWER, client.put("smoke", "2", None)).await??;

    let member = cluster.member(used)?;
    member.pause().await?;
    let frozen = timeout(FROZEN, client.put("smoke", "3", None)).await;
    ensure!(
        frozen.is_err(),
        "put through a paused member answered: {frozen:?}"
    );
    member.unpause().await?;
    // The put given up on above may still be applied now, after any later put of the same key:
    // the one after the pause writes a key of its own.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match timeout(ANSWER, client.put("smoke-after", "4", None)).await {
            Ok(Ok(_)) => break,
            other if Instant::now() > deadline => {
                anyhow::bail!("no put after unpause within 30 s: {other:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let got = timeout(ANSWER, client.get("smoke-after", None)).await??;
    ensure!(
        got.kvs().first().map(|kv| kv.value()) == Some(b"4".as_slice()),
        "get after unpause: {got:?}"
    );

    cluster.member(stopped)?.start().await?;
    cluster.wait_ready(Duration::from_secs(60)).await?;
    Ok(())
}

/// The password in a PostgreSQL URL.
fn postgres_password(url: &str) -> anyhow::Result<String> {
    let parsed = url::Url::parse(url)?;
    Ok(parsed
        .password()
        .ok_or_else(|| anyhow::anyhow!("no password in the URL"))?
        .to_owned())
}

async fn postgres_server() -> anyhow::Result<()> {
    let started = Instant::now();
    let server = PostgresServer::start().await?;
    eprintln!("[timing] PostgresServer::start: {:.2?}", started.elapsed());
    let url = server.url();
    if !server.supports_faults() {
        return Ok(());
    }
    ensure!(
        url.starts_with("postgres://postgres:")
            && url.contains("@127.0.0.1:")
            && url.ends_with("/postgres"),
        "unexpected URL form (password hidden): {server:?}"
    );
    let password = postgres_password(&url)?;
    let debug = format!("{server:?} {:?}", server.member()?);
    ensure!(
        !debug.contains(&password),
        "Debug shows the password: {}",
        debug.replace(&password, "<the password>")
    );
    ensure!(server.psql("SELECT 1").await? == "1", "psql SELECT 1");

    // Clients on the network log in with the password (scram-sha-256), as the URL says.
    let network = |password: &str| {
        format!("host=postgres1 user=postgres dbname=postgres sslmode=disable password={password}")
    };
    let user = server
        .psql_with(&network(&password), "SELECT current_user")
        .await?;
    ensure!(
        user == "postgres",
        "current_user over the network: {user:?}"
    );
    let refused = server.psql_with(&network("wrong"), "SELECT 1").await;
    ensure!(
        matches!(&refused, Err(e) if e.to_string().contains("password authentication failed")),
        "a wrong password over the network: {refused:?}"
    );

    server
        .psql("CREATE TABLE smoke (v int); INSERT INTO smoke VALUES (1)")
        .await?;
    let member = server.member()?;
    let restarting = Instant::now();
    member.restart_keep_data().await?;
    eprintln!(
        "[timing] PostgreSQL restart_keep_data: {:.2?}",
        restarting.elapsed()
    );
    ensure!(server.url() == url, "URL changed across a restart");
    let kept = server.psql("SELECT v FROM smoke").await?;
    ensure!(kept == "1", "restart_keep_data lost the table: {kept:?}");

    member.kill().await?;
    member.start().await?;
    let recovered = server.psql("SELECT v FROM smoke").await?;
    ensure!(
        recovered == "1",
        "crash recovery lost the table: {recovered:?}"
    );

    member.pause().await?;
    let frozen = server.psql("SELECT 1").await;
    ensure!(frozen.is_err(), "psql in a paused container: {frozen:?}");
    member.unpause().await?;
    ensure!(server.psql("SELECT 1").await? == "1", "psql after unpause");

    // Docker drops the published port with the network endpoint: refused at once, not a hang.
    member.disconnect().await?;
    let cut_off = timeout(ANSWER, tokio::net::TcpStream::connect(member.endpoint())).await;
    ensure!(
        matches!(cut_off, Ok(Err(_))),
        "a disconnected PostgreSQL must refuse connections, got {cut_off:?}"
    );
    member.reconnect().await?;
    ensure!(
        server.psql("SELECT 1").await? == "1",
        "psql after reconnect"
    );

    member.restart_wipe_data().await?;
    ensure!(server.url() == url, "URL changed across a wipe");
    let wiped = server
        .psql("SELECT count(*) FROM pg_tables WHERE tablename = 'smoke'")
        .await?;
    ensure!(wiped == "0", "the table survived restart_wipe_data");
    server.shutdown().await?;
    Ok(())
}

async fn postgres_advisory_lock_sessions() -> anyhow::Result<()> {
    let server = PostgresServer::start().await?;
    if !server.supports_faults() {
        return Ok(());
    }
    // Negative, and with bits in both halves: classid and objid as pg_locks splits the key.
    let key: i64 = -0x1234_5678_9abc;
    let holder = server.hold_advisory_lock(key).await?;
    holder.wait_granted(ANSWER).await?;
    let entries = server.advisory_lock_holders(key).await?;
    ensure!(
        entries.len() == 1
            && entries[0].granted
            && entries[0].exclusive
            && entries[0].application_name == holder.application_name(),
        "pg_locks for the held key: {entries:?}"
    );
    ensure!(
        server.advisory_lock_holders(key + 1).await?.is_empty(),
        "another key shows as held"
    );
    let taken = server
        .psql(&format!("SELECT pg_try_advisory_lock({key})"))
        .await?;
    ensure!(
        taken == "f",
        "another session took the held lock: {taken:?}"
    );

    // A second psql queues behind the first and gets the lock when it is released.
    let waiter = server.hold_advisory_lock(key).await?;
    wait_queued(&server, &waiter).await?;
    ensure!(!waiter.is_granted().await?, "both sessions hold the lock");
    holder.release().await?;
    waiter.wait_granted(ANSWER).await?;
    let entries = server.advisory_lock_holders(key).await?;
    ensure!(
        entries.len() == 1 && entries[0].application_name == waiter.application_name(),
        "after the release: {entries:?}"
    );

    // Dropping a holder ends its psql, and the server frees the lock with the session.
    drop(waiter);
    let deadline = Instant::now() + ANSWER;
    while !server.advisory_lock_holders(key).await?.is_empty() {
        ensure!(
            Instant::now() < deadline,
            "a dropped holder's lock was not freed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A request still waiting is given up on release.
    let holder = server.hold_advisory_lock(key).await?;
    holder.wait_granted(ANSWER).await?;
    let waiter = server.hold_advisory_lock(key).await?;
    wait_queued(&server, &waiter).await?;
    waiter.release().await?;
    let entries = server.advisory_lock_holders(key).await?;
    ensure!(
        entries.len() == 1 && entries[0].application_name == holder.application_name(),
        "after giving up a waiting request: {entries:?}"
    );
    holder.release().await?;
    ensure!(
        server.advisory_lock_holders(key).await?.is_empty(),
        "the lock is still held after the last release"
    );
    server.shutdown().await?;
    Ok(())
}

/// Waits until `waiter` queues for its lock (shows in `pg_locks`, not granted).
async fn wait_queued(server: &PostgresServer, waiter: &AdvisoryLockHolder) -> anyhow::Result<()> {
    let deadline = Instant::now() + ANSWER;
    loop {
        let entries = server.advisory_lock_holders(waiter.key()).await?;
        if entries
            .iter()
            .any(|e| !e.granted && e.application_name == waiter.application_name())
        {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the waiter never queued: {entries:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn postgres_tls() -> anyhow::Result<()> {
    if !PostgresServer::needs_docker() {
        return Ok(()); // an external server cannot be given the fixture's files
    }
    let certs = TestCerts::generate(&["localhost", "127.0.0.1", "postgres1"], "postgres")?;
    let options = PostgresOptions::default()
        .with_tls(PostgresTlsFiles {
            ca: certs.ca.clone(),
            server_cert: certs.server_cert.clone(),
            server_key: certs.server_key.clone(),
            require_client_cert: true,
        })
        .with_setting("log_connections", "on");
    let server = PostgresServer::start_with(options).await?;
    ensure!(server.psql("SHOW ssl").await? == "on", "ssl is off");
    ensure!(
        server.psql("SHOW log_connections").await? == "on",
        "the extra setting is missing"
    );
    let loopback = "host=127.0.0.1 sslmode=require user=postgres dbname=postgres";
    let ssl = server
        .psql_with(
            loopback,
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
        )
        .await?;
    ensure!(ssl == "t", "the loopback connection is not TLS: {ssl:?}");
    let rules = server
        .psql("SELECT auth_method FROM pg_hba_file_rules WHERE type = 'hostssl'")
        .await?;
    ensure!(rules == "cert", "hostssl rules: {rules:?}");
    let network = "host=postgres1 sslmode=require user=postgres dbname=postgres";
    let refused = server.psql_with(network, "SELECT 1").await;
    ensure!(
        matches!(&refused, Err(e) if e.to_string().contains("certificate")),
        "TLS without a client certificate: {refused:?}"
    );
    server.member()?.restart_keep_data().await?;
    ensure!(
        server.psql("SHOW ssl").await? == "on",
        "ssl is off after a restart"
    );
    server.shutdown().await?;
    Ok(())
}
