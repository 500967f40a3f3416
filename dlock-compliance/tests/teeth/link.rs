//! A network link in front of the in-process service, so that the silent-link case can cut it:
//! every call of a [`Linked`] client first makes a round trip to an echo server over TCP, through
//! the case's proxy. A correct client drops a connection that stopped answering and opens a new
//! one on the next call; the defective one keeps it, and so fails every call from then on, as a
//! pipelining client does when a reply it waits for will never come.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Attempt, Capabilities, Extension, LeaseRef, LockRequest};
use dlock_core::{DistributedLock, Error, Released, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// The bound on one round trip.
const ROUND_TRIP: Duration = Duration::from_millis(500);

/// How long a defective client answers busy for the key of a try that failed on the link.
const FAILED_BUSY: Duration = Duration::from_secs(10);

/// The address of an echo server that runs on threads of its own for the rest of the process
/// (each case's runtime ends with the case; the server must outlive them).
pub fn echo_server() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let addr = listener.local_addr().expect("the listener's address");
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    if let Ok(mut back) = stream.try_clone() {
                        let _ = std::io::copy(&mut stream, &mut back);
                    }
                });
            }
        });
        addr
    })
}

#[derive(Debug)]
enum Link {
    /// No connection yet, or the last one was dropped.
    Closed,
    Open(TcpStream),
    /// A round trip on it timed out.
    Silent(TcpStream),
}

/// A client of `inner` whose calls each need an answer from the echo server at `addr` first.
#[derive(Debug)]
pub struct Linked {
    inner: Arc<dyn DistributedLock>,
    addr: SocketAddr,
    /// Whether a connection that stopped answering is replaced (the correct behaviour).
    replaces_silent: bool,
    /// With [`Defect::FailedAttemptKeepsKeyBusy`](crate::broken::Defect): the keys of tries that
    /// failed on the link, answered busy by this client until the instant given (as a client
    /// whose clean-up of an abandoned attempt holds the key's local turn does).
    failed_busy: Option<std::sync::Mutex<HashMap<String, Instant>>>,
    link: Mutex<Link>,
}

impl Linked {
    pub fn new(
        inner: Arc<dyn DistributedLock>,
        addr: SocketAddr,
        replaces_silent: bool,
        keeps_failed_busy: bool,
    ) -> Self {
        Linked {
            inner,
            addr,
            replaces_silent,
            failed_busy: keeps_failed_busy.then(Default::default),
            link: Mutex::new(Link::Closed),
        }
    }

    async fn round_trip(&self) -> Result<()> {
        let mut link = self.link.lock().await;
        let mut stream = match std::mem::replace(&mut *link, Link::Closed) {
            Link::Open(stream) => Some(stream),
            Link::Silent(stream) if !self.replaces_silent => {
                *link = Link::Silent(stream);
                return Err(unavailable("the connection stopped answering".into()));
            }
            Link::Silent(_) | Link::Closed => None,
        };
        let exchanged = tokio::time::timeout(ROUND_TRIP, async {
            let stream = match &mut stream {
                Some(stream) => stream,
                None => stream.insert(TcpStream::connect(self.addr).await?),
            };
            stream.write_all(&[1]).await?;
            let mut echo = [0u8; 1];
            stream.read_exact(&mut echo).await?;
            std::io::Result::Ok(())
        })
        .await;
        match (exchanged, stream) {
            (Ok(Ok(())), Some(stream)) => {
                *link = Link::Open(stream);
                Ok(())
            }
            (Err(_), Some(stream)) => {
                *link = Link::Silent(stream);
                Err(unavailable(format!("no answer within {ROUND_TRIP:?}")))
            }
            (Err(_), None) => Err(unavailable(format!("no connection within {ROUND_TRIP:?}"))),
            (Ok(Err(e)), _) => Err(unavailable(e.to_string())),
            (Ok(Ok(())), None) => Err(unavailable("no connection".into())),
        }
    }
}

fn unavailable(why: String) -> Error {
    Error::Unavailable {
        reached: 0,
        needed: 1,
        source: Some(why.into()),
    }
}

#[async_trait]
impl DistributedLock for Linked {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_lock(&self, req: &LockRequest<'_>) -> Result<Attempt> {
        if let Some(failed) = &self.failed_busy {
            let key = req.key.as_str();
            let mut failed = failed.lock().unwrap_or_else(PoisonError::into_inner);
            if failed.get(key).is_some_and(|until| Instant::now() < *until) {
                return Ok(Attempt::Busy { retry_after: None });
            }
            failed.remove(key);
        }
        if let Err(error) = self.round_trip().await {
            if let Some(failed) = &self.failed_busy {
                failed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(req.key.to_string(), Instant::now() + FAILED_BUSY);
            }
            return Err(error);
        }
        self.inner.try_lock(req).await
    }

    async fn extend(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<Extension> {
        self.round_trip().await?;
        self.inner.extend(lease, ttl).await
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<Released> {
        self.round_trip().await?;
        self.inner.release(lease).await
    }
}
