//! The status server on 15020: hyper's HTTP/1 server around
//! [`StatusService`].
//!
//! The server is built in stages: [`StatusServer::bind`] returns a bound
//! listener (so a test can ask for its address), and [`StatusServer::serve`]
//! runs it until the shutdown token is cancelled. Connections get
//! `TCP_NODELAY`, a header-read timeout (a slow client cannot hold a
//! connection open by trickling bytes; it also closes a keep-alive
//! connection idle between requests), a write timeout (a peer that takes no
//! bytes of its response for a while is closed), and a slot from
//! `ConnectionSlots`: a cap per remote peer and a reserve only loopback
//! peers may use, so no peer from another host can starve the probes that
//! come through Envoy. A connection that gets no slot is closed at once.
//! With a wildcard address (`0.0.0.0:15020`, as in a pod), loopback
//! connections also get an accept queue of their own (a second listener on
//! 127.0.0.1, same port), accepted first: a flood of connections from other
//! hosts cannot make a probe wait in the kernel's queue behind it.

use std::net::SocketAddr;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::connections::{Activity, ConnectionSlots, Refused, SlotLimits, TimedIo};
use super::service::StatusService;
use lifeguard_base::throttle::Throttle;

/// How long a client may take to send a request's headers; also how long
/// a keep-alive connection may stay idle between requests.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a write may wait for the peer to take a single byte of its
/// response before the connection is closed.
pub const RESPONSE_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// The listen backlog (the kernel caps it at `net.core.somaxconn`).
const LISTEN_BACKLOG: u32 = 4096;

/// How long open connections get to finish when the server shuts down.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// The status address could not be bound (in use, not this host's, no
/// permission): start-up stops before anything is launched.
#[derive(Debug, thiserror::Error)]
#[error("cannot bind the status address {addr}")]
pub struct AddrBindError {
    pub(crate) addr: SocketAddr,
    #[source]
    pub(crate) source: std::io::Error,
}

/// A status server bound to its address, not yet serving.
pub struct StatusServer {
    listener: TcpListener,
    /// With a wildcard status address: a second listener on 127.0.0.1 and
    /// the same port, so loopback connections (Envoy's probes) have an
    /// accept queue of their own that no remote flood can fill.
    loopback: Option<TcpListener>,
    /// How many connections may be open at once (`connection_limit`).
    max_connections: usize,
}

impl StatusServer {
    pub async fn bind(addr: SocketAddr, max_connections: usize) -> Result<Self, AddrBindError> {
        let (listener, loopback) = Self::listen(addr).map_err(|source| AddrBindError { addr, source })?;
        Ok(Self {
            listener,
            loopback,
            max_connections,
        })
    }

    /// The listener of `addr`, and with a wildcard address the loopback one.
    fn listen(addr: SocketAddr) -> std::io::Result<(TcpListener, Option<TcpListener>)> {
        if !addr.ip().is_unspecified() {
            return Ok((listen(addr, false)?, None));
        }
        // The kernel gives a connection to the listener bound to its exact
        // destination before a wildcard one; two listeners on one port
        // need SO_REUSEPORT on both. That would also let a second process
        // of the same user share the port unnoticed: a plain bind first
        // still fails when anything holds the port.
        drop(listen(addr, false)?);
        let listener = listen(addr, true)?;
        let loopback_addr = SocketAddr::from(([127, 0, 0, 1], listener.local_addr()?.port()));
        let loopback = match listen(loopback_addr, true) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(addr = %loopback_addr, error = %e, "no separate loopback listener; probes share the accept queue");
                None
            }
        };
        Ok((listener, loopback))
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` is cancelled, then gives open connections
    /// a short grace to finish and returns.
    pub async fn serve(self, service: StatusService, shutdown: CancellationToken) {
        let slots = ConnectionSlots::new(SlotLimits::for_total(self.max_connections));
        let mut refusals = RefusalLog::default();
        let tracker = TaskTracker::new();
        let mut http = hyper::server::conn::http1::Builder::new();
        // No header-read timeout of hyper's (a timer made and dropped per
        // request): the connection's TimedIo watches its idle time.
        http
            // A client that shuts down its write side after the request
            // (some load balancers do) still gets its answer.
            .half_close(true)
            .keep_alive(true);
        loop {
            let (stream, peer) = tokio::select! {
                // Loopback first: a probe waits behind no remote connection.
                biased;
                _ = shutdown.cancelled() => break,
                accepted = accept(self.loopback.as_ref()) => match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                },
                accepted = self.listener.accept() => match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        // EMFILE and friends: back off briefly, keep serving.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                },
            };
            let slot = match slots.try_acquire(peer.ip()) {
                Ok(slot) => slot,
                Err(refused) => {
                    drop(stream);
                    refusals.note(refused, peer, &slots);
                    continue;
                }
            };
            let activity = Activity::new();
            let service = service.for_connection(peer, activity.clone());
            let http = http.clone();
            let shutdown = shutdown.clone();
            tracker.spawn(async move {
                let _slot = slot;
                // Nothing of hyper's (no buffers) until the peer sends a
                // byte: an idle connection costs a socket and this task,
                // and is closed after the header-read timeout.
                tokio::select! {
                    ready = tokio::time::timeout(HEADER_READ_TIMEOUT, stream.readable()) => {
                        if !matches!(ready, Ok(Ok(()))) {
                            return;
                        }
                    }
                    _ = shutdown.cancelled() => return,
                }
                let io = TimedIo::new(stream, RESPONSE_WRITE_TIMEOUT).watching(activity, HEADER_READ_TIMEOUT);
                let io = TokioIo::new(io);
                let conn = http.serve_connection(io, service);
                tokio::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => {}
                    _ = shutdown.cancelled() => {
                        conn.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(SHUTDOWN_GRACE, conn).await;
                    }
                }
            });
        }
        tracker.close();
        tracker.wait().await;
    }
}

/// A listening socket on `addr`, with a deep accept queue: a burst of
/// probes or connections is queued by the kernel rather than dropped into
/// SYN retries.
fn listen(addr: SocketAddr, reuseport: bool) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // Like std's bind: reuse a port whose old connections are in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    if reuseport {
        socket.set_reuseport(true)?;
    }
    // Accepted connections inherit it: one system call here, none per
    // connection (a probe is a new connection each time).
    socket.set_nodelay(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// The next connection of an optional listener; never resolves without one.
async fn accept(listener: Option<&TcpListener>) -> std::io::Result<(tokio::net::TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

/// Logs refused connections at most once per reason every 10 s, with how
/// many were refused since the last line: a flood of them is one line.
struct RefusalLog([Throttle; 3]);

impl Default for RefusalLog {
    fn default() -> Self {
        Self([(); 3].map(|_| Throttle::new(Duration::from_secs(10))))
    }
}

impl RefusalLog {
    fn note(&mut self, refused: Refused, peer: SocketAddr, slots: &ConnectionSlots) {
        let throttle = &mut self.0[refused as usize];
        if !throttle.due(Instant::now()) {
            return;
        }
        let (open, from_peer) = slots.held(Some(peer.ip()));
        let limits = slots.limits();
        tracing::warn!(
            peer = %peer.ip(),
            open,
            from_peer,
            total = limits.total,
            per_peer = limits.per_peer,
            loopback_reserve = limits.loopback_reserve,
            refused = throttle.take_held() + 1,
            "closing a new status connection: {}",
            refused.reason()
        );
    }
}
