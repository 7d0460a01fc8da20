//! A misbehaving Envoy admin ([`FakeAdmin`]), for the faults a real Envoy
//! will not make on demand: hang, answer garbage, cut an answer short,
//! answer slowly.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Frame;
use hyper::Response;

use super::ports::{port, Port};
use super::servers::{reply, Body, TestServer};

/// How the fake admin answers the readiness query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminMode {
    /// `server.state: 0` and `workers_started: 1`.
    Live,
    /// Accepts, reads the request, never answers.
    Hang,
    /// 200 with a body that is not stats.
    Garbage,
    /// Promises 100 bytes, sends 10, closes.
    Truncated,
    /// 200 with an 8 MiB body.
    Huge,
    /// HTTP 500.
    Error500,
    /// `server.state: 18446744073709551615`.
    Wrapped,
}

/// A fake Envoy admin API on a reserved loopback port. The active-counts
/// query answers `active_body`; one read of it can be made slow.
pub struct FakeAdmin {
    server: TestServer,
    pub port: Port,
    mode: Arc<Mutex<AdminMode>>,
    pub active_body: Arc<Mutex<String>>,
    /// When set, the next active-counts read is answered after this long.
    pub slow_next_active: Arc<Mutex<Option<Duration>>>,
    pub quit_called: Arc<AtomicBool>,
}

#[derive(Clone)]
struct AdminState {
    mode: Arc<Mutex<AdminMode>>,
    active_body: Arc<Mutex<String>>,
    slow_next_active: Arc<Mutex<Option<Duration>>>,
    quit_called: Arc<AtomicBool>,
}

impl FakeAdmin {
    pub fn start(mode: AdminMode) -> FakeAdmin {
        let state = AdminState {
            mode: Arc::new(Mutex::new(mode)),
            active_body: Arc::new(Mutex::new(String::new())),
            slow_next_active: Arc::new(Mutex::new(None)),
            quit_called: Arc::new(AtomicBool::new(false)),
        };
        let port = port();
        let shared = state.clone();
        let server = TestServer::start(&port, move |request| {
            let state = shared.clone();
            async move {
                let target = request.uri().path_and_query().map_or("/", |p| p.as_str());
                let mut response = state.answer(target).await;
                response.headers_mut().insert("connection", "close".parse().unwrap());
                response
            }
        });
        FakeAdmin {
            server,
            port,
            mode: state.mode,
            active_body: state.active_body,
            slow_next_active: state.slow_next_active,
            quit_called: state.quit_called,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port.port)
    }

    pub fn set(&self, mode: AdminMode) {
        *self.mode.lock().unwrap() = mode;
    }

    /// Stops answering: the listener closes (connections are refused).
    pub fn stop(&mut self) {
        self.server.stop();
    }
}

impl AdminState {
    /// The answer to a request for `path` (with its query).
    async fn answer(&self, path: &str) -> Response<Body> {
        if path.starts_with("/drain_listeners") {
            return reply(200, "OK\n");
        }
        if path.starts_with("/quitquitquit") {
            self.quit_called.store(true, Ordering::Relaxed);
            return reply(200, "OK\n");
        }
        if path.starts_with("/stats/prometheus") {
            return reply(200, "# TYPE envoy_server_live gauge\nenvoy_server_live 1\n");
        }
        if path.contains("downstream_") {
            let slow = self.slow_next_active.lock().unwrap().take();
            if let Some(d) = slow {
                tokio::time::sleep(d).await;
            }
            let body = self.active_body.lock().unwrap().clone();
            return reply(200, body);
        }
        let mode = self.mode.lock().unwrap().clone();
        match mode {
            AdminMode::Live => reply(200, "listener_manager.workers_started: 1\nserver.state: 0\n"),
            AdminMode::Wrapped => reply(
                200,
                "listener_manager.workers_started: 1\nserver.state: 18446744073709551615\n",
            ),
            AdminMode::Garbage => reply(200, "<html><body>502 Bad Gateway</body></html>"),
            AdminMode::Error500 => reply(500, "internal error\n"),
            AdminMode::Truncated => {
                let mut response = Response::new(CutShort(Some(Bytes::from_static(b"server.sta"))).boxed());
                response.headers_mut().insert("content-length", "100".parse().unwrap());
                response
            }
            AdminMode::Hang => std::future::pending().await,
            AdminMode::Huge => {
                static HUGE: OnceLock<Bytes> = OnceLock::new();
                let body = HUGE.get_or_init(|| "server.state: 0\n".repeat((8 << 20) / 16).into());
                reply(200, body.clone())
            }
        }
    }
}

/// A body that sends `first` and then fails: hyper aborts the connection,
/// so the client sees the answer cut short.
struct CutShort(Option<Bytes>);

impl hyper::body::Body for CutShort {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        Poll::Ready(Some(match self.0.take() {
            Some(first) => Ok(Frame::data(first)),
            None => Err(std::io::Error::other("cut short on purpose")),
        }))
    }
}
