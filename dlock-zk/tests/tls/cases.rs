//! The cases of TLS and of the ACLs of credentialed nodes, beyond the shared suite.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use dlock_core::backend::tls::TlsFiles;
use dlock_core::inspect::Holding;
use dlock_core::{Admin, DistributedLockExt, Error, LockOptions};
use dlock_testkit::case;
use dlock_testkit::certs::TestCerts;
use dlock_testkit::fixtures::connect_docker;
use dlock_testkit::trials::{self, Case};
use dlock_zk::ZkLock;
use libtest_mimic::Trial;
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::support::{SESSION, TRIAL_BUDGET};
use crate::{tls, tls_client, url_as, Env, OTHER_PASSWORD, OTHER_USER, PASSWORD, USER};
use dlock_testkit::fixtures::exec::Exec;

fn cases() -> Vec<(&'static str, Case<Env>)> {
    vec![
        case!(a_foreign_authority_is_refused_clearly),
        case!(a_missing_client_certificate_is_refused_clearly),
        case!(plaintext_and_tls_on_the_wrong_ports_fail_clearly),
        case!(bad_files_fail_before_connecting_and_show_no_secret),
        case!(another_identity_sees_the_queue_but_cannot_touch_it),
        case!(kazoo_over_tls_as_another_identity_sees_the_holder_only),
        case!(the_url_form_connects_locks_and_fences_over_tls),
    ]
}

const PREFIX: &str = "zookeeper-tls::zk";

/// The trial names, for a run that opted out of Docker.
pub fn names() -> Vec<String> {
    trials::names(PREFIX, &cases())
}

pub fn trials(env: &Env) -> Vec<Trial> {
    trials::cases(PREFIX, &cases(), env, TRIAL_BUDGET)
}

fn key(name: &str) -> String {
    format!("tls-cases/{:016x}/{name}", rand::random::<u64>())
}

/// The connect timeout of clients that are expected not to connect.
const REFUSED_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How much longer than its connect timeout a refused connect may take (the library's own
/// retries, the diagnosing handshake, a loaded machine).
const SLACK: Duration = Duration::from_secs(8);

/// Fails if `text` shows a password or a line of a private key.
fn shows_no_secret(text: &str, certs: &TestCerts) -> anyhow::Result<()> {
    ensure!(
        !text.contains(PASSWORD) && !text.contains(OTHER_PASSWORD),
        "a password shows: {text}"
    );
    for key in [&certs.client_key, &certs.server_key] {
        let pem = std::fs::read_to_string(key)?;
        for line in pem.lines().filter(|l| !l.starts_with("-----")) {
            ensure!(
                !text.contains(line),
                "a line of a private key shows: {text}"
            );
        }
    }
    Ok(())
}

/// The error of a connect that must fail, with its text (`Display` and `Debug`), checked for
/// secrets and for how long it took.
async fn refused(
    builder: dlock_zk::ZkLockBuilder,
    certs: &TestCerts,
) -> anyhow::Result<(Error, String)> {
    let started = Instant::now();
    let error = match builder
        .with_connect_timeout(REFUSED_CONNECT_TIMEOUT)
        .with_session_timeout(SESSION)
        .connect()
        .await
    {
        Ok(lock) => bail!("connected: {lock:?}"),
        Err(e) => e,
    };
    let took = started.elapsed();
    ensure!(
        took <= REFUSED_CONNECT_TIMEOUT + SLACK,
        "refusing took {took:?}: {error}"
    );
    let text = format!("{error} / {error:?}");
    shows_no_secret(&text, certs)?;
    eprintln!("[refused after {took:.2?}] {error}");
    Ok((error, text))
}

/// A server certificate signed by an authority the client does not trust: the connect fails
/// within its timeout, saying which handshake failed and why.
async fn a_foreign_authority_is_refused_clearly(env: Env) -> anyhow::Result<()> {
    let foreign = TestCerts::generate(&["localhost", "127.0.0.1"], "dlock-client")?;
    let settings =
        TlsFiles::new(&foreign.ca).with_client_cert(&env.certs.client_cert, &env.certs.client_key);
    let builder = ZkLock::builder(&url_as(USER, PASSWORD, &env.secure)).with_tls(settings);
    let (error, text) = refused(builder, &env.certs).await?;
    ensure!(
        text.contains("TLS handshake") && text.contains(&env.secure),
        "does not say which handshake failed: {text}"
    );
    ensure!(
        text.contains("UnknownIssuer") || text.contains("certificate"),
        "does not say the certificate was refused: {text}"
    );
    ensure!(
        !error.is_temporary(),
        "a refused certificate reads as temporary: {text}"
    );
    Ok(())
}

/// The server requires a client certificate (`ssl.clientAuth=need`): a client without one is
/// refused, and the error says the server ended the handshake.
async fn a_missing_client_certificate_is_refused_clearly(env: Env) -> anyhow::Result<()> {
    let builder = ZkLock::builder(&url_as(USER, PASSWORD, &env.secure))
        .with_tls(TlsFiles::new(&env.certs.ca));
    let (_, text) = refused(builder, &env.certs).await?;
    ensure!(
        text.contains("TLS handshake") && text.contains(&env.secure),
        "does not say which handshake failed: {text}"
    );
    Ok(())
}

/// A plaintext client on the secure port fails as unavailable within its connect timeout (the
/// server drops what is not TLS); a TLS client on the plain port fails saying that the server
/// closed the connection on the handshake.
async fn plaintext_and_tls_on_the_wrong_ports_fail_clearly(env: Env) -> anyhow::Result<()> {
    let plain_on_secure = ZkLock::builder(&url_as(USER, PASSWORD, &env.secure));
    let (error, text) = refused(plain_on_secure, &env.certs).await?;
    ensure!(
        matches!(error, Error::Unavailable { .. }),
        "plaintext on the secure port: {text}"
    );

    let tls_on_plain =
        ZkLock::builder(&url_as(USER, PASSWORD, &env.plain)).with_tls(tls(&env.certs));
    let (_, text) = refused(tls_on_plain, &env.certs).await?;
    ensure!(
        text.contains("TLS handshake") && text.contains("closed the connection"),
        "TLS on the plain port: {text}"
    );
    Ok(())
}

/// Missing, malformed and mismatched files are `InvalidInput` naming the setting and the path,
/// before anything is sent; neither they nor `Debug` show a key's contents or the password.
async fn bad_files_fail_before_connecting_and_show_no_secret(env: Env) -> anyhow::Result<()> {
    let certs = &env.certs;
    let missing = certs.dir().join("no-such-ca.pem");
    let cases = [
        (TlsFiles::new(&missing), "ca", missing.clone()),
        // A key where the authority belongs: no certificate in it.
        (
            TlsFiles::new(&certs.client_key),
            "ca",
            certs.client_key.clone(),
        ),
        (
            TlsFiles::new(&certs.ca).with_client_cert(&certs.client_cert, &missing),
            "key",
            missing.clone(),
        ),
        // A certificate where the key belongs.
        (
            TlsFiles::new(&certs.ca).with_client_cert(&certs.client_cert, &certs.client_cert),
            "key",
            certs.client_cert.clone(),
        ),
        // Another certificate's key.
        (
            TlsFiles::new(&certs.ca).with_client_cert(&certs.client_cert, &certs.server_key),
            "key",
            certs.server_key.clone(),
        ),
        (
            TlsFiles::new(&certs.ca).with_client_cert(&missing, &certs.client_key),
            "cert",
            missing.clone(),
        ),
    ];
    for (settings, expected_field, path) in cases {
        let builder = ZkLock::builder(&url_as(USER, PASSWORD, &env.secure)).with_tls(settings);
        let shown = format!("{builder:?}");
        shows_no_secret(&shown, certs)?;
        let started = Instant::now();
        match builder.connect().await {
            Err(Error::InvalidInput { field, message }) => {
                ensure!(
                    field == expected_field,
                    "{path:?}: field {field}: {message}"
                );
                ensure!(
                    message.contains(&path.display().to_string()),
                    "the message does not name {path:?}: {message}"
                );
                shows_no_secret(&message, certs)?;
            }
            other => bail!("{path:?}: expected InvalidInput, got {other:?}"),
        }
        ensure!(
            started.elapsed() < Duration::from_secs(1),
            "checking files took {:?}",
            started.elapsed()
        );
    }
    // The mismatch says so.
    let mismatched =
        TlsFiles::new(&certs.ca).with_client_cert(&certs.client_cert, &certs.server_key);
    let error = ZkLock::builder(&url_as(USER, PASSWORD, &env.secure))
        .with_tls(mismatched)
        .connect()
        .await
        .err()
        .context("a mismatched key connected")?;
    ensure!(error.to_string().contains("does not match"), "{error}");

    // A good configuration shows paths, never contents.
    let lock = tls_client(&env.secure, certs, SESSION, |b| b).await?;
    let shown = format!("{lock:?}");
    shows_no_secret(&shown, certs)?;
    let builder = ZkLock::builder(&url_as(USER, PASSWORD, &env.secure)).with_tls(tls(certs));
    let shown = format!("{builder:?}");
    shows_no_secret(&shown, certs)?;
    ensure!(
        shown.contains(&certs.client_key.display().to_string()),
        "Debug hides the key's path: {shown}"
    );
    Ok(())
}

/// A raw client over TLS authenticated as `user`.
async fn raw_tls(
    hosts: &str,
    certs: &TestCerts,
    user: &str,
    password: &str,
) -> anyhow::Result<zk::Client> {
    // The test process has both of rustls's providers compiled in: name one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let read = |path: &std::path::Path| std::fs::read_to_string(path);
    let options = zk::TlsOptions::new()
        .with_pem_ca(&read(&certs.ca)?)?
        .with_pem_identity(&read(&certs.client_cert)?, &read(&certs.client_key)?)?;
    Ok(zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .with_auth("digest", format!("{user}:{password}").as_bytes())
        .with_tls(options)
        .secure_connect(hosts)
        .await?)
}

/// Nodes created with credentials carry `digest:USER:…` ALL and `world:anyone` READ: another
/// identity lists the queue, reads the holder's data and sees who holds (`holding`), but cannot
/// delete or overwrite the holder's node, nor queue behind it, nor evict it; the holder keeps
/// the lock.
async fn another_identity_sees_the_queue_but_cannot_touch_it(env: Env) -> anyhow::Result<()> {
    let holder = tls_client(&env.secure, &env.certs, SESSION, |b| {
        b.with_identifier("acl-holder")
    })
    .await?;
    let key = key("acl");
    let opts = LockOptions::new(Duration::from_secs(60));
    let lease = holder
        .try_acquire(&key, &opts)
        .await?
        .context("a fresh key was busy")?;
    let parent = holder.lock_path(&key)?;

    let other = raw_tls(&env.secure, &env.certs, OTHER_USER, OTHER_PASSWORD).await?;
    let queue = other.list_children(&parent).await?;
    ensure!(
        queue.len() == 1,
        "queue as the other identity sees it: {queue:?}"
    );
    let node = format!("{parent}/{}", queue[0]);
    let (data, stat) = other.get_data(&node).await?;
    let record = dlock_core::OwnerRecord::parse(&data);
    ensure!(
        record.is_some_and(|r| r.label.as_deref() == Some("acl-holder")),
        "the holder's data reads {data:?}"
    );
    ensure!(
        stat.czxid == lease.fencing_token().get() as i64,
        "the node's czxid {} is not the lease's token {}",
        stat.czxid,
        lease.fencing_token()
    );

    match other.delete(&node, None).await {
        Err(zk::Error::NoAuth) => {}
        other => bail!("deleting the holder's node as another identity: {other:?}"),
    }
    match other.set_data(&node, b"taken", None).await {
        Err(zk::Error::NoAuth) => {}
        other => bail!("overwriting the holder's node as another identity: {other:?}"),
    }
    let intruder = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    match other
        .create(&format!("{parent}/intruder-"), b"", &intruder)
        .await
    {
        Err(zk::Error::NoAuth) => {}
        other => bail!("queueing as another identity: {other:?}"),
    }

    // Exactly the two entries, on the parent and on the holder's node. ZooKeeper (3.6+) shows a
    // digest id's hash only to a client with ADMIN on the node: the other identity sees `USER:x`,
    // the creator the whole id, which must be ZooKeeper's own digest of the credentials.
    let creator = raw_tls(&env.secure, &env.certs, USER, PASSWORD).await?;
    let expected = {
        use base64::Engine;
        let hash = sha1_smol::Sha1::from(format!("{USER}:{PASSWORD}")).digest();
        let encoded = base64::engine::general_purpose::STANDARD.encode(hash.bytes());
        format!("{USER}:{encoded}")
    };
    for path in [&parent, &node] {
        for (reader, id) in [(&other, format!("{USER}:x")), (&creator, expected.clone())] {
            let (acls, _) = reader.get_acl(path).await?;
            let described: Vec<String> = acls
                .iter()
                .map(|a| format!("{}:{} {}", a.scheme(), a.id(), a.permission()))
                .collect();
            ensure!(acls.len() == 2, "{path}: {described:?}");
            ensure!(
                acls.iter().any(|a| a.scheme() == "digest"
                    && a.id() == id
                    && a.permission() == zk::Permission::ALL),
                "{path}: no ALL for digest:{id}: {described:?}"
            );
            ensure!(
                acls.iter().any(|a| a.scheme() == "world"
                    && a.id() == "anyone"
                    && a.permission() == zk::Permission::READ),
                "{path}: no READ for anyone: {described:?}"
            );
        }
    }

    // A dlock client of the other identity sees the holder, and cannot take or queue for it.
    let onlooker = Arc::new(
        ZkLock::builder(&url_as(OTHER_USER, OTHER_PASSWORD, &env.secure))
            .with_tls(tls(&env.certs))
            .with_session_timeout(SESSION)
            .connect()
            .await?,
    );
    match onlooker.holding(&key).await? {
        Holding::Held(holder) if holder.fencing == Some(lease.fencing_token()) => {}
        other => bail!("the other identity sees {other:?}"),
    }
    match onlooker.try_acquire(&key, &opts).await {
        Err(e) => {
            ensure!(!e.is_temporary(), "refused as temporary: {e}");
            shows_no_secret(&format!("{e} {e:?}"), &env.certs)?;
        }
        Ok(got) => bail!("the other identity got {got:?}"),
    }
    // Nor evict it: ZooKeeper checks DELETE on the parent, which only the owner has.
    match Admin::new(&onlooker)
        .force_unlock(&key, Some(lease.fencing_token()))
        .await
    {
        Err(e) => shows_no_secret(&format!("{e} {e:?}"), &env.certs)?,
        Ok(eviction) => bail!("the other identity evicted the holder: {eviction:?}"),
    }
    ensure!(
        lease.is_held(),
        "the refused eviction cost the holder its lock"
    );

    lease.release().await?;
    ensure!(
        other
            .list_children(&parent)
            .await
            .unwrap_or_default()
            .is_empty(),
        "the holder's node outlived its release"
    );
    Ok(())
}

/// kazoo (Debian's python3-kazoo in the server's container) over TLS, authenticated as another
/// identity: its `contenders()` shows the dlock holder, and deleting or overwriting the
/// holder's node is refused.
const KAZOO_ONLOOKER: &str = r#"
import sys
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
zk = KazooClient(hosts="127.0.0.1:2281", use_ssl=True, verify_certs=True, ca="/tls/ca.pem",
                 certfile="/tls/server.pem", keyfile="/tls/server.pem",
                 auth_data=[("digest", sys.argv[2])])
zk.start(timeout=30)
parent = sys.argv[1]
print("contenders " + ",".join(zk.Lock(parent).contenders()), flush=True)
node = parent + "/" + zk.get_children(parent)[0]
for name, attempt in (("delete", lambda: zk.delete(node)), ("set", lambda: zk.set(node, b"x"))):
    try:
        attempt()
        print(name + " allowed", flush=True)
    except NoAuthError:
        print(name + " refused", flush=True)
zk.stop()
"#;

async fn kazoo_over_tls_as_another_identity_sees_the_holder_only(env: Env) -> anyhow::Result<()> {
    let docker = connect_docker().await?;
    let holder = tls_client(&env.secure, &env.certs, SESSION, |b| {
        b.with_identifier("kazoo-sees-me")
    })
    .await?;
    let key = key("kazoo");
    let lease = holder
        .try_acquire(&key, &LockOptions::new(Duration::from_secs(60)))
        .await?
        .context("a fresh key was busy")?;
    let parent = holder.lock_path(&key)?;
    let auth = format!("{OTHER_USER}:{OTHER_PASSWORD}");
    let cmd = vec![
        "python3".to_owned(),
        "-c".to_owned(),
        KAZOO_ONLOOKER.to_owned(),
        parent,
        auth,
    ];
    let mut kazoo = Exec::start(&docker, &env.container, cmd).await?;
    let wait = Duration::from_secs(30);
    let contenders = kazoo.expect("contenders", wait).await?;
    let record = contenders
        .strip_prefix("contenders ")
        .and_then(|json| dlock_core::OwnerRecord::parse(json.as_bytes()));
    ensure!(
        record.is_some_and(|r| r.label.as_deref() == Some("kazoo-sees-me")),
        "kazoo sees {contenders:?}"
    );
    let delete = kazoo.expect("delete", wait).await?;
    ensure!(delete == "delete refused", "{delete}");
    let set = kazoo.expect("set", wait).await?;
    ensure!(set == "set refused", "{set}");
    kazoo.finish(wait).await?;
    lease.release().await?;
    Ok(())
}

/// `zk+tls://user:password@hosts?ca=…&cert=…&key=…` (the form `dlock::connect` and the CLI take)
/// connects, locks and fences like the builder.
async fn the_url_form_connects_locks_and_fences_over_tls(env: Env) -> anyhow::Result<()> {
    let certs = &env.certs;
    let url = format!(
        "zk+tls://{USER}:{PASSWORD}@{}?ca={}&cert={}&key={}&session_timeout=4s&identifier=by-url",
        env.secure,
        certs.ca.display(),
        certs.client_cert.display(),
        certs.client_key.display()
    );
    let builder = dlock_zk::ZkLockBuilder::from_url(&url)?;
    shows_no_secret(&format!("{builder:?}"), certs)?;
    let lock = Arc::new(builder.connect().await?);
    let key = key("url");
    let opts = LockOptions::new(Duration::from_secs(60));
    let first = lock.acquire(&key, &opts).await?;
    let token = first.fencing_token();
    first.release().await?;
    let second = lock.acquire(&key, &opts).await?;
    ensure!(
        second.fencing_token() > token,
        "tokens did not grow: {token} then {}",
        second.fencing_token()
    );
    second.release().await?;

    // Without the files, the URL is refused before anything is sent.
    let bare = format!("zk+tls://{USER}:{PASSWORD}@{}", env.secure);
    match dlock_zk::ZkLockBuilder::from_url(&bare) {
        Err(Error::InvalidInput { message, .. }) => shows_no_secret(&message, certs)?,
        other => bail!("zk+tls:// without ca: {other:?}"),
    }
    Ok(())
}
