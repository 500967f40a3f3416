//! Metrics and tracing around any backend: contended acquires, a renewal, a forced unlock, and
//! the Prometheus scrape they produce.
//!
//! ```sh
//! cargo run -p examples --example metrics
//! ```
//!
//! The URL can name any backend (`DLOCK_URL=redis://localhost:6379 cargo run … --features redis`).

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The application installs the exporter; dlock records into whichever is installed.
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    let url = std::env::var("DLOCK_URL").unwrap_or_else(|_| "memory://?ttl=10s".into());
    let locks = dlock::builder(&url)
        .with_tracing()
        .with_metrics()
        .connect()
        .await?;
    let opts = locks.options().clone();

    // Two workers on one key: one waits while the other holds.
    let mut first = locks.acquire("reports/daily", &opts).await?;
    let second = {
        let (locks, opts) = (
            locks.clone(),
            opts.clone().with_wait(Duration::from_secs(5)),
        );
        tokio::spawn(async move { locks.acquire("reports/daily", &opts).await })
    };
    assert!(locks.try_acquire("reports/daily", &opts).await?.is_none()); // busy
    first.extend(opts.ttl).await?; // a renewal
    tokio::time::sleep(Duration::from_millis(50)).await;
    first.release().await?;
    let second = second.await??;

    // An operator evicts the second holder; it finds out at its next renewal.
    let mut evicted = second;
    let held = locks.admin().list("reports/").await?;
    println!("held before the eviction: {} lock(s)", held.len());
    locks
        .admin()
        .force_unlock("reports/daily", Some(evicted.fencing_token()))
        .await?;
    assert!(evicted.extend(opts.ttl).await.is_err());

    println!("{}", prometheus.render());
    Ok(())
}
