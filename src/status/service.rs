//! The status port's service: one value per connection that knows its
//! peer (for the loopback guard) and shares the rest; a tower `Service`
//! that also serves hyper directly (no adapter, no allocation per request).
//! It only routes: each route is a function in [`super::routes`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use metrics::Counter;

use super::app_probe::AppProber;
pub use super::response::{Body, ResponseFuture};
use super::routes::{self, Shared};
use crate::drain::DrainHandle;
use crate::envoy::readiness::Readiness;
use crate::exit::linger::Linger;
use crate::metrics::scrape::{ScrapeRequest, Scraper};
use crate::metrics::Metrics;
use crate::rotation::checkers::CheckerKey;
use crate::rotation::{Checkers, Rotation};

/// The routes of the status port, as a service. One value per connection:
/// it knows the peer (for the loopback guard) or that it came through the
/// control socket; the rest is shared.
#[derive(Clone)]
pub struct StatusService {
    shared: Arc<Shared>,
    peer: Option<SocketAddr>,
    /// The connection came through the control socket, whose file mode and
    /// mount decide who may connect.
    control_socket: bool,
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
                app_probes: None,
                loopback_control: true,
                control_socket: None,
                checkers: Checkers::default(),
                rotation: None,
            }),
            peer: None,
            control_socket: false,
        }
    }

    /// Who may drain and stop: loopback TCP callers when `loopback` (as
    /// Istio), and always whoever may connect to the control `socket`.
    pub(crate) fn with_control(mut self, loopback: bool, socket: Option<PathBuf>) -> Self {
        let shared = Arc::make_mut(&mut self.shared);
        (shared.loopback_control, shared.control_socket) = (loopback, socket);
        self
    }

    /// The same service, answering a connection of the control socket.
    pub(crate) fn for_control_socket(&self) -> Self {
        Self {
            peer: None,
            control_socket: true,
            ..self.clone()
        }
    }

    /// Whether this connection may drain or stop; the 403 body when not.
    fn may_control(&self) -> Result<(), Bytes> {
        if self.control_socket {
            return Ok(());
        }
        if !self.shared.loopback_control {
            let socket = self.shared.control_socket.as_deref();
            let on = socket.map_or("nowhere on TCP".into(), |p| {
                format!("on the control socket {}", p.display())
            });
            return Err(Bytes::from(format!("forbidden: drain and stop are served {on} only\n")));
        }
        match self.peer_is_loopback() {
            true => Ok(()),
            false => Err(Bytes::from_static(b"forbidden: only loopback callers may do this\n")),
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

    /// Serves the app's probes through `prober`.
    pub fn with_app_probes(mut self, prober: AppProber) -> Self {
        Arc::make_mut(&mut self.shared).app_probes = Some(prober);
        self
    }

    /// Reports each scrape to `linger`.
    pub(crate) fn with_linger(mut self, linger: Linger) -> Self {
        Arc::make_mut(&mut self.shared).linger = Some(linger);
        self
    }

    /// Records each probe's checker in `checkers` and serves the drain
    /// wait through `rotation`.
    pub(crate) fn with_rotation(mut self, rotation: Rotation) -> Self {
        let shared = Arc::make_mut(&mut self.shared);
        shared.checkers = rotation.checkers().clone();
        shared.rotation = Some(rotation);
        self
    }

    /// Serves the drain routes through `drain`.
    pub(crate) fn with_drain(mut self, drain: DrainHandle) -> Self {
        Arc::make_mut(&mut self.shared).drain = Some(drain);
        self
    }

    /// The same service, answering a connection from `peer`.
    pub fn for_peer(&self, peer: SocketAddr) -> Self {
        Self {
            peer: Some(peer),
            control_socket: false,
            ..self.clone()
        }
    }

    /// Whether the caller is on this host (127.0.0.0/8 or ::1, also as an
    /// IPv4-mapped IPv6 address). Unknown peers are not trusted.
    pub(crate) fn peer_is_loopback(&self) -> bool {
        self.peer.is_some_and(|p| is_loopback(&p))
    }

    /// Routes one request. Every route answers from memory but the two
    /// control routes, which wait on the drain, and the merged scrape,
    /// which streams.
    fn handle<B>(&self, mut req: Request<B>) -> ResponseFuture {
        let shared = &*self.shared;
        // Reuse the request's header map for the response: no allocation.
        let mut headers = std::mem::take(req.headers_mut());
        let (method, uri) = (req.method(), req.uri());
        let path = uri.path();
        if path.starts_with("/app-health/") || path.starts_with("/app-lifecycle/") {
            return routes::app_probe(shared, headers, method, path);
        }
        let scrape =
            (path == "/stats/prometheus" || path == "/metrics").then(|| ScrapeRequest::new(uri.query(), &headers));
        let checker = match path {
            "/healthz/ready" => CheckerKey::of(self.peer, &headers),
            _ => None,
        };
        headers.clear();
        match (path, method) {
            ("/healthz/ready", &Method::GET | &Method::HEAD) => routes::probe(shared, headers, method, checker),
            ("/stats/prometheus" | "/metrics", &Method::GET | &Method::HEAD) => {
                routes::scrape(shared, headers, method, scrape)
            }
            ("/drain", &Method::GET | &Method::HEAD) => routes::drain_status(shared, headers, method),
            ("/drain/wait", &Method::GET | &Method::HEAD) => routes::drain_wait(shared, headers, method, uri.query()),
            ("/drain" | "/quitquitquit", &Method::POST) => {
                routes::control(shared, self.may_control(), headers, path, uri.query())
            }
            ("/healthz/ready", _) => routes::wrong_method(headers, method, "GET, HEAD"),
            ("/drain", _) => routes::wrong_method(headers, method, "GET, HEAD, POST"),
            ("/quitquitquit", _) => routes::wrong_method(headers, method, "POST"),
            ("/drain/wait", _) => routes::wrong_method(headers, method, "GET, HEAD"),
            ("/stats/prometheus" | "/metrics", _) => routes::wrong_method(headers, method, "GET, HEAD"),
            _ => routes::finish(headers, method, routes::not_found()),
        }
    }
}

/// Whether an address is on this host.
pub(crate) fn is_loopback(addr: &SocketAddr) -> bool {
    crate::url::is_loopback(addr.ip())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::admin::AdminClient;
    use crate::envoy::readiness::Verdict;
    use hyper::StatusCode;
    use std::time::Duration;
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

    fn rotation_plan() -> crate::rotation::RotationPlan {
        crate::rotation::RotationPlan {
            lb_unhealthy_threshold: 3,
            lb_quiet_period: Duration::from_secs(1),
            checker_timeout: Duration::from_secs(20),
            drain_deadline: Duration::from_secs(28),
            app_time: Duration::from_secs(5),
        }
    }

    /// A service with a drain behind it (not running), its readiness ready.
    fn with_drain() -> (
        StatusService,
        Readiness,
        crate::drain::Drain<crate::envoy::process::Envoy>,
    ) {
        use crate::drain::{Drain, Plan};
        let plan = Plan::for_status_tests();
        let admin = AdminClient::new("http://127.0.0.1:1".parse().unwrap(), Duration::from_millis(100));
        let (drain, handle) = Drain::new(plan, crate::envoy::process::Envoy::external(admin, vec![]), ());
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
    fn the_drain_wait_checks_its_timeout_and_get_drain_shows_it() {
        let (svc, _r, _drain) = with_drain();
        assert_eq!(
            call(&svc, Method::GET, "/drain/wait").0,
            StatusCode::NOT_FOUND,
            "no rotation, no route"
        );
        let (rotation, _publish) = Rotation::new(&rotation_plan(), Checkers::default());
        let svc = svc.with_rotation(rotation);
        let (status, body) = call(&svc, Method::GET, "/drain/wait?timeout=soon");
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(body.starts_with("invalid timeout \"soon\""), "{body}");
        assert_eq!(
            call(&svc, Method::POST, "/drain/wait").0,
            StatusCode::METHOD_NOT_ALLOWED
        );
        // No drain: the wait ends at its timeout, saying so.
        let (status, body) = call(&svc, Method::GET, "/drain/wait?timeout=10ms");
        assert_eq!(status, StatusCode::OK);
        assert!(
            body.starts_with(
                "NOT out of rotation, stopped waiting at the 10ms timeout: was waiting for the drain to begin"
            ),
            "{body}"
        );
        let (_, body) = call(&svc, Method::GET, "/drain");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["phase"], "serving");
        assert_eq!(json["rotation"]["state"], "not_started");
        assert_eq!(json["rotation"]["lb_unhealthy_threshold"], 3);
    }

    #[test]
    fn a_load_balancers_probe_is_recorded_and_the_kubelets_is_not() {
        let r = Readiness::standalone(Duration::from_secs(4));
        r.store(Verdict::ready(Instant::now()));
        let checkers = Checkers::default();
        let svc = StatusService::new(r)
            .with_rotation(Rotation::new(&rotation_plan(), checkers.clone()).0)
            .for_peer("127.0.0.1:40000".parse().unwrap());
        let probe = |headers: &[(&'static str, &'static str)]| {
            let mut req = Request::builder().uri("/healthz/ready");
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async { svc.handle(req.body(()).unwrap()).await.unwrap().status() })
        };
        assert_eq!(
            probe(&[("user-agent", "kube-probe/1.31"), ("x-forwarded-for", "10.0.0.1")]),
            StatusCode::OK
        );
        assert!(checkers.snapshot().is_empty(), "the kubelet is no checker");
        probe(&[("x-forwarded-for", "10.0.0.9")]);
        probe(&[("x-forwarded-for", "10.0.0.9")]);
        let seen = checkers.snapshot();
        assert_eq!(seen.len(), 1);
        assert_eq!(
            (seen[0].key.to_string(), seen[0].probes, seen[0].failures_in_row),
            ("10.0.0.9".into(), 2, 0)
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
        // Every known path with another method: 405.
        for path in [
            "/healthz/ready",
            "/drain/wait",
            "/stats/prometheus",
            "/metrics",
            "/quitquitquit",
        ] {
            let method = if path == "/quitquitquit" {
                Method::GET
            } else {
                Method::DELETE
            };
            assert_eq!(call(&svc, method, path).0, StatusCode::METHOD_NOT_ALLOWED, "{path}");
        }
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
