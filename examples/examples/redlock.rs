//! The Redlock backend through its own builder: takes a lock on independent Redis masters, shows
//! its fencing token, and gives it back.
//!
//! ```sh
//! cargo run -p examples --features redlock --example redlock -- redis://h1:6379 redis://h2:6379 redis://h3:6379
//! ```
//!
//! Without arguments it reads the comma-separated URLs of `DLOCK_TEST_REDLOCK_URLS`.
//! `dlock::connect("redlock://h1:6379,h2:6379,h3:6379?request_timeout=20ms")` builds the same
//! client from a URL.

use std::time::Duration;

use dlock::redlock::RedlockBuilder;
use dlock::{LockOptions, Locks};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut urls: Vec<String> = std::env::args().skip(1).collect();
    if urls.is_empty() {
        urls = std::env::var("DLOCK_TEST_REDLOCK_URLS")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect();
    }
    let redlock = RedlockBuilder::from_urls(urls).connect().await?;
    let (quorum, masters) = (redlock.quorum(), redlock.endpoints().len());
    let locks = Locks::from(redlock);
    let opts = LockOptions::new(Duration::from_secs(10)).with_wait(Duration::from_secs(5));
    let lease = locks.acquire("examples/redlock", &opts).await?;
    println!(
        "held examples/redlock with fencing token {} (quorum {} of {})",
        lease.fencing_token(),
        quorum,
        masters
    );
    println!("released: {:?}", lease.release().await?);
    Ok(())
}
