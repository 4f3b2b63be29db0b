//! A TCP proxy that injects faults between a client and its upstream (a replica and its
//! database, a bridge and its harness): the network failures a test needs, on loopback.
//!
//! - **forward** (the start, and [`FaultProxy::restore`]): bytes pass as they come;
//! - **black hole** ([`FaultProxy::black_hole`]): nothing passes either way and no socket is
//!   closed — bytes already read wait, the rest stays in the kernels' buffers — and a new
//!   connection is accepted but never forwarded. As a dropped-packet partition looks to both
//!   ends: silence, until [`FaultProxy::restore`] lets everything held through in order (as TCP
//!   retransmission would);
//! - **reset** ([`FaultProxy::reset`]): every connection is closed and new ones are closed as soon
//!   as they are accepted, until restored;
//! - **delay** ([`FaultProxy::delay`]): every chunk read, either way, is passed on that long after
//!   it arrived (latency, not a lower throughput);
//! - [`FaultProxy::close_connections`] closes the open connections once and leaves new ones to
//!   the current mode; [`FaultProxy::point_to`] sends new connections elsewhere.

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        TcpListener, TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::{mpsc, watch},
    task::{AbortHandle, JoinHandle},
    time::Instant,
};

/// What the proxy does with traffic now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Forward,
    BlackHole,
    Reset,
    Delay(Duration),
}

/// Chunks read at once; small enough that a delayed stream stays a stream.
const CHUNK: usize = 16 * 1024;

/// A fault-injecting TCP proxy on `127.0.0.1`; see the module documentation.
pub struct FaultProxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    upstream: Arc<Mutex<String>>,
    accepted: Arc<AtomicUsize>,
    links: Arc<Mutex<Vec<AbortHandle>>>,
    acceptor: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`
    /// (`host:port`).
    pub async fn start(upstream: impl ToString) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("the proxy binds a loopback port");
        let addr = listener.local_addr().expect("a bound address");
        let mode = watch::Sender::new(Mode::Forward);
        let upstream = Arc::new(Mutex::new(upstream.to_string()));
        let accepted = Arc::new(AtomicUsize::new(0));
        let links: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let acceptor = tokio::spawn({
            let (mode, upstream, accepted, links) = (
                mode.clone(),
                upstream.clone(),
                accepted.clone(),
                links.clone(),
            );
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    if *mode.borrow() == Mode::Reset {
                        drop(client);
                        continue;
                    }
                    let to = upstream.lock().expect("not poisoned").clone();
                    let link = tokio::spawn(link(client, to, mode.subscribe()));
                    let mut links = links.lock().expect("not poisoned");
                    links.retain(|l| !l.is_finished());
                    links.push(link.abort_handle());
                }
            }
        });
        Self {
            addr,
            mode,
            upstream,
            accepted,
            links,
            acceptor,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Connections accepted so far, whatever became of them.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Forwards again: what a black hole or a delay held goes on at once, in order.
    pub fn restore(&self) {
        self.mode.send_replace(Mode::Forward);
    }

    /// Stops forwarding both ways without closing anything; new connections are accepted and
    /// held.
    pub fn black_hole(&self) {
        self.mode.send_replace(Mode::BlackHole);
    }

    /// Closes every connection, and each new one as soon as it is accepted.
    pub fn reset(&self) {
        self.mode.send_replace(Mode::Reset);
        self.close_connections();
    }

    /// Passes every chunk on `by` after it arrived, both ways.
    pub fn delay(&self, by: Duration) {
        self.mode.send_replace(Mode::Delay(by));
    }

    /// Closes every open connection (both of its sockets); new ones are handled as before.
    pub fn close_connections(&self) {
        for link in self.links.lock().expect("not poisoned").drain(..) {
            link.abort();
        }
    }

    /// Sends new connections to `upstream` from now on (open ones stay where they are).
    pub fn point_to(&self, upstream: impl ToString) {
        *self.upstream.lock().expect("not poisoned") = upstream.to_string();
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.acceptor.abort();
        self.close_connections();
    }
}

/// Waits while the proxy black-holes; the mode it then has.
async fn passable(mode: &mut watch::Receiver<Mode>) -> Option<Mode> {
    mode.wait_for(|m| *m != Mode::BlackHole)
        .await
        .ok()
        .map(|m| *m)
}

/// One accepted connection: connected upstream once traffic may pass, then a pump each way.
async fn link(client: TcpStream, upstream: String, mut mode: watch::Receiver<Mode>) {
    if passable(&mut mode).await.is_none() {
        return;
    }
    let Ok(server) = TcpStream::connect(&upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pump(client_read, server_write, mode.clone()),
        pump(server_read, client_write, mode),
    );
}

/// Carries one direction: a reader stamps each chunk with when it may go on, a writer sends
/// it then. Either waits while the proxy black-holes.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mode: watch::Receiver<Mode>) {
    let (chunks, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = {
        let mut mode = mode.clone();
        async move {
            let mut buf = vec![0; CHUNK];
            loop {
                if passable(&mut mode).await.is_none() {
                    return;
                }
                let n = match from.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let delay = match *mode.borrow() {
                    Mode::Delay(by) => by,
                    _ => Duration::ZERO,
                };
                if chunks
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
                {
                    return;
                }
            }
        }
    };
    let writer = {
        let mut mode = mode;
        async move {
            while let Some((at, chunk)) = due.recv().await {
                tokio::time::sleep_until(at).await;
                if passable(&mut mode).await.is_none() || to.write_all(&chunk).await.is_err() {
                    return;
                }
            }
            // The other end finished sending: pass that on.
            let _ = to.shutdown().await;
        }
    };
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upstream that echoes every byte back.
    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = socket.into_split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream, text: &[u8]) -> Vec<u8> {
        stream.write_all(text).await.unwrap();
        read_exactly(stream, text.len()).await
    }

    async fn read_exactly(stream: &mut TcpStream, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n];
        stream.read_exact(&mut buf).await.unwrap();
        buf
    }

    /// Whether anything arrives within a short look (a black hole must stay silent).
    async fn silent(stream: &mut TcpStream) -> bool {
        let mut buf = [0; 1];
        tokio::time::timeout(Duration::from_millis(200), stream.read(&mut buf))
            .await
            .is_err()
    }

    #[tokio::test]
    async fn a_black_hole_holds_traffic_without_closing_and_restoring_lets_it_through_in_order() {
        crate::bounded(async {
            let proxy = FaultProxy::start(echo_server().await).await;
            let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
            assert_eq!(round_trip(&mut open, b"before").await, b"before");

            proxy.black_hole();
            open.write_all(b"during").await.unwrap();
            assert!(silent(&mut open).await, "nothing comes back");
            let mut new = TcpStream::connect(proxy.addr()).await.unwrap();
            new.write_all(b"new").await.unwrap();
            assert!(silent(&mut new).await, "a new connection is held too");

            proxy.restore();
            open.write_all(b" after").await.unwrap();
            assert_eq!(read_exactly(&mut open, 12).await, b"during after");
            assert_eq!(read_exactly(&mut new, 3).await, b"new");
            assert_eq!(proxy.accepted(), 2);
        })
        .await;
    }

    #[tokio::test]
    async fn a_reset_closes_every_connection_and_refuses_new_ones_until_restored() {
        crate::bounded(async {
            let proxy = FaultProxy::start(echo_server().await).await;
            let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
            assert_eq!(round_trip(&mut open, b"x").await, b"x");

            proxy.reset();
            let mut buf = [0; 1];
            assert!(
                matches!(open.read(&mut buf).await, Ok(0) | Err(_)),
                "closed"
            );
            let mut refused = TcpStream::connect(proxy.addr()).await.unwrap();
            assert!(
                matches!(refused.read(&mut buf).await, Ok(0) | Err(_)),
                "a new connection is closed at once"
            );

            proxy.restore();
            let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
            assert_eq!(round_trip(&mut again, b"back").await, b"back");
        })
        .await;
    }

    #[tokio::test]
    async fn a_delay_passes_every_chunk_on_no_sooner_than_asked() {
        crate::bounded(async {
            let proxy = FaultProxy::start(echo_server().await).await;
            let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
            let by = Duration::from_millis(300);
            proxy.delay(by);
            let sent = Instant::now();
            // Delayed once each way.
            assert_eq!(round_trip(&mut stream, b"slow").await, b"slow");
            assert!(sent.elapsed() >= by * 2);
        })
        .await;
    }

    #[tokio::test]
    async fn pointing_elsewhere_sends_new_connections_there_and_closing_ends_the_old_ones() {
        crate::bounded(async {
            let first = echo_server().await;
            let proxy = FaultProxy::start(first).await;
            let mut old = TcpStream::connect(proxy.addr()).await.unwrap();
            assert_eq!(round_trip(&mut old, b"1").await, b"1");
            let second = TcpListener::bind("127.0.0.1:0").await.unwrap();
            proxy.point_to(second.local_addr().unwrap());
            proxy.close_connections();
            let mut buf = [0; 1];
            assert!(matches!(old.read(&mut buf).await, Ok(0) | Err(_)), "closed");
            let _new = TcpStream::connect(proxy.addr()).await.unwrap();
            second.accept().await.expect("the new target is dialled");
        })
        .await;
    }
}
