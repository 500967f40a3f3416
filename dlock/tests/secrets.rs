//! No secret shows anywhere: for every scheme, a URL's password and the contents of its TLS key
//! file appear in no error, no `Debug` output and no log line, at the most verbose log level,
//! whether the URL is refused or its servers cannot be reached.

#![cfg(all(
    feature = "redis",
    feature = "redis-tls",
    feature = "redlock",
    feature = "zk",
    feature = "zk-tls",
    feature = "etcd",
    feature = "postgres"
))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};

use dlock_testkit::certs::TestCerts;

/// Every log line written while the test runs.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const PASSWORD: &str = "hunter2-Secret";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_password_or_key_shows_in_errors_debug_or_logs() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let certs = TestCerts::generate(&["localhost", "127.0.0.1"], "app").unwrap();
    let key_text = std::fs::read_to_string(&certs.client_key).unwrap();
    // A line of the key's body: what a leak of its contents would show.
    let key_line = key_text
        .lines()
        .find(|l| !l.starts_with("-----") && l.len() > 20)
        .unwrap()
        .to_owned();
    let tls = format!(
        "ca={}&cert={}&key={}",
        certs.ca.display(),
        certs.client_cert.display(),
        certs.client_key.display()
    );
    // Nothing listens on port 1; `nowhere.invalid` does not resolve.
    let urls = [
        format!("redis://app:{PASSWORD}@127.0.0.1:1?connect_timeout=300ms"),
        format!("rediss://app:{PASSWORD}@127.0.0.1:1?{tls}&connect_timeout=300ms"),
        format!(
            "rediss://app:{PASSWORD}@127.0.0.1:1?ca={}",
            certs.client_key.display()
        ),
        format!(
            "redlock://app:{PASSWORD}@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?connect_timeout=300ms"
        ),
        format!("zk://app:{PASSWORD}@127.0.0.1:1?connect_timeout=300ms"),
        format!("zk+tls://app:{PASSWORD}@127.0.0.1:1?{tls}&connect_timeout=300ms"),
        format!(
            "zk+tls://app:{PASSWORD}@127.0.0.1:1?ca={}",
            certs.client_key.display()
        ),
        format!("etcd://app:{PASSWORD}@127.0.0.1:1?connect_timeout=300ms"),
        format!("etcd://app:{PASSWORD}@nowhere.invalid:1?connect_timeout=300ms"),
        format!("redis://app:{PASSWORD}@127.0.0.1:1?colour=red"),
        format!("zk://app:{PASSWORD}@127.0.0.1:1?session_timeout=soon"),
        format!("etcd://app:{PASSWORD}@127.0.0.1:1/a?prefix=b"),
        format!("ftp://app:{PASSWORD}@127.0.0.1:1"),
        format!("redis://app:{PASSWORD}%zz@127.0.0.1:1"),
        format!("redis+sentinel://app:{PASSWORD}@127.0.0.1:1/mymaster?sentinel_password={PASSWORD}&connect_timeout=300ms"),
        format!("redis+sentinel://app:{PASSWORD}@127.0.0.1:1/mymaster?sentinel_password={PASSWORD}&min_replicas=x"),
        format!("etcd+https://app:{PASSWORD}@127.0.0.1:1?{tls}&connect_timeout=300ms"),
        format!(
            "etcd+https://app:{PASSWORD}@127.0.0.1:1?ca={}",
            certs.client_key.display()
        ),
        format!("postgres://app:{PASSWORD}@127.0.0.1:1/db?sslmode=disable&connect_timeout=300ms"),
        format!(
            "postgresql://app:{PASSWORD}@127.0.0.1:1/db?sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}&connect_timeout=300ms",
            certs.ca.display(),
            certs.client_cert.display(),
            certs.client_key.display()
        ),
        format!(
            "postgres://app:{PASSWORD}@127.0.0.1:1/db?sslmode=require&sslrootcert={}",
            certs.client_key.display()
        ),
        format!("postgres://app:{PASSWORD}@127.0.0.1:1/db?sslmode=sometimes"),
    ];
    let mut shown = String::new();
    for url in &urls {
        match dlock::connect(url).await {
            Ok(locks) => shown.push_str(&format!("{locks:?}\n")),
            Err(error) => shown.push_str(&format!("{error}\n{error:?}\n")),
        }
    }
    let builders = [
        format!(
            "{:?}",
            dlock::redis::RedisLockBuilder::from_url(&urls[1]).unwrap()
        ),
        format!(
            "{:?}",
            dlock::redlock::RedlockBuilder::from_url(&urls[3]).unwrap()
        ),
        format!(
            "{:?}",
            dlock::zk::ZkLockBuilder::from_url(&urls[4]).unwrap()
        ),
        format!(
            "{:?}",
            dlock::zk::ZkLockBuilder::from_url(&urls[5]).unwrap()
        ),
        format!(
            "{:?}",
            dlock::etcd::EtcdLockBuilder::from_url(&urls[7]).unwrap()
        ),
        format!(
            "{:?}",
            dlock::etcd::EtcdLockBuilder::from_url(
                urls.iter().find(|u| u.starts_with("etcd+https")).unwrap()
            )
            .unwrap()
        ),
        format!(
            "{:?}",
            <dlock::postgres::PgLockBuilder as dlock::url::FromUrl>::from_url(
                urls.iter().find(|u| u.starts_with("postgresql")).unwrap()
            )
            .unwrap()
        ),
        format!("{:?}", dlock::url::ConnectUrl::parse(&urls[1]).unwrap()),
        format!(
            "{:?}",
            dlock::redis::RedisLockBuilder::from_url(
                urls.iter()
                    .find(|u| u.starts_with("redis+sentinel"))
                    .unwrap()
            )
            .unwrap()
        ),
        format!(
            "{:?}",
            dlock::url::ConnectUrl::parse(
                urls.iter().find(|u| u.contains("min_replicas=x")).unwrap()
            )
            .unwrap()
        ),
    ];
    shown.push_str(&builders.join("\n"));
    let logs = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    for (what, text) in [("errors and Debug", &shown), ("logs", &logs)] {
        assert!(
            !text.contains(PASSWORD),
            "{what} show the password:\n{text}"
        );
        assert!(!text.contains(&key_line), "{what} show the key:\n{text}");
    }
    // The test saw what it checks: every URL was tried, and the logs are not empty.
    assert!(shown.matches("app:***").count() >= urls.len(), "{shown}");
    assert!(!logs.is_empty());
}
