//! What differs between the Envoy versions lifeguard supports
//! (1.36 to 1.40), each difference shown on the Envoy the suite runs and
//! lifeguard's request shown to mean the same there. `scripts/test` runs
//! these (with every other Envoy-facing test) against the oldest supported
//! Envoy as well as the newest, so each difference is seen from both sides.
//!
//! - `/drain_listeners`: up to 1.39, `skip_exit` without `graceful` is
//!   refused; 1.40 accepts it. lifeguard always sends `graceful`: each of
//!   its four forms (inbound or all, with or without `skip_exit`) is
//!   accepted, and Envoy tells connections to close.
//! - `/stats/prometheus`: 1.38 and later answer protobuf to `prom_protobuf`;
//!   lifeguard's merged scrape stays text whatever the client asks.
//! - lifeguard logs the version of the Envoy it runs.

use std::time::Duration;

use common::*;

/// Prometheus' `Accept` when protobuf is its first choice
/// (`scrape_protocols: [PrometheusProto, ...]`).
const PROTOBUF_FIRST: &str = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.9,application/openmetrics-text;version=1.0.0;q=0.8,text/plain;version=0.0.4;q=0.3";

#[test]
fn lifeguard_logs_the_version_of_the_envoy_it_runs() {
    let pod = Pod::start(Agent::builder());
    let version = envoy_version_of(&envoy_bin());
    let out = pod.agent.wait_output("Envoy version", Duration::from_secs(10));
    let line = out.lines().find(|l| l.contains("Envoy version")).unwrap();
    assert!(line.contains(&format!("version={version} ")), "{line}");
    // 1.36 to 1.40 are the versions the suite runs: no warning.
    assert!(line.contains(" INFO ") && !line.contains("tested with"), "{line}");
    eprintln!("{line}");
}

#[test]
fn the_merged_scrape_is_text_whatever_the_client_asks_of_any_envoy() {
    let pod = Pod::start(Agent::builder());
    let version = envoy_minor();

    // Envoy itself: protobuf for `prom_protobuf` from 1.38 on, text before.
    // (Over a Unix socket the kit reads text only: a body that is not
    // UTF-8 is not text.)
    let text = match pod.ports.admin_get("/stats/prometheus?prom_protobuf=1") {
        Ok((200, body)) => body.starts_with("# TYPE "),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => false,
        other => panic!("Envoy's /stats/prometheus: {other:?}"),
    };
    assert_eq!(!text, version >= (1, 38), "Envoy {version:?}: protobuf {}", !text);

    // lifeguard: text with Envoy's families, whatever the query or Accept.
    let agent = pod.ports.agent.addr();
    for (path, accept) in [
        ("/stats/prometheus?prom_protobuf=1", None),
        ("/stats/prometheus?usedonly&prom_protobuf", None),
        ("/stats/prometheus", Some(PROTOBUF_FIRST)),
        ("/stats/prometheus?prom_protobuf=1", Some(PROTOBUF_FIRST)),
    ] {
        let headers: Vec<(&str, &str)> = accept.map(|a| ("accept", a)).into_iter().collect();
        let answer = request(agent, "GET", path, &headers, Duration::from_secs(10)).unwrap();
        let body =
            String::from_utf8(answer.body.clone()).unwrap_or_else(|e| panic!("{path} {accept:?}: not text: {e}"));
        assert_eq!(answer.status, 200, "{path} {accept:?}");
        let content_type = answer.header("content-type").unwrap_or_default();
        assert!(
            content_type.starts_with("text/plain"),
            "{path} {accept:?}: {content_type}"
        );
        assert!(
            sample(&body, "envoy_server_live{}").is_some() && sample(&body, "lifeguard_ready").is_some(),
            "{path} {accept:?}: {body:.300}"
        );
        assert!(
            sample(&body, "lifeguard_scrape_failures_total{source=\"envoy\"}").unwrap_or(0.0) == 0.0,
            "{path} {accept:?}: {body:.300}"
        );
        // promtool parses it (exit 3: lint findings, which Envoy's own
        // names always give).
        let (code, out) = promtool(&body);
        assert!(code == 0 || code == 3, "{path} {accept:?}: promtool ({code}): {out}");
    }
}

/// Envoy's answer to a drain `lifeguard` never sends: `skip_exit` without
/// `graceful`, refused before 1.40.
#[test]
fn envoy_before_1_40_refuses_skip_exit_without_graceful() {
    let ports = Ports::new();
    let envoy = start_envoy(&bootstrap(&ports));
    wait_for("Envoy's admin", Duration::from_secs(30), || {
        match ports.admin_get("/ready") {
            Ok((200, body)) => Ok(body),
            other => Err(other),
        }
    });
    let answer = match &ports.admin_socket {
        Some((socket, _)) => unix_post(socket, "/drain_listeners?inboundonly&skip_exit"),
        None => http("POST", ports.admin.addr(), "/drain_listeners?inboundonly&skip_exit"),
    };
    let (code, body) = answer.unwrap();
    if envoy_minor() >= (1, 40) {
        assert_eq!((code, body.trim()), (200, "OK"));
    } else {
        assert_eq!(code, 400, "{body}");
        assert!(body.contains("skip_exit requires graceful"), "{body}");
    }
    drop(envoy);
}

/// A keep-alive request through Envoy's inbound listener: whether Envoy
/// asked to close the connection (it does once a graceful drain began).
fn closes_connection(pod: &Pod) -> bool {
    let answer = request(
        pod.ports.inbound.addr(),
        "GET",
        "/delay/0",
        &[],
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!((answer.status, answer.text().as_str()), (200, "done\n"));
    answer.header("connection") == Some("close")
}

#[test]
fn each_drain_lifeguard_asks_for_is_accepted_and_closes_connections_on_any_envoy() {
    // The drain's four forms: the preStop `POST /drain` (skip_exit: Envoy
    // keeps running) and SIGTERM, each for a sidecar (inboundonly) and a
    // gateway (all listeners). A fixed 5 s drain keeps Envoy up meanwhile.
    for (scope, trigger) in [
        ("inbound", "POST /drain"),
        ("inbound", "SIGTERM"),
        ("all", "POST /drain"),
        ("all", "SIGTERM"),
    ] {
        let pod = Pod::start(Agent::builder().args(&[
            "--drain-scope",
            scope,
            "--drain-until",
            "time",
            "--termination-drain-duration",
            "5s",
        ]));
        assert!(!closes_connection(&pod), "{scope} {trigger}: closed before the drain");
        match trigger {
            "SIGTERM" => {
                pod.sigterm();
            }
            _ => {
                let (code, body) = http("POST", pod.ports.agent.addr(), "/drain?nowait").unwrap();
                assert_eq!(code, 202, "{body}");
            }
        }
        let agent = pod.ports.agent.addr();
        let series = |outcome: &str| {
            format!("lifeguard_envoy_admin_requests_total{{endpoint=\"drain_listeners\",outcome=\"{outcome}\"}}")
        };
        wait_for(
            &format!("{scope} {trigger}: the drain call answered"),
            Duration::from_secs(5),
            || {
                let (_, scrape) = get(agent, "/stats/prometheus").map_err(|e| e.to_string())?;
                let failed = sample(&scrape, &series("error")).unwrap_or(0.0);
                assert_eq!(
                    failed,
                    0.0,
                    "{scope} {trigger}: Envoy refused the drain:\n{}",
                    pod.agent.output()
                );
                match sample(&scrape, &series("ok")) {
                    Some(ok) if ok >= 1.0 => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        );
        assert!(closes_connection(&pod), "{scope} {trigger}: not told to close");
        assert!(
            !pod.agent.output().contains("drain_listeners failed"),
            "{}",
            pod.agent.output()
        );
    }
}
