//! The drain against the real Envoy and a real slow app: what a client of
//! the app sees when the pod is deleted, and when Envoy is stopped.

use std::time::{Duration, Instant};

use common::*;

#[test]
fn the_incumbent_failure_a_fixed_drain_shorter_than_a_request_cuts_it() {
    let mut pod = Pod::start(Agent::builder().args(&["--termination-drain-duration", "1s"]));
    // 10 s: still in flight when Envoy is stopped, however long a busy
    // machine keeps Envoy from handling its SIGTERM (a 3 s request once
    // finished first, beside a busy loop).
    let req = pod.request_in_flight("/delay/10");
    pod.sigterm();
    let (result, _) = req.join().unwrap();
    match result {
        Ok((200, body)) => panic!("the 10s request survived a 1s fixed drain: {body:?}"),
        Ok((status, _)) => assert!(status >= 500, "expected a failure, got {status}"),
        Err(_) => {} // reset or closed: the failure users see
    }
    // lifeguard says so: exit 3, and the request it cut in the log.
    let out = pod.agent.assert_exit(Duration::from_secs(10), 3);
    assert!(
        out.contains("the drain time ran out with requests in flight") && out.contains("left_at_stop=1"),
        "{out}"
    );
}

#[test]
fn exit_on_zero_lets_the_request_in_flight_finish_then_stops_envoy() {
    // Env names as Istio users write them.
    let mut pod = Pod::start(
        Agent::builder()
            .env("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "true")
            .env("MINIMUM_DRAIN_DURATION", "1s"),
    );
    let envoy_pid = envoy_pid(&pod.agent);

    let req = pod.request_in_flight("/delay/3");
    pod.sigterm();
    let (result, answered_at) = req.join().unwrap();
    assert_eq!(result.unwrap(), (200, "done\n".to_owned()));
    let code = pod.agent.exit_code(Duration::from_secs(10));
    let stopped_after = answered_at.elapsed();
    assert!(!process_alive(envoy_pid), "Envoy still runs after lifeguard exited");
    eprintln!("last connection closed -> lifeguard exited (Envoy stopped before): {stopped_after:?}");
    assert_eq!(code, 0, "{}", pod.agent.output());
    assert!(
        pod.agent.output().contains("zero active connections"),
        "{}",
        pod.agent.output()
    );
}

#[test]
fn readiness_turns_503_at_once_and_stays_answered_through_the_drain() {
    let pod = Pod::start(Agent::builder().exit_on_zero("1s"));
    // 5 s: still in flight 2 s into the drain, with 3 s left for this
    // thread's reads on a busy machine.
    let req = pod.request_in_flight("/delay/5");
    let sent = pod.sigterm();
    let body = wait_status(pod.ports.agent.addr(), "/healthz/ready", 503, Duration::from_secs(2));
    eprintln!("SIGTERM -> 503 on the agent: {:?}", sent.elapsed());
    assert_eq!(body, DRAINING_TERMINATING);
    let body = wait_status(
        pod.ports.status_listener.addr(),
        "/healthz/ready",
        503,
        Duration::from_secs(2),
    );
    assert_eq!(body, DRAINING_TERMINATING);

    // Late in the drain (the request is still in flight): still answered.
    wait_for("2s into the drain", Duration::from_secs(5), || {
        if sent.elapsed() >= Duration::from_secs(2) {
            Ok(())
        } else {
            Err(())
        }
    });
    assert!(!req.is_finished(), "the request should still be in flight");
    assert_eq!(get(pod.ports.agent.addr(), "/healthz/ready").unwrap().0, 503);
    assert_eq!(get(pod.ports.status_listener.addr(), "/healthz/ready").unwrap().0, 503);
    // The drain counts it (its first read may come late on a busy machine:
    // none yet 2 s in, seen): read while the request is in flight.
    wait_for(
        "the drain to count the request in flight",
        Duration::from_secs(5),
        || {
            let (status, body) = get(pod.ports.agent.addr(), "/drain").map_err(|e| e.to_string())?;
            let counted = body.contains("\"phase\":\"draining\"") && body.contains("\"active_connections\":1");
            match (status == 200 && counted, req.is_finished()) {
                (true, _) => Ok(()),
                (false, false) => Err(body),
                (false, true) => panic!("the request ended before the drain counted it: {body}"),
            }
        },
    );
    let (result, _) = req.join().unwrap();
    assert_eq!(result.unwrap().0, 200);
}

#[test]
fn the_deadline_stops_envoy_and_reports_the_connection_cut() {
    let mut pod = Pod::start(
        Agent::builder()
            .args(&["--termination-grace-period", "4s", "--shutdown-margin", "1s"])
            .exit_on_zero("1s"),
    );
    let req = pod.request_in_flight("/delay/10");
    let sent = pod.sigterm();
    let code = pod.agent.exit_code(Duration::from_secs(10));
    let took = sent.elapsed();
    eprintln!("deadline 3s: lifeguard exited {took:?} after SIGTERM");
    assert!(
        took >= Duration::from_millis(2900),
        "stopped before the deadline: {took:?}"
    );
    assert!(
        took < Duration::from_secs(5),
        "stopped after the grace period: {took:?}"
    );
    assert_eq!(code, 3, "{}", pod.agent.output());
    assert!(
        pod.agent.output().contains("Envoy stopped with 1 still active"),
        "{}",
        pod.agent.output()
    );
    let (result, _) = req.join().unwrap();
    assert!(!matches!(result, Ok((200, _))), "the 10s request cannot have finished");
}

#[test]
fn envoy_killed_mid_drain_makes_lifeguard_exit_non_zero() {
    let mut pod = Pod::start(Agent::builder().exit_on_zero("1s"));
    let envoy = envoy_pid(&pod.agent);
    let _req = pod.request_in_flight("/delay/10");
    pod.sigterm();
    wait_for("the drain phase", Duration::from_secs(5), || {
        match get(pod.ports.agent.addr(), "/drain") {
            Ok((200, body)) if body.contains("\"phase\":\"draining\"") => Ok(()),
            other => Err(other),
        }
    });
    // The Envoy our lifeguard launched.
    common::pod::signal(envoy, libc::SIGKILL);
    let code = pod.agent.exit_code(Duration::from_secs(5));
    assert_eq!(code, 4, "{}", pod.agent.output());
    assert!(pod.agent.output().contains("Envoy exited on its own"));
}

#[test]
fn drain_until_requests_is_not_held_by_an_idle_keepalive_connection() {
    let mut pod =
        Pod::start(Agent::builder().args(&["--drain-until", "requests", "--minimum-drain-duration", "500ms"]));
    let idle = idle_keepalive_connection(pod.ports.inbound.addr(), "/delay/0");
    let sent = pod.sigterm();
    let code = pod.agent.exit_code(Duration::from_secs(10));
    eprintln!(
        "requests mode with an idle connection: exited {:?} after SIGTERM",
        sent.elapsed()
    );
    assert_eq!(code, 0, "{}", pod.agent.output());
    assert!(pod.agent.output().contains("zero active requests"));
    drop(idle);
}

#[test]
fn drain_until_connections_is_held_by_the_same_idle_connection_until_the_deadline() {
    let mut pod = Pod::start(Agent::builder().args(&[
        "--drain-until",
        "connections",
        "--minimum-drain-duration",
        "500ms",
        "--termination-grace-period",
        "3s",
        "--shutdown-margin",
        "1s",
    ]));
    let idle = idle_keepalive_connection(pod.ports.inbound.addr(), "/delay/0");
    pod.sigterm();
    let code = pod.agent.exit_code(Duration::from_secs(10));
    assert_eq!(code, 3, "{}", pod.agent.output());
    drop(idle);
}

/// What a load balancer is told while the pod terminates.
const DRAINING_TERMINATING: &str = "not ready: draining (the pod terminates: load balancers are answered 503; \
the kubelet 200 while Envoy accepts new connections)\n";

/// A readiness probe as the kubelet sends it: `(status, body)`.
fn kubelet_probe(addr: std::net::SocketAddr) -> std::io::Result<(u16, String)> {
    let answer = request(
        addr,
        "GET",
        "/healthz/ready",
        &[("user-agent", "kube-probe/1.34"), ("connection", "close")],
        Duration::from_secs(2),
    )?;
    Ok((answer.status, answer.text()))
}

/// The pod terminates (SIGTERM): the kubelet, through Envoy's 15021 as it
/// probes and on 15020, is answered 200 while Envoy accepts new
/// connections, which it does (a new connection to the inbound listener
/// is served); a load balancer 503 from the first moment. Once the node's
/// load balancers have had their time (declared here: every 2 s, out
/// after 1, and kube-proxy's second), the kubelet is answered 503 too, so
/// that announcers withdraw the node, while Envoy still serves until the
/// traffic has been quiet (6 s, the quiet period set). Once Envoy stops,
/// the exit summary says how the kubelet was answered, when that changed
/// and why.
#[test]
fn while_the_pod_terminates_the_kubelet_is_answered_as_envoy_is_and_load_balancers_get_503() {
    let mut pod = Pod::start(Agent::builder().args(&[
        "--drain-until",
        "time",
        "--termination-drain-duration",
        "3s",
        "--load-balancer-checks",
        "2sx1",
        "--drain-wait-min-quiet-period",
        "6s",
    ]));
    let sent = pod.sigterm();
    wait_status(pod.ports.agent.addr(), "/healthz/ready", 503, Duration::from_secs(2));
    for addr in [pod.ports.status_listener.addr(), pod.ports.agent.addr()] {
        let (status, body) = kubelet_probe(addr).unwrap();
        assert_eq!(status, 200, "{addr}: {body}");
        assert!(
            body.starts_with("ready: the pod terminates and Envoy accepts new connections"),
            "{body}"
        );
        assert_eq!(get(addr, "/healthz/ready").unwrap(), (503, DRAINING_TERMINATING.into()));
    }
    // What the kubelet is told is true: a new connection is served.
    assert_eq!(
        get(pod.ports.inbound.addr(), "/delay/0").unwrap(),
        (200, "done\n".into())
    );
    let (_, body) = get(pod.ports.agent.addr(), "/drain").unwrap();
    let drain: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(drain["trigger"], "SIGTERM");
    assert_eq!(drain["kubelet"]["answer"], "follows_envoy", "{body}");
    assert_eq!(drain["kubelet"]["serving_window_seconds"], 3.0, "{body}");
    assert!(drain["kubelet"]["ready_probes"].as_u64() >= Some(2), "{body}");
    // The node's load balancers' time is over: the kubelet's 503, Envoy
    // still serving.
    let body = wait_for("the kubelet's 503", Duration::from_secs(5), || {
        match kubelet_probe(pod.ports.status_listener.addr()) {
            Ok((503, body)) => Ok(body),
            other => Err(other),
        }
    });
    assert!(
        body.starts_with("not ready: the pod terminates and the node's load balancers have had their time"),
        "{body}"
    );
    assert_eq!(
        get(pod.ports.inbound.addr(), "/delay/0").unwrap(),
        (200, "done\n".into())
    );
    pod.agent.assert_exit(Duration::from_secs(15), 0);
    eprintln!("SIGTERM -> lifeguard exited: {:?}", sent.elapsed());
    let out = pod.agent.output();
    let summary = out
        .lines()
        .find(|l| l.contains("lifeguard exiting"))
        .expect("the exit summary");
    assert!(
        summary.contains(
            r#"kubelet="{\"answer\":\"follows_envoy\",\"serving_window_seconds\":3.0,\"not_serving_after_seconds\":3.0,\"not_serving_because\":\"node_load_balancers_time\""#
        ),
        "{summary}"
    );
    assert!(
        out.contains("the kubelet is answered 503 from now, 3s into the drain"),
        "{out}"
    );
}

/// An operator's `POST /drain` (the pod not terminating) takes it out of
/// its Service's endpoints: the kubelet is answered 503 too. The preStop
/// hook's (`?prestop`) is the pod's termination.
#[test]
fn an_operators_drain_answers_the_kubelet_503_and_the_prestop_hooks_does_not() {
    let pod = Pod::start(Agent::builder().args(&["--drain-until", "requests", "--minimum-drain-duration", "500ms"]));
    let (status, body) = http("POST", pod.ports.agent.addr(), "/drain").unwrap();
    assert_eq!(status, 200, "{body}");
    for addr in [pod.ports.status_listener.addr(), pod.ports.agent.addr()] {
        assert_eq!(kubelet_probe(addr).unwrap(), (503, "not ready: draining\n".into()));
        assert_eq!(
            get(addr, "/healthz/ready").unwrap(),
            (503, "not ready: draining\n".into())
        );
    }
    let pod = Pod::start(Agent::builder().args(&["--drain-until", "requests", "--minimum-drain-duration", "500ms"]));
    let (status, body) = http("POST", pod.ports.agent.addr(), "/drain?nowait&prestop").unwrap();
    assert_eq!(status, 202, "{body}");
    assert!(body.contains(r#""trigger":"preStop hook""#), "{body}");
    assert_eq!(kubelet_probe(pod.ports.status_listener.addr()).unwrap().0, 200);
    assert_eq!(get(pod.ports.status_listener.addr(), "/healthz/ready").unwrap().0, 503);
}

#[test]
fn post_drain_flips_readiness_drains_and_leaves_envoy_running_until_sigterm() {
    let mut pod =
        Pod::start(Agent::builder().args(&["--drain-until", "requests", "--minimum-drain-duration", "500ms"]));
    let (status, body) = http("POST", pod.ports.agent.addr(), "/drain").unwrap();
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["trigger"], "POST /drain");
    assert_eq!(json["active_requests"], 0);
    assert_eq!(
        get(pod.ports.agent.addr(), "/healthz/ready").unwrap(),
        (503, "not ready: draining\n".into())
    );
    // Idempotent: a second call answers at once with the same drain.
    let (status, body) = http("POST", pod.ports.agent.addr(), "/drain").unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("\"phase\":\"drained\""), "{body}");
    // Envoy still serves the app.
    assert_eq!(
        get(pod.ports.inbound.addr(), "/delay/0").unwrap(),
        (200, "done\n".into())
    );
    // SIGTERM now stops Envoy promptly.
    pod.sigterm();
    pod.agent.assert_exit(Duration::from_secs(5), 0);
}

#[test]
fn an_external_envoy_is_drained_and_quit_through_its_admin_api() {
    let ports = Ports::new();
    let _app = App::start(&ports.app);
    let mut envoy = start_envoy(&bootstrap(&ports));
    let mut agent = Agent::builder().on(&ports).exit_on_zero("200ms").start();
    wait_status(ports.agent.addr(), "/healthz/ready", 200, Duration::from_secs(30));
    agent.signal(libc::SIGTERM);
    let code = agent
        .wait_exit(Duration::from_secs(10))
        .expect("lifeguard exits")
        .code();
    assert_eq!(code, Some(0), "{}", agent.output());
    // Envoy got /quitquitquit.
    assert!(envoy.wait_exit(Duration::from_secs(10)).is_some(), "Envoy still runs");
}

#[test]
fn quitquitquit_stops_envoy_and_exits_cleanly() {
    let mut pod = Pod::start(Agent::builder());
    let envoy = envoy_pid(&pod.agent);
    let (status, body) = http("POST", pod.ports.agent.addr(), "/quitquitquit").unwrap();
    assert_eq!((status, body.as_str()), (200, "OK\n"));
    assert_eq!(pod.agent.exit_code(Duration::from_secs(5)), 0);
    assert!(!process_alive(envoy));
}

#[test]
fn a_second_signal_changes_nothing() {
    let mut pod = Pod::start(Agent::builder().args(&["--termination-drain-duration", "1s"]));
    let sent = pod.sigterm();
    wait_status(pod.ports.agent.addr(), "/healthz/ready", 503, Duration::from_secs(2));
    pod.agent.signal(libc::SIGINT);
    pod.agent.signal(libc::SIGTERM);
    assert_eq!(pod.agent.exit_code(Duration::from_secs(10)), 0);
    assert!(
        sent.elapsed() >= Duration::from_secs(1),
        "the fixed drain was cut short"
    );
    let out = pod.agent.output();
    assert_eq!(out.matches("drain started").count(), 1, "{out}");
    assert!(out.contains("signal received again"), "{out}");
}

/// The drain wait counts a request when it arrives, not when it ends: a
/// request that arrives on a kept-alive connection during the wait and
/// runs for 8 s holds the wait for a quiet period from its arrival (4 s
/// here: the request is sent after a second of quiet, and arrives within
/// it on a busy machine), so the hook answers while it still runs. Counting completions
/// (the old rule) would have let the hook answer at once: the counter
/// would not move until the request ended. `h2`: the connection speaks
/// HTTP/2 (prior knowledge), else HTTP/1.1.
fn a_request_arriving_on_a_kept_alive_connection_holds_the_drain_wait(h2: bool) {
    let pod = Pod::start(Agent::builder().args(&["--drain-wait-min-quiet-period", "4s"]));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let inbound = pod.ports.inbound.addr();
    // One connection, kept alive; a first request on it before the drain.
    let mut conn = rt.block_on(Conn::open(inbound, h2));
    assert_eq!(rt.block_on(conn.send("/delay/0")), 200);
    let agent = pod.ports.agent.addr();
    let hook = std::thread::spawn(move || {
        let answer = http_timeout("GET", agent, "/drain/wait", Duration::from_secs(30));
        (answer, Instant::now())
    });
    pod.sigterm();
    // The wait has seen a second of quiet: the rule runs.
    wait_for("a second of quiet in the drain wait", Duration::from_secs(10), || {
        let (_, body) = get(agent, "/drain").map_err(|e| e.to_string())?;
        let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        match v["drain_wait"]["quiet_for_seconds"].as_f64() {
            Some(q) if q >= 1.0 => Ok(()),
            _ => Err(body),
        }
    });
    let arrived = Instant::now();
    let slow = rt.block_on(async { tokio::time::timeout(Duration::from_secs(20), conn.send("/delay/8")).await });
    let ended = Instant::now();
    assert_eq!(slow.unwrap(), 200, "the request on the kept-alive connection");
    let (answer, answered) = hook.join().unwrap();
    let (status, line) = answer.unwrap();
    let after = answered.duration_since(arrived);
    eprintln!(
        "{}: the request arrived, the hook answered {after:?} later, the request ended {:?} after it arrived: {line}",
        if h2 { "HTTP/2" } else { "HTTP/1.1" },
        ended.duration_since(arrived)
    );
    assert_eq!(status, 200);
    assert!(line.starts_with("out of rotation: "), "{line}");
    assert!(
        after >= Duration::from_secs(4),
        "the hook answered {after:?} after the request arrived: its arrival did not count"
    );
    assert!(
        answered < ended,
        "the hook waited for the request's end, not its arrival"
    );
}

#[test]
fn an_http1_request_on_a_kept_alive_connection_counts_when_it_arrives() {
    a_request_arriving_on_a_kept_alive_connection_holds_the_drain_wait(false);
}

#[test]
fn an_http2_request_counts_when_it_arrives() {
    a_request_arriving_on_a_kept_alive_connection_holds_the_drain_wait(true);
}

/// A client connection to Envoy's inbound listener, kept alive.
enum Conn {
    H1(hyper::client::conn::http1::SendRequest<http_body_util::Empty<bytes::Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>),
}

impl Conn {
    async fn open(addr: std::net::SocketAddr, h2: bool) -> Conn {
        use hyper_util::rt::{TokioExecutor, TokioIo};
        let io = TokioIo::new(tokio::net::TcpStream::connect(addr).await.unwrap());
        if h2 {
            let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
            tokio::spawn(conn);
            Conn::H2(sender)
        } else {
            let (sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            Conn::H1(sender)
        }
    }

    /// `GET path` on this connection: the status, once the body is read.
    async fn send(&mut self, path: &str) -> u16 {
        use http_body_util::BodyExt;
        let request = hyper::Request::get(format!("http://app{path}"))
            .body(http_body_util::Empty::new())
            .unwrap();
        let response = match self {
            Conn::H1(sender) => sender.send_request(request).await,
            Conn::H2(sender) => sender.send_request(request).await,
        };
        let response = response.unwrap();
        let status = response.status().as_u16();
        response.into_body().collect().await.unwrap();
        status
    }
}

/// A sidecar's bootstrap written the way users write theirs, not ours:
/// the traffic listener named `public_web`, bound to 127.0.0.1, with no
/// `traffic_direction` and no listener `stat_prefix`; the status listener
/// named `health`. Admin on TCP (the listeners are what differ here).
fn users_bootstrap(ports: &Ports) -> String {
    let hcm = "envoy.filters.network.http_connection_manager";
    let hcm_type =
        "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
    let router = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";
    let cluster = |name: &str, port: u16| {
        format!(
            "  - name: {name}\n    type: STATIC\n    connect_timeout: 1s\n    load_assignment:\n      cluster_name: {name}\n      endpoints:\n      - lb_endpoints:\n        - endpoint:\n            address:\n              socket_address: {{ address: 127.0.0.1, port_value: {port} }}\n"
        )
    };
    let listener = |name: &str, port: u16, prefix: &str, route: &str| {
        format!(
            "  - name: {name}\n    address:\n      socket_address: {{ address: 127.0.0.1, port_value: {port} }}\n    filter_chains:\n    - filters:\n      - name: {hcm}\n        typed_config:\n          \"@type\": {hcm_type}\n          stat_prefix: {prefix}\n          route_config:\n            virtual_hosts:\n            - name: all\n              domains: [\"*\"]\n              routes:\n              - match: {{ prefix: / }}\n                route: {{ cluster: {route}, timeout: 0s }}\n          http_filters:\n          - name: envoy.filters.http.router\n            typed_config:\n              \"@type\": {router}\n"
        )
    };
    format!(
        "admin:\n  address:\n    socket_address: {{ address: 127.0.0.1, port_value: {} }}\nstatic_resources:\n  listeners:\n{}{}  clusters:\n{}{}",
        ports.admin.port,
        listener("health", ports.status_listener.port, "health", "lifeguard"),
        listener("public_web", ports.inbound.port, "ingress_http", "web_app"),
        cluster("lifeguard", ports.agent.port),
        cluster("web_app", ports.app.port),
    )
}

/// With a bootstrap that is not ours, on the oldest and the newest Envoy
/// (scripts/test runs this file against both): the request in flight at
/// SIGTERM gets its answer, and lifeguard exits 0 once nothing is in flight.
#[test]
fn a_request_in_flight_at_sigterm_is_answered_through_a_bootstrap_users_write() {
    let ports = Ports::with_admin_socket(false);
    let _app = App::start(&ports.app);
    let mut agent = Agent::builder().on(&ports).envoy(&users_bootstrap(&ports)).spawn();
    wait_status(
        ports.status_listener.addr(),
        "/healthz/ready",
        200,
        Duration::from_secs(30),
    );
    let addr = ports.inbound.addr();
    let req = std::thread::spawn(move || http_timeout("GET", addr, "/delay/3", Duration::from_secs(20)));
    wait_for(
        "the request in flight in Envoy",
        Duration::from_secs(10),
        || match ports.admin_get("/stats?filter=ingress_http.downstream_rq_active") {
            Ok((200, body)) if body.contains("http.ingress_http.downstream_rq_active: 1") => Ok(()),
            other => Err(other),
        },
    );
    agent.signal(libc::SIGTERM);
    assert_eq!(req.join().unwrap().unwrap(), (200, "done\n".to_owned()));
    let code = agent.exit_code(Duration::from_secs(20));
    let out = agent.output();
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("outcome=\"drained\""), "{out}");
}
