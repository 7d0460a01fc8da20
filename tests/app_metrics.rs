//! The app's own metrics in the merged scrape (`ISTIO_PROMETHEUS_ANNOTATIONS`),
//! against the real Envoy and fake apps, each answer checked by promtool,
//! and once by a real Prometheus scraping the agent.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use hyper::header::CONTENT_TYPE;

const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// `promtool check metrics` on `text`: it must parse (exit 0, or 3 for
/// lint findings); lint findings may name Envoy's and the apps' families
/// (an OpenMetrics counter read as text has no help of its own), never
/// lifeguard's.
fn promtool_parses(text: &str) {
    let (code, said) = promtool(text);
    assert!(
        code == 0 || code == 3,
        "promtool cannot parse the scrape ({code}):\n{said}"
    );
    for finding in said.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            !finding.starts_with("lifeguard_") && !finding.starts_with("process_"),
            "promtool finding: {finding}"
        );
    }
}

/// One scrape with `headers`: status, `content-type` and body (gunzipped
/// when it came gzipped).
fn scrape_with(addr: SocketAddr, headers: &[(&str, &str)]) -> (u16, String, String) {
    let answer = request(addr, "GET", "/stats/prometheus", headers, Duration::from_secs(30)).unwrap();
    let content_type = answer.header("content-type").unwrap_or_default().to_owned();
    (answer.status, content_type, answer.decoded())
}

/// A fake app serving `body` as `content_type` on `port`.
fn app(port: &Port, content_type: &'static str, body: String) -> TestServer {
    TestServer::start(port, move |_| {
        let mut answer = reply(200, body.clone());
        answer.headers_mut().insert(CONTENT_TYPE, content_type.parse().unwrap());
        async move { answer }
    })
}

const TEXT_APP: &str = "# HELP app_requests_total Requests served.\n# TYPE app_requests_total counter\napp_requests_total{code=\"200\"} 7\n# HELP envoy_server_state A copy of Envoy's.\n# TYPE envoy_server_state gauge\nenvoy_server_state 42\n# HELP process_open_fds The app's.\n# TYPE process_open_fds gauge\nprocess_open_fds 99\n";
const OM_APP: &str = "# HELP om_jobs Jobs run.\n# TYPE om_jobs counter\n# UNIT om_jobs jobs\nom_jobs_total{kind=\"a\"} 3 # {trace_id=\"abc\"} 1.0 1700000000.000\n# HELP om_temp_celsius Temperature.\n# TYPE om_temp_celsius gauge\nom_temp_celsius 21.5\n# EOF\n";

/// The line index of the first line starting with `prefix`.
fn first(body: &str, prefix: &str) -> usize {
    body.lines()
        .position(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix} in:\n{body}"))
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario, read top to bottom
fn a_text_app_and_an_openmetrics_app_come_last_in_every_format() {
    let ports = Ports::new();
    let om = port();
    let _text_app = app(&ports.app, "text/plain; version=0.0.4", TEXT_APP.into());
    let _om_app = app(
        &om,
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
        OM_APP.into(),
    );
    let _envoy = start_envoy(&bootstrap(&ports));
    let json = format!(
        r#"{{"scrape":"true","targets":[{{"port":"{}","path":"/metrics"}},{{"port":"{}","path":"/om"}}]}}"#,
        ports.app.port, om.port
    );
    let _agent = Agent::builder()
        .on(&ports)
        .args(&["--log", "info"])
        .env("ISTIO_PROMETHEUS_ANNOTATIONS", &json)
        .spawn();
    wait_status(ports.agent.addr(), "/healthz/ready", 200, Duration::from_secs(30));

    let protobuf_first = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.9,text/plain;version=0.0.4;q=0.3";
    for (accept, gzip) in [
        (PROMETHEUS_ACCEPT, "gzip"),
        (protobuf_first, "identity"),
        ("text/plain;version=0.0.4", "gzip"),
    ] {
        let (status, content_type, body) =
            scrape_with(ports.agent.addr(), &[("Accept", accept), ("Accept-Encoding", gzip)]);
        assert_eq!(status, 200);
        assert!(
            content_type.starts_with("text/plain; version=0.0.4"),
            "{accept}: {content_type}"
        );
        // Envoy's, lifeguard's, the text app's, the OpenMetrics app's.
        let order = [
            first(&body, "envoy_"),
            first(&body, "lifeguard_"),
            first(&body, "app_requests_total"),
            first(&body, "om_temp_celsius"),
        ];
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{accept}: order {order:?}");
        assert_eq!(sample(&body, "app_requests_total{code=\"200\"}"), Some(7.0));
        assert_eq!(
            sample(&body, "om_jobs_total{kind=\"a\"}"),
            Some(3.0),
            "the exemplar is dropped"
        );
        assert_eq!(sample(&body, "om_temp_celsius"), Some(21.5));
        // Envoy's and lifeguard's families are kept; the app's copies left out.
        assert_eq!(sample(&body, "envoy_server_state{}"), Some(0.0));
        assert_eq!(body.matches("# TYPE envoy_server_state ").count(), 1);
        assert_eq!(body.matches("# TYPE process_open_fds ").count(), 1);
        assert_ne!(sample(&body, "process_open_fds"), Some(99.0));
        assert!(!body.contains("# EOF") && !body.contains("# UNIT"), "{accept}");
        promtool_parses(&body);
    }

    // A client that takes only OpenMetrics: exactly one # EOF, at the end.
    let (status, content_type, body) = scrape_with(
        ports.agent.addr(),
        &[("Accept", "application/openmetrics-text;version=1.0.0")],
    );
    assert_eq!(status, 200);
    assert!(
        content_type.starts_with("application/openmetrics-text; version=1.0.0"),
        "{content_type}"
    );
    assert_eq!(body.matches("# EOF").count(), 1);
    assert!(
        body.ends_with("\n# EOF\n"),
        "{}",
        &body[body.len().saturating_sub(200)..]
    );
    assert!(
        !body.lines().any(|l| l.trim().is_empty()),
        "a blank line in OpenMetrics"
    );
    assert!(
        body.contains("# UNIT om_jobs jobs\n") && body.contains("om_jobs_total{kind=\"a\"} 3 # {trace_id=\"abc\"}")
    );
    assert_eq!(sample(&body, "app_requests_total{code=\"200\"}"), Some(7.0));
    assert!(first(&body, "lifeguard_") < first(&body, "app_requests_total"));
    // (promtool reads only the text format: an exemplar is a parse error
    // there, so this answer is checked by its shape above.)

    // A real Prometheus scraping the agent sees all three parts.
    // (ports.prometheus is Envoy's own 15090 listener: Prometheus gets its own.)
    let prometheus_port = port();
    let prometheus = Prometheus::start(&prometheus_port, ports.agent.addr());
    for query in [
        "up",
        "app_requests_total",
        "om_temp_celsius",
        "lifeguard_ready",
        "envoy_server_state",
    ] {
        let value = prometheus.wait_value(query);
        assert!(query != "up" || value == "1", "up = {value}");
    }
    let states = prometheus.query("envoy_server_state");
    assert!(
        !states.contains("\"42\""),
        "the app's copy of Envoy's family reached Prometheus: {states}"
    );
}

#[test]
fn failing_apps_leave_the_rest_of_the_scrape() {
    let ports = Ports::new();
    let (hang, broken, big) = (port(), port(), port());
    let _good = app(&ports.app, "text/plain; version=0.0.4", TEXT_APP.into());
    let _hang = TestServer::start(&hang, |_| async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        reply(200, "late_metric 1\n")
    });
    let _broken = TestServer::start(&broken, |_| async { reply(500, "oops\n") });
    let lines: String = (0..600_000).map(|i| format!("big_metric{{i=\"{i}\"}} {i}\n")).collect();
    assert!(lines.len() > 11 << 20);
    let _big = app(
        &big,
        "text/plain; version=0.0.4",
        format!("# TYPE big_metric gauge\n{lines}"),
    );
    let _envoy = start_envoy(&bootstrap(&ports));
    let json = format!(
        r#"{{"targets":[{{"port":"{}"}},{{"port":"{}","path":"/hang"}},{{"port":"{}"}},{{"port":"{}","path":"/big"}}]}}"#,
        ports.app.port, hang.port, broken.port, big.port
    );
    let _agent = Agent::builder().on(&ports).args(&["--app-metrics", &json]).start();
    wait_status(ports.agent.addr(), "/healthz/ready", 200, Duration::from_secs(30));

    let started = Instant::now();
    let (status, _, body) = scrape_with(
        ports.agent.addr(),
        &[
            ("Accept", PROMETHEUS_ACCEPT),
            ("X-Prometheus-Scrape-Timeout-Seconds", "3"),
        ],
    );
    let took = started.elapsed();
    assert_eq!(status, 200);
    // Every read stops at the budget (2.7 s), the hung app's too (it would
    // hold the scrape until the client's 30 s timeout); fitting the 10 MiB
    // that came into the answer comes after it: in a debug build on a busy
    // 2-core machine, up to 2 s seen. The figure is printed.
    println!("scrape with a hung, a failing and a 10 MiB app: {took:?}");
    assert!(took < Duration::from_secs(8), "the scrape took {took:?}");
    assert_eq!(sample(&body, "app_requests_total{code=\"200\"}"), Some(7.0));
    assert!(sample(&body, "lifeguard_ready").is_some() && sample(&body, "envoy_server_state{}").is_some());
    assert!(!body.contains("late_metric") && !body.contains("oops"));
    // The big app: cut at 10 MiB, after a whole line.
    let big_lines = body.lines().filter(|l| l.starts_with("big_metric{")).count();
    assert!(big_lines > 100_000 && big_lines < 600_000, "{big_lines}");
    assert!(body.ends_with('\n'));
    let last = body.lines().rev().find(|l| l.starts_with("big_metric{")).unwrap();
    let i: u64 = last.split('"').nth(1).unwrap().parse().unwrap();
    assert!(last.ends_with(&format!("\"}} {i}")), "cut mid-line: {last}");
    promtool_parses(&body);

    let (_, _, after) = scrape_with(ports.agent.addr(), &[]);
    let failures = |target: String, reason: &str| {
        sample(
            &after,
            &format!("lifeguard_scrape_app_incomplete_total{{reason=\"{reason}\",target=\"{target}\"}}"),
        )
        .or_else(|| {
            sample(
                &after,
                &format!("lifeguard_scrape_app_incomplete_total{{target=\"{target}\",reason=\"{reason}\"}}"),
            )
        })
        .unwrap_or(0.0)
    };
    assert!(
        failures(format!("{}/hang", hang.port), "timeout") >= 1.0,
        "{}",
        after
            .lines()
            .filter(|l| l.contains("app_incomplete"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(failures(format!("{}/metrics", broken.port), "error") >= 1.0);
    assert!(failures(format!("{}/big", big.port), "cap") >= 1.0);
    assert_eq!(failures(format!("{}/metrics", ports.app.port), "error"), 0.0);
    // Every source's failure, whatever the reason, in one family.
    let by_source = sample(&after, r#"lifeguard_scrape_failures_total{source="app"}"#).unwrap_or(0.0);
    assert!(by_source >= 3.0, "{by_source}");
}

#[test]
fn a_target_on_a_port_of_the_proxy_stops_start_up_naming_the_field() {
    let status = port();
    let status_addr = status.addr().to_string();
    let own = format!(r#"{{"port":"{}"}}"#, status.port);
    let (code, out) = run_lifeguard(&["check", "--status-addr", &status_addr, "--app-metrics", &own]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("invalid --app-metrics") && out.contains("status port"),
        "{out}"
    );
    for (json, says) in [
        (
            r#"{"scrape":"true","port":"15090","path":"/metrics"}"#,
            "invalid ISTIO_PROMETHEUS_ANNOTATIONS",
        ),
        (
            r#"{"targets":[{"port":"8080"},{"port":"15006"}]}"#,
            "targets[1].port: 15006",
        ),
        (r#"{"port":"15001"}"#, "15001"),
        (r#"{"port":"15000"}"#, "Envoy's admin"),
    ] {
        let out = Command::new(lifeguard_bin())
            .args(["run", "--status-addr", &status_addr])
            .env("ISTIO_PROMETHEUS_ANNOTATIONS", json)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{json}: {text}");
        assert!(text.contains(says), "{json}: {text}");
    }
    // `check` shows the setting and where it came from.
    let out = Command::new(lifeguard_bin())
        .args(["check"])
        .env(
            "ISTIO_PROMETHEUS_ANNOTATIONS",
            r#"{"scrape":"true","port":"8080","path":"/metrics"}"#,
        )
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.contains("app_metrics"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("8080") && line.contains("env"), "{line}");
    // scrape "false" is off, not an error.
    let (code, out) = run_lifeguard(&["check", "--app-metrics", r#"{"scrape":"false","port":"15020"}"#]);
    assert_eq!(code, 0, "{out}");
}

/// A real Prometheus (Debian's `prometheus`) scraping the agent every
/// second, on 127.0.0.1, with its own storage; stopped on drop.
struct Prometheus {
    addr: SocketAddr,
    _proc: Proc,
}

impl Prometheus {
    fn start(port: &Port, agent: SocketAddr) -> Prometheus {
        let dir = temp_dir("prometheus");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: pod\n    metrics_path: /stats/prometheus\n    static_configs:\n      - targets: ['{agent}']\n"
            ),
        )
        .unwrap();
        let mut cmd = Command::new("prometheus");
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={}", port.addr()))
            .arg("--log.level=warn");
        let proc = Proc::spawn("prometheus", cmd, dir);
        Prometheus {
            addr: port.addr(),
            _proc: proc,
        }
    }

    fn query(&self, q: &str) -> String {
        match get(self.addr, &format!("/api/v1/query?query={q}")) {
            Ok((200, body)) => body,
            other => format!("{other:?}"),
        }
    }

    /// The value of the first series `q` returns, once it returns one.
    fn wait_value(&self, q: &str) -> String {
        wait_for(&format!("Prometheus to have {q}"), Duration::from_secs(60), || {
            let body = self.query(q);
            let value = body
                .split("\"value\":[")
                .nth(1)
                .and_then(|v| v.split('"').nth(1))
                .map(str::to_owned);
            value.ok_or(body)
        })
    }
}
