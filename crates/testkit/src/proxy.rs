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
//!   the current mode; [`FaultProxy::point_to`] sends new connections elsewhere;
//! - **a trip** ([`FaultProxy::trip`]): one fault at one exact moment of a conversation — when a
//!   client sends a given request (say PostgreSQL's `COMMIT` after a transaction that wrote a
//!   given value): the request's answer is lost, or the request itself, or the proxy black-holes
//!   right after the request went on.

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

/// What a trip does to the connection whose client sent the request it waits for (see
/// [`FaultProxy::trip`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trip {
    /// The request goes on; the upstream's answer to it is dropped and the connection closed:
    /// the request was served, and its client never learns it.
    LoseAnswer,
    /// The request is dropped and the connection closed: it never arrives.
    LoseRequest,
    /// The request goes on, then the proxy black-holes every connection, as
    /// [`FaultProxy::black_hole`] does: the request was served, its answer is held.
    BlackHoleAfter,
    /// The proxy black-holes every connection before the request goes on: it is held, and
    /// arrives only once restored (if its connection is still there to carry it).
    BlackHoleBefore,
}

/// A trip waiting for its request.
struct Armed {
    after: Vec<u8>,
    on: Vec<u8>,
    trip: Trip,
}

/// What every connection of a proxy shares: the mode, and the trip armed.
struct Faults {
    mode: watch::Sender<Mode>,
    armed: Mutex<Option<Armed>>,
    tripped: watch::Sender<bool>,
}

impl Faults {
    /// The trip to apply to a chunk a client sent, given what its connection sent before
    /// (`tail`, the end of the previous chunk; `seen_after`, whether the trip's `after` came).
    fn check(&self, chunk: &[u8], tail: &mut Vec<u8>, seen_after: &mut bool) -> Option<Trip> {
        let mut armed = self.armed.lock().expect("not poisoned");
        let trip = armed.as_ref()?;
        let mut window = std::mem::take(tail);
        window.extend_from_slice(chunk);
        let keep = trip.after.len().max(trip.on.len()).saturating_sub(1);
        let mut from = 0;
        if !*seen_after && let Some(at) = find(&window, &trip.after) {
            *seen_after = true;
            from = at + trip.after.len();
        }
        let fires = *seen_after && find(&window[from..], &trip.on).is_some();
        *tail = window[window.len().saturating_sub(keep)..].to_vec();
        if !fires {
            return None;
        }
        let trip = armed.take().map(|a| a.trip);
        self.tripped.send_replace(true);
        trip
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// One connection's side of a trip.
#[derive(Default)]
struct LinkFaults {
    /// The next chunk from upstream is the answer to lose.
    lose_answer: std::sync::atomic::AtomicBool,
    /// Closes the connection.
    cut: tokio::sync::Notify,
}

/// Which way a pump carries bytes, with what it needs for trips.
enum Way {
    /// Client to upstream: where a trip's request is seen.
    Request(Arc<Faults>, Arc<LinkFaults>),
    /// Upstream to client: where an answer is lost.
    Answer(Arc<LinkFaults>),
}

/// A fault-injecting TCP proxy on `127.0.0.1`; see the module documentation.
pub struct FaultProxy {
    addr: SocketAddr,
    faults: Arc<Faults>,
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
        let faults = Arc::new(Faults {
            mode: watch::Sender::new(Mode::Forward),
            armed: Mutex::new(None),
            tripped: watch::Sender::new(false),
        });
        let upstream = Arc::new(Mutex::new(upstream.to_string()));
        let accepted = Arc::new(AtomicUsize::new(0));
        let links: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let acceptor = tokio::spawn({
            let (faults, upstream, accepted, links) = (
                faults.clone(),
                upstream.clone(),
                accepted.clone(),
                links.clone(),
            );
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    if *faults.mode.borrow() == Mode::Reset {
                        drop(client);
                        continue;
                    }
                    let to = upstream.lock().expect("not poisoned").clone();
                    let link = tokio::spawn(link(client, to, faults.clone()));
                    let mut links = links.lock().expect("not poisoned");
                    links.retain(|l| !l.is_finished());
                    links.push(link.abort_handle());
                }
            }
        });
        Self {
            addr,
            faults,
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
        self.faults.mode.send_replace(Mode::Forward);
    }

    /// Stops forwarding both ways without closing anything; new connections are accepted and
    /// held.
    pub fn black_hole(&self) {
        self.faults.mode.send_replace(Mode::BlackHole);
    }

    /// Closes every connection, and each new one as soon as it is accepted.
    pub fn reset(&self) {
        self.faults.mode.send_replace(Mode::Reset);
        self.close_connections();
    }

    /// Passes every chunk on `by` after it arrived, both ways.
    pub fn delay(&self, by: Duration) {
        self.faults.mode.send_replace(Mode::Delay(by));
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

    /// Arms `trip` for the first chunk a client sends that holds `on`, on a connection whose
    /// client sent `after` before (`b""`: any connection). Fires once; arming again replaces a
    /// trip that has not fired. Bytes are matched as sent, across chunk boundaries.
    pub fn trip(&self, after: &[u8], on: &[u8], trip: Trip) {
        self.faults.tripped.send_replace(false);
        *self.faults.armed.lock().expect("not poisoned") = Some(Armed {
            after: after.to_vec(),
            on: on.to_vec(),
            trip,
        });
    }

    /// Waits until the armed trip has fired.
    pub async fn tripped(&self) {
        let mut tripped = self.faults.tripped.subscribe();
        let _ = tripped.wait_for(|t| *t).await;
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

/// One accepted connection: connected upstream once traffic may pass, then a pump each way,
/// until both ends are done or a trip closes it.
async fn link(client: TcpStream, upstream: String, faults: Arc<Faults>) {
    let mut mode = faults.mode.subscribe();
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
    let this = Arc::new(LinkFaults::default());
    let pumps = async {
        tokio::join!(
            pump(
                client_read,
                server_write,
                mode.clone(),
                Way::Request(faults, this.clone())
            ),
            pump(server_read, client_write, mode, Way::Answer(this.clone())),
        )
    };
    // Cut: both pumps, and with them all four halves, are dropped (both sockets closed).
    tokio::select! {
        _ = pumps => {}
        () = this.cut.notified() => {}
    }
}

/// Carries one direction: a reader stamps each chunk with when it may go on, a writer sends
/// it then. Either waits while the proxy black-holes. A trip's request is recognised by the
/// reader, whose writer does what the trip says once it went on.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mode: watch::Receiver<Mode>,
    way: Way,
) {
    let (chunks, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>, Option<Trip>)>();
    let reader = {
        let mut mode = mode.clone();
        let way = &way;
        async move {
            let mut buf = vec![0; CHUNK];
            let (mut tail, mut seen_after) = (Vec::new(), false);
            loop {
                if passable(&mut mode).await.is_none() {
                    return;
                }
                let n = match from.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let trip = match way {
                    Way::Request(faults, _) => faults.check(&buf[..n], &mut tail, &mut seen_after),
                    Way::Answer(this) => {
                        if this.lose_answer.load(Ordering::SeqCst) {
                            this.cut.notify_one();
                            return;
                        }
                        None
                    }
                };
                match (trip, way) {
                    (Some(Trip::LoseRequest), Way::Request(_, this)) => {
                        this.cut.notify_one();
                        return;
                    }
                    (Some(Trip::BlackHoleBefore), Way::Request(faults, _)) => {
                        faults.mode.send_replace(Mode::BlackHole);
                    }
                    _ => {}
                }
                let delay = match *mode.borrow() {
                    Mode::Delay(by) => by,
                    _ => Duration::ZERO,
                };
                if chunks
                    .send((Instant::now() + delay, buf[..n].to_vec(), trip))
                    .is_err()
                {
                    return;
                }
            }
        }
    };
    let writer = {
        let mut mode = mode;
        let way = &way;
        async move {
            while let Some((at, chunk, trip)) = due.recv().await {
                tokio::time::sleep_until(at).await;
                if passable(&mut mode).await.is_none() || to.write_all(&chunk).await.is_err() {
                    return;
                }
                if let (Some(trip), Way::Request(faults, this)) = (trip, way) {
                    match trip {
                        Trip::LoseAnswer => this.lose_answer.store(true, Ordering::SeqCst),
                        Trip::BlackHoleAfter => {
                            faults.mode.send_replace(Mode::BlackHole);
                        }
                        Trip::LoseRequest | Trip::BlackHoleBefore => {}
                    }
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

    /// An upstream that echoes every byte back and keeps what it received.
    async fn recording_echo_server() -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received: Arc<Mutex<Vec<u8>>> = Arc::default();
        let kept = received.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let kept = kept.clone();
                tokio::spawn(async move {
                    let mut buf = [0; 1024];
                    while let Ok(n) = socket.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        kept.lock().unwrap().extend_from_slice(&buf[..n]);
                        if socket.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, received)
    }

    fn holds(received: &Mutex<Vec<u8>>, text: &[u8]) -> bool {
        find(&received.lock().unwrap(), text).is_some()
    }

    /// Whether the connection is closed (read gives nothing more).
    async fn closed(stream: &mut TcpStream) -> bool {
        let mut buf = [0; 16];
        matches!(stream.read(&mut buf).await, Ok(0) | Err(_))
    }

    #[tokio::test]
    async fn a_trip_that_loses_the_answer_lets_the_request_through_and_closes_before_the_answer() {
        crate::bounded(async {
            let (upstream, received) = recording_echo_server().await;
            let proxy = FaultProxy::start(upstream).await;
            let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
            proxy.trip(b"", b"COMMIT", Trip::LoseAnswer);
            assert_eq!(round_trip(&mut stream, b"BEGIN").await, b"BEGIN");
            stream.write_all(b"COMMIT").await.unwrap();
            assert!(closed(&mut stream).await, "the answer never comes");
            proxy.tripped().await;
            assert!(holds(&received, b"COMMIT"), "the request arrived");

            // Once only: a new connection passes everything.
            let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
            assert_eq!(round_trip(&mut again, b"COMMIT").await, b"COMMIT");
        })
        .await;
    }

    #[tokio::test]
    async fn a_trip_that_loses_the_request_closes_the_connection_before_it_arrives() {
        crate::bounded(async {
            let (upstream, received) = recording_echo_server().await;
            let proxy = FaultProxy::start(upstream).await;
            let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
            proxy.trip(b"", b"COMMIT", Trip::LoseRequest);
            assert_eq!(round_trip(&mut stream, b"BEGIN").await, b"BEGIN");
            stream.write_all(b"COMMIT").await.unwrap();
            assert!(closed(&mut stream).await);
            assert!(!holds(&received, b"COMMIT"), "the request never arrived");
        })
        .await;
    }

    #[tokio::test]
    async fn a_trip_that_black_holes_after_the_request_holds_its_answer_until_restored() {
        crate::bounded(async {
            let (upstream, received) = recording_echo_server().await;
            let proxy = FaultProxy::start(upstream).await;
            let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
            proxy.trip(b"", b"COMMIT", Trip::BlackHoleAfter);
            stream.write_all(b"COMMIT").await.unwrap();
            proxy.tripped().await;
            assert!(silent(&mut stream).await, "the answer is held");
            assert!(holds(&received, b"COMMIT"), "the request arrived");
            proxy.restore();
            assert_eq!(read_exactly(&mut stream, 6).await, b"COMMIT");
        })
        .await;
    }

    #[tokio::test]
    async fn a_trip_that_black_holes_before_the_request_holds_it_until_restored() {
        crate::bounded(async {
            let (upstream, received) = recording_echo_server().await;
            let proxy = FaultProxy::start(upstream).await;
            let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
            proxy.trip(b"", b"COMMIT", Trip::BlackHoleBefore);
            stream.write_all(b"COMMIT").await.unwrap();
            proxy.tripped().await;
            assert!(silent(&mut stream).await, "nothing comes back");
            assert!(!holds(&received, b"COMMIT"), "the request is held");
            proxy.restore();
            assert_eq!(read_exactly(&mut stream, 6).await, b"COMMIT");
        })
        .await;
    }

    #[tokio::test]
    async fn a_trip_waits_for_its_request_on_a_connection_that_sent_the_marker_first() {
        crate::bounded(async {
            let (upstream, received) = recording_echo_server().await;
            let proxy = FaultProxy::start(upstream).await;
            let mut other = TcpStream::connect(proxy.addr()).await.unwrap();
            let mut marked = TcpStream::connect(proxy.addr()).await.unwrap();
            proxy.trip(b"marker", b"COMMIT", Trip::LoseRequest);
            // Another connection's request, and the request before the marker, pass.
            assert_eq!(round_trip(&mut other, b"COMMIT").await, b"COMMIT");
            assert_eq!(round_trip(&mut marked, b"COMMIT").await, b"COMMIT");
            // The marker split over two chunks still counts.
            assert_eq!(round_trip(&mut marked, b"mar").await, b"mar");
            assert_eq!(round_trip(&mut marked, b"ker").await, b"ker");
            marked.write_all(b"COMMIT").await.unwrap();
            assert!(closed(&mut marked).await);
            assert_eq!(
                received
                    .lock()
                    .unwrap()
                    .windows(6)
                    .filter(|w| w == b"COMMIT")
                    .count(),
                2,
                "only the request after the marker was lost"
            );
        })
        .await;
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
