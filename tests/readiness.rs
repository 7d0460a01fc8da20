//! Readiness against the real Envoy: what a kubelet (through Envoy's 15021
//! listener) and a load balancer (straight at the agent) are told.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::*;

#[test]
fn not_ready_with_a_reason_while_envoy_is_not_running() {
    let ports = Ports::new();
    let _agent = Agent::builder().on(&ports).start();
    // Until the poller's first read has failed, the reason is "no answer
    // from Envoy admin yet"; then it says why.
    let body = wait_for(
        "the reason of the first failed read",
        Duration::from_secs(5),
        || match get(ports.agent.addr(), "/healthz/ready") {
            Ok((503, body)) if !body.contains("no answer from Envoy admin yet") => Ok(body),
            other => Err(other),
        },
    );
    assert!(
        body.contains(&format!("cannot connect to Envoy admin at {}", ports.admin_url())),
        "reason should say the admin API is unreachable: {body:?}"
    );
    // HEAD gets the status without a body.
    let (status, body) = http("HEAD", ports.agent.addr(), "/healthz/ready").unwrap();
    assert_eq!((status, body.as_str()), (503, ""));
}

#[test]
fn ready_directly_and_through_envoy_once_envoy_is_live() {
    let ports = Ports::new();
    let _agent = Agent::builder().on(&ports).start();
    let _envoy = start_envoy(&bootstrap(&ports));

    // Time from Envoy's own /ready saying LIVE to the agent saying 200.
    let live_at = {
        let (s, _) = wait_for("Envoy /ready LIVE", Duration::from_secs(30), || {
            match ports.admin_get("/ready") {
                Ok((200, body)) if body.trim() == "LIVE" => Ok((200, body)),
                other => Err(other),
            }
        });
        assert_eq!(s, 200);
        Instant::now()
    };
    let body = wait_status(ports.agent.addr(), "/healthz/ready", 200, Duration::from_secs(5));
    eprintln!("agent ready {:?} after Envoy /ready said LIVE", live_at.elapsed());
    assert_eq!(body, "ready\n");

    // The kubelet's path: Envoy's status listener forwards to the agent.
    let body = wait_status(
        ports.status_listener.addr(),
        "/healthz/ready",
        200,
        Duration::from_secs(5),
    );
    assert_eq!(body, "ready\n");
}

#[test]
fn names_the_missing_xds_update_while_the_xds_server_never_answers() {
    let admin = port();
    let agent = port();
    // An xDS server that accepts connections and never says a word.
    let xds = port();
    let silent = TcpListener::bind(xds.addr()).unwrap();
    let bootstrap = format!(
        r#"
node: {{ id: sidecar, cluster: app }}
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }}
dynamic_resources:
  cds_config: {{ ads: {{}}, resource_api_version: V3 }}
  lds_config: {{ ads: {{}}, resource_api_version: V3 }}
  ads_config:
    api_type: GRPC
    transport_api_version: V3
    grpc_services: [ {{ envoy_grpc: {{ cluster_name: xds }} }} ]
static_resources:
  clusters:
  - name: xds
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    load_assignment:
      cluster_name: xds
      endpoints: [ {{ lb_endpoints: [ {{ endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {xds} }} }} }} }} ] }} ]
"#,
        admin = admin.port,
        xds = xds.port
    );
    let envoy = start_envoy(&bootstrap);
    let _agent = Agent::builder()
        .status(agent.addr())
        .admin_url(format!("http://127.0.0.1:{}", admin.port))
        .spawn();

    // Once Envoy answers its admin API, the reason names the missing update.
    let body = wait_for("a reason naming the CDS update", Duration::from_secs(20), || match get(
        agent.addr(),
        "/healthz/ready",
    ) {
        Ok((503, body)) if body.contains("first CDS") => Ok(body),
        other => Err(other),
    });
    assert!(body.starts_with("not ready: "), "{body:?}");
    drop(envoy);
    drop(silent);
}

#[test]
fn turns_not_ready_within_the_staleness_bound_when_envoy_is_killed() {
    let ports = Ports::new();
    // Bound: 3 poll intervals + the admin timeout = 3 * 200ms + 200ms.
    let _agent = Agent::builder()
        .on(&ports)
        .args(&["--poll-interval", "200ms", "--admin-timeout", "200ms"])
        .start();
    let mut envoy = start_envoy(&bootstrap(&ports));
    wait_status(ports.agent.addr(), "/healthz/ready", 200, Duration::from_secs(30));

    envoy.kill();
    let killed = Instant::now();
    let bound = Duration::from_millis(800);
    // The bound with a generous margin for a busy machine; the figure is
    // printed.
    let body = wait_status(
        ports.agent.addr(),
        "/healthz/ready",
        503,
        bound + Duration::from_secs(2),
    );
    eprintln!("agent said 503 {:?} after Envoy was killed", killed.elapsed());
    assert!(body.contains("cannot connect to Envoy admin"), "{body:?}");
}
