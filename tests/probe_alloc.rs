//! The probe's hot path allocates nothing: `GET /healthz/ready` answered
//! by the status service, counted by a global allocator that counts every
//! allocation of this process, in every case the probe can meet: each
//! phase of the drain (`Phase`, all eight), for the kubelet's probe and a
//! load balancer's (recorded against its checker), Envoy ready or not, the
//! kubelet answered as Envoy is or not, and when it is, its window open,
//! open until a time to come, closed by the node's load balancers' time or
//! closed by the drain wait's verdict. A closed window stays closed, so
//! each case has a drain (and a service) of its own. Each case's figure is
//! printed; a probe that starts allocating fails here (the figure is also
//! printed by `cargo bench --bench probe`, with the timings).

use lifeguard_base::reason::Label;
use std::time::Duration;

use common::alloc::{per_call, ready_now};
use hyper::header::{HeaderValue, ACCEPT, HOST, USER_AGENT};
use hyper::{Request, Uri};
use lifeguard::checkers::Checkers;
use lifeguard::drain::{Audience, Drain, KubeletAnswer, NotServingBecause, Phase, PhaseCell, Plan};
use lifeguard::drain_wait::{DrainWait, DrainWaitPlan};
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

/// A probe's `User-Agent` for each audience: the kubelet's, a load
/// balancer's (a new audience does not compile here until it has one).
fn agent_of(audience: Audience) -> &'static str {
    let agent = match audience {
        Audience::Kubelet => "kube-probe/1.34",
        Audience::LoadBalancer => "ELB-HealthChecker/2.0",
    };
    assert_eq!(Audience::of_agent(Some(agent.as_bytes())), audience, "{agent}");
    agent
}

/// How the kubelet is answered in the drain.
#[derive(Debug, Clone, Copy)]
enum Kubelet {
    /// 503 with everyone (an operator's drain, `--terminating-readiness
    /// failing`).
    NotServing,
    /// As Envoy is, its window open.
    FollowsEnvoy,
    /// As Envoy is, its window open until a time to come (the drain set
    /// it: a clock read a probe).
    FollowsEnvoyUntilLater,
    /// Its window closed: the node's load balancers had their time.
    WindowClosedByTime,
    /// Its window closed: the drain wait's verdict came.
    WindowClosedByVerdict,
}

const KUBELET: [Kubelet; 5] = [
    Kubelet::NotServing,
    Kubelet::FollowsEnvoy,
    Kubelet::FollowsEnvoyUntilLater,
    Kubelet::WindowClosedByTime,
    Kubelet::WindowClosedByVerdict,
];

impl Kubelet {
    /// Publishes `phase` and this answer in `cell`.
    fn publish(self, cell: &PhaseCell, phase: Phase) {
        let answer = match self {
            Kubelet::NotServing => KubeletAnswer::NotServing,
            _ => KubeletAnswer::FollowsEnvoy,
        };
        cell.set(phase, Some(answer));
        let window = match self {
            Kubelet::NotServing | Kubelet::FollowsEnvoy => None,
            Kubelet::FollowsEnvoyUntilLater => {
                Some((Duration::from_secs(3600), NotServingBecause::NodeLoadBalancersTime))
            }
            Kubelet::WindowClosedByTime => Some((Duration::ZERO, NotServingBecause::NodeLoadBalancersTime)),
            Kubelet::WindowClosedByVerdict => Some((Duration::ZERO, NotServingBecause::OutOfRotation)),
        };
        if let Some((after, because)) = window {
            cell.kubelet_window_ends(Instant::now() + after, because);
        }
    }
}

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

/// A status service as the agent wires it (the drain's phase, the drain
/// wait's checkers, the probe's counters), over a drain of its own, Envoy
/// ready or not: the service, and the drain's phase cell.
fn service(metrics: &Metrics, envoy_ready: bool) -> (StatusService, PhaseCell) {
    let admin = AdminClient::new("http://127.0.0.1:1".parse().unwrap(), Duration::from_millis(100));
    let (_drain, handle) = Drain::new(Plan::for_status_tests(), Envoy::external(admin, vec![]), ());
    // Far from stale: the test runs longer than the default 4 s.
    let readiness = Readiness::new(Duration::from_secs(3600), handle.phase());
    readiness.store(match envoy_ready {
        true => Verdict::ready(Instant::now()),
        false => Verdict::not_ready("server.state is 3 (INITIALIZING), not 0 (LIVE)", Instant::now()),
    });
    let scraper = Scraper::builder(metrics.clone(), readiness.clone()).build();
    let wait = DrainWait::new(&DrainWaitPlan::for_tests(), Checkers::default()).0;
    let svc = StatusService::builder(readiness)
        .drain_wait(wait)
        .metrics(metrics, scraper)
        .service()
        .for_peer("127.0.0.1:40000".parse().unwrap());
    (svc, handle.phase())
}

#[test]
fn the_probe_allocates_nothing_in_any_phase_for_either_audience() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let metrics = Metrics::new(Instant::now());
    let (mut cases, mut failures) = (0, Vec::new());
    for phase in Phase::all() {
        for kubelet in KUBELET {
            for envoy_ready in [true, false] {
                let (mut svc, cell) = service(&metrics, envoy_ready);
                kubelet.publish(&cell, phase);
                for audience in Audience::all() {
                    let agent = agent_of(audience);
                    let (allocations, status) = per_probe(&mut svc, agent);
                    let case = format!("{phase:?}, kubelet {kubelet:?}, Envoy ready {envoy_ready}, {agent}");
                    eprintln!("{case}: {status}, {allocations} heap allocations a probe");
                    cases += 1;
                    if allocations != 0.0 {
                        failures.push(format!("{case}: {allocations}"));
                    }
                }
            }
        }
    }
    eprintln!("{cases} cases");
    assert_eq!(
        cases,
        Phase::all().count() * KUBELET.len() * 2 * Audience::all().count()
    );
    assert!(failures.is_empty(), "the probe allocated: {failures:#?}");
}
