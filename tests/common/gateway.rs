//! Ingress gateways' Envoy bootstraps, shaped the ways their users write
//! them, each routing its traffic listener ([`GATEWAY_PORT`]) to the pod's
//! peer service, outside the pod (a gateway's upstream is never in its
//! pod), and forwarding 15021 `/healthz/ready` to lifeguard:
//!
//! - [`Gateway::Shipped`]: `config/envoy-gateway.yaml` as shipped, its
//!   backend cluster pointed at the peer;
//! - [`Gateway::IstioShaped`]: as Istio's ingress gateway looks: its status
//!   listener does not forward the prober's address (every probe through
//!   Envoy is one checker, 127.0.0.1, told apart by `User-Agent`), its
//!   traffic listener named `0.0.0.0_8080` with the direction istiod gives
//!   a gateway's listeners (`OUTBOUND`) and the stat prefix
//!   `outbound_0.0.0.0_8080`, its cluster `outbound|8080||…`;
//! - [`Gateway::FileXds`]: the traffic listener and its cluster from a
//!   control plane (here files, LDS and CDS through `path_config_source`:
//!   dynamic listeners, as Contour and Envoy Gateway feed theirs), named as
//!   Contour names them;
//! - [`Gateway::EnvoyGatewayShaped`]: Envoy as Envoy Gateway 1.9 runs it,
//!   in a container of its own beside lifeguard's (the pod
//!   `config/k8s/envoy-gateway/envoyproxy.yaml` makes): admin on
//!   127.0.0.1:19000, Prometheus stats on 19001, and from xDS (files here)
//!   the ready listener on 19003 (Envoy's `health_check` filter on
//!   `/ready`) and the traffic listener, named and prefixed as Envoy
//!   Gateway names them. No status listener: the kubelet and the load
//!   balancer probe lifeguard's status port, 19002 ([`EG_STATUS`]).

use std::net::Ipv4Addr;
use std::path::Path;

/// The gateway's traffic port (Istio's ingress gateway's, 8080).
pub const GATEWAY_PORT: u16 = 8080;
/// Envoy Gateway's admin port.
pub const EG_ADMIN: u16 = 19000;
/// lifeguard's status port in Envoy Gateway's pods (the shutdown manager's).
pub const EG_STATUS: u16 = 19002;

/// A gateway's bootstrap, by shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gateway {
    Shipped,
    /// The shipped bootstrap, its traffic listener as it could have been
    /// (the benchmark of what a drain does to kept-alive clients).
    ShippedWith(TrafficListener),
    IstioShaped,
    FileXds,
    EnvoyGatewayShaped,
}

impl Gateway {
    /// Whether Envoy runs in a container of its own beside lifeguard's
    /// (lifeguard looks after it over its admin), not as lifeguard's child.
    pub fn envoy_beside(self) -> bool {
        self == Gateway::EnvoyGatewayShaped
    }
}

/// The shipped traffic listener's alternatives: what it would do with its
/// kept-alive clients from the drain's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrafficListener {
    /// The default drain type (no `drain_type: MODIFY_ONLY`): the
    /// `/healthcheck/fail` that fails the load balancers' checks of its
    /// `health_check` filter also makes Envoy close every kept-alive
    /// connection at its next response from the drain's start.
    DefaultDrainType,
    /// No `health_check` filter (and the default drain type): nothing
    /// makes Envoy fail checks of the traffic port, nor close anything,
    /// before `drain_listeners`.
    NoHealthCheckFilter,
}

/// The bootstrap of a `kind` gateway whose upstream is at `peer:port`;
/// files it needs besides (LDS, CDS) are written to `dir`.
pub fn gateway_bootstrap(kind: Gateway, peer: Ipv4Addr, port: u16, dir: &Path) -> String {
    match kind {
        Gateway::Shipped => shipped(peer, port),
        Gateway::ShippedWith(listener) => shipped_with(listener, peer, port),
        Gateway::IstioShaped => istio_shaped(peer, port),
        Gateway::FileXds => file_xds(peer, port, dir),
        Gateway::EnvoyGatewayShaped => envoy_gateway(peer, port, dir),
    }
}

/// config/envoy-gateway.yaml, its backend the peer.
fn shipped(peer: Ipv4Addr, port: u16) -> String {
    let text = std::fs::read_to_string(crate::root().join("config/envoy-gateway.yaml")).unwrap();
    let backend = "socket_address: { address: backend.default.svc.cluster.local, port_value: 80 }";
    assert!(text.contains(backend), "config/envoy-gateway.yaml's backend changed");
    let out = text
        .replace(
            backend,
            &format!("socket_address: {{ address: {peer}, port_value: {port} }}"),
        )
        .replace("type: STRICT_DNS", "type: STATIC");
    assert!(!out.contains("STRICT_DNS"));
    out
}

/// config/envoy-gateway.yaml, its traffic listener changed to `listener`.
fn shipped_with(listener: TrafficListener, peer: Ipv4Addr, port: u16) -> String {
    let text = shipped(peer, port);
    let drain_type = "\n    drain_type: MODIFY_ONLY\n";
    assert!(
        text.contains(drain_type),
        "config/envoy-gateway.yaml's drain type changed"
    );
    let text = text.replacen(drain_type, "\n", 1);
    match listener {
        TrafficListener::DefaultDrainType => text,
        TrafficListener::NoHealthCheckFilter => {
            let start = text
                .find("          - name: envoy.filters.http.health_check")
                .expect("config/envoy-gateway.yaml's health_check filter");
            let end = start
                + text[start..]
                    .find("          - name: envoy.filters.http.router")
                    .expect("the router after the health_check filter");
            format!("{}{}", &text[..start], &text[end..])
        }
    }
}

const HCM: &str = "envoy.filters.network.http_connection_manager
        typed_config:
          \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";

const ROUTER: &str = "
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";

/// The readiness listener on 15021 and the `agent` cluster, as Istio's
/// bootstrap has them (its listener's stat prefix `agent`); with
/// `forward_peer`, appending the prober's address to `x-forwarded-for`.
fn status_listener(forward_peer: bool) -> String {
    let forward = if forward_peer {
        "\n          use_remote_address: true"
    } else {
        ""
    };
    format!(
        r#"
  - name: status
    address: {{ socket_address: {{ address: 0.0.0.0, port_value: 15021 }} }}
    filter_chains:
    - filters:
      - name: {HCM}
          stat_prefix: agent
          codec_type: AUTO{forward}
          route_config:
            virtual_hosts:
            - name: agent
              domains: ["*"]
              routes:
              - match: {{ prefix: /healthz/ready }}
                route: {{ cluster: agent, timeout: 3s }}{ROUTER}
"#
    )
}

const AGENT_CLUSTER: &str = r#"
  - name: agent
    type: STATIC
    connect_timeout: 0.25s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        common_http_protocol_options: { idle_timeout: 4s }
        explicit_http_config: { http_protocol_options: {} }
    load_assignment:
      cluster_name: agent
      endpoints:
      - lb_endpoints:
        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 15020 } } }
"#;

/// A STATIC cluster `name` of one endpoint.
fn cluster(name: &str, peer: Ipv4Addr, port: u16, indent: &str) -> String {
    let text = format!(
        r#"- name: "{name}"
  type: STATIC
  connect_timeout: 1s
  load_assignment:
    cluster_name: "{name}"
    endpoints:
    - lb_endpoints:
      - endpoint: {{ address: {{ socket_address: {{ address: {peer}, port_value: {port} }} }} }}
"#
    );
    text.lines().map(|l| format!("{indent}{l}\n")).collect()
}

/// The traffic listener: `name`, its direction, its stat prefix, routing
/// everything to `cluster`.
fn traffic_listener(name: &str, direction: Option<&str>, stat_prefix: &str, cluster: &str) -> String {
    let direction = direction.map_or(String::new(), |d| format!("\n    traffic_direction: {d}"));
    format!(
        r#"
  - name: "{name}"{direction}
    address: {{ socket_address: {{ address: 0.0.0.0, port_value: {GATEWAY_PORT} }} }}
    filter_chains:
    - filters:
      - name: {HCM}
          stat_prefix: "{stat_prefix}"
          codec_type: AUTO
          use_remote_address: true
          route_config:
            virtual_hosts:
            - name: backend
              domains: ["*"]
              routes:
              - match: {{ prefix: / }}
                route: {{ cluster: "{cluster}", timeout: 60s }}{ROUTER}
"#
    )
}

const ADMIN: &str = "admin:\n  address: { socket_address: { address: 127.0.0.1, port_value: 15000 } }\n";

/// Istio's ingress gateway, as its bootstrap and istiod's listeners shape it.
fn istio_shaped(peer: Ipv4Addr, port: u16) -> String {
    let cluster_name = "outbound|8080||backend.default.svc.cluster.local";
    format!(
        "node: {{ id: router~10.0.0.1~istio-ingressgateway.istio-system~istio-system.svc.cluster.local, cluster: istio-ingressgateway.istio-system }}\n\
         {ADMIN}static_resources:\n  listeners:{}{}  clusters:{AGENT_CLUSTER}{}",
        status_listener(false),
        traffic_listener("0.0.0.0_8080", Some("OUTBOUND"), "outbound_0.0.0.0_8080", cluster_name),
        cluster(cluster_name, peer, port, "  "),
    )
}

/// A gateway fed by a control plane: its listener and cluster from files.
fn file_xds(peer: Ipv4Addr, port: u16, dir: &Path) -> String {
    let cluster_name = "default/backend/8080";
    let listener = traffic_listener("ingress_http", None, "ingress_http", cluster_name);
    // The listener as an LDS resource: `- name:` becomes the resource.
    let resource = unindent(&listener).replacen(
        "\n- name:",
        "\n- \"@type\": type.googleapis.com/envoy.config.listener.v3.Listener\n  name:",
        1,
    );
    let lds = dir.join("lds.yaml");
    std::fs::write(&lds, format!("resources:{resource}")).unwrap();
    let cds = dir.join("cds.yaml");
    let cluster = cluster(cluster_name, peer, port, "").replacen(
        "- name:",
        "- \"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\n  name:",
        1,
    );
    std::fs::write(&cds, format!("resources:\n{cluster}")).unwrap();
    let source = |path: &Path| {
        format!(
            "{{ resource_api_version: V3, path_config_source: {{ path: {} }} }}",
            path.display()
        )
    };
    format!(
        "node: {{ id: envoy-gateway, cluster: contour }}\n{ADMIN}\
         dynamic_resources:\n  lds_config: {}\n  cds_config: {}\n\
         static_resources:\n  listeners:{}  clusters:{AGENT_CLUSTER}",
        source(&lds),
        source(&cds),
        status_listener(true),
    )
}

/// `text` two spaces to the left (a static listener's lines as a list of
/// resources).
fn unindent(text: &str) -> String {
    text.lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// Envoy as Envoy Gateway 1.9 configures it: its bootstrap's admin, stats
/// listener and overload manager; its ready and traffic listeners and the
/// route's cluster over xDS (here LDS and CDS files).
fn envoy_gateway(peer: Ipv4Addr, port: u16, dir: &Path) -> String {
    let cluster_name = "httproute/default/backend/rule/0";
    let resource = |kind: &str, text: &str| {
        text.replacen(
            "- name:",
            &format!(
                "- \"@type\": type.googleapis.com/envoy.config.{kind}.v3.{}\n  name:",
                capitalize(kind)
            ),
            1,
        )
    };
    let ready = unindent(&format!(
        r#"
  - name: envoy-gateway-proxy-ready-0.0.0.0-19003
    address: {{ socket_address: {{ address: 0.0.0.0, port_value: 19003 }} }}
    bypass_overload_manager: true
    filter_chains:
    - filters:
      - name: {HCM}
          stat_prefix: eg-ready-http
          route_config:
            name: ready_route
            virtual_hosts:
            - name: ready_route
              domains: ["*"]
              routes:
              - match: {{ prefix: / }}
                direct_response: {{ status: 500 }}
          http_filters:
          - name: envoy.filters.http.health_check
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.health_check.v3.HealthCheck
              pass_through_mode: false
              headers:
              - name: ":path"
                string_match: {{ exact: /ready }}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
              suppress_envoy_headers: true
"#
    ));
    let traffic = unindent(&traffic_listener("default/eg/http", None, "http-8080", cluster_name));
    let lds = dir.join("lds.yaml");
    std::fs::write(
        &lds,
        format!(
            "resources:\n{}{}",
            resource("listener", ready.trim_start_matches('\n')),
            resource("listener", traffic.trim_start_matches('\n'))
        ),
    )
    .unwrap();
    let cds = dir.join("cds.yaml");
    std::fs::write(
        &cds,
        format!(
            "resources:\n{}",
            resource("cluster", &cluster(cluster_name, peer, port, ""))
        ),
    )
    .unwrap();
    let source = |path: &Path| {
        format!(
            "{{ resource_api_version: V3, path_config_source: {{ path: {} }} }}",
            path.display()
        )
    };
    format!(
        r#"node: {{ id: envoy-default-eg-6b8d9c7f5-x2v4z, cluster: default/eg }}
admin:
  access_log:
  - name: envoy.access_loggers.file
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
      path: /dev/null
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {EG_ADMIN} }} }}
dynamic_resources:
  lds_config: {lds}
  cds_config: {cds}
static_resources:
  listeners:
  - name: envoy-gateway-proxy-stats-0.0.0.0-19001
    address: {{ socket_address: {{ address: 0.0.0.0, port_value: 19001, protocol: TCP }} }}
    bypass_overload_manager: true
    filter_chains:
    - filters:
      - name: {HCM}
          stat_prefix: eg-stats-http
          normalize_path: true
          route_config:
            name: local_route
            virtual_hosts:
            - name: prometheus_stats
              domains: ["*"]
              routes:
              - match:
                  path: /stats/prometheus
                  headers: [{{ name: ":method", string_match: {{ exact: GET }} }}]
                route: {{ cluster: prometheus_stats }}{ROUTER}
  clusters:
  - name: prometheus_stats
    connect_timeout: 0.250s
    type: STATIC
    load_assignment:
      cluster_name: prometheus_stats
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {EG_ADMIN} }} }} }}
overload_manager:
  refresh_interval: 0.25s
  resource_monitors:
  - name: envoy.resource_monitors.global_downstream_max_connections
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig
      max_active_downstream_connections: 50000
"#,
        lds = source(&lds),
        cds = source(&cds),
    )
}

fn capitalize(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}
