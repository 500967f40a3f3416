//! A TCP proxy that can lose the server's replies on the links that are open now: requests still
//! reach the server, answers never come back, and the client eventually gives the connection up
//! and reconnects (through a new, healthy link). That is the "create applied, reply lost" fault.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use dlock_testkit::proxy::accept_links;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Forwards connections to a target; [`LossyProxy::lose_replies`] cuts the way back.
pub struct LossyProxy {
    addr: SocketAddr,
    links: Arc<Mutex<Vec<Arc<AtomicBool>>>>,
    acceptor: JoinHandle<()>,
}

impl LossyProxy {
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let links: Arc<Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let registry = links.clone();
        let acceptor = accept_links(listener, move |client| {
            let lose = Arc::new(AtomicBool::new(false));
            registry
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(lose.clone());
            async move {
                let Ok(server) = TcpStream::connect(target).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let never = Arc::new(AtomicBool::new(false));
                let up = tokio::spawn(pump(cr, sw, never));
                let down = tokio::spawn(pump(sr, cw, lose));
                let _ = up.await;
                down.abort();
            }
        });
        Ok(LossyProxy {
            addr,
            links,
            acceptor,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// From now on, the server's bytes on every link open now are dropped.
    pub fn lose_replies(&self) {
        for link in self
            .links
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
        {
            link.store(true, Ordering::SeqCst);
        }
    }
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    lose: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if lose.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
