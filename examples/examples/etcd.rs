//! The etcd backend through its own builder: several endpoints, a namespace and the session
//! TTL, then one fenced lease.
//!
//! Needs an etcd cluster (3.4 or later). Run it with
//!
//! ```sh
//! docker run --rm -p 2379:2379 quay.io/coreos/etcd:v3.5.17 etcd \
//!     --listen-client-urls http://0.0.0.0:2379 --advertise-client-urls http://127.0.0.1:2379
//! ETCD_ENDPOINTS=127.0.0.1:2379 cargo run -p examples --features etcd --example etcd
//! ```
//!
//! `ETCD_ENDPOINTS` takes a comma-separated list. `dlock::connect("etcd://127.0.0.1:2379/
//! billing/locks/?session_timeout=15s")` builds the same client from a URL.

use std::error::Error;
use std::time::Duration;

use dlock::etcd::EtcdLock;
use dlock::{LockOptions, Locks};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let endpoints = std::env::var("ETCD_ENDPOINTS").unwrap_or_else(|_| "127.0.0.1:2379".to_owned());
    let etcd = EtcdLock::builder()
        .with_endpoints(endpoints.split(','))
        .with_prefix("billing/locks/")
        .with_session_timeout(Duration::from_secs(15))
        .connect()
        .await?;
    let locks = Locks::from(etcd);

    let opts = LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(5));
    let lease = locks.acquire("invoices/42", &opts).await?;
    println!(
        "holding \"invoices/42\" with fencing token {} (the key's create revision)",
        lease.fencing_token()
    );
    println!("release: {:?}", lease.release().await?);
    Ok(())
}
