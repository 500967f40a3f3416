//! A TCP proxy that can freeze the link between one client and its server.
//!
//! Session-based backends keep their sessions alive from a background task of the client
//! library, so stopping dlock's renewals does not make a holder lose its lock. Freezing the
//! client's connection does, exactly as a long process pause or a partition between that client
//! and the servers would: bytes stop flowing both ways, the server expires the session, the client
//! sees its connection stall. Thawing lets the held-up bytes through.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::subject::Freeze;

/// Forwards every connection made to [`addr`](FreezeProxy::addr) to a target address.
#[derive(Debug)]
pub struct FreezeProxy {
    addr: SocketAddr,
    frozen: Arc<watch::Sender<bool>>,
    acceptor: JoinHandle<()>,
}

impl FreezeProxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let frozen = Arc::new(watch::channel(false).0);
        let gate = frozen.clone();
        let acceptor = tokio::spawn(async move {
            let mut links = Vec::new();
            while let Ok((client, _)) = listener.accept().await {
                let gate = gate.clone();
                links.push(tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(target).await {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let (cr, cw) = client.into_split();
                        let (sr, sw) = server.into_split();
                        let up = tokio::spawn(pump(cr, sw, gate.subscribe()));
                        let down = tokio::spawn(pump(sr, cw, gate.subscribe()));
                        let _ = tokio::join!(up, down);
                    }
                }));
                links.retain(|l: &JoinHandle<()>| !l.is_finished());
            }
            for link in links {
                link.abort();
            }
        });
        Ok(FreezeProxy {
            addr,
            frozen,
            acceptor,
        })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A handle that freezes and thaws this proxy's links.
    pub fn switch(&self) -> Arc<dyn Freeze> {
        Arc::new(Switch(self.frozen.clone()))
    }
}

impl Drop for FreezeProxy {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

struct Switch(Arc<watch::Sender<bool>>);

impl Freeze for Switch {
    fn freeze(&self) {
        self.0.send_replace(true);
    }

    fn thaw(&self) {
        self.0.send_replace(false);
    }
}

/// Copies bytes from `from` to `to`, holding them while frozen.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Bytes read just before a freeze are held until the thaw, like packets in a queue.
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
