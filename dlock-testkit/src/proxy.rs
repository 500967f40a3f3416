//! A TCP proxy that can freeze the link between one client and its server.
//!
//! Session-based backends keep their sessions alive from a background task of the client
//! library, so stopping dlock's renewals does not make a holder lose its lock. Freezing the
//! client's connection does, exactly as a long process pause or a partition between that client
//! and the servers would: bytes stop flowing both ways, the server expires the session, the client
//! sees its connection stall. Thawing lets the held-up bytes through.
//!
//! A proxy started with [`FreezeProxy::start_dropping`] discards the bytes instead of holding
//! them, as a route that drops packets or a peer that forgot the connection would: the
//! connection stays open, nothing sent in the silence ever arrives, and a client that keeps
//! waiting for those answers on the same connection waits forever.
//!
//! [`FreezeProxy::silence_links`] silences the links open now for good, while new connections
//! pass: a half-open connection, or a route gone for one flow, that a client must replace.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::control::Freeze;

/// What a frozen link does with the bytes sent over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frozen {
    /// Holds them until the thaw, like packets in a queue.
    Hold,
    /// Discards them.
    Drop,
}

/// Forwards every connection made to [`addr`](FreezeProxy::addr) to a target address.
#[derive(Debug)]
pub struct FreezeProxy {
    addr: SocketAddr,
    frozen: Arc<watch::Sender<bool>>,
    /// Each open link's flag: set, the link discards its bytes for good.
    links: Arc<Mutex<Vec<Weak<AtomicBool>>>>,
    acceptor: JoinHandle<()>,
}

/// Accepts connections on `listener` until it fails, each handled by `link` on a task of its
/// own: the accept loop every proxy here runs. Aborting the returned task stops accepting.
pub fn accept_links<F, Fut>(listener: TcpListener, mut link: F) -> JoinHandle<()>
where
    F: FnMut(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        let mut links = Vec::new();
        while let Ok((client, _)) = listener.accept().await {
            links.push(tokio::spawn(link(client)));
            links.retain(|l: &JoinHandle<()>| !l.is_finished());
        }
        for link in links {
            link.abort();
        }
    })
}

impl FreezeProxy {
    /// Listens on a free loopback port and forwards to `target`; a frozen link holds its bytes.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        Self::start_with(target, Frozen::Hold).await
    }

    /// Like [`start`](Self::start), but a frozen link discards its bytes, both ways, and stays
    /// open: the thaw lets only bytes sent after it through.
    pub async fn start_dropping(target: SocketAddr) -> std::io::Result<Self> {
        Self::start_with(target, Frozen::Drop).await
    }

    async fn start_with(target: SocketAddr, mode: Frozen) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let frozen = Arc::new(watch::channel(false).0);
        let links: Arc<Mutex<Vec<Weak<AtomicBool>>>> = Arc::default();
        let gate = frozen.clone();
        let open = links.clone();
        let acceptor = accept_links(listener, move |client| {
            let gate = gate.clone();
            let dead = Arc::new(AtomicBool::new(false));
            open.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Arc::downgrade(&dead));
            async move {
                if let Ok(server) = TcpStream::connect(target).await {
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let up = tokio::spawn(pump(cr, sw, gate.subscribe(), dead.clone(), mode));
                    let down = tokio::spawn(pump(sr, cw, gate.subscribe(), dead, mode));
                    let _ = tokio::join!(up, down);
                }
            }
        });
        Ok(FreezeProxy {
            addr,
            frozen,
            links,
            acceptor,
        })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Silences every link open now for good (bytes discarded both ways, connections left open);
    /// connections made from now on pass as usual.
    pub fn silence_links(&self) {
        let mut links = self.links.lock().unwrap_or_else(PoisonError::into_inner);
        links.retain(|link| match link.upgrade() {
            Some(dead) => {
                dead.store(true, Ordering::SeqCst);
                true
            }
            None => false,
        });
    }

    /// A handle that freezes and thaws this proxy's links.
    pub fn switch(&self) -> Arc<dyn Freeze> {
        Arc::new(Switch(self.frozen.clone()))
    }
}

/// The proxy is its own switch: a test that hands out `Arc<dyn Freeze>` keeps the proxy running
/// for as long as the switch is held.
impl Freeze for FreezeProxy {
    fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    fn thaw(&self) {
        self.frozen.send_replace(false);
    }
}

impl Drop for FreezeProxy {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

/// The address of the server at `url` (`scheme://[user[:password]@]host[:port][/path]`), for
/// a proxy in front of it; `default_port` where the URL has none.
pub fn url_target(url: &str, default_port: u16) -> anyhow::Result<SocketAddr> {
    let parsed = url::Url::parse(url).map_err(|e| anyhow::anyhow!("not a URL: {e}"))?;
    parsed
        .socket_addrs(|| Some(default_port))?
        .first()
        .copied()
        .ok_or_else(|| anyhow::anyhow!("the URL's host has no address"))
}

/// `url` with its host and port replaced by `addr`: the same server, reached through a proxy.
pub fn url_via(url: &str, addr: SocketAddr) -> anyhow::Result<String> {
    let mut parsed = url::Url::parse(url).map_err(|e| anyhow::anyhow!("not a URL: {e}"))?;
    parsed
        .set_ip_host(addr.ip())
        .and_then(|()| parsed.set_port(Some(addr.port())))
        .map_err(|()| anyhow::anyhow!("the URL cannot have a host and port"))?;
    Ok(parsed.into())
}

/// Dropping proxies in front of every address of a service, frozen and thawed together; they
/// stop when this is dropped.
#[derive(Debug)]
pub struct DroppingProxies(Vec<FreezeProxy>);

impl DroppingProxies {
    /// One [`FreezeProxy::start_dropping`] per target, in order.
    pub async fn start(targets: &[SocketAddr]) -> std::io::Result<Self> {
        let mut proxies = Vec::with_capacity(targets.len());
        for target in targets {
            proxies.push(FreezeProxy::start_dropping(*target).await?);
        }
        Ok(DroppingProxies(proxies))
    }

    /// The addresses to connect to instead of the targets, in the same order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.0.iter().map(FreezeProxy::addr).collect()
    }

    /// [`FreezeProxy::silence_links`] on every proxy.
    pub fn silence_links(&self) {
        self.0.iter().for_each(FreezeProxy::silence_links);
    }
}

impl Freeze for DroppingProxies {
    fn freeze(&self) {
        self.0.iter().for_each(|p| {
            p.frozen.send_replace(true);
        });
    }

    fn thaw(&self) {
        self.0.iter().for_each(|p| {
            p.frozen.send_replace(false);
        });
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

/// Copies bytes from `from` to `to`, holding or discarding them while frozen, and discarding
/// them for good once `dead` is set.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
    dead: Arc<AtomicBool>,
    mode: Frozen,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if mode == Frozen::Hold && frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if dead.load(Ordering::SeqCst) {
            continue;
        }
        match mode {
            // Bytes read just before a freeze are held until the thaw, like packets in a queue.
            Frozen::Hold => {
                if frozen.wait_for(|f| !*f).await.is_err() {
                    return;
                }
            }
            Frozen::Drop => {
                if *frozen.borrow() {
                    continue;
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
