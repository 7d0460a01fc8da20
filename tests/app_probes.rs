//! The app's own probes through the status port (`/app-health/...`,
//! `/app-lifecycle/...`, configured by `ISTIO_KUBE_APP_PROBERS`): against
//! real servers (a scripted HTTP app, HTTPS with a self-signed certificate
//! and HTTP/2, a real gRPC health server, a TCP port), through the drain,
//! on the pod's own address inside a network namespace, and under a flood.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::netns::Net;
use common::*;

/// A kubelet's probe: `GET path` with the kubelet's headers (its Host names
/// the status port); the status code and body.
fn kubelet_get(status: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(status).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {status}\r\nUser-Agent: kube-probe/1.34\r\nX-Kubelet: yes\r\n\
         Accept: */*\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let code = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, body.to_owned())
}

/// The scripted app: one answer per path.
fn scripted_app(port: &Port) -> TestServer {
    TestServer::start(port, |request| async move {
        let header = |name: &str| {
            let value = request.headers().get(name).and_then(|v| v.to_str().ok());
            value.unwrap_or("-").to_owned()
        };
        let redirect = |to: Option<&str>| {
            let mut response = reply(302, "");
            if let Some(to) = to {
                response.headers_mut().insert("location", to.parse().unwrap());
            }
            response
        };
        match request.uri().path() {
            "/ok" => reply(200, "fine\n"),
            "/created" => reply(201, "made\n"),
            "/moved" => redirect(Some("/ok")),
            "/moved-nowhere" => redirect(None),
            // TEST-NET-1: never contacted, the redirect leaves the app's host.
            "/moved-away" => redirect(Some("http://192.0.2.1/elsewhere")),
            "/loop" => redirect(Some("/loop")),
            "/missing" => reply(404, "no such thing\n"),
            "/broken" => reply(503, "x".repeat(20_000)),
            "/slow" => {
                tokio::time::sleep(Duration::from_secs(3)).await;
                reply(200, "too late\n")
            }
            "/echo" => reply(
                200,
                format!(
                    "host={} agent={} kubelet={} probe={}\n",
                    header("host"),
                    header("user-agent"),
                    header("x-kubelet"),
                    header("x-probe")
                ),
            ),
            _ => reply(500, "unexpected path\n"),
        }
    })
}

fn http_probe(path: &str, port: u16) -> String {
    format!(
        r#"{{"httpGet":{{"path":"{path}","port":{port},"scheme":"HTTP","httpHeaders":[{{"name":"X-Probe","value":"from-spec"}}]}},"timeoutSeconds":1}}"#
    )
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario, read top to bottom
fn http_probes_answer_as_the_kubelet_would_have_seen_the_app() {
    let app_port = port();
    let _app = scripted_app(&app_port);
    let closed = port();
    let app = app_port.port;
    let cases = [
        ("ok", "/ok"),
        ("created", "/created"),
        ("moved", "/moved"),
        ("nowhere", "/moved-nowhere"),
        ("away", "/moved-away"),
        ("loop", "/loop"),
        ("missing", "/missing"),
        ("broken", "/broken"),
        ("slow", "/slow"),
        ("echo", "/echo"),
    ];
    let mut entries: Vec<String> = cases
        .iter()
        .map(|(c, path)| format!(r#""/app-health/{c}/livez":{}"#, http_probe(path, app)))
        .collect();
    entries.push(format!(
        r#""/app-health/closed/livez":{{"httpGet":{{"path":"/","port":{}}}}}"#,
        closed.port
    ));
    entries.push(format!(
        r#""/app-lifecycle/ok/prestopz":{{"httpGet":{{"path":"ok","port":"{app}"}}}}"#
    ));
    let json = format!("{{{}}}", entries.join(","));
    let admin = FakeAdmin::start(AdminMode::Live);
    let agent = Agent::builder()
        .admin_url(admin.url())
        .args(&["--app-probers", &json, "--pod-ip", "127.0.0.1"])
        .ready();
    let status = agent.status;
    let probe = |c: &str| kubelet_get(status, &format!("/app-health/{c}/livez"));

    assert_eq!(probe("ok"), (200, "fine\n".into()));
    assert_eq!(probe("created"), (201, "made\n".into()));
    assert_eq!(
        probe("moved"),
        (200, "fine\n".into()),
        "a redirect on the app's host is followed"
    );
    assert_eq!(probe("nowhere").0, 200, "a redirect without Location is a success");
    assert_eq!(
        probe("away").0,
        200,
        "a redirect to another host is a success, not followed"
    );
    let (code, body) = probe("loop");
    assert_eq!(code, 500);
    assert!(body.contains("redirects"), "{body}");
    assert_eq!(probe("missing"), (404, "no such thing\n".into()));
    let (code, body) = probe("broken");
    assert_eq!(
        (code, body.len()),
        (503, 10 * 1024),
        "the app's code and at most 10 KiB of its body"
    );
    let asked = Instant::now();
    let (code, body) = probe("slow");
    eprintln!("slow app: answered after {:?}: {body}", asked.elapsed());
    assert_eq!(code, 500);
    assert!(body.contains("no answer within 1s"), "{body}");
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "bounded by the probe's timeout"
    );
    let (code, body) = probe("closed");
    assert_eq!(code, 500);
    assert!(body.contains("refused"), "{body}");
    let (code, body) = probe("echo");
    assert_eq!(code, 200);
    assert_eq!(
        body,
        format!("host=127.0.0.1:{app} agent=kube-probe/1.34 kubelet=yes probe=from-spec\n"),
        "the kubelet's headers and the probe's own reach the app; Host names the app's port"
    );
    assert_eq!(
        kubelet_get(status, "/app-lifecycle/ok/prestopz"),
        (200, "fine\n".into())
    );

    let (code, body) = probe("unknown");
    assert_eq!(code, 404);
    assert!(body.contains("/app-health/unknown/livez"), "{body}");
    assert_eq!(http("POST", status, "/app-health/ok/livez").unwrap().0, 405);
    let scrape = get(status, "/stats/prometheus").unwrap().1;
    let ok = sample(
        &scrape,
        r#"lifeguard_app_probe_results_total{path="/app-health/ok/livez",result="success"}"#,
    );
    assert_eq!(ok, Some(1.0), "{scrape}");
    let failed = sample(
        &scrape,
        r#"lifeguard_app_probe_results_total{path="/app-health/missing/livez",result="failure"}"#,
    );
    assert_eq!(failed, Some(1.0));
    assert!(scrape.contains(r#"lifeguard_app_probe_duration_seconds_count{path="/app-health/slow/livez"} 1"#));
}

/// A server running on a one-thread runtime of its own; stopped (and its
/// thread joined) when dropped.
struct Background {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    /// Runs `serve(listener, stopped)` on its own thread.
    fn start<F, Fut>(listener: TcpListener, serve: F) -> Background
    where
        F: FnOnce(tokio::net::TcpListener, tokio::sync::oneshot::Receiver<()>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()>,
    {
        listener.set_nonblocking(true).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                serve(listener, stopped).await;
            });
        });
        Background {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
        let _ = self.thread.take().map(|t| t.join());
    }
}

/// An HTTPS app with a self-signed certificate, speaking HTTP/2 and
/// HTTP/1.1 (ALPN); its answer names the protocol the probe used. Held
/// for its Drop (the server stops with it).
struct TlsApp(#[allow(dead_code)] Background);

impl TlsApp {
    fn start(port: &Port, alpn: &[&[u8]]) -> TlsApp {
        use hyper_util::rt::{TokioExecutor, TokioIo};
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
        let certified = rcgen::generate_simple_self_signed(vec!["app.example".into()]).unwrap();
        let cert = CertificateDer::from(certified.cert.der().to_vec());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .unwrap();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        TlsApp(Background::start(
            bind_leased(port),
            |listener, mut stopped| async move {
                loop {
                    let stream = tokio::select! {
                        _ = &mut stopped => return,
                        accepted = listener.accept() => match accepted { Ok((s, _)) => s, Err(_) => continue },
                    };
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        let Ok(tls) = acceptor.accept(stream).await else { return };
                        let service = hyper::service::service_fn(|request: hyper::Request<_>| async move {
                            let body = format!("{:?} {}\n", request.version(), request.uri().path());
                            Ok::<_, std::convert::Infallible>(reply(200, body))
                        });
                        let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(tls), service)
                            .await;
                    });
                }
            },
        ))
    }
}

#[test]
fn https_probes_skip_the_certificate_check_and_use_http2_when_offered() {
    let (h2_port, h1_port) = (port(), port());
    let _h2 = TlsApp::start(&h2_port, &[b"h2", b"http/1.1"]);
    let _h1 = TlsApp::start(&h1_port, &[]);
    let json = format!(
        r#"{{"/app-health/h2/readyz":{{"httpGet":{{"path":"/ready","port":{},"scheme":"HTTPS"}}}},
            "/app-health/h1/readyz":{{"httpGet":{{"path":"/ready","port":{},"scheme":"HTTPS"}}}}}}"#,
        h2_port.port, h1_port.port
    );
    let admin = FakeAdmin::start(AdminMode::Live);
    let agent = Agent::builder()
        .admin_url(admin.url())
        .args(&["--app-probers", &json, "--pod-ip", "127.0.0.1"])
        .ready();
    assert_eq!(
        kubelet_get(agent.status, "/app-health/h2/readyz"),
        (200, "HTTP/2.0 /ready\n".into())
    );
    assert_eq!(
        kubelet_get(agent.status, "/app-health/h1/readyz"),
        (200, "HTTP/1.1 /ready\n".into())
    );
}

/// A real gRPC health server (tonic-health): `x` serving, `y` not.
struct GrpcApp(#[allow(dead_code)] Background);

impl GrpcApp {
    fn start(port: &Port) -> GrpcApp {
        use tonic_health::ServingStatus;
        let (up, is_up) = std::sync::mpsc::channel();
        let app = Background::start(bind_leased(port), |listener, stopped| async move {
            let (reporter, service) = tonic_health::server::health_reporter();
            reporter.set_service_status("x", ServingStatus::Serving).await;
            reporter.set_service_status("y", ServingStatus::NotServing).await;
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            up.send(()).unwrap();
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
        });
        is_up.recv_timeout(Duration::from_secs(10)).unwrap();
        GrpcApp(app)
    }
}

#[test]
fn grpc_and_tcp_probes_against_real_servers() {
    let grpc_port = port();
    let _grpc = GrpcApp::start(&grpc_port);
    let tcp_port = port();
    let _tcp = bind_leased(&tcp_port);
    let closed = port();
    let g = grpc_port.port;
    let json = format!(
        r#"{{"/app-health/x/livez":{{"grpc":{{"port":{g},"service":"x"}},"timeoutSeconds":2}},
            "/app-health/y/livez":{{"grpc":{{"port":{g},"service":"y"}}}},
            "/app-health/z/livez":{{"grpc":{{"port":{g},"service":"z"}}}},
            "/app-health/all/livez":{{"grpc":{{"port":{g}}}}},
            "/app-health/nogrpc/livez":{{"grpc":{{"port":{}}}}},
            "/app-health/tcp/readyz":{{"tcpSocket":{{"port":{}}}}},
            "/app-health/tcp/livez":{{"tcpSocket":{{"port":{}}}}}}}"#,
        closed.port, tcp_port.port, closed.port
    );
    let admin = FakeAdmin::start(AdminMode::Live);
    let agent = Agent::builder()
        .admin_url(admin.url())
        .args(&["--app-probers", &json, "--pod-ip", "127.0.0.1"])
        .ready();
    let status = agent.status;
    assert_eq!(kubelet_get(status, "/app-health/x/livez"), (200, "SERVING\n".into()));
    assert_eq!(kubelet_get(status, "/app-health/all/livez"), (200, "SERVING\n".into()));
    let (code, body) = kubelet_get(status, "/app-health/y/livez");
    assert_eq!(code, 500);
    assert!(body.contains("NOT_SERVING"), "{body}");
    let (code, body) = kubelet_get(status, "/app-health/z/livez");
    assert_eq!(code, 500);
    assert!(body.contains("NOT_FOUND"), "an unknown service: {body}");
    let (code, body) = kubelet_get(status, "/app-health/nogrpc/livez");
    assert_eq!(code, 500);
    assert!(body.contains("refused"), "{body}");
    assert_eq!(kubelet_get(status, "/app-health/tcp/readyz").0, 200);
    let (code, body) = kubelet_get(status, "/app-health/tcp/livez");
    assert_eq!(code, 500);
    assert!(body.contains("refused"), "{body}");
}

#[test]
fn a_bad_entry_stops_start_up_naming_it() {
    for (json, want) in [
        (
            r#"{"/app-health/web/livez":{"httpGet":{"path":"/","port":"http"}}}"#,
            r#"/app-health/web/livez: the named port "http" is left unresolved"#,
        ),
        (r#"{"/app-health/web/livez":{}}"#, "/app-health/web/livez: no handler"),
        (
            r#"{"/app-health/web/livez":{"tcpSocket":{"port":1},"grpc":{"port":2}}}"#,
            "more than one handler",
        ),
        (
            r#"{"/healthz/web":{"tcpSocket":{"port":1}}}"#,
            "/healthz/web: the path must be",
        ),
    ] {
        let (code, out) = run_lifeguard(&["check", "--app-probers", json]);
        assert_eq!(code, 2, "{out}");
        assert!(out.contains("--app-probers") && out.contains(want), "{out}");
    }
    // The same through Istio's variable, named as such.
    let out = std::process::Command::new(lifeguard_bin())
        .arg("check")
        .env(
            "ISTIO_KUBE_APP_PROBERS",
            r#"{"/app-health/web/readyz":{"httpGet":{"port":"web"}}}"#,
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("ISTIO_KUBE_APP_PROBERS") && stderr.contains("/app-health/web/readyz"),
        "{stderr}"
    );
}

#[test]
fn app_probes_are_served_through_the_drain_and_the_linger() {
    let app_port = port();
    let _app = scripted_app(&app_port);
    let json = format!(
        r#"{{"/app-health/web/readyz":{},"/app-lifecycle/web/prestopz":{}}}"#,
        http_probe("/ok", app_port.port),
        http_probe("/ok", app_port.port)
    );
    let pod = Pod::start(Agent::builder().args(&[
        "--app-probers",
        &json,
        "--pod-ip",
        "127.0.0.1",
        "--drain-until",
        "time",
        // 4 s: the reads below happen while it drains, on a busy machine.
        "--termination-drain-duration",
        "4s",
        "--linger",
        "20s",
    ]));
    let status = pod.ports.agent.addr();
    assert_eq!(kubelet_get(status, "/app-health/web/readyz"), (200, "fine\n".into()));
    pod.sigterm();
    wait_status(status, "/healthz/ready", 503, Duration::from_secs(2));
    let (_, drain) = get(status, "/drain").unwrap();
    assert!(drain.contains(r#""phase":"draining""#), "{drain}");
    assert_eq!(
        kubelet_get(status, "/app-health/web/readyz"),
        (200, "fine\n".into()),
        "while draining"
    );
    assert_eq!(
        kubelet_get(status, "/app-lifecycle/web/prestopz"),
        (200, "fine\n".into()),
        "the preStop hook too"
    );
    wait_for("Envoy to stop", Duration::from_secs(10), || {
        let (_, drain) = get(status, "/drain").map_err(|e| e.to_string())?;
        drain.contains(r#""phase":"stopped""#).then_some(()).ok_or(drain)
    });
    assert_eq!(
        kubelet_get(status, "/app-health/web/readyz"),
        (200, "fine\n".into()),
        "while lingering"
    );
}

/// The app listens only on the pod's address, inside a network namespace:
/// the probe reaches it there, from 127.0.0.6, as the kubelet's would
/// (asked from a peer outside the pod); the legacy loopback mode does not.
#[test]
fn the_prober_reaches_an_app_on_the_pods_address_from_127_0_0_6() {
    let net = Net::new();
    let pod_ip = net.pod_ip;
    let app = net.pod.run(move || TcpListener::bind((pod_ip, 8080)).unwrap());
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let peers = seen.clone();
    let app_thread = std::thread::spawn(move || {
        for stream in app.incoming() {
            let Ok(mut stream) = stream else { return };
            let peer = stream.peer_addr().unwrap();
            peers.lock().unwrap().push(peer);
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let body = format!("from {}\n", peer.ip());
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(answer.as_bytes());
            if buf.starts_with(b"GET /last") {
                return;
            }
        }
    });
    let json = r#"{"/app-health/web/readyz":{"httpGet":{"path":"/ready","port":8080}},
                   "/app-health/web/livez":{"tcpSocket":{"port":8080}},
                   "/app-health/last/livez":{"httpGet":{"path":"/last","port":8080}}}"#;
    // Probed once it says it listens: a connection accepted by the kernel
    // before that was reset once, beside a busy loop.
    let start = |legacy: &str| {
        let agent = Agent::builder()
            .netns(&net.pod)
            .status("0.0.0.0:15020".parse().unwrap())
            .admin_url("http://127.0.0.1:9")
            .args(&["--app-probers", json, "--app-probe-localhost", legacy])
            .env("POD_IP", &pod_ip.to_string())
            .spawn();
        agent.wait_output("lifeguard listening", Duration::from_secs(20));
        agent
    };
    let status = net.pod_addr(15020);
    let kubelet = |path: &'static str| net.peer.run(move || kubelet_get_when_up(status, path));
    let mut agent = start("false");
    assert_eq!(kubelet("/app-health/web/readyz"), (200, "from 127.0.0.6\n".into()));
    assert_eq!(kubelet("/app-health/web/livez").0, 200);
    agent.kill();
    let _legacy = start("true");
    let (code, body) = kubelet("/app-health/web/readyz");
    assert_eq!(code, 500, "the app is not on loopback: {body}");
    assert!(body.contains("127.0.0.1:8080"), "{body}");
    drop(_legacy);
    let mut agent = start("false");
    assert_eq!(kubelet("/app-health/last/livez").0, 200);
    agent.kill();
    app_thread.join().unwrap();
    let seen = seen.lock().unwrap();
    assert!(seen.iter().all(|p| p.ip().to_string() == "127.0.0.6"), "{seen:?}");
}

/// `kubelet_get` once the status port accepts connections.
fn kubelet_get_when_up(status: SocketAddr, path: &str) -> (u16, String) {
    wait_for("the status port", Duration::from_secs(10), || {
        TcpStream::connect(status).map(drop)
    });
    kubelet_get(status, path)
}

#[test]
fn a_flood_of_probes_keeps_the_app_within_the_bound_and_other_paths_answered() {
    let app_port = port();
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (n, m) = (now.clone(), most.clone());
    let _app = TestServer::start(&app_port, move |_| {
        let (now, most) = (n.clone(), m.clone());
        async move {
            let in_flight = now.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(in_flight, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(200)).await;
            now.fetch_sub(1, Ordering::SeqCst);
            reply(200, "ok\n")
        }
    });
    let tcp_port = port();
    let _tcp = bind_leased(&tcp_port);
    let json = format!(
        r#"{{"/app-health/busy/livez":{{"httpGet":{{"path":"/","port":{}}},"timeoutSeconds":1}},
            "/app-health/calm/readyz":{{"tcpSocket":{{"port":{}}}}}}}"#,
        app_port.port, tcp_port.port
    );
    let admin = FakeAdmin::start(AdminMode::Live);
    let agent = Agent::builder()
        .admin_url(admin.url())
        .args(&["--app-probers", &json, "--pod-ip", "127.0.0.1"])
        .ready();
    let status = agent.status;
    let flood: Vec<_> = (0..100)
        .map(|_| std::thread::spawn(move || kubelet_get(status, "/app-health/busy/livez").0))
        .collect();
    // While the flood is on, another path still answers.
    let asked = Instant::now();
    assert_eq!(kubelet_get(status, "/app-health/calm/readyz").0, 200);
    eprintln!("another path during the flood: {:?}", asked.elapsed());
    let codes: Vec<u16> = flood.into_iter().map(|t| t.join().unwrap()).collect();
    let ok = codes.iter().filter(|c| **c == 200).count();
    let busy = codes.iter().filter(|c| **c == 503).count();
    eprintln!(
        "flood of 100: {ok} answered 200, {busy} 503 (busy); the app saw at most {} at once",
        most.load(Ordering::SeqCst)
    );
    assert!(
        most.load(Ordering::SeqCst) <= 4,
        "at most 4 probes of a path reach the app at once"
    );
    assert!(ok >= 4 && ok + busy == 100, "{codes:?}");
    let scrape = get(status, "/stats/prometheus").unwrap().1;
    let counted = sample(
        &scrape,
        r#"lifeguard_app_probe_results_total{path="/app-health/busy/livez",result="busy"}"#,
    );
    assert_eq!(counted, Some(busy as f64));
}

/// An IPv6 pod: the probe reaches the app at the pod's IPv6 address. Its
/// source, ::6, exists only where the capture rules added it; here it does
/// not, so the probe goes from the pod's own address and says so once.
#[test]
fn an_ipv6_pod_address_is_probed_and_a_missing_source_is_logged_once() {
    let app_port = port();
    let app = TcpListener::bind(("::1", app_port.port)).unwrap();
    let json = format!(
        r#"{{"/app-health/v6/readyz":{{"tcpSocket":{{"port":{}}}}}}}"#,
        app_port.port
    );
    let admin = FakeAdmin::start(AdminMode::Live);
    let agent = Agent::builder()
        .admin_url(admin.url())
        .args(&["--app-probers", &json, "--pod-ip", "::1"])
        .ready();
    for _ in 0..3 {
        assert_eq!(kubelet_get(agent.status, "/app-health/v6/readyz").0, 200);
    }
    let (_, peer) = app.accept().unwrap();
    assert_eq!(peer.ip().to_string(), "::1");
    let log = agent.wait_output("cannot use their source address", Duration::from_secs(5));
    assert_eq!(log.matches("cannot use their source address").count(), 1, "{log}");
}
