//! The Redis backend through its own builder: a key prefix and request timeouts, then one fenced
//! lease.
//!
//! Needs a Redis server (5 or later). Run it with
//!
//! ```sh
//! docker run --rm -p 6379:6379 redis:7        # or any server you have
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p examples --features redis --example redis
//! ```
//!
//! `dlock::connect("redis://127.0.0.1:6379?prefix=billing:&request_timeout=500ms")` builds the
//! same client from a URL.

use std::error::Error;
use std::time::Duration;

use dlock::redis::RedisLock;
use dlock::{LockOptions, Locks};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let redis = RedisLock::builder(url)
        .with_prefix("billing:")
        .with_request_timeout(Duration::from_millis(500))
        .with_connect_timeout(Duration::from_secs(2))
        .connect()
        .await?;
    println!("connected to {}", redis.endpoint());
    let locks = Locks::from(redis);

    let opts = LockOptions::new(Duration::from_secs(10)).with_wait(Duration::from_secs(5));
    let lease = locks.acquire("invoices/42", &opts).await?;
    println!(
        "holding \"invoices/42\" (Redis key billing:invoices/42) with fencing token {}",
        lease.fencing_token()
    );
    println!("status: {}", locks.holding("invoices/42").await?);
    println!("release: {:?}", lease.release().await?);
    Ok(())
}
