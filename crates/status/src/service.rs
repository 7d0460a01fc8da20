//! The status port's service: one value per connection that knows its
//! caller (its peer, or the control socket) and shares the routes; a tower
//! `Service` that also serves hyper directly (no adapter, no allocation per
//! request). It routes and counts the request as served on its connection;
//! the route table is `super::routes`'s.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::body::Incoming;
use hyper::{Request, Response};

use super::connections::Activity;
pub use super::response::{Body, ResponseFuture};
use super::routes::{Caller, Routes};
pub use super::routes::{ControlAccess, RoutesBuilder};
use lifeguard_envoy::readiness::Readiness;

/// The routes of the status port, as a service. One value per connection:
/// it knows who calls; the routes are shared.
#[derive(Clone)]
pub struct StatusService {
    routes: Arc<Routes>,
    caller: Caller,
    /// The connection's activity, when its idle time is watched (the
    /// status server's connections): each request counts as served until
    /// its response's body is dropped.
    activity: Option<Activity>,
}

impl StatusService {
    /// The service's parts, starting with the readiness probe's; each part
    /// wired adds its routes ([`RoutesBuilder`]).
    pub fn builder(readiness: Readiness) -> RoutesBuilder {
        RoutesBuilder::new(readiness)
    }

    /// The same service, answering a connection from `peer`.
    pub fn for_peer(&self, peer: SocketAddr) -> Self {
        Self {
            caller: Caller {
                peer: Some(peer),
                control_socket: false,
            },
            activity: None,
            routes: self.routes.clone(),
        }
    }

    /// The same service, answering the status server's connection from
    /// `peer`, whose idle time `activity` watches.
    pub fn for_connection(&self, peer: SocketAddr, activity: Activity) -> Self {
        Self {
            activity: Some(activity),
            ..self.for_peer(peer)
        }
    }

    /// The same service, answering a connection of the control socket.
    pub fn for_control_socket(&self) -> Self {
        Self {
            caller: Caller {
                peer: None,
                control_socket: true,
            },
            activity: None,
            routes: self.routes.clone(),
        }
    }

    /// One request, served on its connection until its answer is out.
    fn tracked<B>(&self, req: Request<B>) -> ResponseFuture {
        let mut answer = self.routes.answer(&self.caller, req);
        if let Some(activity) = &self.activity {
            answer.track(activity.begin());
        }
        answer
    }
}

impl RoutesBuilder {
    /// The service of the routes wired.
    pub fn service(self) -> StatusService {
        StatusService {
            routes: Arc::new(self.build()),
            caller: Caller::default(),
            activity: None,
        }
    }
}

impl<B> tower::Service<Request<B>> for StatusService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        self.tracked(req)
    }
}

/// hyper calls services through `&self`; ours needs no `&mut`, so it serves
/// hyper directly, without an adapter that would allocate per request.
impl hyper::service::Service<Request<Incoming>> for StatusService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        self.tracked(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::Method;
    use hyper::StatusCode;
    use lifeguard_checkers::Checkers;
    use lifeguard_drain_wait::DrainWait;
    use lifeguard_envoy::admin::AdminClient;
    use lifeguard_envoy::readiness::Verdict;
    use std::time::Duration;
    use tokio::time::Instant;

    fn call(svc: &StatusService, method: Method, path: &str) -> (StatusCode, String) {
        send(svc, Request::builder().method(method).uri(path).body(()).unwrap())
    }

    /// Serves `req` on a runtime of its own: the answer's status and body.
    fn send(svc: &StatusService, req: Request<()>) -> (StatusCode, String) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            use http_body_util::BodyExt;
            let resp = svc.tracked(req).await.unwrap();
            let status = resp.status();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8(bytes.to_vec()).unwrap())
        })
    }

    fn wait_plan() -> lifeguard_drain_wait::DrainWaitPlan {
        lifeguard_drain_wait::DrainWaitPlan {
            min_quiet_period: Duration::from_secs(1),
            ..lifeguard_drain_wait::DrainWaitPlan::for_tests()
        }
    }

    /// The parts of a service with a drain behind it (not running), its
    /// readiness ready.
    fn with_drain() -> (
        RoutesBuilder,
        Readiness,
        lifeguard_drain::Drain<lifeguard_envoy::process::Envoy>,
    ) {
        use lifeguard_drain::{Drain, Plan};
        let plan = Plan::for_status_tests();
        let admin = AdminClient::new("http://127.0.0.1:1".parse().unwrap(), Duration::from_millis(100));
        let (drain, handle) = Drain::new(plan, lifeguard_envoy::process::Envoy::external(admin, vec![]), ());
        let r = Readiness::new(Duration::from_secs(4), handle.phase());
        r.store(Verdict::ready(Instant::now()));
        (
            StatusService::builder(r.clone()).drain(handle, ControlAccess::loopback()),
            r,
            drain,
        )
    }

    #[test]
    fn drain_and_quit_from_another_host_are_forbidden_and_change_nothing() {
        let (svc, r, _drain) = with_drain();
        let svc = svc.service();
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
        let svc = svc.service();
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
        let (builder, r, _drain) = with_drain();
        let unwired = StatusService::builder(r).service();
        assert_eq!(
            call(&unwired, Method::GET, "/drain/wait").0,
            StatusCode::NOT_FOUND,
            "no drain wait wired, no route"
        );
        let (wait, _publish) = DrainWait::new(&wait_plan(), Checkers::default());
        let svc = builder.drain_wait(wait).service();
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
        assert_eq!(json["drain_wait"]["state"], "not_started");
        assert_eq!(json["drain_wait"]["unhealthy_threshold"], 3);
    }

    #[test]
    fn a_load_balancers_probe_is_recorded_and_the_kubelets_is_not() {
        let r = Readiness::standalone(Duration::from_secs(4));
        r.store(Verdict::ready(Instant::now()));
        let checkers = Checkers::default();
        // As the drain wait learned: Envoy's status listener appends the
        // prober's address.
        checkers.trust_forwarded(true);
        let svc = StatusService::builder(r)
            .drain_wait(DrainWait::new(&wait_plan(), checkers.clone()).0)
            .service()
            .for_peer("127.0.0.1:40000".parse().unwrap());
        let probe = |headers: &[(&'static str, &'static str)]| {
            let mut req = Request::builder().uri("/healthz/ready");
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            send(&svc, req.body(()).unwrap()).0
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

    /// While the pod terminates, the same probe is answered by its
    /// `User-Agent`: the kubelet as Envoy is, load balancers 503, through
    /// Envoy (a forwarded prober) or not; an operator's drain, 503 to both.
    #[test]
    fn while_the_pod_terminates_the_kubelet_and_the_load_balancers_get_their_own_answers() {
        use lifeguard_drain::{Drain, KubeletAnswer, Phase, Plan};
        let admin = AdminClient::new("http://127.0.0.1:1".parse().unwrap(), Duration::from_millis(100));
        let envoy = lifeguard_envoy::process::Envoy::external(admin, vec![]);
        let (_drain, handle) = Drain::new(Plan::for_status_tests(), envoy, ());
        let phase = handle.phase();
        let r = Readiness::new(Duration::from_secs(4), handle.phase());
        r.store(Verdict::ready(Instant::now()));
        let checkers = Checkers::default();
        checkers.trust_forwarded(true);
        let svc = StatusService::builder(r)
            .drain(handle.clone(), ControlAccess::loopback())
            .drain_wait(DrainWait::new(&wait_plan(), checkers.clone()).0)
            .service()
            .for_peer("127.0.0.1:40000".parse().unwrap());
        let probe = |agent: &'static str| {
            let req = Request::builder()
                .uri("/healthz/ready")
                .header("user-agent", agent)
                .header("x-forwarded-for", "10.0.0.9")
                .body(())
                .unwrap();
            send(&svc, req)
        };
        phase.set(Phase::Draining, Some(KubeletAnswer::FollowsEnvoy));
        let (status, body) = probe("kube-probe/1.34");
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body.starts_with("ready: the pod terminates"), "{body}");
        for agent in ["ELB-HealthChecker/2.0", "Envoy/HC", "GoogleHC/1.0"] {
            let (status, body) = probe(agent);
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{agent}");
            assert!(body.starts_with("not ready: draining (the pod terminates"), "{body}");
        }
        let seen = checkers.snapshot();
        assert_eq!(seen.len(), 3, "each load balancer recorded, the kubelet not: {seen:?}");
        let mut status = handle.status();
        assert_eq!(status.kubelet, None, "no drain was published");
        status.kubelet = Some(lifeguard_drain::Kubelet {
            answer: KubeletAnswer::FollowsEnvoy,
            serving_window_seconds: Some(31.0),
            not_serving_after_seconds: None,
            not_serving_because: None,
            ready_probes: 0,
            not_ready_probes: 0,
            last_ready_after_seconds: None,
        });
        phase.fill_kubelet(&mut status);
        assert_eq!(status.kubelet.map(|k| k.ready_probes), Some(1));
        phase.set(Phase::Stopping, Some(KubeletAnswer::FollowsEnvoy));
        assert_eq!(probe("kube-probe/1.34").0, StatusCode::SERVICE_UNAVAILABLE);
        phase.set(Phase::Draining, Some(KubeletAnswer::NotServing));
        assert_eq!(
            probe("kube-probe/1.34"),
            (StatusCode::SERVICE_UNAVAILABLE, "not ready: draining\n".into())
        );
    }

    #[test]
    fn routes_and_methods() {
        let r = Readiness::standalone(Duration::from_secs(4));
        let svc = StatusService::builder(r.clone()).service();
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
        assert_eq!(call(&svc, Method::GET, "/nope").0, StatusCode::NOT_FOUND);
        // A part not wired has no route.
        for path in ["/drain", "/drain/wait", "/stats/prometheus", "/app-health/x/readyz"] {
            assert_eq!(call(&svc, Method::GET, path).0, StatusCode::NOT_FOUND, "{path}");
        }
    }

    /// Each app probe's route runs its own probe; a path under the app's
    /// prefixes that no probe is configured for is 404, saying so.
    #[test]
    fn each_app_probe_route_runs_its_own_probe() {
        let open = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let up = open.local_addr().unwrap().port();
        let down = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let json = format!(
            r#"{{"/app-health/up/livez":{{"tcpSocket":{{"port":{up}}}}},
                "/app-lifecycle/down/prestopz":{{"tcpSocket":{{"port":{down}}}}}}}"#
        );
        let probes = lifeguard_istio::probers::AppProbes::parse(&json).unwrap();
        let prober = crate::app_probe::AppProber::new(&probes, [127, 0, 0, 1].into(), 15020, None).unwrap();
        let svc = StatusService::builder(Readiness::standalone(Duration::from_secs(4)))
            .app_probes(prober)
            .service();
        assert_eq!(
            call(&svc, Method::GET, "/app-health/up/livez"),
            (StatusCode::OK, String::new())
        );
        let (code, body) = call(&svc, Method::GET, "/app-lifecycle/down/prestopz");
        assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(body.starts_with("app probe failed: "), "{body}");
        for path in ["/app-health/down/livez", "/app-lifecycle/up/prestopz"] {
            let body = format!("no app probe is configured for {path}\n");
            assert_eq!(call(&svc, Method::GET, path), (StatusCode::NOT_FOUND, body));
        }
        assert_eq!(
            call(&svc, Method::POST, "/app-health/up/livez").0,
            StatusCode::METHOD_NOT_ALLOWED
        );
    }

    /// Every known path with another method: 405, with `Allow` from the
    /// same table that routes it.
    #[test]
    fn a_known_path_with_another_method_is_405_with_its_methods() {
        let (builder, r, _drain) = with_drain();
        let metrics = lifeguard_metrics::Metrics::new(Instant::now());
        let scraper = lifeguard_scrape::Scraper::builder(metrics.clone(), r).build();
        let (wait, _publish) = DrainWait::new(&wait_plan(), Checkers::default());
        let svc = builder.metrics(&metrics, scraper).drain_wait(wait).service();
        for (method, path, allow) in [
            (Method::POST, "/healthz/ready", "GET, HEAD"),
            (Method::DELETE, "/drain/wait", "GET, HEAD"),
            (Method::DELETE, "/stats/prometheus", "GET, HEAD"),
            (Method::PUT, "/metrics", "GET, HEAD"),
            (Method::GET, "/quitquitquit", "POST"),
            (Method::PUT, "/drain", "GET, HEAD, POST"),
        ] {
            let req = Request::builder().method(method).uri(path).body(()).unwrap();
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let resp = rt.block_on(svc.tracked(req)).unwrap();
            assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED, "{path}");
            assert_eq!(resp.headers()["allow"], allow, "{path}");
        }
    }

    #[test]
    fn a_request_counts_as_served_until_its_answers_body_is_dropped() {
        use std::future::Future;
        use std::pin::Pin;
        use std::task::Waker;
        let (svc, _r, _drain) = with_drain();
        let activity = Activity::new();
        let conn = svc
            .service()
            .for_connection("127.0.0.1:40000".parse().unwrap(), activity.clone());
        let req = |method: Method, path: &str| Request::builder().method(method).uri(path).body(()).unwrap();
        // A ready answer: served from the call until its body is dropped
        // (hyper drops it once the last byte is written).
        let mut ready = conn.tracked(req(Method::GET, "/healthz/ready"));
        assert_eq!(activity.serving(), 1);
        let Poll::Ready(Ok(response)) = Pin::new(&mut ready).poll(&mut Context::from_waker(Waker::noop())) else {
            panic!("the probe answers at once");
        };
        drop(ready);
        assert_eq!(activity.serving(), 1, "its body is still to be written");
        drop(response);
        assert_eq!(activity.serving(), 0);
        // A waiting answer (POST /drain; the drain is not running, so it
        // never answers): served while it waits, done once dropped.
        let waiting = conn.tracked(req(Method::POST, "/drain"));
        assert!(matches!(waiting, ResponseFuture::Waiting(..)));
        assert_eq!(activity.serving(), 1);
        drop(waiting);
        assert_eq!(activity.serving(), 0);
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
            let caller = Caller {
                peer: Some(addr.parse().unwrap()),
                control_socket: false,
            };
            assert_eq!(caller.is_loopback(), want, "{addr}");
        }
    }
}
