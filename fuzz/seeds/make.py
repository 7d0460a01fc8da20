#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (fuzz/seeds/<target>/) from the
real inputs: the repository's config files (config/k8s/*.yaml,
config/lifeguard.toml), the test fixtures (tests/fixtures/), and the
literals of the unit and integration tests, in each target's input form
(see the target's doc). Inputs that found a bug (`found-*` files) are kept
as they were found; this script leaves them alone.

Run from anywhere: python3 fuzz/seeds/make.py
"""
import json
import os
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEEDS = ROOT / "fuzz" / "seeds"


def put(target, name, data):
    d = SEEDS / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / name).write_bytes(data)


def nul(*fields):
    return b"\0".join(f.encode() if isinstance(f, str) else f for f in fields)


# ---- Envoy's /stats (as in /work/shared/ENVOY-FACTS.md and src/envoy/*.rs tests)
LIVE = "listener_manager.workers_started: 1\nserver.state: 0\n"
ACTIVE = """http.admin.downstream_cx_active: 1
http.admin.downstream_rq_active: 1
http.inbound_http.downstream_cx_active: 1
http.inbound_http.downstream_rq_active: 1
http.status.downstream_cx_active: 1
http.status.downstream_rq_active: 0
listener.0.0.0.0_15021.downstream_cx_active: 1
listener.0.0.0.0_15021.worker_0.downstream_cx_active: 1
listener.127.0.0.1_15006.downstream_cx_active: 1
listener.127.0.0.1_15006.worker_0.downstream_cx_active: 1
listener.admin.downstream_cx_active: 1
listener.admin.main_thread.downstream_cx_active: 1
"""
STATS = {
    "live": LIVE,
    "empty": "",
    "initializing": "server.state: 2\n",
    "active": ACTIVE,
    "xds": LIVE + "cluster_manager.cds.update_attempt: 3\nlistener_manager.lds.update_attempt: 1\n"
    "cluster_manager.cds.update_success: 1\nlistener_manager.lds.update_rejected: 2\n",
    "ipv6": "listener.[__1]_15006.downstream_cx_active: 2\nlistener.[__1]_15006.worker_1.downstream_cx_active: 2\n"
    "listener.[__]_15021.downstream_cx_active: 5\nlistener.envoy_internal_inner.downstream_cx_active: 1\n"
    "http.inner.downstream_cx_active: 0\nlistener.127.0.0.1_15001.downstream_cx_active: 1\n",
    "wrapped": "listener.127.0.0.1_15006.downstream_cx_active: 18446744073709551615\n"
    "http.inbound_http.downstream_rq_active: zero\nserver.state: banana\n",
    "histogram": "cluster.x.upstream_rq_time: P0(nan,0) P25(nan,1)\n  server.state :   3  \r\n",
    "ready": "LIVE",
    "server_info": '{"version":"3a6b5e2c/1.40.0/Clean/RELEASE/BoringSSL","state":"LIVE","hot_restart_version":"11.104"}',
    "server_info_dev": '{"version":"0000/1.41.0-dev/Modified/DEBUG/BoringSSL"}',
}
for name, body in STATS.items():
    put("envoy_stats", name, body)

# ---- The app's metrics (tests/app_metrics.rs, crates/scrape/src/app/lines.rs)
TEXT_APP = ("# HELP app_requests_total Requests served.\n# TYPE app_requests_total counter\n"
            "app_requests_total{code=\"200\"} 7\n# HELP envoy_server_state A copy of Envoy's.\n"
            "# TYPE envoy_server_state gauge\nenvoy_server_state 42\n# HELP process_open_fds The app's.\n"
            "# TYPE process_open_fds gauge\nprocess_open_fds 99\n")
OM_APP = ("# HELP om_jobs Jobs run.\n# TYPE om_jobs counter\n# UNIT om_jobs jobs\n"
          "om_jobs_total{kind=\"a\"} 3 # {trace_id=\"abc\"} 1.0 1700000000.000\n"
          "# HELP om_temp_celsius Temperature.\n# TYPE om_temp_celsius gauge\nom_temp_celsius 21.5\n# EOF\n")
OM_MIX = ("# HELP req Requests.\n# TYPE req counter\n# UNIT req_seconds seconds\n"
          "req_total{a=\"x y}\"} 3 # {trace_id=\"1\"} 1 1.7e9\nreq_created 1.7e9\n# TYPE up_info info\n"
          "up_info{v=\"1\"} 1 1700000000.5\n\n# EOF\n")
TEXT_MIX = "# a comment\n# TYPE x untyped\nx 1 1700000000000\n\ny{l=\"v\"} 2\n"
ENVOY_PROM = ("# TYPE envoy_server_state gauge\nenvoy_server_state{} 0\n"
              "# TYPE envoy_cluster_upstream_rq counter\nenvoy_cluster_upstream_rq{envoy_response_code=\"200\",envoy_cluster_name=\"app\"} 12\n"
              "# TYPE envoy_cluster_upstream_rq_time histogram\nenvoy_cluster_upstream_rq_time_bucket{le=\"0.5\"} 3\n"
              "envoy_cluster_upstream_rq_time_sum 1.5\nenvoy_cluster_upstream_rq_time_count 3\n")
OURS = "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 9\n# TYPE lifeguard_ready gauge\nlifeguard_ready 1\n"
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
ACCEPTS = [PROMETHEUS_ACCEPT, "application/openmetrics-text;version=1.0.0",
           "application/openmetrics-text; version=0.0.1\ntext/plain;q=0", "text/plain;version=0.0.4", ""]
# flags: from = f % 3, to = f / 3 % 3 (text, OpenMetrics 1.0.0, 0.0.1), pieces = f >> 4.
for i, (from_to, app) in enumerate([(0, TEXT_APP), (1, OM_APP), (3 + 1, OM_APP), (3, TEXT_MIX),
                                    (1, OM_MIX), (0x20, TEXT_MIX), (0x31, OM_MIX)]):
    put("metrics_lines", f"app{i}", bytes([from_to]) + nul(ACCEPTS[i % len(ACCEPTS)], ENVOY_PROM + OURS, app))

# flags: gzip 1, accept (0: the field, 1 text, 2 OM 1.0.0, 3 OM 0.0.1) << 1, apps << 3,
# Envoy missing 0x20, first app failing 0x40; then a chunk size - 1.
for i, (flags, chunk, accept, envoy, apps) in enumerate([
    (0b00_00_0, 255, PROMETHEUS_ACCEPT, ENVOY_PROM, []),
    (0b01_00_1, 7, PROMETHEUS_ACCEPT, ENVOY_PROM, [("text/plain; version=0.0.4", TEXT_APP)]),
    (0b10_10_0, 3, "", ENVOY_PROM, [("text/plain", TEXT_APP), ("application/openmetrics-text; version=1.0.0", OM_APP)]),
    (0b10_11_1, 0, "", ENVOY_PROM.rstrip("\n"), [("application/openmetrics-text", OM_MIX), ("", TEXT_MIX)]),
    (0x20 | 0b01_01_0, 31, "", "", [("application/openmetrics-text; version=0.0.1", OM_APP)]),
    (0x40 | 0b01_00_0, 15, ACCEPTS[2], ENVOY_PROM, [("text/plain", TEXT_APP)]),
]):
    fields = [accept, envoy] + [x for ct_body in apps for x in ct_body]
    put("merged_scrape", f"scrape{i}", bytes([flags, chunk]) + nul(*fields))

# ---- gRPC health (src/status/app_probe/grpc.rs tests): flags, grpc-status, grpc-message, body.
def frame(msg):
    return b"\0" + struct.pack(">I", len(msg)) + msg
for i, (flags, status, message, body) in enumerate([
    (0, "0", "", frame(b"\x08\x01")), (0, "0", "", frame(b"\x08\x02")), (0, "0", "", frame(b"")),
    (2, "5", "unknown service", b""), (1, "0", "", frame(b"\x12\x03abc\x08\x03")), (4, "0", "", frame(b"\x08")),
    (0, "14", "upstream connect error", b""), (0, "0", "", b"\x01\x00\x00\x00\x02\x08\x01"),
]):
    put("grpc_health", f"answer{i}", bytes([flags]) + nul(status, message, body))

# ---- An app probe's answer (tests/app_probes.rs): flags (h2 1, https 2), write size,
# kubelet headers, probe headers, path, Location, the app's raw answer.
KUBELET = "host: 10.0.0.5:15020\nuser-agent: kube-probe/1.34\naccept: */*\nconnection: close\n"
PROBE = "X-Probe: from-spec\n"
H1 = [
    "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
    "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n4\r\nbusy\r\n0\r\n\r\n",
    "HTTP/1.1 302 Found\r\nlocation: /b?x=1\r\ncontent-length: 0\r\n\r\n",
    "HTTP/1.1 301 Moved\r\nlocation: https://10.0.0.5:8443/c\r\n\r\n",
    "HTTP/1.1 200 OK\r\n\r\nbody until the app closes",
    "HTTP/1.0 204 No Content\r\n\r\n",
]
for i, raw in enumerate(H1):
    put("app_probe_answer", f"h1-{i}", bytes([0, 255]) + nul(KUBELET, PROBE, "/ready", "http://example.com/", raw))
# HTTP/2: the server's SETTINGS, its ACK of the client's, HEADERS (:status 200, or 302 and a
# location) and DATA on stream 1, as a server would write them.
def h2frame(kind, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload
SETTINGS = h2frame(4, 0, 0, b"") + h2frame(4, 1, 0, b"")
OK_H2 = SETTINGS + h2frame(1, 4, 1, b"\x88") + h2frame(0, 1, 1, b"ok")
loc = b"/moved"
REDIRECT_H2 = SETTINGS + h2frame(1, 5, 1, b"\x08\x03302" + b"\x0f\x1f" + bytes([len(loc)]) + loc)
put("app_probe_answer", "h2-0", bytes([3, 255]) + nul(KUBELET, PROBE, "/ready", "/x", OK_H2))
put("app_probe_answer", "h2-1", bytes([3, 8]) + nul(KUBELET, "", "live", "//example.com/", REDIRECT_H2))

# ---- ISTIO_KUBE_APP_PROBERS (config/k8s/app-probes.injected.yaml, spec.rs tests, tests/app_probes.rs)
INJECTED = (ROOT / "config/k8s/app-probes.injected.yaml").read_text()
probers = [line.split("value: '", 1)[1].rstrip("'") for line in INJECTED.splitlines() if "value: '{\"/app-" in line]
probers += [
    '{"/app-health/hello/livez":{"httpGet":{"path":"live","port":8080,"scheme":"HTTPS",'
    '"httpHeaders":[{"name":"X-A","value":"b"}]},"timeoutSeconds":3},'
    '"/app-health/hello/readyz":{"tcpSocket":{"port":"3333"}},'
    '"/app-health/grpc/livez":{"grpc":{"port":7070,"service":"x"},"timeoutSeconds":2,"periodSeconds":5}}',
    '{"/app-lifecycle/a/prestopz":{"httpGet":{"port":"http"}}}',
    '{"/app-health/a/readyz":{"tcpSocket":{"port":70000}}}',
    '{"/app-health/a/readyz":{"httpGet":{"port":1,"scheme":"FTP"}}}',
    '{"/app-health/a/livez":{"tcpSocket":{"port":1},"grpc":{"port":2}}}',
    '{"/healthz/x":{"tcpSocket":{"port":1}}}',
    '["x"]',
    "",
]
for i, text in enumerate(probers):
    put("app_probers", f"probers{i}", text)

# ---- ISTIO_PROMETHEUS_ANNOTATIONS (istio/annotations.rs tests, tests/app_metrics.rs)
for i, text in enumerate([
    '{"scrape":"true","path":"/metrics","port":"8080"}',
    '{"scrape":"true","port":"8080","targets":[{"port":"8080","path":"/metrics"},{"port":"9090","path":"/q"}]}',
    '{"scrape":"true"}', '{"port":9100}', '{"scrape":"false","port":"8080"}', '{"port":"15020"}',
    '{"targets":[{"port":"8080"},{"port":"15006"}]}', '{"port":"http"}', '{"port":"8080","path":"/m x"}',
    '{"port":', "true", "",
]):
    put("prometheus_annotations", f"annotations{i}", text)

# ---- PROXY_CONFIG (tests/fixtures/istio-proxy-config.txt, config/proxy_config.rs tests, tests/proxy_config.rs)
fixture = [l for l in (ROOT / "tests/fixtures/istio-proxy-config.txt").read_text().splitlines()
           if l and not l.startswith("#")]
PROXY = fixture + [
    '{"terminationDrainDuration":"30s","drainDuration":"23s","statusPort":15120,"proxyAdminPort":"15100",'
    '"discoveryAddress":"istiod:15012","proxyMetadata":{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS":"true",'
    '"LIFEGUARD_IGNORE_APP_PORTS":"9000,9001","MINIMUM_DRAIN_DURATION":"10s","FOO":"bar"}}',
    "terminationDrainDuration: 45s\nholdApplicationUntilProxyStarts: true\n",
    '{"proxyMetadata":{"LIFEGUARD_DRAIN_DELAY":"1s","LIFEGUARD_READINESS_FAIL_DELAY":"2s",'
    '"TERMINATION_GRACE_PERIOD":"60","LIFEGUARD_SHUTDOWN_MARGIN":"5s","LIFEGUARD_LOOPBACK_CONTROL":"false"}}',
    '{"statusPort":70000}', '{"terminationDrainDuration":{"seconds":3}}',
    '{"proxyMetadata":{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS":"maybe"}}', "{not json", "[1, 2]",
]
for i, text in enumerate(PROXY):
    put("proxy_config", f"proxy{i}", text)

# ---- The settings file (config/lifeguard.toml, config/mod.rs tests)
TOML = (ROOT / "config/lifeguard.toml").read_text()
for i, (text, proxy) in enumerate([
    (TOML, ""),
    ('termination_grace_period = "45"\ndrain_until = "requests"\nignore_app_ports = [9000, 9001]\n', ""),
    ('poll_interval = "5ms"\n', ""),
    ('nope = 1\n', ""),
    ('drain_delay = "1s"\nreadiness_fail_delay = "1s"\n', ""),
    ('app_metrics = \'{"port":"8080"}\'\nstatus_addr = "0.0.0.0:8080"\n', ""),
    ('loopback_control = false\n', '{"proxyMetadata":{"LIFEGUARD_CONTROL_SOCKET":"/run/lg.sock"}}'),
    ('termination_drain_duration = "30s"\n', PROXY[-8]),
    ("admin_url = 'unix:///var/run/lifeguard/admin.sock'\n", '{"proxyAdminPort":15100}'),
    ('log = "debug"\n[envoy]\npoll_interval = "2s"\n[drain]\ndrain_scope = "all"\n', ""),
    ('drain.shutdown_margin = "50ms"\nenvoy.poll_interval = "5x"\n', ""),
    ('[drain]\npoll_interval = "2s"\n', ""),
    # The drain wait's keys under their old names, read as the new ones.
    ('drain_wait_app_time = "3s"\n[drain_wait]\ndrain_wait_checker_timeout = "9s"\napp_time = "1s"\n', ""),
    ('poll_interval = "1s"\n[envoy]\npoll_interval = "2s"\n', ""),
    ('drain = "5s"\n', '{"terminationDrainDuration":"30s"}'),
]):
    put("settings_toml", f"settings{i}", nul(text, proxy))

# ---- Envoy's inbound listeners (envoy/inbound.rs tests, captured from Envoy 1.40): flags (the all scope 1,
# ports 15021 and 15090 ignored 2), the masked /config_dump answer, the counts' /stats answer.
INBOUND_STATS = """listener.0.0.0.0_15006.downstream_cx_total: 3
listener.0.0.0.0_15006.http.inbound_http.downstream_rq_completed: 3
listener.0.0.0.0_15006.worker_0.downstream_cx_total: 3
listener.0.0.0.0_15021.downstream_cx_total: 40
listener.0.0.0.0_15021.http.status.downstream_rq_completed: 41
listener.127.0.0.1_15001.downstream_cx_total: 9
listener.admin.downstream_cx_total: 1
listener.admin.http.admin.downstream_rq_completed: 1
listener.admin.main_thread.downstream_cx_total: 1
"""
STATIC_DUMP = """{"configs":[
 {"@type":"type.googleapis.com/envoy.admin.v3.ListenersConfigDump.StaticListener",
  "listener":{"name":"status","address":{"socket_address":{"address":"0.0.0.0","port_value":15021}}}},
 {"@type":"type.googleapis.com/envoy.admin.v3.ListenersConfigDump.StaticListener",
  "listener":{"name":"outbound","address":{"socket_address":{"address":"127.0.0.1","port_value":15001}},"traffic_direction":"OUTBOUND"}},
 {"@type":"type.googleapis.com/envoy.admin.v3.ListenersConfigDump.StaticListener",
  "listener":{"name":"inbound","address":{"socket_address":{"address":"0.0.0.0","port_value":15006}},"traffic_direction":"INBOUND"}}]}"""
DYNAMIC_DUMP = """{"configs":[
  {"name":"virtualInbound","active_state":{"listener":{"name":"virtualInbound",
    "address":{"socket_address":{"address":"::","port_value":15006}},"traffic_direction":"INBOUND"}}},
  {"name":"v6","active_state":{"listener":{"name":"v6",
    "address":{"socket_address":{"address":"::1","port_value":8443}},"traffic_direction":"INBOUND"}}},
  {"name":"tagged","active_state":{"listener":{"name":"tagged","stat_prefix":"web",
    "address":{"socket_address":{"address":"0.0.0.0","port_value":80}},"traffic_direction":"INBOUND"}}},
  {"name":"inner","active_state":{"listener":{"name":"inner",
    "address":{"envoy_internal_address":{"server_listener_name":"inner"}},"traffic_direction":"INBOUND"}}},
  {"name":"warming-only","warming_state":{}}]}"""
DYNAMIC_STATS = "listener.[__]_15006.downstream_cx_total: 2\nlistener.web.http.web.downstream_rq_completed: 5\n"
for i, (flags, dump, stats) in enumerate([(2, STATIC_DUMP, INBOUND_STATS), (3, STATIC_DUMP, INBOUND_STATS),
                                          (0, DYNAMIC_DUMP, DYNAMIC_STATS), (1, DYNAMIC_DUMP, INBOUND_STATS),
                                          (2, "{}", INBOUND_STATS), (0, '{"configs":3}', ""), (2, "not json", "")]):
    put("inbound", f"inbound{i}", bytes([flags]) + nul(dump, stats))

# ---- Go durations (duration.rs tests): a setting, the text, a duration's bytes.
for i, text in enumerate(["500ms", "5s", "1m30s", "1h", "1.5s", ".5s", "0", "0s", "250us", "10ns", "1h2m3s4ms",
                          "8760h", "8760h1ns", "5", "-5s", "1..5s", "5 s", "µs", "30", "520.976182ms",
                          "18446744073709551615s", "1h340282366920938463463374607431768211455ns"]):
    put("go_duration", f"duration{i}", bytes([i % 4]) + nul(text, struct.pack("<QI", 90 + i * 3607, i * 1000)))

# ---- lifeguard inject (config/k8s/*.yaml, inject/mod.rs tests): flags (--proxy-container proxy 1,
# --status-port 15021 2, --drain-wait 4), the YAML.
for i, path in enumerate(sorted((ROOT / "config/k8s").glob("*.yaml"))):
    put("inject", path.stem, bytes([4 * (i % 2)]) + path.read_bytes())
POD = """apiVersion: v1
kind: Pod
metadata:
  name: web
  annotations:
    status.sidecar.istio.io/port: "15021"
    lifeguard.io/drain-wait: "true"
spec:
  containers:
  - name: proxy
    image: example/lifeguard-envoy:1
    command: ["/usr/local/bin/lifeguard", "run", "--status-addr", "0.0.0.0:15021", "--"]
    env:
    - name: PROXY_CONFIG
      value: '{"statusPort": 15021}'
  - name: app
    image: example/app
    ports:
    - name: http
      containerPort: 8080
    readinessProbe:
      httpGet: {path: /ready, port: http, scheme: HTTPS, httpHeaders: [{name: X-A, value: b}]}
      timeoutSeconds: 3
    livenessProbe: {tcpSocket: {port: 8080}}
    startupProbe: {grpc: {port: 7070, service: x}}
    lifecycle:
      preStop: {httpGet: {path: /stop, port: "8080"}}
      postStart: {exec: {command: ["true"]}}
"""
put("inject", "pod", b"\0" + POD.encode())
put("inject", "list", b"\x01" + ("apiVersion: v1\nkind: List\nitems:\n- " + POD.replace("\n", "\n  ").strip()).encode())
put("inject", "cronjob", b"\x02kind: CronJob\nmetadata: {name: c}\nspec:\n  jobTemplate:\n    spec:\n      template:\n"
    b"        metadata: {labels: {sidecar.istio.io/inject: \"true\"}}\n        spec:\n          initContainers:\n"
    b"          - {name: proxy, image: lifeguard, restartPolicy: Always}\n          containers:\n"
    b"          - {name: job, livenessProbe: {httpGet: {port: 15021}}}\n---\nkind: Service\nmetadata: {name: s}\n")

# ---- The status port (status/service.rs tests): flags (loopback control 1, control socket 2,
# peer << 2, via the control socket 0x10, ready 0x20), method, target, headers.
for i, (flags, method, target, headers) in enumerate([
    (0x21, "GET", "/healthz/ready", "host: 10.0.0.5:15021\nuser-agent: kube-probe/1.34\n"),
    (0x01, "HEAD", "/healthz/ready?x=1", ""),
    (0x09, "POST", "/drain", ""), (0x01, "POST", "/drain?nowait", ""), (0x10, "POST", "/quitquitquit", ""),
    (0x03, "GET", "/drain", "accept: application/json\n"), (0x01, "PUT", "/drain", ""),
    (0x21, "GET", "/stats/prometheus?usedonly", "accept: " + PROMETHEUS_ACCEPT + "\naccept-encoding: gzip\n"
     "x-prometheus-scrape-timeout-seconds: 10\n"),
    (0x21, "GET", "/metrics", "accept: application/openmetrics-text;version=1.0.0\n"),
    (0x21, "GET", "/app-health/app/readyz", "host: 10.0.0.5:15020\n"),
    (0x21, "GET", "/app-lifecycle/app/prestopz", ""), (0x00, "DELETE", "/nope", ""),
    (0x21, "GET", "http://10.0.0.5:15020/healthz/ready", ""),
    (0x21, "GET", "/healthz/ready", "user-agent: ELB-HealthChecker/2.0\nx-forwarded-for: 10.1.2.3, 10.0.0.9\n"),
    (0x29, "GET", "/healthz/ready", "user-agent: GoogleHC/1.0\n"),
    (0x01, "GET", "/drain/wait?timeout=10ms", ""), (0x01, "GET", "/drain/wait?timeout=soon", ""),
    (0x01, "HEAD", "/drain/wait", ""), (0x01, "POST", "/drain/wait", ""),
    (0x09, "GET", "/drain/stopped?timeout=10ms", ""), (0x01, "GET", "/drain/stopped?timeout=soon", ""),
    (0x01, "POST", "/drain/stopped", ""), (0x01, "POST", "/drain?prestop", ""),
]):
    put("status_routes", f"route{i}", bytes([flags]) + nul(method, target, headers))

# ---- Dictionaries (fuzz/dict/<target>.dict): the words each input is made of.
def dict_file(target, words):
    d = ROOT / "fuzz" / "dict"
    d.mkdir(exist_ok=True)
    lines = []
    for w in sorted(set(words)):
        b = w.encode() if isinstance(w, str) else w
        lines.append('"' + "".join(chr(c) if 0x20 <= c < 0x7f and c not in b'"\\' else f"\\x{c:02x}" for c in b) + '"')
    (d / f"{target}.dict").write_text("\n".join(lines) + "\n")

KEYS = [l.split(" =", 1)[0] for l in TOML.splitlines() if l and l[0].isalpha() and " = " in l]
# Old names still read (crates/config/src/sections.rs, RENAMED).
KEYS += ["drain_wait_" + k for k in ("unhealthy_threshold", "min_quiet_period", "checker_ranges", "checker_timeout", "app_time")]
SECTIONS = [l for l in TOML.splitlines() if l.startswith("[")]
ENVS = [w.strip(".") for l in TOML.splitlines() if l.startswith("# Env: ") for w in l[7:].split() if w.isupper()]
ISTIO = ["terminationDrainDuration", "drainDuration", "statusPort", "proxyAdminPort", "proxyMetadata",
         "holdApplicationUntilProxyStarts", "discoveryAddress"]
dict_file("envoy_stats", ["server.state", "listener_manager.workers_started", "cluster_manager.cds.update_",
                          "listener_manager.lds.update_", "attempt", "success", "rejected", "listener.", "http.",
                          ".downstream_cx_active", ".downstream_rq_active", "admin", "agent", "status", "stats",
                          "worker_", "main_thread", "envoy_internal_", "[__1]_", "[__]_", "0.0.0.0_", "_15021",
                          "_15090", "18446744073709551615", "9223372036854775808", ": ", "LIVE", "DRAINING",
                          '{"version":"', "/1.40.0/", "-dev", "Clean/RELEASE",
                          "PRE_INITIALIZING", "INITIALIZING"])
METRICS = ["# TYPE ", "# HELP ", "# UNIT ", "# EOF", "counter", "gauge", "histogram", "summary", "untyped", "unknown",
           "info", "stateset", "gaugehistogram", "_total", "_created", "_bucket", "_sum", "_count", "_gsum", "_gcount",
           "_info", "_max", "text/plain", "application/openmetrics-text", "version=1.0.0", "version=0.0.1",
           "version=0.0.4", ";q=0", ";q=0.5", "*/*", "application/*", "text/*", "envoy_server_state", "process_open_fds",
           "lifeguard_ready", "{", "}", '="', '\\"', " # {", "\t", "\r\n", " 1700000000000"]
dict_file("metrics_lines", METRICS)
dict_file("merged_scrape", METRICS + ["charset=utf-8", "; "])
PROBES = ["/app-health/", "/app-lifecycle/", "/livez", "/readyz", "/startupz", "/prestopz", "/poststartz", "httpGet",
          "tcpSocket", "grpc", "timeoutSeconds", "path", "port", "scheme", "HTTP", "HTTPS", "httpHeaders", "name",
          "value", "service", "host", "65535", "65536", "-1"]
dict_file("app_probers", PROBES + ['":', '{"', '"}', "[{", "}]"])
dict_file("prometheus_annotations", ["scrape", "port", "path", "targets", "true", "false", "15020", "15090", "/metrics",
                                     '":', '{"', '"}', "[{", "}]", "?", "%20", "`"])
dict_file("proxy_config", ISTIO + ENVS + ['":', '{"', '"}', ": ", "\n  ", "true", "false", "0s", "1s", "60", "none",
                                          "unix:///"])
dict_file("settings_toml", KEYS + SECTIONS + ISTIO + ENVS + [" = ", '"', "'", "[", "]", "\n", "true", "false", "0s", "5ms", "1s",
                                                  "60", "none", "auto", "app-exit", "requests", "connections", "time",
                                                  "inbound", "all", "json", "text", "unix:///", "http://127.0.0.1:"])
dict_file("inbound", ['{"configs":[', "]}", '"listener":{', '"active_state":{', '"name":', '"stat_prefix":',
                      '"address":{"socket_address":{"address":', '"port_value":', '"traffic_direction":"INBOUND"',
                      '"traffic_direction":"OUTBOUND"', '"envoy_internal_address":{"server_listener_name":', '"::"',
                      '"0.0.0.0"', "15021", "15090", "15006", "listener.", ".downstream_cx_total: ",
                      ".http.inbound_http.downstream_rq_completed: ", ".worker_0", ".main_thread", "admin", "[__]",
                      "envoy_internal_", "|", "(", ")", ".", "\\", "\x00"])
dict_file("go_duration", ["ns", "us", "\u00b5s", "\u03bcs", "ms", "s", "m", "h", ".", "8760h", "+", "-",
                          "99999999999999999999999", "0.000000001"])
dict_file("inject", ["kind: ", "Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "List",
                     "ReplicationController", "items", "spec", "template", "jobTemplate", "metadata", "annotations",
                     "labels", "containers", "initContainers", "readinessProbe", "livenessProbe", "startupProbe",
                     "lifecycle", "preStop", "postStart", "httpGet", "tcpSocket", "grpc", "exec", "port", "ports",
                     "containerPort", "name", "command", "args", "env", "image", "lifeguard", "/usr/local/bin/lifeguard",
                     "--status-addr", "--status-addr=", "LIFEGUARD_STATUS_ADDR", "PROXY_CONFIG", "statusPort",
                     "ISTIO_KUBE_APP_PROBERS", "sidecar.istio.io/inject", "sidecar.istio.io/rewriteAppHTTPProbers",
                     "status.sidecar.istio.io/port", "restartPolicy", "Always", "---\n", "timeoutSeconds",
                     "httpHeaders", "scheme", "HTTPS", "path", "value", "proxy", "15020", "15021", '"false"', "&a",
                     "lifeguard.io/drain-wait", "/drain/wait", "preStop",
                     "*a", "!!str", "? ", "- ", ": ", "{", "}", "[", "]"])
dict_file("status_routes", ["/drain/wait", "/drain/stopped", "?prestop", "prestop", "?timeout=", "10ms", "user-agent: ", "kube-probe/1.34",
                            "x-forwarded-for: ", "10.0.0.9", "::1", ", ",
                            "/healthz/ready", "/drain", "/quitquitquit", "/stats/prometheus", "/metrics",
                            "/app-health/app/readyz", "/app-lifecycle/", "/app-health/", "?nowait", "nowait", "GET",
                            "HEAD", "POST", "PUT", "accept: ", "accept-encoding: ", "gzip", "host: ",
                            "x-prometheus-scrape-timeout-seconds: ", "application/openmetrics-text", "text/plain",
                            "http://", "*"])
dict_file("app_probe_answer", ["HTTP/1.1 ", "HTTP/1.0 ", "200 OK", "302", "301", "204", "404", "location: ",
                               "content-length: ", "transfer-encoding: chunked", "\r\n", "\r\n\r\n",
                               "connection: close", "https://10.0.0.5", "http://10.0.0.5:8080", "//", "host: ",
                               ":15020", "te: ", "upgrade: ", "0\r\n\r\n", "PRI * HTTP/2.0"])
dict_file("grpc_health", ["0", "1", "2", "3", "5", "13", "16", "17", "4294967296", "\x08\x01", "\x08\x02", "\x12",
                          "\x00\x00\x00\x00\x02", "\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"])
