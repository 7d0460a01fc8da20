//! What config/ ships for the people who run lifeguard: the alerting rules
//! (promtool), the Grafana dashboard (names only metrics lifeguard
//! exports), the metric table of docs/operations.md, and the Kubernetes manifests
//! (validated against the Kubernetes API schemas).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use lifeguard::checkers::NotCountedReport;
use lifeguard::drain::DrainUntil;
use lifeguard::drain::{Kubelet, KubeletAnswer, NotServingBecause, Phase, Signal, Status, Trigger};
use lifeguard::drain_wait::budget::Budget;
use lifeguard::drain_wait::rule::{CheckerReport, CheckerState};
use lifeguard::drain_wait::{DrainWaitStatus, WaitState, WaitWhy};
use lifeguard::envoy::admin::{CallOutcome, Endpoint};
use lifeguard::envoy::poller::ReadinessEvents;
use lifeguard::envoy::readiness::{Readiness, Verdict};
use lifeguard::metrics::{CounterFamily, Metrics};
use lifeguard::status::app_probe::AppProbeResult;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs a tool the suite depends on; a missing tool fails the test, naming
/// how to install it (scripts/test does).
fn run(program: &str, install: &str, args: &[&str], dir: &Path) -> (bool, String) {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} ({e}): install it with `{install}` (scripts/test does)"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Every family lifeguard's scrape can hold, with every value present:
/// a drain stopped with work left, an admin call, a ready read.
#[allow(clippy::too_many_lines)] // one scenario, read top to bottom
fn exported() -> BTreeSet<String> {
    let metrics = Metrics::new(tokio::time::Instant::now());
    metrics.admin_call(Endpoint::Stats, CallOutcome::Ok, Duration::from_millis(1));
    metrics.envoy_read(true, true);
    metrics.envoy_read(true, false);
    // The families another crate's words name, as the status port and the
    // merged scrape register them when the agent starts.
    let path = [("path", "/app-health/web/readyz")];
    metrics.counters::<AppProbeResult>(CounterFamily::APP_PROBE_RESULTS, &path, |_| true);
    metrics.app_probe_duration("/app-health/web/readyz").record(0.01);
    let targets = lifeguard::istio::annotations::AppMetrics::parse(r#"{"scrape":"true","port":"8080"}"#).unwrap();
    let readiness = Readiness::standalone(Duration::from_secs(4));
    let _scraper = lifeguard::scrape::Scraper::builder(metrics.clone(), readiness)
        .app_metrics(&targets)
        .build();
    metrics.drain_wait(WaitWhy::Out, Duration::from_millis(1500));
    let readiness = Readiness::standalone(Duration::from_secs(4));
    readiness.store(Verdict::ready(tokio::time::Instant::now()));
    let mut status = Status::initial(DrainUntil::AppExit, String::new());
    status.phase = Phase::Stopped;
    status.trigger = Some(Trigger::Signal(Signal::Term));
    status.started_at = Some(1.8e9);
    status.deadline = Some(1.8e9 + 28.0);
    status.duration_seconds = Some(28.0);
    status.active_connections = Some(1);
    status.active_requests = Some(1);
    status.active_tcp = Some(0);
    status.app_sockets = Some(1);
    status.app_processes = Some(1);
    status.cut_by_deadline = true;
    status.left_at_stop = Some(2);
    status.kubelet = Some(Kubelet {
        answer: KubeletAnswer::FollowsEnvoy,
        serving_window_seconds: Some(31.0),
        not_serving_after_seconds: Some(27.5),
        not_serving_because: Some(NotServingBecause::EnvoyStopping),
        ready_probes: 5,
        not_ready_probes: 1,
        last_ready_after_seconds: Some(25.0),
    });
    let checker = CheckerReport {
        peer: "10.0.0.5".into(),
        user_agent: Some("ELB-HealthChecker/2.0".into()),
        forwarded: true,
        counted: true,
        state: CheckerState::Failed,
        probes: 9,
        interval_seconds: Some(30.0),
        failures_in_row: 2,
        unhealthy_threshold: 2,
        last_probe_seconds_ago: 1.0,
        done_after_seconds: Some(60.0),
    };
    let wait = DrainWaitStatus {
        state: WaitState::Out,
        unhealthy_threshold: 2,
        min_quiet_period_seconds: 0.5,
        checker_timeout_seconds: 20.0,
        bound_seconds: 23.0,
        requests_per_second_before_drain: Some(2.0),
        quiet_period_seconds: Some(3.45),
        sparse_traffic: None,
        inbound_listeners: None,
        envoy_health_checks: lifeguard::drain_wait::HealthChecks::Passing,
        checkers: vec![checker],
        probes_not_counted: NotCountedReport::default(),
        waiting_on: None,
        quiet_for_seconds: Some(3.5),
        conclusion: Some(lifeguard::drain::Conclusion::default()),
        took_seconds: Some(64.0),
        traffic_stopped_after_seconds: Some(60.2),
        last_checker_done_after_seconds: Some(60.0),
        budget: Some(Budget {
            fits: false,
            checker: "10.0.0.5 (ELB-HealthChecker/2.0)".into(),
            checker_takes_seconds: 60.0,
            needed_grace_period_seconds: 63.0,
            grace_period_seconds: 30.0,
            needed_checker_timeout_seconds: Some(60.0),
        }),
        began: None,
    };
    let text = metrics.render(&readiness, Some(&status), Some(&wait));
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split(' ');
        let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
        names.insert(name.to_owned());
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
    }
    names
}

/// Words that are never metric names: binary operators, modifiers, and the
/// aggregation operators (which may be followed by `by (...)` rather than
/// their parenthesis).
const KEYWORDS: [&str; 24] = [
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
];

/// The metric names a PromQL expression reads: identifiers that are not
/// functions, keywords, label names, durations, strings or `$variables`.
fn metric_names(expr: &str) -> Vec<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = Vec::new();
    let mut i = 0;
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut skip_list = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while i < chars.len() && chars[i] != close {
                    i += 1;
                }
                i += 1;
            }
            '(' if skip_list => {
                // The label list after by/without/on/ignoring/group_*.
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
                i += 1;
                skip_list = false;
            }
            '$' => {
                i += 1;
                while i < chars.len() && (ident(chars[i]) || chars[i] == '{' || chars[i] == '}') {
                    i += 1;
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                while i < chars.len() && (ident(chars[i]) || chars[i] == '.') {
                    i += 1;
                }
            }
            c if ident(c) => {
                let start = i;
                while i < chars.len() && ident(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let next = chars[i..].iter().find(|c| !c.is_whitespace());
                if ["by", "without", "on", "ignoring", "group_left", "group_right"].contains(&word.as_str()) {
                    skip_list = true;
                } else if next != Some(&'(') && !KEYWORDS.contains(&word.to_lowercase().as_str()) {
                    names.push(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

#[test]
fn the_metric_name_reader_reads_promql() {
    assert_eq!(
        metric_names(
            r#"histogram_quantile(0.99, sum by (le, endpoint) (rate(a_bucket{x=~"$ns",y!="b c"}[$__rate_interval]))) * on (pod) group_left () b or vector(0) > 2e3"#
        ),
        ["a_bucket", "b"]
    );
    assert_eq!(
        metric_names("(time() - c > 30) and ignoring (phase) (d{phase=\"serving\"} == 1)"),
        ["c", "d"]
    );
}

/// Every string under a key named `expr` (panel targets) in a JSON value.
fn exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

#[test]
fn the_dashboard_names_only_metrics_lifeguard_exports() {
    let exported = exported();
    let text = std::fs::read_to_string(root().join("config/grafana/lifeguard-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut found = Vec::new();
    exprs(&dashboard["panels"], &mut found);
    assert!(found.len() >= 15, "{} expressions", found.len());
    // Template variables read label values of a metric too.
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(q) = var["definition"].as_str() {
            let metric = q
                .strip_prefix("label_values(")
                .and_then(|r| r.split(',').next())
                .unwrap_or_else(|| panic!("unexpected variable query {q}"));
            found.push(metric.trim().to_owned());
        }
    }
    let mut used = BTreeSet::new();
    for expr in &found {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "no metric in {expr}");
        for name in names {
            assert!(
                exported.contains(&name),
                "the dashboard reads {name}, which lifeguard does not export ({expr})\nexported: {exported:?}"
            );
            used.insert(name);
        }
    }
    // The panels the issue asks for: phases, durations, cut drains, work
    // left at stop, probe answers.
    for needed in [
        "lifeguard_drain_phase",
        "lifeguard_drain_duration_seconds",
        "lifeguard_drain_cut_by_deadline",
        "lifeguard_drain_left_at_stop",
        "lifeguard_probe_responses_total",
    ] {
        assert!(used.contains(needed), "no panel reads {needed}");
    }
}

#[test]
fn alerting_rules_pass_promtool_and_their_unit_tests() {
    let dir = root().join("config/prometheus");
    let install = "apt-get install prometheus";
    let (ok, out) = run("promtool", install, &["check", "rules", "alerts.yaml"], &dir);
    assert!(ok, "promtool check rules:\n{out}");
    let (ok, out) = run("promtool", install, &["test", "rules", "alerts_test.yaml"], &dir);
    assert!(ok, "promtool test rules:\n{out}");
    assert!(out.contains("SUCCESS"), "{out}");

    // Each rule reads only metrics lifeguard exports, and each is tested.
    let exported = exported();
    let rules: serde_norway::Value =
        serde_norway::from_str(&std::fs::read_to_string(dir.join("alerts.yaml")).unwrap()).unwrap();
    let tests = std::fs::read_to_string(dir.join("alerts_test.yaml")).unwrap();
    for rule in rules["groups"][0]["rules"].as_sequence().unwrap() {
        let alert = rule["alert"].as_str().unwrap();
        let expr = rule["expr"].as_str().unwrap();
        for name in metric_names(expr) {
            assert!(exported.contains(&name), "{alert} reads {name}, not exported");
        }
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "{alert} has no promtool test"
        );
    }
}

#[test]
fn the_metric_table_lists_every_exported_family() {
    let ops = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    let table = ops
        .split("\n## Metrics\n")
        .nth(1)
        .expect("docs/operations.md has a Metrics section")
        .split("\n## ")
        .next()
        .unwrap();
    let listed: BTreeSet<String> = table
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split(['`', '{']).next())
        .map(str::to_owned)
        .collect();
    let exported: BTreeSet<String> = exported()
        .into_iter()
        .filter(|n| !n.ends_with("_bucket") && !n.ends_with("_sum") && !n.ends_with("_count"))
        .collect();
    let missing: Vec<_> = exported.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "the metric table (docs/operations.md) lacks {missing:?}"
    );
    let stale: Vec<_> = listed.difference(&exported).collect();
    assert!(
        stale.is_empty(),
        "the metric table (docs/operations.md) lists {stale:?}, which are not exported"
    );
}

#[test]
fn kubernetes_manifests_validate_against_the_api_schemas() {
    // 1.30: native sidecars (restartPolicy: Always on an init container)
    // are on by default from 1.29.
    let install = "pip install kubernetes-validate";
    // The gateway's kustomize base and overlays: tests/gateway_deploy.rs.
    let files = ["config/k8s/classic-sidecar.yaml", "config/k8s/native-sidecar.yaml"];
    // The app-probes example, and what `lifeguard inject` made of it.
    let probes = ["config/k8s/app-probes.yaml", "config/k8s/app-probes.injected.yaml"];
    let mut args = vec!["--strict", "--kubernetes-version", "1.30.0"];
    args.extend(files);
    args.extend(probes);
    let (ok, out) = run("kubernetes-validate", install, &args, &root());
    assert!(ok, "kubernetes-validate:\n{out}");
    assert_eq!(out.matches("passed for resource").count(), 8, "{out}");

    // The validator does reject a mistake (so a pass means something).
    let dir = std::env::temp_dir().join(format!("lifeguard-k8s-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.yaml");
    let text = std::fs::read_to_string(root().join(files[1])).unwrap();
    std::fs::write(
        &bad,
        text.replace("terminationMessagePolicy:", "terminationMessagePolicyy:"),
    )
    .unwrap();
    let (ok, out) = run(
        "kubernetes-validate",
        install,
        &["--strict", "--kubernetes-version", "1.30.0", bad.to_str().unwrap()],
        &root(),
    );
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(!ok && out.contains("terminationMessagePolicyy"), "{out}");

    // The proxy containers keep their summary where the kubelet reads it.
    for file in files {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        assert!(
            text.contains("terminationMessagePath: /dev/termination-log") && text.contains("LIFEGUARD_LINGER"),
            "{file}"
        );
    }
}

/// The pod's address is read in one place, the settings: `INSTANCE_IP`
/// (Istio's), else `POD_IP`; `lifeguard check` shows it and where it came
/// from, and a bad one stops start-up naming the variable.
#[test]
fn the_pods_address_is_instance_ip_else_pod_ip_and_check_shows_it() {
    let check = |env: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lifeguard"));
        cmd.arg("check").env_remove("INSTANCE_IP").env_remove("POD_IP");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let line = |text: &str| text.lines().find(|l| l.starts_with("pod_ip ")).unwrap_or("").to_owned();
    let (code, text) = check(&[("POD_IP", "10.1.2.3")]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        line(&text).contains("10.1.2.3") && line(&text).contains("(env)"),
        "{text}"
    );
    let (_, text) = check(&[("POD_IP", "10.1.2.3"), ("INSTANCE_IP", "10.9.9.9")]);
    assert!(line(&text).contains("10.9.9.9"), "INSTANCE_IP wins: {text}");
    let (code, text) = check(&[("POD_IP", "not-an-ip")]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("invalid POD_IP = \"not-an-ip\" (from env)"), "{text}");
}

/// A log filter that does not parse (`[[[`: no level, no Rust path) is
/// bad input: `check` and `run` alike refuse it at start-up, naming it,
/// from the flag, the env variable and the settings file.
#[test]
fn a_log_filter_that_does_not_parse_is_refused_by_check_and_run_wherever_it_is_set() {
    let dir = common::temp_dir("log-filter");
    let file = dir.path().join("lifeguard.toml");
    std::fs::write(&file, "[logging]\nlog = \"[[[\"\n").unwrap();
    let file = file.to_str().unwrap();
    /// Flags, env variables, and the name the refusal gives.
    type Way<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let ways: [Way; 3] = [
        (&["--log", "[[["], &[], "--log"),
        (&[], &[("LIFEGUARD_LOG", "[[[")], "LIFEGUARD_LOG"),
        (&["--config", file], &[], "log"),
    ];
    let ports = common::Ports::new();
    let status = ports.agent.addr().to_string();
    for command in ["check", "run"] {
        for (args, env, named) in ways {
            let mut argv = vec![command, "--status-addr", &status];
            argv.extend_from_slice(args);
            if command == "run" {
                // Taken, it would run `true` as Envoy, and end: no hang.
                argv.extend_from_slice(&["--", "true"]);
            }
            let (code, out) = common::run_lifeguard_env(&argv, env);
            assert_eq!(code, 2, "{command} {args:?} {env:?}: {out}");
            assert!(
                out.contains(named) && out.contains("[[[") && out.contains("not a log filter"),
                "{command} {args:?} {env:?}: {out}"
            );
            assert!(!out.contains("configuration OK"), "{out}");
        }
    }
}

/// A settings file written with the drain wait's old key names (before
/// they stopped repeating their section's name) still runs as written:
/// `lifeguard check` reads each old name as the new one, says so, shows
/// the value from the file, and passes.
#[test]
fn the_drain_waits_old_key_names_are_read_and_said() {
    let dir = common::temp_dir("old-keys");
    let file = dir.path().join("lifeguard.toml");
    std::fs::write(
        &file,
        "[drain_wait]\ndrain_wait_app_time = \"3s\"\ndrain_wait_unhealthy_threshold = 2\n",
    )
    .unwrap();
    let (code, out) = common::run_lifeguard(&["check", "--config", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("configuration OK"), "{out}");
    for (old, new) in [("app_time", "3s"), ("unhealthy_threshold", "2")] {
        assert!(
            out.contains(&format!(
                "`drain_wait.drain_wait_{old}` is now `drain_wait.{old}`: read as such; rename it in the file"
            )),
            "{out}"
        );
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{old} ")))
            .unwrap_or_default();
        assert!(line.contains(new) && line.contains("file"), "{line}\n{out}");
    }
}
