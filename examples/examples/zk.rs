//! The ZooKeeper backend through its own builder: a chroot in the URL, the session timeout and
//! the owner label (written into the owner record of every node it creates), then one fenced lease.
//!
//! Needs a ZooKeeper ensemble (3.5 or later). Run it with
//!
//! ```sh
//! docker run --rm -p 2181:2181 zookeeper:3.9   # or any ensemble you have
//! ZK_URL=zk://127.0.0.1:2181/examples cargo run -p examples --features zk --example zk
//! ```
//!
//! `dlock::connect("zk://127.0.0.1:2181/examples?session_timeout=15s")` builds the same client
//! from a URL.

use std::error::Error;
use std::time::Duration;

use dlock::zk::ZkLock;
use dlock::{LockOptions, Locks};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let url = std::env::var("ZK_URL").unwrap_or_else(|_| "zk://127.0.0.1:2181/examples".to_owned());
    let zk = ZkLock::builder(&url)
        .with_session_timeout(Duration::from_secs(15))
        .with_owner("zk-example")
        .connect()
        .await?;
    let locks = Locks::from(zk);

    // The lease follows the ZooKeeper session: held while connected, uncertain while
    // disconnected, lost when the session expires.
    let opts = LockOptions::new(Duration::from_secs(30))
        .with_wait(Duration::from_secs(5))
        .with_auto_renew();
    let lease = locks.acquire("invoices/42", &opts).await?;
    println!(
        "holding \"invoices/42\" with fencing token {} (the node's creation zxid)",
        lease.fencing_token()
    );
    println!("state: {}", lease.state());
    println!("release: {:?}", lease.release().await?);
    Ok(())
}
