//! `dlock::connect` URLs, good and bad, per scheme, without a server: a good URL gets as far as
//! connecting (to a port nobody listens on, so it fails as unavailable, not as invalid), a bad
//! one fails with InvalidInput before anything is sent, and no message shows the password.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use dlock::{Error, Holding, Locks};

/// An address where nothing listens: connecting there fails fast.
#[allow(dead_code)]
const NOBODY: &str = "127.0.0.1:1";

async fn invalid(url: &str) -> String {
    match dlock::connect(url).await {
        Err(Error::InvalidInput { field, message }) => {
            let shown = format!("{field}: {message}");
            assert!(
                !shown.contains("hunter2"),
                "{url}: the password shows in {shown}"
            );
            shown
        }
        Err(other) => panic!("{url}: expected InvalidInput, got {other}"),
        Ok(locks) => panic!("{url}: accepted as {locks:?}"),
    }
}

/// Each `(url, says)`: the URL is rejected as invalid with a message that contains `says`.
async fn rejected(cases: &[(&str, &str)]) {
    for (url, says) in cases {
        let m = invalid(url).await;
        assert!(m.contains(says), "{url}: {m}");
    }
}

/// A URL the facade accepted and handed to the backend, which then could not reach a server.
#[allow(dead_code)]
async fn unreachable(url: &str) {
    match dlock::connect(url).await {
        Err(Error::InvalidInput { field, message }) => {
            panic!("{url}: rejected as invalid {field}: {message}")
        }
        Err(e) => {
            let shown = e.to_string();
            assert!(
                !shown.contains("hunter2"),
                "{url}: the password shows in {shown}"
            );
        }
        Ok(locks) => panic!("{url}: connected to nothing as {locks:?}"),
    }
}

#[tokio::test]
async fn memory_urls_give_a_working_backend_with_the_url_defaults() {
    let locks: Locks = dlock::connect("memory://?ttl=5s&wait=1s&drift=3ms")
        .await
        .unwrap();
    assert_eq!(locks.backend().backend_name(), "memory");
    assert_eq!(locks.options().ttl, Duration::from_secs(5));
    assert_eq!(locks.options().wait, Some(Duration::from_secs(1)));
    assert_eq!(locks.options().drift.fixed, Duration::from_millis(3));
    let lease = locks.acquire("k", locks.options()).await.unwrap();
    match locks.holding("k").await.unwrap() {
        Holding::Held(holder) => assert_eq!(holder.fencing, Some(lease.fencing_token())),
        other => panic!("expected held, got {other:?}"),
    }
    assert!(locks
        .try_acquire("k", locks.options())
        .await
        .unwrap()
        .is_none());
    lease.release().await.unwrap();
    assert_eq!(locks.holding("k").await.unwrap(), Holding::Free);
    assert!(format!("{locks:?}").contains("memory://?ttl=5s"));
    assert!(dlock::connect("MEMORY://").await.is_ok());
}

#[test]
fn a_handle_never_shows_a_password() {
    let locks = Locks::new(
        std::sync::Arc::new(dlock::InMemoryLock::new()),
        dlock::LockOptions::default(),
        "redis://app:hunter2@cache:6379/1",
    );
    assert_eq!(locks.url(), "redis://app:***@cache:6379/1");
    assert!(!format!("{locks:?}").contains("hunter2"));
}

#[tokio::test]
async fn malformed_urls_say_what_and_where() {
    rejected(&[("", "has no scheme"), ("localhost:6379", "has no scheme")]).await;
    let m = invalid("http://u:hunter2@h").await;
    assert!(m.contains("unknown scheme \"http\""), "{m}");
    assert!(m.contains("http://u:***@h"), "{m}");
    rejected(&[
        ("memory://host", "takes no host"),
        ("memory:///path", "takes no host"),
        (
            "memory://?prefix=x",
            "unknown parameter `prefix` for memory://",
        ),
        ("memory://?ttl=0s", "parameter `ttl`"),
        ("memory://?wait=later", "parameter `wait`"),
    ])
    .await;
}

#[cfg(not(feature = "redlock"))]
#[tokio::test]
async fn redlock_without_its_feature_names_it() {
    rejected(&[(
        "redlock://u:hunter2@h1:6379,h2:6379,h3:6379",
        "needs the `redlock` feature",
    )])
    .await;
}

#[cfg(feature = "redlock")]
#[tokio::test]
async fn redlock_urls_are_checked_before_anything_is_sent() {
    rejected(&[
        ("redlock://u:hunter2@h1:6379,,h3:6379", "host #2 is empty"),
        ("redlock://h1:6379,h2:6379,h3:6379?quorum=most", "quorum"),
        ("redlock://h1:6379,h2:6379,h3:6379?fencing=maybe", "fencing"),
        (
            "redlock://h1:6379,h2:6379,h3:6379?request_timeout=fast",
            "request_timeout",
        ),
        (
            "redlock://h1:6379,h2:6379,h3:6379?fence_ttl=30",
            "parameter `fence_ttl`: \"30\" is not a duration",
        ),
    ])
    .await;
    let m = invalid("redlock://h1:6379,h2:6379,h3:6379?fence_ttl=1h").await;
    assert!(m.starts_with("fence_ttl: 3600s is outside"), "{m}");
    // An even number of masters is refused by the Redlock builder itself.
    let m = invalid("redlock://:hunter2@h1:6379,h2:6379").await;
    assert!(!m.is_empty());
}

#[cfg(feature = "redlock")]
#[tokio::test]
async fn redlock_to_masters_nobody_runs_is_unavailable() {
    let url =
        format!("redlock://{NOBODY},127.0.0.1:2,127.0.0.1:3?connect_timeout=200ms&fence_ttl=30d");
    match dlock::connect(&url).await {
        Err(e @ Error::Unavailable { .. }) => assert!(e.to_string().contains("of 3"), "{e}"),
        other => panic!("expected unavailable, got {other:?}"),
    }
}

#[cfg(not(feature = "redis"))]
#[tokio::test]
async fn redis_without_its_feature_names_it() {
    rejected(&[
        (
            "redis://u:hunter2@localhost:6379",
            "needs the `redis` feature",
        ),
        ("rediss://localhost:6379", "needs the `redis-tls` feature"),
    ])
    .await;
}

#[cfg(all(feature = "redis", not(feature = "redis-tls")))]
#[tokio::test]
async fn rediss_without_tls_names_the_feature() {
    rejected(&[(
        "rediss://u:hunter2@localhost:6379",
        "needs the `redis-tls` feature",
    )])
    .await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_urls() {
    unreachable(&format!(
        "redis://u:hunter2@{NOBODY}/2?prefix=billing%3A&request_timeout=200ms&connect_timeout=200ms&ttl=5s&wait=1s"
    ))
    .await;
    unreachable("redis+unix:///nonexistent/redis.sock?connect_timeout=200ms").await;
    unreachable(&format!(
        "redis://{NOBODY}?connect_timeout=200ms&fence_ttl=30d"
    ))
    .await;
    rejected(&[
        (
            "redis://u:hunter2@h?session_timeout=1s",
            "unknown parameter `session_timeout` for redis://",
        ),
        ("redis://u:hunter2@h?request_timeout=0", "request_timeout"),
        ("redis://u:hunter2@h?connect_timeout=1h", "connect_timeout"),
        ("redis://u:hunter2@h/notadb", "database"),
        ("redis://u:hunter2@h:99999", "url"),
        ("redis://u:hunter2@h?prefix=p&prefix=q", "given twice"),
        (
            "redis://u:hunter2@h?fence_ttl=forever",
            "parameter `fence_ttl`: \"forever\" is not a duration",
        ),
        (
            "redis://u:hunter2@127.0.0.1:1?fence_ttl=1m",
            "fence_ttl: 60s is outside 86400s..=",
        ),
    ])
    .await;
}

#[cfg(not(feature = "zk"))]
#[tokio::test]
async fn zk_without_its_feature_names_it() {
    rejected(&[(
        "zk://u:hunter2@zk1:2181,zk2:2181/app",
        "needs the `zk` feature",
    )])
    .await;
}

#[cfg(feature = "zk")]
#[tokio::test]
async fn zk_urls() {
    unreachable(&format!(
        "zk://u:hunter2@{NOBODY},127.0.0.1:2/app?prefix=/locks&session_timeout=1s&connect_timeout=300ms&request_timeout=300ms&identifier=me%40host&naming=curator&ttl=5s"
    ))
    .await;
    rejected(&[
        (
            "zk://u:hunter2@h?operation_timeout=1s",
            // Renamed: refused with its new name.
            "parameter `operation_timeout` was renamed `request_timeout` for zk://",
        ),
        (
            "zk://u:hunter2@h?prefix=locks",
            "prefix: \"locks\" must start with",
        ),
        ("zk://u:hunter2@h?prefix=/zookeeper/x", "prefix:"),
        ("zk://u:hunter2@h?session_timeout=1ms", "session_timeout"),
        ("zk://u:hunter2@h1,,h2", "url"),
        ("zk://u:hunter2@h:0", "url"),
        ("zk://u:p%zz@h", "percent-encoded"),
        ("zk://u:hunter2@h?naming=zookeeper", "naming"),
    ])
    .await;
}

#[cfg(all(feature = "zk", not(feature = "zk-tls")))]
#[tokio::test]
async fn zk_tls_without_its_feature_names_it() {
    rejected(&[(
        "zk+tls://u:hunter2@zk1:2281?ca=/ca.pem",
        "needs the `zk-tls` feature",
    )])
    .await;
}

#[cfg(feature = "zk-tls")]
#[tokio::test]
async fn zk_tls_urls() {
    rejected(&[
        ("zk+tls://u:hunter2@h", "needs `ca=PATH`"),
        (
            "zk+tls://u:hunter2@h?ca=/a&cert=/c",
            "key: a client certificate needs its key",
        ),
        ("zk://u:hunter2@h?ca=/a", "use zk+tls://"),
        ("zk+tls://u:hunter2@h?ca=/no/such/ca.pem", "/no/such/ca.pem"),
    ])
    .await;
}

#[cfg(not(feature = "etcd"))]
#[tokio::test]
async fn etcd_without_its_feature_names_it() {
    rejected(&[(
        "etcd://u:hunter2@h1:2379,h2:2379",
        "needs the `etcd` feature",
    )])
    .await;
}

#[cfg(feature = "etcd")]
#[tokio::test]
async fn etcd_urls() {
    unreachable(&format!(
        "etcd://u:hunter2@{NOBODY},127.0.0.1:2?prefix=billing/&session_timeout=5s&request_timeout=300ms&connect_timeout=300ms&ttl=5s"
    ))
    .await;
    unreachable(&format!("etcd://{NOBODY}/billing/?connect_timeout=300ms")).await;
    rejected(&[
        (
            "etcd://u:hunter2@h:1?session_ttl=1s",
            // Renamed: refused with its new name.
            "parameter `session_ttl` was renamed `session_timeout` for etcd://",
        ),
        (
            "etcd://u:hunter2@h:1/ns/?prefix=other/",
            "prefix is given twice",
        ),
        (
            "etcd://u:hunter2@h:1?session_timeout=10",
            "parameter `session_timeout`",
        ),
        ("etcd://u:hunter2@h:1?session_timeout=0s", "session_timeout"),
        ("etcd://u:hunter2@h", "endpoints"),
        ("etcd://u:p%zz@h:1", "percent-encoded"),
    ])
    .await;
    let m = invalid(&format!("etcd://u:hunter2@h:1?prefix={}", "n".repeat(5000))).await;
    assert!(m.starts_with("prefix: is 5000 bytes long"), "{m}");
}

#[cfg(not(feature = "postgres"))]
#[tokio::test]
async fn postgres_without_its_feature_names_it() {
    rejected(&[
        (
            "postgres://app:hunter2@db:5432/billing",
            "needs the `postgres` feature",
        ),
        (
            "postgresql://app:hunter2@db/billing?sslmode=require",
            "needs the `postgres` feature",
        ),
    ])
    .await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_urls() {
    unreachable(&format!(
        "postgres://app:hunter2@{NOBODY}/billing?sslmode=disable&session_timeout=2s&request_timeout=300ms&connect_timeout=300ms&application_name=billing&owner=worker-1&ttl=5s&wait=1s"
    ))
    .await;
    unreachable(&format!(
        "postgresql://app:hunter2@{NOBODY},127.0.0.1:2/billing?connect_timeout=300ms"
    ))
    .await;
    rejected(&[
        (
            "postgres://app:hunter2@db?prefix=locks/",
            "unknown parameter `prefix` for postgres://",
        ),
        ("postgres://app:hunter2@db?sslmode=allow", "sslmode"),
        (
            "postgres://app:hunter2@db?session_timeout=1ms",
            "session_timeout",
        ),
        (
            "postgres://app:hunter2@db?session_timeout=10",
            "session_timeout",
        ),
        (
            "postgres://app:hunter2@db?connect_timeout=1h",
            "connect_timeout",
        ),
        ("postgres://app:hunter2@db/a/b", "one database name"),
        ("postgres://app:hunter2@db:99999", "url"),
        ("postgres://app:hunter2@db#frag", "fragments"),
        ("postgres://app:p%zz@db", "percent-encoded"),
        ("postgres://app:hunter2@db?owner=x&owner=y", "given twice"),
        (
            "postgres://app:hunter2@db?sslmode=verify-full",
            "sslrootcert",
        ),
        (
            "postgres://app:hunter2@db?sslmode=require&sslcert=/c.pem",
            "key",
        ),
    ])
    .await;
}
