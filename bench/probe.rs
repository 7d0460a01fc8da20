//! The probe hot path in-process: `GET /healthz/ready` through the tower
//! service (ready and not ready, probe counters registered as in
//! production), and through hyper's HTTP/1 server over an in-memory pipe
//! (keep-alive, as the status server serves a connection: its IO wrapper
//! watching writes and idle time), so a regression in either shows
//! without a network.
//!
//! Run: `cargo bench --bench probe`. Prints the heap allocations per probe
//! (counted by a wrapping global allocator) before the timings.

use std::time::Duration;
use tokio::time::Instant;

use bytes::Bytes;
use common::alloc::{per_call, ready_now};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use http_body_util::{BodyExt, Empty};
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;
use lifeguard::envoy::readiness::{Readiness, Verdict};
use lifeguard::metrics::Metrics;
use lifeguard::scrape::Scraper;
use lifeguard::status::connections::{Activity, TimedIo};
use lifeguard::status::server::{HEADER_READ_TIMEOUT, RESPONSE_WRITE_TIMEOUT};
use lifeguard::status::service::StatusService;
use tower::Service;

#[global_allocator]
static GLOBAL: common::alloc::Counting = common::alloc::Counting;

/// A probe as the kubelet sends it (through Envoy, which adds a few
/// headers): hyper parses these into the request's header map, which the
/// handler then reuses for the response.
fn probe() -> Request<()> {
    use hyper::header::{HeaderValue, ACCEPT, CONNECTION, HOST, USER_AGENT};
    let mut req = Request::new(());
    *req.uri_mut() = Uri::from_static("/healthz/ready");
    let h = req.headers_mut();
    h.insert(HOST, HeaderValue::from_static("10.0.0.7:15021"));
    h.insert(USER_AGENT, HeaderValue::from_static("kube-probe/1.31"));
    h.insert(ACCEPT, HeaderValue::from_static("*/*"));
    h.insert(CONNECTION, HeaderValue::from_static("close"));
    req
}

/// A load balancer's health check through Envoy's status listener: from
/// loopback, its address in `x-forwarded-for`. Recorded against its
/// checker for the drain wait (the kubelet's is not).
fn lb_probe() -> Request<()> {
    use hyper::header::{HeaderValue, HOST};
    let mut req = Request::new(());
    *req.uri_mut() = Uri::from_static("/healthz/ready");
    let h = req.headers_mut();
    h.insert(HOST, HeaderValue::from_static("pod"));
    h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.9"));
    h.insert("x-envoy-expected-rq-timeout-ms", HeaderValue::from_static("3000"));
    req
}

/// Builds one probe's request.
type MakeProbe = fn() -> Request<()>;

fn service(ready: bool) -> StatusService {
    // Stale bound far away: the bench runs longer than the default 4s.
    let readiness = Readiness::standalone(Duration::from_secs(3600));
    if ready {
        readiness.store(Verdict::ready(Instant::now()));
    } else {
        readiness.store(Verdict::not_ready(
            "server.state is 3 (INITIALIZING), not 0 (LIVE)",
            Instant::now(),
        ));
    }
    let metrics = Metrics::new(Instant::now());
    let scraper = Scraper::builder(metrics.clone(), readiness.clone()).build();
    StatusService::builder(readiness).metrics(&metrics, scraper).service()
}

fn in_process(c: &mut Criterion) {
    let envoy = "127.0.0.1:40000".parse().unwrap();
    let cases: [(&str, bool, MakeProbe); 3] = [
        ("probe_service_ready", true, probe),
        ("probe_service_not_ready", false, probe),
        ("probe_service_ready_lb_checker", true, lb_probe),
    ];
    for (name, ready, make) in cases {
        let mut svc = service(ready).for_peer(envoy);
        // The first probe of a checker makes its entry; count the rest.
        ready_now(svc.call(make())).unwrap();
        eprintln!(
            "{name}: {:.2} heap allocations per probe",
            per_call(10_000, make, |req| ready_now(svc.call(req)).unwrap())
        );
        c.bench_function(name, |b| {
            b.iter_batched(make, |req| ready_now(svc.call(req)).unwrap(), BatchSize::SmallInput)
        });
    }
}

fn over_hyper(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (mut sender, allocs) = rt.block_on(async {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        // As the status server serves a connection: its activity watched
        // by the service and the IO wrapper.
        let activity = Activity::new();
        let svc = service(true).for_connection("127.0.0.1:40000".parse().unwrap(), activity.clone());
        let io = TimedIo::new(server_io, RESPONSE_WRITE_TIMEOUT).watching(activity, HEADER_READ_TIMEOUT);
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .half_close(true)
                .keep_alive(true)
                .serve_connection(TokioIo::new(io), svc)
                .await;
        });
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client_io))
            .await
            .unwrap();
        tokio::spawn(conn);
        // Warm up, then count allocations for a keep-alive round trip
        // (client and server together).
        for _ in 0..100 {
            round_trip(&mut sender).await;
        }
        let before = common::alloc::allocations();
        for _ in 0..1000 {
            round_trip(&mut sender).await;
        }
        let allocs = (common::alloc::allocations() - before) as f64 / 1000.0;
        (sender, allocs)
    });
    eprintln!("probe_hyper_duplex_keepalive: {allocs:.2} heap allocations per round trip (client + server)");
    c.bench_function("probe_hyper_duplex_keepalive", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    round_trip(&mut sender).await;
                }
                start.elapsed()
            })
        })
    });
}

async fn round_trip(sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>) {
    let req = Request::builder()
        .uri("/healthz/ready")
        .header("host", "lifeguard")
        .body(Empty::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    std::hint::black_box(resp.into_body().collect().await.unwrap());
}

criterion_group!(benches, in_process, over_hyper);
criterion_main!(benches);
