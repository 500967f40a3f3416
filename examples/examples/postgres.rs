//! The PostgreSQL backend through its own builder: the server, the database, TLS as libpq reads
//! it and the session timeout, then one fenced lease.
//!
//! Needs PostgreSQL 14 or later (the lock session is ended by `idle_session_timeout` when its
//! client falls silent). Run it with
//!
//! ```sh
//! docker run --rm -p 5432:5432 -e POSTGRES_PASSWORD=secret postgres:16
//! PGHOST=127.0.0.1 PGPASSWORD=secret cargo run -p examples --features postgres --example postgres
//! ```
//!
//! `PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD` and `PGDATABASE` are read as psql reads them.
//! `dlock::connect("postgres://postgres:secret@127.0.0.1:5432/postgres?sslmode=disable&
//! session_timeout=15s")` builds the same client from a URL.

use std::error::Error;
use std::time::Duration;

use dlock::postgres::{PgLock, SslMode};
use dlock::{LockOptions, Locks};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    // The server from libpq's variables, so the example runs wherever psql does; the password
    // comes from PGPASSWORD, never from the source.
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let port: u16 = var("PGPORT", "5432").parse()?;
    let postgres = PgLock::builder()
        .with_host(var("PGHOST", "127.0.0.1"), port)
        .with_credentials(var("PGUSER", "postgres"), std::env::var("PGPASSWORD").ok())
        .with_database(var("PGDATABASE", "postgres"))
        .with_ssl_mode(SslMode::Prefer)
        .with_session_timeout(Duration::from_secs(15))
        .connect()
        .await?;
    let locks = Locks::from(postgres);

    let opts = LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(5));
    let lease = locks.acquire("invoices/42", &opts).await?;
    println!(
        "holding \"invoices/42\" (advisory key {}) with fencing token {} (from the dlock_fencing sequence)",
        PgLock::advisory_key("invoices/42"),
        lease.fencing_token()
    );
    println!("release: {:?}", lease.release().await?);
    Ok(())
}
