//! The status port's routing (status/service.rs, routes.rs): any method,
//! path, query and headers, from any peer or the control socket, against
//! the service the agent serves (readiness and its checkers, the drain
//! routes, the drain wait, the merged scrape with lifeguard's part, one app
//! probe), driven in-process.
//!
//! Input: a flags byte (loopback control, a control socket, the caller,
//! ready or not), then NUL-separated: the method, the request target, the
//! headers (`name: value` a line).
//! Holds: each known path answers its methods and 405 (with `Allow`) for
//! others, anything else 404 whatever the method (an app probe's path
//! that no probe is configured for too); the probe says 200 exactly when ready; the
//! drain wait refuses a timeout that is no Go duration with 400; only
//! a loopback caller (with loopback control) or the control socket may
//! drain or stop, others get 403; HEAD has no body; every answer has a
//! Content-Type and no header of the request's; every answer comes at once
//! (the drain has ended, the app probe's app refuses).

use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;
use std::time::Duration;

use super::{fields, header_map, runtime};
use http_body_util::BodyExt;
use hyper::header::{ALLOW, CONTENT_ENCODING, CONTENT_TYPE, VARY};
use hyper::{Method, Request, StatusCode, Uri};
use lifeguard::fuzzing::{go_duration, status_service, AppProbes, Readiness, StatusOptions, StatusService, Verdict};

const PROBE: &str = "/app-health/app/readyz";

/// The four services (loopback control or not, a control socket or not).
fn services() -> &'static [(StatusService, Readiness); 4] {
    static SERVICES: OnceLock<[(StatusService, Readiness); 4]> = OnceLock::new();
    SERVICES.get_or_init(|| {
        let json = format!(r#"{{"{PROBE}":{{"tcpSocket":{{"port":1}}}}}}"#);
        let probes = AppProbes::parse(&json).expect("one TCP probe");
        runtime().block_on(async {
            std::array::from_fn(|i| {
                let opts = StatusOptions {
                    loopback_control: i & 1 == 1,
                    control_socket: (i & 2 == 2).then(|| "/run/lifeguard/control.sock".into()),
                    drain: true,
                    drain_wait: true,
                    scrape: Some(None),
                    app_metrics: Default::default(),
                    app_probes: Some((probes.clone(), IpAddr::from([127, 0, 0, 1]))),
                };
                status_service(&opts)
            })
        })
    })
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
    }
}

/// The status and `Allow` the route promises, and whether a body is a
/// 503 `lifeguard is stopping` (an allowed drain or stop).
fn expected(method: &Method, uri: &Uri, ready: bool, may_control: bool) -> (StatusCode, Option<&'static str>) {
    let read = method == Method::GET || method == Method::HEAD;
    // The drain wait's `timeout`: the first one, a Go duration.
    let timeout = uri
        .query()
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|p| p.strip_prefix("timeout="));
    match uri.path() {
        "/drain/wait" if read && timeout.is_some_and(|t| go_duration(t).is_err()) => (StatusCode::BAD_REQUEST, None),
        "/drain/wait" if read => (StatusCode::OK, None),
        "/drain/wait" => (StatusCode::METHOD_NOT_ALLOWED, Some("GET, HEAD")),
        "/drain/stopped" if read && timeout.is_some_and(|t| go_duration(t).is_err()) => (StatusCode::BAD_REQUEST, None),
        "/drain/stopped" if read => (StatusCode::OK, None),
        "/drain/stopped" => (StatusCode::METHOD_NOT_ALLOWED, Some("GET, HEAD")),
        "/healthz/ready" if read => (
            if ready {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            },
            None,
        ),
        "/healthz/ready" => (StatusCode::METHOD_NOT_ALLOWED, Some("GET, HEAD")),
        "/stats/prometheus" | "/metrics" if read => (StatusCode::OK, None),
        "/stats/prometheus" | "/metrics" => (StatusCode::METHOD_NOT_ALLOWED, Some("GET, HEAD")),
        "/drain" if read => (StatusCode::OK, None),
        "/drain" | "/quitquitquit" if method == Method::POST => match may_control {
            true => (StatusCode::SERVICE_UNAVAILABLE, None),
            false => (StatusCode::FORBIDDEN, None),
        },
        "/drain" => (StatusCode::METHOD_NOT_ALLOWED, Some("GET, HEAD, POST")),
        "/quitquitquit" => (StatusCode::METHOD_NOT_ALLOWED, Some("POST")),
        PROBE if read => (StatusCode::INTERNAL_SERVER_ERROR, None),
        PROBE => (StatusCode::METHOD_NOT_ALLOWED, Some("GET, HEAD")),
        _ => (StatusCode::NOT_FOUND, None),
    }
}

/// One input, as the fuzz target runs it: panics when a promise above is broken.
pub fn run(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let f = fields(rest, 3);
    let (Ok(method), Ok(uri)) = (Method::from_bytes(f[0]), Uri::try_from(f[1])) else {
        return;
    };
    let headers = header_map(f[2]);
    let (svc, readiness) = &services()[usize::from(flags & 3)];
    let loopback_control = flags & 1 == 1;
    let peer: SocketAddr = match flags >> 2 & 3 {
        0 => "127.0.0.1:40000".parse().unwrap(),
        1 => "[::ffff:127.0.0.9]:40000".parse().unwrap(),
        2 => "10.1.2.3:40000".parse().unwrap(),
        _ => "[2001:db8::1]:40000".parse().unwrap(),
    };
    let control_socket = flags & 0x10 != 0;
    let mut svc = match control_socket {
        true => svc.for_control_socket(),
        false => svc.for_peer(peer),
    };
    let ready = flags & 0x20 != 0;
    readiness.store(match ready {
        true => Verdict::ready(tokio::time::Instant::now()),
        false => Verdict::not_ready("fuzzing", tokio::time::Instant::now()),
    });

    let mut req = Request::builder().method(method.clone()).uri(uri.clone());
    *req.headers_mut().unwrap() = headers.clone();
    let req = req.body(()).unwrap();
    let (status, answer_headers, body) = runtime().block_on(async {
        let answer = async {
            let response = tower::Service::call(&mut svc, req).await.unwrap();
            let (parts, body) = response.into_parts();
            (parts.status, parts.headers, body.collect().await.unwrap().to_bytes())
        };
        tokio::time::timeout(Duration::from_secs(10), answer)
            .await
            .expect("an answer at once")
    });

    let path = uri.path();
    let may_control = control_socket || loopback_control && is_loopback(peer.ip());
    let (want, allow) = expected(&method, &uri, ready, may_control);
    assert_eq!(status, want, "{method} {uri}");
    assert_eq!(answer_headers.get(ALLOW).map(|v| v.to_str().unwrap()), allow);
    assert!(
        answer_headers.contains_key(CONTENT_TYPE),
        "{method} {uri}: no Content-Type"
    );
    for name in answer_headers.keys() {
        assert!(
            [CONTENT_TYPE, ALLOW, VARY, CONTENT_ENCODING].contains(name),
            "{name} in the answer to {method} {uri}"
        );
    }
    if method == Method::HEAD {
        assert!(body.is_empty(), "a body for HEAD {uri}");
    }
    if path == "/healthz/ready" && method == Method::GET {
        assert_eq!(body.starts_with(b"ready\n"), ready);
    }
}
