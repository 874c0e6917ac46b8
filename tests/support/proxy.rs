//! A fault-injection TCP proxy to put between a client and a real server.
//!
//! [`Proxy::start`] listens on a free loopback port and forwards every
//! connection to the upstream address, in both directions. The test can then,
//! at any time and from any thread:
//!
//! - make the connections open at that moment vanish
//!   ([`Proxy::blackhole_existing`]): whatever either side sends is read and
//!   discarded, nothing is answered, no FIN and no RST, as if the peer's host
//!   had crashed; connections accepted later work;
//! - do the same to every connection, new ones included, until
//!   [`Proxy::heal`] ([`Proxy::blackhole_all`]);
//! - delay every forwarded chunk ([`Proxy::set_latency`]);
//! - reset every open connection ([`Proxy::reset_all`]);
//! - reset new connections as soon as they are accepted
//!   ([`Proxy::refuse_new`]).
//!
//! A fault takes effect for every byte the proxy reads after the call
//! returns. The proxy runs on its own thread with its own current-thread
//! tokio runtime, so it works under any runtime the test uses, or none.
//! Dropping it closes the listener and every connection (normally, with a
//! FIN) and joins the thread.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, sleep, sleep_until};

use super::redis_server::RedisServer;

/// Bytes read from a socket at a time (one forwarded chunk at most).
const CHUNK: usize = 16 * 1024;

/// Chunks read but not yet written, per direction, before reading pauses.
const QUEUE: usize = 64;

/// How long [`Proxy::reset_all`] waits for the reset connections to close.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Pause after a failed `accept` (e.g. out of file descriptors), so the
/// accept loop never spins.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// What becomes of one connection. It only moves forward in this order: a
/// vanished peer does not come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Bytes are forwarded both ways.
    Forward,
    /// Bytes from both sides are read and discarded.
    Blackhole,
    /// The client side is closed with an RST, the upstream side closed.
    Reset,
}

/// A fault-injection proxy in front of one upstream address; stopped on drop.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// What the test thread and the proxy thread share.
struct Shared {
    state: Mutex<State>,
    /// Signalled whenever a connection closes.
    closed: Condvar,
}

/// The proxy's switches and open connections.
struct State {
    /// The open client connections, each with the sender of its fate.
    conns: HashMap<u64, watch::Sender<Fate>>,
    /// The id of the next connection.
    next_id: u64,
    /// Client connections accepted so far, refused ones included.
    accepted: usize,
    /// Whether new connections start blackholed ([`Proxy::blackhole_all`]).
    blackhole_new: bool,
    /// Whether new connections are reset at once ([`Proxy::refuse_new`]).
    refuse_new: bool,
    /// The delay added to every forwarded chunk.
    latency: Duration,
}

impl Proxy {
    /// Starts a proxy on a free 127.0.0.1 port forwarding to `upstream`,
    /// which must be a loopback address.
    ///
    /// Panics (with what went wrong) if the proxy cannot start.
    pub fn start(upstream: SocketAddr) -> Proxy {
        assert!(
            upstream.ip().is_loopback(),
            "the proxy only forwards to loopback addresses, not {upstream}"
        );
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("proxy: cannot bind 127.0.0.1:0: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("proxy: no local address: {e}"));
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("proxy: cannot make the listener non-blocking: {e}"));
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                conns: HashMap::new(),
                next_id: 0,
                accepted: 0,
                blackhole_new: false,
                refuse_new: false,
                latency: Duration::ZERO,
            }),
            closed: Condvar::new(),
        });
        let (stop, stopped) = oneshot::channel();
        let thread_shared = Arc::clone(&shared);
        let thread = thread::Builder::new()
            .name(format!("proxy-{}", addr.port()))
            .spawn(move || run(listener, upstream, thread_shared, stopped))
            .unwrap_or_else(|e| panic!("proxy: cannot spawn its thread: {e}"));
        Proxy {
            addr,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Starts a proxy in front of `server` (see [`start`](Self::start)).
    pub fn in_front_of(server: &RedisServer) -> Proxy {
        Self::start(SocketAddr::from((Ipv4Addr::LOCALHOST, server.port())))
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `redis://127.0.0.1:<port>/`, through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port())
    }

    /// A client connecting through the proxy (connects lazily).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("a valid redis URL")
    }

    /// Makes every connection open now vanish: from now on, whatever either
    /// side sends on it is read and discarded, and nothing is sent to either
    /// side (no data, no FIN, no RST) until the client closes it or
    /// [`reset_all`](Self::reset_all). Later connections are not affected.
    ///
    /// A connection the kernel has accepted but the proxy has not picked up
    /// yet counts as a later one: make a round trip on a connection first to
    /// be sure it is open.
    pub fn blackhole_existing(&self) {
        for fate in self.state().conns.values() {
            vanish(fate);
        }
    }

    /// Makes every connection vanish, as
    /// [`blackhole_existing`](Self::blackhole_existing) does, and new ones
    /// too until [`heal`](Self::heal): they are accepted, never forwarded
    /// (not even connected upstream).
    pub fn blackhole_all(&self) {
        let mut state = self.state();
        state.blackhole_new = true;
        for fate in state.conns.values() {
            vanish(fate);
        }
    }

    /// Makes new connections work again: undoes
    /// [`blackhole_all`](Self::blackhole_all) and
    /// [`refuse_new`](Self::refuse_new) for the connections accepted from
    /// now on. Blackholed connections stay dead, and the latency is kept.
    pub fn heal(&self) {
        let mut state = self.state();
        state.blackhole_new = false;
        state.refuse_new = false;
    }

    /// Delays every chunk forwarded from now on, both ways, by `latency`
    /// (`Duration::ZERO` for none). Chunks stay in order; chunks already
    /// queued keep their delay.
    pub fn set_latency(&self, latency: Duration) {
        self.state().latency = latency;
    }

    /// Closes every open connection: the client side with an RST (zero
    /// linger), the upstream side normally. Returns once they are closed;
    /// panics if that takes more than 2 seconds. New connections work.
    pub fn reset_all(&self) {
        let state = self.state();
        let doomed: Vec<u64> = state.conns.keys().copied().collect();
        for fate in state.conns.values() {
            fate.send_replace(Fate::Reset);
        }
        let (state, timeout) = self
            .shared
            .closed
            .wait_timeout_while(state, CLOSE_TIMEOUT, |state| {
                doomed.iter().any(|id| state.conns.contains_key(id))
            })
            .unwrap_or_else(PoisonError::into_inner);
        let left = doomed
            .iter()
            .filter(|id| state.conns.contains_key(id))
            .count();
        assert!(
            !timeout.timed_out(),
            "proxy {}: {left} reset connections still open after {CLOSE_TIMEOUT:?}",
            self.addr
        );
    }

    /// While `refuse`, new connections are accepted and reset at once (they
    /// count in [`accepted`](Self::accepted), never in
    /// [`connections`](Self::connections)); open ones are not affected.
    pub fn refuse_new(&self, refuse: bool) {
        self.state().refuse_new = refuse;
    }

    /// How many client connections are open now, blackholed ones included.
    pub fn connections(&self) -> usize {
        self.state().conns.len()
    }

    /// How many client connections were accepted so far, refused ones
    /// included.
    pub fn accepted(&self) -> usize {
        self.state().accepted
    }

    /// The shared state, locked.
    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.state()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Ends the accept loop; the thread then drops its runtime, which
        // drops every connection task and so closes every socket.
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Shared {
    /// The state, locked (a panic while it was held does not matter here).
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Blackholes a connection that is still forwarding.
fn vanish(fate: &watch::Sender<Fate>) {
    fate.send_if_modified(|fate| {
        let forwarding = *fate == Fate::Forward;
        if forwarding {
            *fate = Fate::Blackhole;
        }
        forwarding
    });
}

/// The proxy thread: accepts connections until `stopped` fires (or its
/// sender is dropped), then drops every connection with the runtime.
fn run(
    listener: std::net::TcpListener,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    stopped: oneshot::Receiver<()>,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("proxy: cannot build its runtime: {e}"));
    runtime.block_on(async {
        let listener = TcpListener::from_std(listener)
            .unwrap_or_else(|e| panic!("proxy: cannot register the listener: {e}"));
        tokio::select! {
            () = accept_loop(listener, upstream, shared) => {}
            _ = stopped => {}
        }
    });
}

/// Accepts client connections forever, each served by its own task.
async fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(_) => {
                sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let _ = client.set_nodelay(true);
        let (id, fate) = {
            let mut state = shared.state();
            state.accepted += 1;
            if state.refuse_new {
                drop(state);
                reset(client);
                continue;
            }
            let initial = if state.blackhole_new {
                Fate::Blackhole
            } else {
                Fate::Forward
            };
            let (sender, fate) = watch::channel(initial);
            let id = state.next_id;
            state.next_id += 1;
            state.conns.insert(id, sender);
            (id, fate)
        };
        let open = Open {
            shared: Arc::clone(&shared),
            id,
        };
        tokio::spawn(async move {
            serve(client, upstream, fate, &open.shared).await;
            drop(open);
        });
    }
}

/// A connection's entry in [`State::conns`], removed when the connection's
/// task ends or is dropped.
struct Open {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.shared.state().conns.remove(&self.id);
        self.shared.closed.notify_all();
    }
}

/// Serves one client connection until it ends, following its fate.
async fn serve(
    client: TcpStream,
    upstream: SocketAddr,
    mut fate: watch::Receiver<Fate>,
    shared: &Shared,
) {
    let mut server = None;
    if *fate.borrow() == Fate::Forward {
        tokio::select! {
            connected = TcpStream::connect(upstream) => match connected {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    server = Some(stream);
                }
                // The upstream is down: refuse the client as it would.
                Err(_) => return reset(client),
            },
            _ = fate.wait_for(|fate| *fate != Fate::Forward) => {}
        }
    }
    if let Some(server) = &server {
        let forwarding = fate.clone();
        tokio::select! {
            // One side closed or failed: close both.
            _ = forward(&client, server, &forwarding, shared) => return,
            _ = fate.wait_for(|fate| *fate != Fate::Forward) => {}
        }
    }
    if *fate.borrow() == Fate::Blackhole {
        tokio::select! {
            // The client gave up on it: close both.
            () = discard(&client, server.as_ref()) => return,
            _ = fate.wait_for(|fate| *fate == Fate::Reset) => {}
        }
    }
    reset(client);
}

/// Closes `stream` with an RST.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// Forwards both ways until one side has closed (and what it sent before is
/// delivered) or either fails.
async fn forward(
    client: &TcpStream,
    server: &TcpStream,
    fate: &watch::Receiver<Fate>,
    shared: &Shared,
) -> io::Result<()> {
    tokio::select! {
        done = pipe(client, server, fate, shared) => done,
        done = pipe(server, client, fate, shared) => done,
    }
}

/// Copies `from` to `to`, each chunk delayed by the latency at the time it
/// was read, until `from` closes. Chunks read or due while the connection
/// is not forwarding are dropped.
async fn pipe(
    from: &TcpStream,
    to: &TcpStream,
    fate: &watch::Receiver<Fate>,
    shared: &Shared,
) -> io::Result<()> {
    let forwarding = || *fate.borrow() == Fate::Forward;
    let (queue, mut queued) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUE);
    let reading = async move {
        let mut buf = vec![0; CHUNK];
        loop {
            let n = read_some(from, &mut buf).await?;
            if n == 0 {
                return Ok(()); // drops `queue`: the writer ends once it is empty
            }
            if !forwarding() {
                continue;
            }
            let due = Instant::now() + shared.state().latency;
            if queue.send((due, buf[..n].to_vec())).await.is_err() {
                return Ok(());
            }
        }
    };
    let writing = async {
        while let Some((due, bytes)) = queued.recv().await {
            if due > Instant::now() {
                sleep_until(due).await;
            }
            if forwarding() {
                write_all(to, &bytes).await?;
            }
        }
        Ok(())
    };
    tokio::try_join!(reading, writing).map(|_| ())
}

/// Reads and drops whatever both sides send, until the client closes or
/// fails. The server closing changes nothing for the client.
async fn discard(client: &TcpStream, server: Option<&TcpStream>) {
    let mut client_buf = vec![0; CHUNK];
    let mut server_buf = vec![0; CHUNK];
    let client_side = async { while let Ok(1..) = read_some(client, &mut client_buf).await {} };
    let server_side = async {
        if let Some(server) = server {
            while let Ok(1..) = read_some(server, &mut server_buf).await {}
        }
        std::future::pending::<()>().await
    };
    tokio::select! {
        () = client_side => {}
        () = server_side => {}
    }
}

/// Reads what is available into `buf` (0 at end of stream).
async fn read_some(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        stream.readable().await?;
        match stream.try_read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            done => return done,
        }
    }
}

/// Writes all of `bytes`.
async fn write_all(stream: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        stream.writable().await?;
        match stream.try_write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
