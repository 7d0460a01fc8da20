//! The routes of the status port: a table built once, when the service is
//! built, from the parts the agent wired. A route is a path and a handler
//! per method; a request is matched against the table once, by its path,
//! then by its method (405 with the path's `Allow` for another). A part
//! that was not wired has no route (its path is not found, like any
//! other), and costs the probe nothing. An answer reuses the request's
//! header map (an app probe's passes it on to the app, and answers with a
//! new one); the readiness probe's allocates nothing.

mod drain;

use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::Stream;
use hyper::header::{HeaderMap, HeaderValue, ALLOW, CONTENT_ENCODING, CONTENT_TYPE, USER_AGENT, VARY};
use hyper::{Method, Request, Response, StatusCode};
use tokio::time::Instant;

use super::app_probe::{AppProbe, AppProber};
use super::response::{Body, ResponseFuture};
use drain::{drain_wait, Control, DrainStatus, DrainStopped};
use lifeguard_checkers::Checkers;
use lifeguard_drain::DrainHandle;
use lifeguard_drain_wait::DrainWait;
use lifeguard_envoy::readiness::{Audience, Readiness};
use lifeguard_metrics::{Metrics, ProbeCounters};
use lifeguard_scrape::linger;
use lifeguard_scrape::{ScrapeRequest, Scraper};

static TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");
static APPLICATION_JSON: HeaderValue = HeaderValue::from_static("application/json");
static GZIP: HeaderValue = HeaderValue::from_static("gzip");
static VARY_VALUE: HeaderValue = HeaderValue::from_static("accept, accept-encoding");
static GET_HEAD: HeaderValue = HeaderValue::from_static("GET, HEAD");

/// Who is asking: the connection's peer (None: the control socket, or
/// unknown), and whether it came through the control socket.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Caller {
    pub(crate) peer: Option<std::net::SocketAddr>,
    pub(crate) control_socket: bool,
}

impl Caller {
    /// Whether the caller is on this host (127.0.0.0/8 or ::1, also as an
    /// IPv4-mapped IPv6 address). Unknown peers are not trusted.
    pub(crate) fn is_loopback(&self) -> bool {
        self.peer.is_some_and(|p| lifeguard_base::url::is_loopback(p.ip()))
    }
}

/// Where a route is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Path {
    Exact(Box<str>),
    Prefix(&'static str),
}

impl Path {
    // Inlined: at opt-level "s" these were a call each on the probe's path.
    #[inline]
    fn matches(&self, path: &str) -> bool {
        match self {
            Path::Exact(p) => path == &**p,
            Path::Prefix(p) => path.starts_with(p),
        }
    }
}

/// One route: a path, and what answers each method it takes.
struct Route {
    path: Path,
    /// Every method it takes, for a 405's `Allow`.
    allow: HeaderValue,
    /// `GET` (and `HEAD`): the handler of reads.
    read: Option<Handler>,
    /// `POST`: the handler of changes.
    post: Option<Handler>,
    /// Every method the two above do not take (a path no resource is at:
    /// 404 whatever the method).
    any: Option<Handler>,
}

/// What answers a route's method, with the parts it needs: each route
/// names its own.
enum Handler {
    Probe(Probe),
    Scrape(Scrape),
    DrainStatus(DrainStatus),
    Drain(Control),
    Quit(Control),
    DrainWait(DrainWait),
    DrainStopped(DrainStopped),
    /// One of the app's probes, on its path.
    AppProbe(AppProbe),
    /// `/app-health/...` and `/app-lifecycle/...` paths no probe is
    /// configured for: 404, saying so.
    NoAppProbe,
}

/// The routes of the status port, built once.
pub(crate) struct Routes {
    table: Vec<Route>,
}

/// Who may drain and stop Envoy (`POST /drain`, `POST /quitquitquit`):
/// loopback TCP callers when `loopback` (as Istio), and always whoever may
/// connect to the control `socket`.
#[derive(Debug, Clone, Default)]
pub struct ControlAccess {
    pub loopback: bool,
    pub socket: Option<PathBuf>,
}

impl ControlAccess {
    /// Loopback callers may drain and stop (Istio's way); no control socket.
    pub fn loopback() -> ControlAccess {
        ControlAccess {
            loopback: true,
            socket: None,
        }
    }
}

/// The parts the routes are built from; each one wired gives its routes.
/// A part that needs another takes it: the drain's routes take who may
/// drain; the scrape carries its linger.
pub struct RoutesBuilder {
    probe: Probe,
    drain: Option<(DrainHandle, ControlAccess)>,
    scrape: Option<Scrape>,
    drain_wait: Option<DrainWait>,
    app_probes: Option<AppProber>,
}

impl RoutesBuilder {
    /// The readiness probe, answered from `readiness`; nothing else yet.
    pub(crate) fn new(readiness: Readiness) -> RoutesBuilder {
        RoutesBuilder {
            probe: Probe {
                readiness,
                counted: ProbeCounters::noop(),
                checkers: None,
            },
            drain: None,
            scrape: None,
            drain_wait: None,
            app_probes: None,
        }
    }

    /// `GET /drain`, and `POST /drain` and `POST /quitquitquit` for those
    /// `access` lets through, through `drain`.
    pub fn drain(mut self, drain: DrainHandle, access: ControlAccess) -> Self {
        self.drain = Some((drain, access));
        self
    }

    /// Counts probes in `metrics`; `/stats/prometheus` (and `/metrics`)
    /// through `scraper` (which tells its linger, if it has one, of each
    /// scrape).
    pub fn metrics(mut self, metrics: &Metrics, scraper: Scraper) -> Self {
        self.probe.counted = metrics.probe_counters();
        self.scrape = Some(Scrape { scraper });
        self
    }

    /// `GET /drain/wait` through `drain_wait`, each probe's checker recorded
    /// in its table.
    pub fn drain_wait(mut self, drain_wait: DrainWait) -> Self {
        self.probe.checkers = Some(drain_wait.checkers().clone());
        self.drain_wait = Some(drain_wait);
        self
    }

    /// The app's probes and hooks (`/app-health/...`, `/app-lifecycle/...`).
    pub fn app_probes(mut self, prober: AppProber) -> Self {
        self.app_probes = Some(prober);
        self
    }

    /// The table: the probe first (the hot path), then every route whose
    /// part was wired, the app's probes' own paths before the prefixes
    /// that answer for the paths no probe is configured for.
    pub(crate) fn build(self) -> Routes {
        let read = |path: Path, handler| Route {
            path,
            allow: GET_HEAD.clone(),
            read: Some(handler),
            post: None,
            any: None,
        };
        let exact = |p: &str| Path::Exact(p.into());
        let mut table = vec![read(exact("/healthz/ready"), Handler::Probe(self.probe))];
        let drain_handle = self.drain.as_ref().map(|(drain, _)| drain.clone());
        if let Some(scrape) = self.scrape {
            table.push(read(exact("/stats/prometheus"), Handler::Scrape(scrape.clone())));
            table.push(read(exact("/metrics"), Handler::Scrape(scrape)));
        }
        if let Some((drain, access)) = self.drain {
            let control = Control {
                drain: drain.clone(),
                access,
            };
            let status = DrainStatus {
                drain,
                drain_wait: self.drain_wait.clone(),
            };
            table.push(Route {
                path: exact("/drain"),
                allow: HeaderValue::from_static("GET, HEAD, POST"),
                read: Some(Handler::DrainStatus(status)),
                post: Some(Handler::Drain(control.clone())),
                any: None,
            });
            table.push(Route {
                path: exact("/quitquitquit"),
                allow: HeaderValue::from_static("POST"),
                read: None,
                post: Some(Handler::Quit(control)),
                any: None,
            });
        }
        if let Some(drain_wait) = self.drain_wait {
            if let Some(drain) = drain_handle {
                let stopped = DrainStopped {
                    drain,
                    admission: drain_wait.clone(),
                };
                table.push(read(exact("/drain/stopped"), Handler::DrainStopped(stopped)));
            }
            table.push(read(exact("/drain/wait"), Handler::DrainWait(drain_wait)));
        }
        if let Some(prober) = self.app_probes {
            for probe in prober.probes() {
                table.push(read(exact(probe.path()), Handler::AppProbe(probe.clone())));
            }
            // No probe at the path: no resource, 404 for every method.
            for prefix in ["/app-health/", "/app-lifecycle/"] {
                table.push(Route {
                    path: Path::Prefix(prefix),
                    allow: GET_HEAD.clone(),
                    read: None,
                    post: None,
                    any: Some(Handler::NoAppProbe),
                });
            }
        }
        Routes { table }
    }
}

impl Routes {
    /// One request: the route of its path, matched once, answers by its
    /// method; another method is 405 with the path's `Allow`; an unknown
    /// path 404.
    pub(crate) fn answer<B>(&self, caller: &Caller, req: Request<B>) -> ResponseFuture {
        let path = req.uri().path();
        let Some(route) = self.table.iter().find(|r| r.path.matches(path)) else {
            return refuse(req, StatusCode::NOT_FOUND, None);
        };
        let handler = match *req.method() {
            Method::GET | Method::HEAD => route.read.as_ref(),
            Method::POST => route.post.as_ref(),
            _ => None,
        }
        .or(route.any.as_ref());
        match handler {
            Some(handler) => handler.answer(caller, req),
            None => refuse(req, StatusCode::METHOD_NOT_ALLOWED, Some(route.allow.clone())),
        }
    }
}

/// A 404 or a 405 (with its `Allow`).
fn refuse<B>(req: Request<B>, status: StatusCode, allow: Option<HeaderValue>) -> ResponseFuture {
    let method = req.method().clone();
    let mut headers = into_headers(req);
    let body = match allow {
        Some(allow) => {
            headers.insert(ALLOW, allow);
            Bytes::from_static(b"method not allowed\n")
        }
        None => Bytes::from_static(b"not found\n"),
    };
    finish(headers, &method, (status, body))
}

/// The request's header map, emptied, to be the response's.
fn into_headers<B>(mut req: Request<B>) -> HeaderMap {
    let mut headers = std::mem::take(req.headers_mut());
    headers.clear();
    headers
}

impl Handler {
    fn answer<B>(&self, caller: &Caller, req: Request<B>) -> ResponseFuture {
        match self {
            Handler::Probe(probe) => probe.answer(caller, req),
            Handler::Scrape(scrape) => scrape.answer(req),
            Handler::DrainStatus(status) => status.answer(req),
            Handler::Drain(control) => control.drain(caller, req),
            Handler::Quit(control) => control.quit(caller, req),
            Handler::DrainWait(wait) => drain_wait(wait, caller, req),
            Handler::DrainStopped(stopped) => stopped.answer(caller, req),
            Handler::AppProbe(probe) => app_probe(probe, req),
            Handler::NoAppProbe => {
                let path = req.uri().path().to_owned();
                let method = req.method().clone();
                let body = Bytes::from(format!("no app probe is configured for {path}\n"));
                finish(into_headers(req), &method, (StatusCode::NOT_FOUND, body))
            }
        }
    }
}

/// `GET|HEAD /healthz/ready`: from the readiness snapshot, never waiting
/// on Envoy, to its audience (the kubelet, by its `User-Agent`, or a load
/// balancer). A load balancer's answer is recorded against its checker,
/// for the drain wait.
struct Probe {
    readiness: Readiness,
    /// The answers, counted by status code.
    counted: ProbeCounters,
    /// Who checks the pod's readiness (the drain wait's table, when it is
    /// wired): each probe's answer is recorded.
    checkers: Option<Checkers>,
}

impl Probe {
    fn answer<B>(&self, caller: &Caller, mut req: Request<B>) -> ResponseFuture {
        let mut headers = std::mem::take(req.headers_mut());
        let audience = Audience::of_agent(headers.get(USER_AGENT).map(HeaderValue::as_bytes));
        let checker = match audience {
            Audience::Kubelet => None,
            Audience::LoadBalancer => self
                .checkers
                .as_ref()
                .and_then(|c| Some((c, c.key_of(caller.peer, &headers)?))),
        };
        headers.clear();
        let answer = self.readiness.answer(audience);
        self.readiness.answered(audience, &answer);
        self.counted.count(answer.ready);
        let status = match answer.ready {
            true => StatusCode::OK,
            false => StatusCode::SERVICE_UNAVAILABLE,
        };
        if let Some((checkers, key)) = checker {
            checkers.record(key, Instant::now(), answer.ready);
        }
        finish(headers, req.method(), (status, answer.body))
    }
}

/// `GET|HEAD /stats/prometheus` (and `/metrics`): the merged scrape,
/// streamed; the linger is told once its last byte is out.
#[derive(Clone)]
struct Scrape {
    scraper: Scraper,
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
            let ticket = self.scraper.linger().map(linger::Linger::scrape_begins);
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

/// `GET|HEAD /app-health/<container>/<kind>` and `/app-lifecycle/...`
/// (the probes configured): the app's own probe, run now (see
/// [`super::app_probe`]); the kubelet's headers are passed on to the app.
fn app_probe<B>(probe: &AppProbe, mut req: Request<B>) -> ResponseFuture {
    let method = req.method().clone();
    let request = std::mem::take(req.headers_mut());
    let probe = probe.clone();
    ResponseFuture::waiting(async move {
        let answer = probe.answer(&request).await;
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
