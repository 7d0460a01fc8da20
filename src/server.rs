//! The status server on 15020: a tower service on hyper's HTTP/1 server.
//!
//! Endpoints:
//! - `GET|HEAD /healthz/ready` — 200 `ready`, or 503 with a one-line reason.
//!   Answered from the readiness snapshot: no Envoy call, no allocation.
//! - `GET /drain` — the drain's status as JSON (any caller).
//! - `POST /drain` — loopback only: start the drain (readiness 503 at once)
//!   or join the one under way; answers with the status once drained. Envoy
//!   keeps running until a signal. The native-sidecar preStop hook.
//!   `POST /drain?nowait` starts it the same way and answers 202 at once,
//!   once readiness is 503 (how `wait-app-exit` tells the agent that
//!   termination began, so the deadline counts from then).
//! - `POST /quitquitquit` — loopback only: stop Envoy now and exit cleanly.
//! - `GET /stats/prometheus` (alias `/metrics`) — Envoy's own metrics,
//!   streamed, then lifeguard's (any caller); the query string goes to
//!   Envoy, gzip when accepted. The machinery is [`crate::scrape`]'s.
//!
//! Callers of the POST routes from other hosts get 403 and nothing happens.
//! Unknown paths get 404, known paths with another method 405.
//!
//! The server is built in stages: [`StatusServer::bind`] returns a bound
//! listener (so a test can ask for its address), and [`StatusServer::serve`]
//! runs it until the shutdown token is cancelled. Connections get
//! `TCP_NODELAY`, a header-read timeout (a slow client cannot hold a
//! connection open by trickling bytes; it also closes a keep-alive
//! connection idle between requests), a write timeout (a peer that takes no
//! bytes of its response for a while is closed), and a slot from
//! [`ConnectionSlots`]: a cap per remote peer and a reserve only loopback
//! peers may use, so no peer from another host can starve the probes that
//! come through Envoy. A connection that gets no slot is closed at once.
//! With a wildcard address (`0.0.0.0:15020`, as in a pod), loopback
//! connections also get an accept queue of their own (a second listener on
//! 127.0.0.1, same port), accepted first: a flood of connections from other
//! hosts cannot make a probe wait in the kernel's queue behind it.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use http_body_util::Full;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::header::{HeaderMap, HeaderValue, ALLOW, CONTENT_ENCODING, CONTENT_TYPE, VARY};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::connections::{ConnectionSlots, Refused, SlotLimits, WriteTimeout};
use crate::drain::DrainHandle;
use crate::linger::Linger;
use crate::metrics::Metrics;
use crate::readiness::Readiness;
use crate::scrape::{ScrapeRequest, Scraper};
use metrics::Counter;

/// The response body of every route: a whole body (every route but one,
/// the probe's with no allocation), or the merged scrape's stream.
pub enum Body {
    Full(Full<Bytes>),
    Stream(Pin<Box<dyn Stream<Item = Bytes> + Send>>),
}

impl Body {
    fn full(bytes: Bytes) -> Self {
        Body::Full(Full::new(bytes))
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Full(full) => hyper::body::Body::poll_frame(Pin::new(full), cx),
            Body::Stream(stream) => stream.as_mut().poll_next(cx).map(|b| b.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(full) => hyper::body::Body::is_end_stream(full),
            Body::Stream(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(full) => hyper::body::Body::size_hint(full),
            Body::Stream(_) => SizeHint::default(),
        }
    }
}

/// How long a client may take to send a request's headers; also how long
/// a keep-alive connection may stay idle between requests.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a write may wait for the peer to take a single byte of its
/// response before the connection is closed.
pub const RESPONSE_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How many connections may be open at once; more are closed on accept.
/// Fewer when the process may not open that many files: see
/// [`connection_limit`]. How they are shared: [`SlotLimits::for_total`].
///
/// This is what bounds lifeguard's memory under any number of peers: a
/// connection hyper serves holds about 16 KiB of read and write buffers
/// (about 36 KiB per slow reader of the merged scrape with its task and its
/// own part, measured in a debug build), so 768 of them keep lifeguard
/// inside 64 MiB; a connection that has sent nothing yet holds no buffer at
/// all (hyper gets it only once it is readable). Probes, Prometheus and a
/// load balancer need a handful.
pub const MAX_CONNECTIONS: usize = 768;
/// The listen backlog (the kernel caps it at `net.core.somaxconn`).
const LISTEN_BACKLOG: u32 = 4096;
/// File descriptors kept free for everything but status connections.
const SPARE_FDS: u64 = 64;

/// Raises the soft open-files limit to the hard one (so the connection cap,
/// not the kernel, bounds the status server) and returns the cap:
/// [`MAX_CONNECTIONS`], or the soft limit less some spare descriptors when
/// that is lower.
pub fn connection_limit() -> usize {
    let Some(soft) = crate::sys::raise_nofile_limit() else {
        return MAX_CONNECTIONS;
    };
    let usable = soft.saturating_sub(SPARE_FDS).max(16);
    MAX_CONNECTIONS.min(usize::try_from(usable).unwrap_or(MAX_CONNECTIONS))
}
/// How long open connections get to finish when the server shuts down.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

static TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");
static APPLICATION_JSON: HeaderValue = HeaderValue::from_static("application/json");
static PROMETHEUS_TEXT: HeaderValue = HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8");
static GZIP: HeaderValue = HeaderValue::from_static("gzip");
static ACCEPT_ENCODING_VALUE: HeaderValue = HeaderValue::from_static("accept-encoding");

/// The future of one response: ready at once for every route but the two
/// that wait on the drain.
pub enum ResponseFuture {
    Ready(Option<Response<Body>>),
    Waiting(Pin<Box<dyn Future<Output = Response<Body>> + Send>>),
}

impl Future for ResponseFuture {
    type Output = Result<Response<Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            ResponseFuture::Ready(response) => Poll::Ready(Ok(response.take().expect("polled after completion"))),
            ResponseFuture::Waiting(fut) => fut.as_mut().poll(cx).map(Ok),
        }
    }
}

/// The routes of the status port, as a service. One value per connection:
/// it knows the peer, for the loopback guard; the rest is shared.
#[derive(Clone)]
pub struct StatusService {
    shared: Arc<Shared>,
    peer: Option<SocketAddr>,
}

/// What every connection's service shares.
#[derive(Clone)]
struct Shared {
    readiness: Readiness,
    drain: Option<DrainHandle>,
    /// The merged scrape (None: no metrics route).
    scraper: Option<Scraper>,
    /// Told of each scrape, so a last one can end the linger.
    linger: Option<Linger>,
    probe_ok: Counter,
    probe_unavailable: Counter,
}

impl StatusService {
    pub fn new(readiness: Readiness) -> Self {
        Self {
            shared: Arc::new(Shared {
                readiness,
                drain: None,
                scraper: None,
                linger: None,
                probe_ok: Counter::noop(),
                probe_unavailable: Counter::noop(),
            }),
            peer: None,
        }
    }

    /// Counts probes in `metrics` and serves `/stats/prometheus` through
    /// `scraper`.
    pub fn with_metrics(mut self, metrics: &Metrics, scraper: Scraper) -> Self {
        let shared = Arc::make_mut(&mut self.shared);
        (shared.probe_ok, shared.probe_unavailable) = metrics.probe_counters();
        shared.scraper = Some(scraper);
        self
    }

    /// Reports each scrape to `linger`.
    pub fn with_linger(mut self, linger: Linger) -> Self {
        Arc::make_mut(&mut self.shared).linger = Some(linger);
        self
    }

    /// Serves the drain routes through `drain`.
    pub fn with_drain(mut self, drain: DrainHandle) -> Self {
        Arc::make_mut(&mut self.shared).drain = Some(drain);
        self
    }

    /// The same service, answering a connection from `peer`.
    pub fn for_peer(&self, peer: SocketAddr) -> Self {
        Self {
            peer: Some(peer),
            ..self.clone()
        }
    }

    /// Whether the caller is on this host (127.0.0.0/8 or ::1, also as an
    /// IPv4-mapped IPv6 address). Unknown peers are not trusted.
    pub fn peer_is_loopback(&self) -> bool {
        self.peer.is_some_and(|p| is_loopback(&p))
    }

    fn handle<B>(&self, mut req: Request<B>) -> ResponseFuture {
        let shared = &*self.shared;
        // Reuse the request's header map for the response: no allocation.
        let mut headers = std::mem::take(req.headers_mut());
        let path = req.uri().path();
        let scrape = (path == "/stats/prometheus" || path == "/metrics")
            .then(|| ScrapeRequest::new(req.uri().query(), &headers));
        headers.clear();
        let method = req.method().clone();
        let (status, body) = match (req.uri().path(), &method) {
            ("/healthz/ready", &Method::GET | &Method::HEAD) => {
                let answer = shared.readiness.answer();
                let status = if answer.ready {
                    shared.probe_ok.increment(1);
                    StatusCode::OK
                } else {
                    shared.probe_unavailable.increment(1);
                    StatusCode::SERVICE_UNAVAILABLE
                };
                (status, answer.body)
            }
            ("/stats/prometheus" | "/metrics", &Method::GET | &Method::HEAD) => {
                let (Some(scraper), Some(scrape)) = (&shared.scraper, scrape) else {
                    return finish(headers, &method, not_found());
                };
                headers.insert(CONTENT_TYPE, PROMETHEUS_TEXT.clone());
                headers.insert(VARY, ACCEPT_ENCODING_VALUE.clone());
                if scrape.gzip {
                    headers.insert(CONTENT_ENCODING, GZIP.clone());
                }
                let body = if method == Method::HEAD {
                    Body::full(Bytes::new())
                } else {
                    let ticket = shared.linger.as_ref().map(Linger::scrape_begins);
                    Body::Stream(Box::pin(ServedAtEnd {
                        stream: Box::pin(scraper.body(scrape)),
                        ticket,
                    }))
                };
                let mut response = Response::new(body);
                *response.headers_mut() = headers;
                return ResponseFuture::Ready(Some(response));
            }
            ("/drain", &Method::GET | &Method::HEAD) => match &shared.drain {
                Some(drain) => {
                    headers.insert(CONTENT_TYPE, APPLICATION_JSON.clone());
                    (StatusCode::OK, status_json(&drain.status()))
                }
                None => not_found(),
            },
            ("/drain", &Method::POST) | ("/quitquitquit", &Method::POST) => {
                let Some(drain) = shared.drain.clone() else {
                    return finish(headers, &method, not_found());
                };
                if !self.peer_is_loopback() {
                    return finish(
                        headers,
                        &method,
                        (
                            StatusCode::FORBIDDEN,
                            Bytes::from_static(b"forbidden: only loopback callers may do this\n"),
                        ),
                    );
                }
                let quit = req.uri().path() == "/quitquitquit";
                let nowait = req.uri().query().is_some_and(|q| q.split('&').any(|p| p == "nowait"));
                return ResponseFuture::Waiting(Box::pin(async move {
                    let mut headers = headers;
                    let answer = if quit {
                        if drain.quit().await {
                            (StatusCode::OK, Bytes::from_static(b"OK\n"))
                        } else {
                            stopping()
                        }
                    } else if nowait {
                        match drain.begin().await {
                            Some(status) => {
                                headers.insert(CONTENT_TYPE, APPLICATION_JSON.clone());
                                (StatusCode::ACCEPTED, status_json(&status))
                            }
                            None => stopping(),
                        }
                    } else {
                        match drain.drain().await {
                            Some(status) => {
                                headers.insert(CONTENT_TYPE, APPLICATION_JSON.clone());
                                (StatusCode::OK, status_json(&status))
                            }
                            None => stopping(),
                        }
                    };
                    respond(headers, &Method::POST, answer)
                }));
            }
            ("/healthz/ready", _) | ("/drain", _) => {
                let allow = if req.uri().path() == "/drain" {
                    "GET, HEAD, POST"
                } else {
                    "GET, HEAD"
                };
                headers.insert(ALLOW, HeaderValue::from_static(allow));
                method_not_allowed()
            }
            ("/quitquitquit", _) => {
                headers.insert(ALLOW, HeaderValue::from_static("POST"));
                method_not_allowed()
            }
            _ => not_found(),
        };
        finish(headers, &method, (status, body))
    }
}

/// A scrape's body that tells the linger the scrape was served once its
/// last byte has been produced.
struct ServedAtEnd {
    stream: Pin<Box<dyn Stream<Item = Bytes> + Send>>,
    ticket: Option<crate::linger::Scrape>,
}

impl Stream for ServedAtEnd {
    type Item = Bytes;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let next = self.stream.as_mut().poll_next(cx);
        if let Poll::Ready(None) = next {
            if let Some(ticket) = self.ticket.take() {
                ticket.served();
            }
        }
        next
    }
}

fn finish(headers: HeaderMap, method: &Method, answer: (StatusCode, Bytes)) -> ResponseFuture {
    ResponseFuture::Ready(Some(respond(headers, method, answer)))
}

fn respond(mut headers: HeaderMap, method: &Method, (status, body): (StatusCode, Bytes)) -> Response<Body> {
    if !headers.contains_key(CONTENT_TYPE) {
        headers.insert(CONTENT_TYPE, TEXT_PLAIN.clone());
    }
    let body = if method == Method::HEAD { Bytes::new() } else { body };
    let mut response = Response::new(Body::full(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

fn status_json(status: &crate::drain::Status) -> Bytes {
    let mut body = serde_json::to_vec(status).unwrap_or_default();
    body.push(b'\n');
    Bytes::from(body)
}

fn not_found() -> (StatusCode, Bytes) {
    (StatusCode::NOT_FOUND, Bytes::from_static(b"not found\n"))
}

fn stopping() -> (StatusCode, Bytes) {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Bytes::from_static(b"lifeguard is stopping\n"),
    )
}

fn method_not_allowed() -> (StatusCode, Bytes) {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        Bytes::from_static(b"method not allowed\n"),
    )
}

/// Whether an address is on this host.
pub fn is_loopback(addr: &SocketAddr) -> bool {
    crate::connections::is_loopback(addr.ip())
}

impl<B> tower::Service<Request<B>> for StatusService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        self.handle(req)
    }
}

/// hyper calls services through `&self`; ours needs no `&mut`, so it serves
/// hyper directly, without an adapter that would allocate per request.
impl hyper::service::Service<Request<Incoming>> for StatusService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        self.handle(req)
    }
}

/// A status server bound to its address, not yet serving.
pub struct StatusServer {
    listener: TcpListener,
    /// With a wildcard status address: a second listener on 127.0.0.1 and
    /// the same port, so loopback connections (Envoy's probes) have an
    /// accept queue of their own that no remote flood can fill.
    loopback: Option<TcpListener>,
}

impl StatusServer {
    pub async fn bind(addr: SocketAddr) -> std::io::Result<Self> {
        if !addr.ip().is_unspecified() {
            return Ok(Self {
                listener: listen(addr, false)?,
                loopback: None,
            });
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
        Ok(Self { listener, loopback })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` is cancelled, then gives open connections
    /// a short grace to finish and returns.
    pub async fn serve(self, service: StatusService, shutdown: CancellationToken) {
        let slots = ConnectionSlots::new(SlotLimits::for_total(connection_limit()));
        let mut refusals = RefusalLog::default();
        let tracker = TaskTracker::new();
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
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
            let _ = stream.set_nodelay(true);
            let service = service.for_peer(peer);
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
                let io = TokioIo::new(WriteTimeout::new(stream, RESPONSE_WRITE_TIMEOUT));
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
#[derive(Default)]
struct RefusalLog {
    last: [Option<(std::time::Instant, u64)>; 3],
}

impl RefusalLog {
    fn note(&mut self, refused: Refused, peer: SocketAddr, slots: &ConnectionSlots) {
        let i = match refused {
            Refused::Full => 0,
            Refused::RemoteFull => 1,
            Refused::PeerFull => 2,
        };
        let now = std::time::Instant::now();
        match &mut self.last[i] {
            Some((at, count)) if now.duration_since(*at) < Duration::from_secs(10) => *count += 1,
            last => {
                let since = last.map_or(1, |(_, count)| count + 1);
                let (open, from_peer) = slots.held(Some(peer.ip()));
                let limits = slots.limits();
                tracing::warn!(
                    peer = %peer.ip(),
                    open,
                    from_peer,
                    total = limits.total,
                    per_peer = limits.per_peer,
                    loopback_reserve = limits.loopback_reserve,
                    refused = since,
                    "closing a new status connection: {}",
                    refused.reason()
                );
                *last = Some((now, 0));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::AdminClient;
    use crate::readiness::Verdict;
    use tokio::time::Instant;

    fn call(svc: &StatusService, method: Method, path: &str) -> (StatusCode, String) {
        let req = Request::builder().method(method).uri(path).body(()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            use http_body_util::BodyExt;
            let resp = svc.handle(req).await.unwrap();
            let status = resp.status();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8(bytes.to_vec()).unwrap())
        })
    }

    /// A service with a drain behind it (not running), its readiness ready.
    fn with_drain() -> (StatusService, Readiness, crate::drain::Drain<crate::envoy::Envoy>) {
        use crate::drain::{Drain, Plan};
        let plan = Plan {
            policy: crate::drain::DrainUntil::Time,
            delay: Duration::ZERO,
            drain_time: Duration::from_secs(5),
            minimum: Duration::from_secs(5),
            deadline: Duration::from_secs(28),
            read_timeout: Duration::from_secs(1),
            stop_bound: Duration::from_secs(2),
            report_every: Duration::from_secs(1),
        };
        let admin = AdminClient::new("http://127.0.0.1:1".parse().unwrap(), Duration::from_millis(100));
        let (drain, handle) = Drain::new(plan, crate::envoy::Envoy::external(admin, vec![]), ());
        let r = Readiness::new(Duration::from_secs(4), handle.watch());
        r.store(Verdict::ready(Instant::now()));
        (StatusService::new(r.clone()).with_drain(handle), r, drain)
    }

    #[test]
    fn drain_and_quit_from_another_host_are_forbidden_and_change_nothing() {
        let (svc, r, _drain) = with_drain();
        let outsider = svc.for_peer("10.1.2.3:40000".parse().unwrap());
        for path in ["/drain", "/quitquitquit"] {
            let (status, body) = call(&outsider, Method::POST, path);
            assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
            assert!(body.contains("loopback"), "{body}");
        }
        assert!(!r.is_draining());
        assert_eq!(
            call(
                &svc.for_peer("127.0.0.1:40000".parse().unwrap()),
                Method::GET,
                "/healthz/ready"
            )
            .0,
            StatusCode::OK
        );
        // Unknown peer (no address): not trusted either.
        assert_eq!(call(&svc, Method::POST, "/drain").0, StatusCode::FORBIDDEN);
    }

    #[test]
    fn drain_status_is_json_for_anyone() {
        let (svc, _r, _drain) = with_drain();
        let outsider = svc.for_peer("10.1.2.3:40000".parse().unwrap());
        let (status, body) = call(&outsider, Method::GET, "/drain");
        assert_eq!(status, StatusCode::OK);
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["phase"], "serving");
        assert_eq!(json["policy"], "time");
        assert_eq!(call(&svc, Method::PUT, "/drain").0, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(
            call(&svc, Method::GET, "/quitquitquit").0,
            StatusCode::METHOD_NOT_ALLOWED
        );
    }

    #[test]
    fn routes_and_methods() {
        let r = Readiness::standalone(Duration::from_secs(4));
        let svc = StatusService::new(r.clone());
        assert_eq!(
            call(&svc, Method::GET, "/healthz/ready"),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: no answer from Envoy admin yet\n".into()
            )
        );
        r.store(Verdict::ready(Instant::now()));
        assert_eq!(
            call(&svc, Method::GET, "/healthz/ready"),
            (StatusCode::OK, "ready\n".into())
        );
        assert_eq!(
            call(&svc, Method::HEAD, "/healthz/ready"),
            (StatusCode::OK, String::new())
        );
        assert_eq!(call(&svc, Method::GET, "/healthz/ready?x=1").0, StatusCode::OK);
        assert_eq!(
            call(&svc, Method::POST, "/healthz/ready").0,
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(call(&svc, Method::GET, "/nope").0, StatusCode::NOT_FOUND);
    }

    #[test]
    fn loopback_peers() {
        for (addr, want) in [
            ("127.0.0.1:1", true),
            ("127.9.8.7:1", true),
            ("[::1]:1", true),
            ("[::ffff:127.0.0.1]:1", true),
            ("10.0.0.1:1", false),
            ("[::ffff:10.0.0.1]:1", false),
            ("[2001:db8::1]:1", false),
        ] {
            assert_eq!(is_loopback(&addr.parse().unwrap()), want, "{addr}");
        }
    }
}
