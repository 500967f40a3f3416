//! `dlock::connect` against a real PostgreSQL server (the test kit's container, or the server
//! named in `DLOCK_TEST_POSTGRES_URL`): both schemes connect, the URL's defaults reach the
//! handle, a lease excludes a second client and is seen by `holding`, and the handle's `Debug`
//! and URL never show the password.

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use dlock::Holding;
use dlock_testkit::fixtures::{docker_opt_out, PostgresServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_schemes_connect_and_exclude_each_other() {
    if PostgresServer::needs_docker() && docker_opt_out() {
        eprintln!(
            "skipped: no PostgreSQL server (DLOCK_TEST_POSTGRES_URL unset, Docker opted out)"
        );
        return;
    }
    let server = PostgresServer::start().await.unwrap();
    let url = server.url();
    let params = "session_timeout=2s&connect_timeout=10s&ttl=5s&wait=300ms&owner=facade-test";
    let sep = if url.contains('?') { '&' } else { '?' };
    let first = dlock::connect(&format!("{url}{sep}{params}"))
        .await
        .unwrap();
    let other_url = url.replacen("postgres://", "postgresql://", 1);
    let second = dlock::connect(&format!("{other_url}{sep}{params}&tracing=true"))
        .await
        .unwrap();
    assert_eq!(first.backend().backend_name(), "postgres");
    assert_eq!(first.options().ttl, Duration::from_secs(5));
    assert_eq!(first.options().wait, Some(Duration::from_millis(300)));
    if let Some(password) = dlock_testkit::fixtures::postgres::password_of(&url) {
        for shown in [
            format!("{first:?}"),
            first.url().to_owned(),
            format!("{second:?}"),
        ] {
            assert!(!shown.contains(&password), "the password shows in {shown}");
        }
    }

    let key = format!("dlock-facade-test/{}", std::process::id());
    let lease = first.acquire(&key, first.options()).await.unwrap();
    assert!(second
        .try_acquire(&key, second.options())
        .await
        .unwrap()
        .is_none());
    match second.holding(&key).await.unwrap() {
        Holding::Held(holder) => {
            assert_eq!(holder.fencing, Some(lease.fencing_token()));
            let owner = holder.owner.expect("the holder's owner record");
            assert_eq!(owner.label.as_deref(), Some("facade-test"));
        }
        other => panic!("expected held, got {other:?}"),
    }
    let token = lease.fencing_token();
    lease.release().await.unwrap();
    let next = second.acquire(&key, second.options()).await.unwrap();
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();
    assert_eq!(first.holding(&key).await.unwrap(), Holding::Free);
    server.shutdown().await.unwrap();
}
