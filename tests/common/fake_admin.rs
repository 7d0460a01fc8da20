//! A fake Envoy admin ([`FakeAdmin`]), for what a real Envoy will not do
//! on demand: hang (its readiness reads, one path, or everything), answer
//! garbage, cut an answer short, answer slowly, report the drain's counts
//! a test scripts; and what it was asked, and when.
//!
//! It answers as a live Envoy does until told otherwise: `/ready` says
//! `LIVE`, the readiness stats say ready, `/stats/prometheus` has one
//! family, the drain's active counts are [`AdminState::active_body`],
//! `/drain_listeners` and `/quitquitquit` say OK. Every answer closes its
//! connection.

use std::collections::VecDeque;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Frame;
use hyper::Response;

use super::ports::{port, Port};
use super::servers::{reply, Body, TestServer};

/// How the fake admin answers the readiness reads (`/ready` and the
/// readiness stats).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum AdminMode {
    /// `/ready` says `LIVE`; `server.state: 0` and `workers_started: 1`.
    #[default]
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

/// A fake Envoy admin API on a leased loopback port; its knobs and what it
/// saw are its [`AdminState`]'s fields (`admin.hang_all.store(true, ..)`).
pub struct FakeAdmin {
    server: TestServer,
    pub port: Port,
    state: Arc<AdminState>,
}

/// The fake admin's knobs, set by the test at any time, and what it saw.
#[derive(Default)]
pub struct AdminState {
    mode: Mutex<AdminMode>,
    /// Every request is read and never answered.
    pub hang_all: AtomicBool,
    /// `/stats/prometheus` is read and never answered.
    pub hang_prometheus: AtomicBool,
    /// The drain's active-count read (the `downstream_` stats) answers
    /// this, once `active_script` is used up.
    pub active_body: Mutex<String>,
    /// The answers of the next active-count reads, one a read.
    pub active_script: Mutex<VecDeque<String>>,
    /// Every active-count read is answered after this long.
    pub active_read_takes: Mutex<Duration>,
    /// How long each readiness stats read takes to answer (an Envoy of
    /// thousands of listeners on a busy node).
    pub readiness_stats_takes: Mutex<Duration>,
    /// When set, the next active-count read is answered after this long.
    pub slow_next_active: Mutex<Option<Duration>>,
    /// When each active-count read came in.
    pub active_reads: Mutex<Vec<Instant>>,
    /// Envoy's main thread, which serves its admin API: slowed
    /// active-count reads are answered one at a time, and each is finished
    /// even when its client gave up on it.
    admin_thread: Arc<tokio::sync::Mutex<()>>,
    /// When `/ready` last answered `LIVE`.
    pub last_live: Mutex<Option<Instant>>,
    /// Set once a `/stats/prometheus` request was read.
    pub got_prometheus: AtomicBool,
    /// Set once `/quitquitquit` was asked.
    pub quit_called: AtomicBool,
    /// `/quitquitquit` is read and never answered (an Envoy that begins to
    /// exit before it answers).
    pub quit_unanswered: AtomicBool,
}

impl FakeAdmin {
    pub fn start(mode: AdminMode) -> FakeAdmin {
        let state = Arc::new(AdminState {
            mode: Mutex::new(mode),
            ..AdminState::default()
        });
        let port = port();
        let shared = state.clone();
        let server = TestServer::start(&port, move |request| {
            let state = shared.clone();
            let target = request.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned();
            async move {
                let mut response = state.answer(&target).await;
                response.headers_mut().insert("connection", "close".parse().unwrap());
                response
            }
        });
        FakeAdmin { server, port, state }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port.port)
    }

    /// How the readiness reads are answered from now on.
    pub fn set(&self, mode: AdminMode) {
        *self.state.mode.lock().unwrap() = mode;
    }

    /// Stops answering: the listener closes (connections are refused).
    pub fn stop(&mut self) {
        self.server.stop();
    }
}

impl Deref for FakeAdmin {
    type Target = AdminState;

    fn deref(&self) -> &AdminState {
        &self.state
    }
}

impl AdminState {
    /// The answer to a request for `target` (path and query).
    async fn answer(&self, target: &str) -> Response<Body> {
        let prometheus = target.starts_with("/stats/prometheus");
        if prometheus {
            self.got_prometheus.store(true, Ordering::Relaxed);
        }
        if self.hang_all.load(Ordering::Relaxed) || (prometheus && self.hang_prometheus.load(Ordering::Relaxed)) {
            return std::future::pending().await;
        }
        if target.starts_with("/drain_listeners") {
            return reply(200, "OK\n");
        }
        if target.starts_with("/quitquitquit") {
            self.quit_called.store(true, Ordering::Relaxed);
            if self.quit_unanswered.load(Ordering::Relaxed) {
                return std::future::pending().await;
            }
            return reply(200, "OK\n");
        }
        if prometheus {
            return reply(200, "# TYPE envoy_server_live gauge\nenvoy_server_live 1\n");
        }
        if target.contains("downstream_") {
            return self.active_counts().await;
        }
        let mode = self.mode.lock().unwrap().clone();
        if mode == AdminMode::Live && target == "/ready" {
            *self.last_live.lock().unwrap() = Some(Instant::now());
            return reply(200, "LIVE\n");
        }
        let takes = *self.readiness_stats_takes.lock().unwrap();
        if target.starts_with("/stats?") && !takes.is_zero() {
            tokio::time::sleep(takes).await;
        }
        readiness(mode).await
    }

    /// The drain's active-count read: recorded, slowed as told (behind any
    /// slowed read before it, as on Envoy's main thread), the next scripted
    /// answer or `active_body`.
    async fn active_counts(&self) -> Response<Body> {
        self.active_reads.lock().unwrap().push(Instant::now());
        let slow = self.slow_next_active.lock().unwrap().take();
        let takes = *self.active_read_takes.lock().unwrap();
        let delay = slow.unwrap_or_default().max(takes);
        if !delay.is_zero() {
            let thread = self.admin_thread.clone();
            let _ = tokio::spawn(async move {
                let _busy = thread.lock_owned().await;
                tokio::time::sleep(delay).await;
            })
            .await;
        }
        let scripted = self.active_script.lock().unwrap().pop_front();
        let body = scripted.unwrap_or_else(|| self.active_body.lock().unwrap().clone());
        reply(200, body)
    }
}

/// A readiness read's answer in `mode`.
async fn readiness(mode: AdminMode) -> Response<Body> {
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
