//! The probe's hot path allocates nothing: `GET /healthz/ready` answered
//! by the status service, counted by a global allocator that counts every
//! allocation of this process, for the kubelet's probe and a load
//! balancer's (recorded against its checker), Envoy ready or not, outside
//! a drain, while the pod terminates (the kubelet answered as Envoy is,
//! its answers recorded; then its window over) and in an operator's
//! drain. A probe that starts
//! allocating fails here (the figure is also printed by
//! `cargo bench --bench probe`, with the timings).

use std::time::Duration;

use common::alloc::{per_call, ready_now};
use hyper::header::{HeaderValue, ACCEPT, HOST, USER_AGENT};
use hyper::{Request, Uri};
use lifeguard::drain::{Drain, KubeletAnswer, NotServingBecause, Phase, PhaseCell, Plan};
use lifeguard::drain_wait::{Checkers, DrainWait, DrainWaitPlan};
use lifeguard::envoy::admin::AdminClient;
use lifeguard::envoy::process::Envoy;
use lifeguard::envoy::readiness::{Readiness, Verdict};
use lifeguard::metrics::Metrics;
use lifeguard::scrape::Scraper;
use lifeguard::status::service::StatusService;
use tokio::time::Instant;
use tower::Service;

#[global_allocator]
static GLOBAL: common::alloc::Counting = common::alloc::Counting;

/// A probe with this `User-Agent` (and, through Envoy, the prober's
/// address appended), as hyper hands it to the service.
fn probe(agent: &'static str) -> Request<()> {
    let mut req = Request::new(());
    *req.uri_mut() = Uri::from_static("/healthz/ready");
    let h = req.headers_mut();
    h.insert(HOST, HeaderValue::from_static("10.0.0.7:15021"));
    h.insert(USER_AGENT, HeaderValue::from_static(agent));
    h.insert(ACCEPT, HeaderValue::from_static("*/*"));
    h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.9"));
    req
}

/// Heap allocations of the handler alone, a probe: requests built
/// before, responses dropped after the count.
fn per_probe(svc: &mut StatusService, agent: &'static str) -> (f64, u16) {
    // The first probe of a checker makes its entry: not counted.
    let status = ready_now(svc.call(probe(agent))).unwrap().status().as_u16();
    let allocations = per_call(2_000, || probe(agent), |req| ready_now(svc.call(req)).unwrap());
    (allocations, status)
}

#[test]
fn the_probe_allocates_nothing_for_the_kubelet_or_a_load_balancer_in_any_phase() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let admin = AdminClient::new("http://127.0.0.1:1".parse().unwrap(), Duration::from_millis(100));
    let (_drain, handle) = Drain::new(Plan::for_status_tests(), Envoy::external(admin, vec![]), ());
    let cell: PhaseCell = handle.phase();
    // Far from stale: the test runs longer than the default 4 s.
    let readiness = Readiness::new(Duration::from_secs(3600), handle.phase());
    let metrics = Metrics::new(Instant::now());
    let scraper = Scraper::builder(metrics.clone(), readiness.clone()).build();
    let checkers = Checkers::default();
    let wait = DrainWait::new(&DrainWaitPlan::for_tests(), checkers).0;
    let mut svc = StatusService::builder(readiness.clone())
        .drain_wait(wait)
        .metrics(&metrics, scraper)
        .service()
        .for_peer("127.0.0.1:40000".parse().unwrap());
    // The kubelet's window closes for good: its case comes last.
    let phases = [
        ("serving", Phase::Serving, None, false),
        ("terminating", Phase::Draining, Some(KubeletAnswer::FollowsEnvoy), false),
        (
            "terminating, Envoy stopping",
            Phase::Stopping,
            Some(KubeletAnswer::FollowsEnvoy),
            false,
        ),
        (
            "an operator's drain",
            Phase::Draining,
            Some(KubeletAnswer::NotServing),
            false,
        ),
        (
            "terminating, the kubelet's window over",
            Phase::Draining,
            Some(KubeletAnswer::FollowsEnvoy),
            true,
        ),
    ];
    let mut failures = Vec::new();
    for (name, phase, kubelet, window_over) in phases {
        cell.set(phase, kubelet);
        if window_over {
            cell.kubelet_window_ends(Instant::now(), NotServingBecause::NodeLoadBalancersTime);
        }
        for ready in [true, false] {
            readiness.store(match ready {
                true => Verdict::ready(Instant::now()),
                false => Verdict::not_ready("server.state is 3 (INITIALIZING), not 0 (LIVE)", Instant::now()),
            });
            for agent in ["kube-probe/1.34", "ELB-HealthChecker/2.0"] {
                let (allocations, status) = per_probe(&mut svc, agent);
                eprintln!("{agent}, ready {ready}, {name}: {status}, {allocations} heap allocations a probe");
                if allocations != 0.0 {
                    failures.push(format!("{agent}, ready {ready}, {name}: {allocations}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "the probe allocated: {failures:#?}");
}
