//! The routes of the status port, one function each. Every answer reuses
//! the request's header map; the probe's allocates nothing.

use bytes::Bytes;
use futures_util::Stream;
use hyper::header::{HeaderMap, HeaderValue, ALLOW, CONTENT_ENCODING, CONTENT_TYPE, VARY};
use hyper::{Method, Response, StatusCode};
use std::pin::Pin;
use std::task::{Context, Poll};

use super::app_probe::AppProber;
use super::response::{Body, ResponseFuture};
use crate::drain::DrainHandle;
use crate::duration::DurationError;
use crate::envoy::readiness::Readiness;
use crate::exit::linger::{self, Linger};
use crate::metrics::scrape::ScrapeRequest;
use crate::metrics::scrape::Scraper;
use crate::rotation::checkers::CheckerKey;
use crate::rotation::Checkers;
use crate::rotation::Rotation;
use metrics::Counter;
use std::path::PathBuf;
use tokio::time::Instant;

static TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");
static APPLICATION_JSON: HeaderValue = HeaderValue::from_static("application/json");
static GZIP: HeaderValue = HeaderValue::from_static("gzip");
static VARY_VALUE: HeaderValue = HeaderValue::from_static("accept, accept-encoding");

/// What every connection's service shares.
#[derive(Clone)]
pub(super) struct Shared {
    pub(super) readiness: Readiness,
    pub(super) drain: Option<DrainHandle>,
    /// The merged scrape (None: no metrics route).
    pub(super) scraper: Option<Scraper>,
    /// Told of each scrape, so a last one can end the linger.
    pub(super) linger: Option<Linger>,
    pub(super) probe_ok: Counter,
    pub(super) probe_unavailable: Counter,
    /// The app's probes (`/app-health/...`, `/app-lifecycle/...`).
    pub(super) app_probes: Option<AppProber>,
    /// Whether loopback TCP callers may drain and stop (`--loopback-control`).
    pub(super) loopback_control: bool,
    /// The control socket, named in the answer to a TCP caller refused.
    pub(super) control_socket: Option<PathBuf>,
    /// Who checks the pod's readiness: each probe's answer is recorded.
    pub(super) checkers: Checkers,
    /// The drain wait (`GET /drain/wait`).
    pub(super) rotation: Option<Rotation>,
}

/// `GET|HEAD /healthz/ready`: from the readiness snapshot, never waiting
/// on Envoy. The answer is recorded against its checker (a load balancer),
/// for the drain wait.
pub(super) fn probe(
    shared: &Shared,
    headers: HeaderMap,
    method: &Method,
    checker: Option<CheckerKey>,
) -> ResponseFuture {
    let answer = shared.readiness.answer();
    let status = if answer.ready {
        shared.probe_ok.increment(1);
        StatusCode::OK
    } else {
        shared.probe_unavailable.increment(1);
        StatusCode::SERVICE_UNAVAILABLE
    };
    if let Some(checker) = checker {
        shared.checkers.record(checker, Instant::now(), answer.ready);
    }
    finish(headers, method, (status, answer.body))
}

/// `GET|HEAD /stats/prometheus` (and `/metrics`): the merged scrape,
/// streamed; the linger is told once its last byte is out.
pub(super) fn scrape(
    shared: &Shared,
    mut headers: HeaderMap,
    method: &Method,
    scrape: Option<ScrapeRequest>,
) -> ResponseFuture {
    let (Some(scraper), Some(scrape)) = (&shared.scraper, scrape) else {
        return finish(headers, method, not_found());
    };
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(scrape.format.content_type()));
    headers.insert(VARY, VARY_VALUE.clone());
    if scrape.gzip {
        headers.insert(CONTENT_ENCODING, GZIP.clone());
    }
    let body = if method == Method::HEAD {
        Body::full(Bytes::new())
    } else {
        let ticket = shared.linger.as_ref().map(Linger::scrape_begins);
        Body::stream(Box::pin(ServedAtEnd {
            stream: Box::pin(scraper.body(scrape)),
            ticket,
        }))
    };
    let mut response = Response::new(body);
    *response.headers_mut() = headers;
    ResponseFuture::Ready(Some(response))
}

/// `GET|HEAD /drain`: the drain's status as JSON, with the drain wait's
/// (`rotation`).
pub(super) fn drain_status(shared: &Shared, mut headers: HeaderMap, method: &Method) -> ResponseFuture {
    let Some(drain) = &shared.drain else {
        return finish(headers, method, not_found());
    };
    #[derive(serde::Serialize)]
    struct View {
        #[serde(flatten)]
        drain: crate::drain::Status,
        rotation: Option<crate::rotation::RotationStatus>,
    }
    let view = View {
        drain: drain.status(),
        rotation: shared.rotation.as_ref().map(Rotation::status),
    };
    let mut body = serde_json::to_vec(&view).unwrap_or_default();
    body.push(b'\n');
    headers.insert(CONTENT_TYPE, APPLICATION_JSON.clone());
    finish(headers, method, (StatusCode::OK, Bytes::from(body)))
}

/// `GET|HEAD /drain/wait[?timeout=D]`: the app container's preStop hook.
/// Answers 200 with one line once the pod is out of rotation, or at its
/// bound (the timeout, the drain's deadline, Envoy stopping), saying which;
/// 400 for a timeout that is not a duration. Starts nothing; any caller.
pub(super) fn drain_wait(shared: &Shared, headers: HeaderMap, method: &Method, query: Option<&str>) -> ResponseFuture {
    let Some(rotation) = shared.rotation.clone() else {
        return finish(headers, method, not_found());
    };
    let timeout = match wait_timeout(query) {
        Ok(timeout) => timeout,
        Err(why) => {
            return finish(
                headers,
                method,
                (StatusCode::BAD_REQUEST, Bytes::from(format!("{why}\n"))),
            )
        }
    };
    let method = method.clone();
    ResponseFuture::Waiting(Box::pin(async move {
        let end = rotation.wait(timeout).await;
        respond(headers, &method, (StatusCode::OK, Bytes::from(end.line + "\n")))
    }))
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

/// `POST /drain[?nowait]` and `POST /quitquitquit`, for the callers that
/// `allowed` lets through (loopback, or the control socket): answered once
/// the drain has begun (`nowait`), is drained, or Envoy has stopped.
pub(super) fn control(
    shared: &Shared,
    allowed: Result<(), Bytes>,
    mut headers: HeaderMap,
    path: &str,
    query: Option<&str>,
) -> ResponseFuture {
    let Some(drain) = shared.drain.clone() else {
        return finish(headers, &Method::POST, not_found());
    };
    if let Err(forbidden) = allowed {
        return finish(headers, &Method::POST, (StatusCode::FORBIDDEN, forbidden));
    }
    let quit = path == "/quitquitquit";
    let nowait = query.is_some_and(|q| q.split('&').any(|p| p == "nowait"));
    ResponseFuture::Waiting(Box::pin(async move {
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
    }))
}

/// `GET|HEAD /app-health/<container>/<kind>` and `/app-lifecycle/...`:
/// the app's own probe, run now (see [`super::app_probe`]); `request` is
/// the kubelet's headers, passed on to the app.
pub(super) fn app_probe(shared: &Shared, request: HeaderMap, method: &Method, path: &str) -> ResponseFuture {
    let prober = match &shared.app_probes {
        Some(prober) if prober.knows(path) => prober.clone(),
        _ => {
            let why = format!("no app probe is configured for {path}\n");
            return finish(HeaderMap::new(), method, (StatusCode::NOT_FOUND, Bytes::from(why)));
        }
    };
    if method != Method::GET && method != Method::HEAD {
        return wrong_method(HeaderMap::new(), method, "GET, HEAD");
    }
    let (method, path) = (method.clone(), path.to_owned());
    ResponseFuture::Waiting(Box::pin(async move {
        let answer = prober.answer(&path, &request).await;
        respond(HeaderMap::new(), &method, answer)
    }))
}

/// A known path asked with another method: 405 and the methods it takes.
pub(super) fn wrong_method(mut headers: HeaderMap, method: &Method, allow: &'static str) -> ResponseFuture {
    headers.insert(ALLOW, HeaderValue::from_static(allow));
    finish(headers, method, method_not_allowed())
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

pub(super) fn finish(headers: HeaderMap, method: &Method, answer: (StatusCode, Bytes)) -> ResponseFuture {
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

pub(super) fn not_found() -> (StatusCode, Bytes) {
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
