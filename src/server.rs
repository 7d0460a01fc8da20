//! The status server on 15020: a tower service on hyper's HTTP/1 server.
//!
//! Endpoints:
//! - `GET|HEAD /healthz/ready` — 200 `ready`, or 503 with a one-line reason.
//!   Answered from the readiness snapshot: no Envoy call, no allocation.
//!
//! Unknown paths get 404, known paths with another method 405.
//!
//! The server is built in stages: [`StatusServer::bind`] returns a bound
//! listener (so a test can ask for its address), and [`StatusServer::serve`]
//! runs it until the shutdown token is cancelled. Connections get
//! `TCP_NODELAY`, a header-read timeout (a slow client cannot hold a
//! connection open by trickling bytes) and a cap on how many are open at
//! once; past the cap new connections are closed at once.

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::readiness::Readiness;

/// The response body type of every route.
pub type Body = Full<Bytes>;

/// How long a client may take to send a request's headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How many connections may be open at once; more are closed on accept.
pub const MAX_CONNECTIONS: usize = 4096;
/// How long open connections get to finish when the server shuts down.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

static TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");

/// The routes of the status port, as a service. One value per connection:
/// it knows the peer, for the loopback guard.
#[derive(Clone)]
pub struct StatusService {
    readiness: Readiness,
    peer: Option<SocketAddr>,
}

impl StatusService {
    pub fn new(readiness: Readiness) -> Self {
        Self {
            readiness,
            peer: None,
        }
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

    fn handle<B>(&self, mut req: Request<B>) -> Response<Body> {
        // Reuse the request's header map for the response: no allocation.
        let mut headers = std::mem::take(req.headers_mut());
        headers.clear();
        let is_head = req.method() == Method::HEAD;
        let (status, body) = match req.uri().path() {
            "/healthz/ready" => match *req.method() {
                Method::GET | Method::HEAD => {
                    let answer = self.readiness.answer();
                    let status = if answer.ready {
                        StatusCode::OK
                    } else {
                        StatusCode::SERVICE_UNAVAILABLE
                    };
                    (status, answer.body)
                }
                _ => {
                    headers.insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
                    method_not_allowed()
                }
            },
            _ => (StatusCode::NOT_FOUND, Bytes::from_static(b"not found\n")),
        };
        headers.insert(CONTENT_TYPE, TEXT_PLAIN.clone());
        let body = if is_head { Bytes::new() } else { body };
        let mut response = Response::new(Full::new(body));
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        response
    }
}

fn method_not_allowed() -> (StatusCode, Bytes) {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        Bytes::from_static(b"method not allowed\n"),
    )
}

/// Whether an address is on this host.
pub fn is_loopback(addr: &SocketAddr) -> bool {
    match addr {
        SocketAddr::V4(a) => a.ip().is_loopback(),
        SocketAddr::V6(a) => {
            a.ip().is_loopback() || a.ip().to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

impl<B> tower::Service<Request<B>> for StatusService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        ready(Ok(self.handle(req)))
    }
}

/// hyper calls services through `&self`; ours needs no `&mut`, so it serves
/// hyper directly, without an adapter that would allocate per request.
impl hyper::service::Service<Request<Incoming>> for StatusService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Ready<Result<Response<Body>, Infallible>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        ready(Ok(self.handle(req)))
    }
}

/// A status server bound to its address, not yet serving.
pub struct StatusServer {
    listener: TcpListener,
    service: StatusService,
}

impl StatusServer {
    pub async fn bind(addr: SocketAddr, service: StatusService) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        Ok(Self { listener, service })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` is cancelled, then gives open connections
    /// a short grace to finish and returns.
    pub async fn serve(self, shutdown: CancellationToken) {
        let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let tracker = TaskTracker::new();
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .keep_alive(true);
        loop {
            let (stream, peer) = tokio::select! {
                _ = shutdown.cancelled() => break,
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
            let Ok(permit) = limit.clone().try_acquire_owned() else {
                drop(stream);
                continue;
            };
            let _ = stream.set_nodelay(true);
            let service = self.service.for_peer(peer);
            let conn = http.serve_connection(TokioIo::new(stream), service);
            let shutdown = shutdown.clone();
            tracker.spawn(async move {
                let _permit = permit;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::readiness::Verdict;
    use std::time::Instant;

    fn call(svc: &StatusService, method: Method, path: &str) -> (StatusCode, String) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .unwrap();
        let resp = svc.handle(req);
        let status = resp.status();
        let body = futures_body(resp);
        (status, body)
    }

    fn futures_body(resp: Response<Body>) -> String {
        use http_body_util::BodyExt;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let bytes = rt.block_on(resp.into_body().collect()).unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[test]
    fn routes_and_methods() {
        let r = Readiness::new(Duration::from_secs(4));
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
        assert_eq!(
            call(&svc, Method::GET, "/healthz/ready?x=1").0,
            StatusCode::OK
        );
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
