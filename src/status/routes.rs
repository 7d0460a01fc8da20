//! The routes of the status port: a table built once, when the service is
//! built, from the parts the agent wired. Each route names its path, the
//! methods it takes and what answers it, and takes its own inputs from the
//! request; a part that was not wired has no route (its path is not
//! found, like any other), and a known path asked with another method is
//! answered 405 with `Allow` from the same table. Every answer reuses the
//! request's header map; the probe's allocates nothing.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::Stream;
use hyper::header::{HeaderMap, HeaderValue, ALLOW, CONTENT_ENCODING, CONTENT_TYPE, VARY};
use hyper::{Method, Request, Response, StatusCode};
use metrics::Counter;
use tokio::time::Instant;

use super::app_probe::AppProber;
use super::response::{Body, ResponseFuture};
use crate::drain::DrainHandle;
use crate::drain_wait::{Checkers, DrainWait};
use crate::duration::DurationError;
use crate::envoy::readiness::Readiness;
use crate::exit::linger::{self, Linger};
use crate::metrics::scrape::{ScrapeRequest, Scraper};
use crate::metrics::Metrics;

static TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");
static APPLICATION_JSON: HeaderValue = HeaderValue::from_static("application/json");
static GZIP: HeaderValue = HeaderValue::from_static("gzip");
static VARY_VALUE: HeaderValue = HeaderValue::from_static("accept, accept-encoding");

const GET_HEAD: &[Method] = &[Method::GET, Method::HEAD];
const POST: &[Method] = &[Method::POST];

/// Who is asking: the connection's peer (None: the control socket, or
/// unknown), and whether it came through the control socket.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Caller {
    pub(crate) peer: Option<SocketAddr>,
    pub(crate) control_socket: bool,
}

impl Caller {
    /// Whether the caller is on this host (127.0.0.0/8 or ::1, also as an
    /// IPv4-mapped IPv6 address). Unknown peers are not trusted.
    pub(crate) fn is_loopback(&self) -> bool {
        self.peer.is_some_and(|p| crate::url::is_loopback(p.ip()))
    }
}

/// Where a route is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Exact(&'static str),
    Prefix(&'static str),
}

impl Path {
    // Inlined: at opt-level "s" these were a call each on the probe's path.
    #[inline]
    fn matches(self, path: &str) -> bool {
        match self {
            Path::Exact(p) => path == p,
            Path::Prefix(p) => path.starts_with(p),
        }
    }
}

/// One route.
struct Route {
    path: Path,
    methods: &'static [Method],
    answer: Answer,
}

impl Route {
    /// Whether this route serves `path` (an app probe's, only the probes
    /// configured).
    #[inline]
    fn takes(&self, path: &str) -> bool {
        self.path.matches(path)
            && match &self.answer {
                Answer::AppProbe(prober) => prober.knows(path),
                _ => true,
            }
    }
}

/// What answers a route, with the parts it needs.
enum Answer {
    Probe(Probe),
    Scrape(Scrape),
    DrainStatus(DrainStatus),
    DrainWait(DrainWait),
    Control(Control),
    AppProbe(AppProber),
}

/// The routes of the status port, built once.
pub(crate) struct Routes {
    table: Vec<Route>,
    /// Each path's `Allow`: every method its routes take.
    allow: Vec<(Path, HeaderValue)>,
}

/// The parts the routes are built from; each one wired gives its routes.
pub struct RoutesBuilder {
    probe: Probe,
    drain: Option<DrainHandle>,
    scrape: Option<Scrape>,
    linger: Option<Linger>,
    drain_wait: Option<DrainWait>,
    app_probes: Option<AppProber>,
    loopback_control: bool,
    control_socket: Option<PathBuf>,
}

impl RoutesBuilder {
    /// The readiness probe, answered from `readiness`; nothing else yet.
    pub(crate) fn new(readiness: Readiness) -> RoutesBuilder {
        RoutesBuilder {
            probe: Probe {
                readiness,
                ok: Counter::noop(),
                unavailable: Counter::noop(),
                checkers: Checkers::default(),
            },
            drain: None,
            scrape: None,
            linger: None,
            drain_wait: None,
            app_probes: None,
            loopback_control: true,
            control_socket: None,
        }
    }

    /// `GET /drain`, `POST /drain` and `POST /quitquitquit`, through `drain`.
    pub(crate) fn drain(mut self, drain: DrainHandle) -> Self {
        self.drain = Some(drain);
        self
    }

    /// Who may drain and stop: loopback TCP callers when `loopback` (as
    /// Istio), and always whoever may connect to the control `socket`.
    pub(crate) fn control(mut self, loopback: bool, socket: Option<PathBuf>) -> Self {
        (self.loopback_control, self.control_socket) = (loopback, socket);
        self
    }

    /// Counts probes in `metrics`; `/stats/prometheus` (and `/metrics`)
    /// through `scraper`.
    pub fn metrics(mut self, metrics: &Metrics, scraper: Scraper) -> Self {
        (self.probe.ok, self.probe.unavailable) = metrics.probe_counters();
        self.scrape = Some(Scrape { scraper, linger: None });
        self
    }

    /// Tells `linger` of each scrape.
    pub(crate) fn linger(mut self, linger: Linger) -> Self {
        self.linger = Some(linger);
        self
    }

    /// `GET /drain/wait` through `drain_wait`, each probe's checker recorded
    /// in its table.
    pub(crate) fn drain_wait(mut self, drain_wait: DrainWait) -> Self {
        self.probe.checkers = drain_wait.checkers().clone();
        self.drain_wait = Some(drain_wait);
        self
    }

    /// The app's probes and hooks (`/app-health/...`, `/app-lifecycle/...`).
    pub fn app_probes(mut self, prober: AppProber) -> Self {
        self.app_probes = Some(prober);
        self
    }

    /// The table: the probe first (the hot path), then every route whose
    /// part was wired.
    pub(crate) fn build(self) -> Routes {
        let route = |path, methods, answer| Route { path, methods, answer };
        let mut table = vec![route(
            Path::Exact("/healthz/ready"),
            GET_HEAD,
            Answer::Probe(self.probe),
        )];
        if let Some(mut scrape) = self.scrape {
            scrape.linger = self.linger;
            for path in ["/stats/prometheus", "/metrics"] {
                table.push(route(Path::Exact(path), GET_HEAD, Answer::Scrape(scrape.clone())));
            }
        }
        if let Some(drain) = self.drain {
            let drain_wait = self.drain_wait.clone();
            let status = DrainStatus {
                drain: drain.clone(),
                drain_wait,
            };
            table.push(route(Path::Exact("/drain"), GET_HEAD, Answer::DrainStatus(status)));
            let control = Control {
                drain,
                loopback: self.loopback_control,
                socket: self.control_socket,
            };
            for path in ["/drain", "/quitquitquit"] {
                table.push(route(Path::Exact(path), POST, Answer::Control(control.clone())));
            }
        }
        if let Some(drain_wait) = self.drain_wait {
            table.push(route(
                Path::Exact("/drain/wait"),
                GET_HEAD,
                Answer::DrainWait(drain_wait),
            ));
        }
        if let Some(prober) = self.app_probes {
            for prefix in ["/app-health/", "/app-lifecycle/"] {
                table.push(route(Path::Prefix(prefix), GET_HEAD, Answer::AppProbe(prober.clone())));
            }
        }
        let mut allow: Vec<(Path, Vec<&str>)> = Vec::new();
        for r in &table {
            let methods = r.methods.iter().map(Method::as_str);
            match allow.iter_mut().find(|(p, _)| *p == r.path) {
                Some((_, all)) => all.extend(methods),
                None => allow.push((r.path, methods.collect())),
            }
        }
        let allow = allow
            .into_iter()
            .map(|(path, methods)| {
                let value = HeaderValue::from_str(&methods.join(", ")).expect("method names are header values");
                (path, value)
            })
            .collect();
        Routes { table, allow }
    }
}

impl Routes {
    /// One request: the route of its path and method answers it; a known
    /// path with another method is 405 with its `Allow`; else 404.
    pub(crate) fn answer<B>(&self, caller: &Caller, req: Request<B>) -> ResponseFuture {
        let path = req.uri().path();
        let method = req.method();
        if let Some(route) = self.table.iter().find(|r| r.methods.contains(method) && r.takes(path)) {
            return route.answer.answer(caller, req);
        }
        let known = self.table.iter().find(|r| r.takes(path)).map(|r| r.path);
        let allow = self
            .allow
            .iter()
            .find(|(p, _)| Some(*p) == known)
            .map(|(_, a)| a.clone());
        let app_probe = self
            .table
            .iter()
            .any(|r| matches!(r.answer, Answer::AppProbe(_)) && r.path.matches(path));
        let not_found = match app_probe {
            true => Bytes::from(format!("no app probe is configured for {path}\n")),
            false => Bytes::from_static(b"not found\n"),
        };
        let method = method.clone();
        let mut headers = into_headers(req);
        match allow {
            Some(allow) => {
                headers.insert(ALLOW, allow);
                let body = Bytes::from_static(b"method not allowed\n");
                finish(headers, &method, (StatusCode::METHOD_NOT_ALLOWED, body))
            }
            None => finish(headers, &method, (StatusCode::NOT_FOUND, not_found)),
        }
    }
}

/// The request's header map, emptied, to be the response's.
fn into_headers<B>(mut req: Request<B>) -> HeaderMap {
    let mut headers = std::mem::take(req.headers_mut());
    headers.clear();
    headers
}

impl Answer {
    fn answer<B>(&self, caller: &Caller, req: Request<B>) -> ResponseFuture {
        match self {
            Answer::Probe(probe) => probe.answer(caller, req),
            Answer::Scrape(scrape) => scrape.answer(req),
            Answer::DrainStatus(status) => status.answer(req),
            Answer::DrainWait(wait) => drain_wait(wait, caller, req),
            Answer::Control(control) => control.answer(caller, req),
            Answer::AppProbe(prober) => app_probe(prober, req),
        }
    }
}

/// `GET|HEAD /healthz/ready`: from the readiness snapshot, never waiting
/// on Envoy. The answer is recorded against its checker (a load balancer),
/// for the drain wait.
struct Probe {
    readiness: Readiness,
    ok: Counter,
    unavailable: Counter,
    /// Who checks the pod's readiness (the drain wait's table, when it is
    /// wired): each probe's answer is recorded.
    checkers: Checkers,
}

impl Probe {
    fn answer<B>(&self, caller: &Caller, mut req: Request<B>) -> ResponseFuture {
        let mut headers = std::mem::take(req.headers_mut());
        let checker = self.checkers.key_of(caller.peer, &headers);
        headers.clear();
        let answer = self.readiness.answer();
        let status = if answer.ready {
            self.ok.increment(1);
            StatusCode::OK
        } else {
            self.unavailable.increment(1);
            StatusCode::SERVICE_UNAVAILABLE
        };
        if let Some(key) = checker {
            self.checkers.record(key, Instant::now(), answer.ready);
        }
        finish(headers, req.method(), (status, answer.body))
    }
}

/// `GET|HEAD /stats/prometheus` (and `/metrics`): the merged scrape,
/// streamed; the linger is told once its last byte is out.
#[derive(Clone)]
struct Scrape {
    scraper: Scraper,
    linger: Option<Linger>,
}

impl Scrape {
    fn answer<B>(&self, mut req: Request<B>) -> ResponseFuture {
        let mut headers = std::mem::take(req.headers_mut());
        let scrape = ScrapeRequest::new(req.uri().query(), &headers);
        headers.clear();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(scrape.format.content_type()));
        headers.insert(VARY, VARY_VALUE.clone());
        if scrape.gzip {
            headers.insert(CONTENT_ENCODING, GZIP.clone());
        }
        let body = if req.method() == Method::HEAD {
            Body::full(Bytes::new())
        } else {
            let ticket = self.linger.as_ref().map(Linger::scrape_begins);
            Body::stream(Box::pin(ServedAtEnd {
                stream: Box::pin(self.scraper.body(scrape)),
                ticket,
            }))
        };
        let mut response = Response::new(body);
        *response.headers_mut() = headers;
        ResponseFuture::Ready(Some(response))
    }
}

/// `GET|HEAD /drain`: the drain's status as JSON, with the drain wait's
/// (`drain_wait`).
struct DrainStatus {
    drain: DrainHandle,
    drain_wait: Option<DrainWait>,
}

impl DrainStatus {
    fn answer<B>(&self, req: Request<B>) -> ResponseFuture {
        #[derive(serde::Serialize)]
        struct View {
            #[serde(flatten)]
            drain: crate::drain::Status,
            drain_wait: Option<crate::drain_wait::DrainWaitStatus>,
        }
        let view = View {
            drain: self.drain.status(),
            drain_wait: self.drain_wait.as_ref().map(DrainWait::status),
        };
        let mut body = serde_json::to_vec(&view).unwrap_or_default();
        body.push(b'\n');
        let method = req.method().clone();
        let mut headers = into_headers(req);
        headers.insert(CONTENT_TYPE, APPLICATION_JSON.clone());
        finish(headers, &method, (StatusCode::OK, Bytes::from(body)))
    }
}

/// `GET|HEAD /drain/wait[?timeout=D]`: the app container's preStop hook.
/// Answers 200 with one line once the pod is out of rotation, or at its
/// bound (the timeout, the drain's deadline less the app's time, Envoy
/// stopping), saying which; 400 for a timeout that is not a duration.
/// Starts nothing; any caller, those outside the pod a few waits at a
/// time (429 past them).
fn drain_wait<B>(wait: &DrainWait, caller: &Caller, req: Request<B>) -> ResponseFuture {
    let timeout = wait_timeout(req.uri().query());
    let method = req.method().clone();
    let headers = into_headers(req);
    let held = match caller.peer {
        Some(peer) if !caller.is_loopback() => match wait.admit_remote(peer.ip()) {
            Some(held) => Some(held),
            None => {
                let body = Bytes::from_static(b"too many drain waits held open from outside the pod\n");
                return finish(headers, &method, (StatusCode::TOO_MANY_REQUESTS, body));
            }
        },
        _ => None,
    };
    let timeout = match timeout {
        Ok(timeout) => timeout,
        Err(why) => {
            return finish(
                headers,
                &method,
                (StatusCode::BAD_REQUEST, Bytes::from(format!("{why}\n"))),
            )
        }
    };
    let wait = wait.clone();
    ResponseFuture::waiting(async move {
        let end = wait.wait(timeout).await;
        drop(held);
        respond(headers, &method, (StatusCode::OK, Bytes::from(end.line + "\n")))
    })
}

/// A drain wait's `timeout` that is no Go duration.
#[derive(Debug, thiserror::Error)]
#[error("invalid timeout {value:?}: {why}")]
struct TimeoutError {
    value: String,
    why: DurationError,
}

/// The `timeout` of a drain wait's query string, a Go duration.
fn wait_timeout(query: Option<&str>) -> Result<Option<std::time::Duration>, TimeoutError> {
    let Some(value) = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|p| p.strip_prefix("timeout="))
    else {
        return Ok(None);
    };
    match crate::duration::parse(value) {
        Ok(timeout) => Ok(Some(timeout)),
        Err(why) => Err(TimeoutError {
            value: value.to_owned(),
            why,
        }),
    }
}

/// `POST /drain[?nowait]` and `POST /quitquitquit`, for the callers this
/// lets through (loopback when allowed, or the control socket): answered
/// once the drain has begun (`nowait`), is drained, or Envoy has stopped.
#[derive(Clone)]
struct Control {
    drain: DrainHandle,
    /// Whether loopback TCP callers may drain and stop (`--loopback-control`).
    loopback: bool,
    /// The control socket, named in the answer to a TCP caller refused.
    socket: Option<PathBuf>,
}

impl Control {
    /// Whether `caller` may drain or stop; the 403 body when not.
    fn may(&self, caller: &Caller) -> Result<(), Bytes> {
        if caller.control_socket {
            return Ok(());
        }
        if !self.loopback {
            let on = self.socket.as_deref().map_or("nowhere on TCP".into(), |p| {
                format!("on the control socket {}", p.display())
            });
            return Err(Bytes::from(format!("forbidden: drain and stop are served {on} only\n")));
        }
        match caller.is_loopback() {
            true => Ok(()),
            false => Err(Bytes::from_static(b"forbidden: only loopback callers may do this\n")),
        }
    }

    fn answer<B>(&self, caller: &Caller, req: Request<B>) -> ResponseFuture {
        let quit = req.uri().path() == "/quitquitquit";
        let nowait = req.uri().query().is_some_and(|q| q.split('&').any(|p| p == "nowait"));
        let mut headers = into_headers(req);
        if let Err(forbidden) = self.may(caller) {
            return finish(headers, &Method::POST, (StatusCode::FORBIDDEN, forbidden));
        }
        let drain = self.drain.clone();
        ResponseFuture::waiting(async move {
            let (status, drained) = match (quit, nowait) {
                (true, _) => {
                    let answer = match drain.quit().await {
                        true => (StatusCode::OK, Bytes::from_static(b"OK\n")),
                        false => stopping(),
                    };
                    return respond(headers, &Method::POST, answer);
                }
                (false, true) => (StatusCode::ACCEPTED, drain.begin().await),
                (false, false) => (StatusCode::OK, drain.drain().await),
            };
            let answer = match drained {
                Some(drained) => {
                    headers.insert(CONTENT_TYPE, APPLICATION_JSON.clone());
                    (status, status_json(&drained))
                }
                None => stopping(),
            };
            respond(headers, &Method::POST, answer)
        })
    }
}

/// `GET|HEAD /app-health/<container>/<kind>` and `/app-lifecycle/...`
/// (the probes configured): the app's own probe, run now (see
/// [`super::app_probe`]); the kubelet's headers are passed on to the app.
fn app_probe<B>(prober: &AppProber, mut req: Request<B>) -> ResponseFuture {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let request = std::mem::take(req.headers_mut());
    let prober = prober.clone();
    ResponseFuture::waiting(async move {
        let answer = prober.answer(&path, &request).await;
        respond(HeaderMap::new(), &method, answer)
    })
}

/// A scrape's body that tells the linger the scrape was served once its
/// last byte has been produced.
struct ServedAtEnd {
    stream: Pin<Box<dyn Stream<Item = Bytes> + Send>>,
    ticket: Option<linger::Scrape>,
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
    let fresh = std::mem::replace(response.headers_mut(), headers);
    // `Response::new`'s map holds no memory: forgetting it frees nothing,
    // and spares the probe's path a drop that calls out four times.
    if fresh.capacity() == 0 {
        std::mem::forget(fresh);
    }
    response
}

fn status_json(status: &crate::drain::Status) -> Bytes {
    let mut body = serde_json::to_vec(status).unwrap_or_default();
    body.push(b'\n');
    Bytes::from(body)
}

fn stopping() -> (StatusCode, Bytes) {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Bytes::from_static(b"lifeguard is stopping\n"),
    )
}
