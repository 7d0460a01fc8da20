//! The merged Prometheus scrape against the real Envoy, checked by promtool.

use std::collections::HashSet;
use std::thread;
use std::time::Duration;

use common::*;

/// lifeguard's part of a merged scrape.
fn ours_only(scrape: &str) -> String {
    scrape
        .lines()
        .filter(|l| !l.starts_with("envoy_") && !l.starts_with("# HELP envoy_") && !l.starts_with("# TYPE envoy_"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// A family of lifeguard's part: its own, or its process's.
fn ours(family: &str) -> bool {
    family.starts_with("lifeguard_") || family.starts_with("process_")
}

fn families(scrape: &str) -> Vec<&str> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect()
}

fn scrape(addr: std::net::SocketAddr) -> String {
    let (status, body) = get(addr, "/stats/prometheus").unwrap();
    assert_eq!(status, 200, "{body}");
    body
}

#[test]
fn merged_scrape_passes_promtool_and_names_each_family_once() {
    let ports = Ports::new();
    let _envoy = start_envoy(&bootstrap(&ports));
    let _agent = Agent::builder().on(&ports).start();
    wait_status(ports.agent.addr(), "/healthz/ready", 200, Duration::from_secs(30));

    let merged = scrape(ports.agent.addr());
    let fams = families(&merged);
    assert!(
        fams.iter().any(|f| f.starts_with("lifeguard_")),
        "no lifeguard families"
    );
    assert!(
        fams.iter().any(|f| f.starts_with("envoy_")),
        "Envoy's families are missing"
    );
    assert!(fams.iter().all(|f| ours(f) || f.starts_with("envoy_")), "{fams:?}");
    let unique: HashSet<_> = fams.iter().collect();
    assert_eq!(unique.len(), fams.len(), "a family appears twice");
    assert_eq!(sample(&merged, "lifeguard_ready"), Some(1.0));
    assert!(sample(&merged, "lifeguard_probe_responses_total{code=\"200\"}").unwrap() >= 1.0);
    let version = format!("lifeguard_build_info{{version=\"{}\"}}", env!("CARGO_PKG_VERSION"));
    assert_eq!(sample(&merged, &version), Some(1.0));
    // Ready: the time it took and the last answered read are known.
    assert!(sample(&merged, "lifeguard_time_to_first_ready_seconds").unwrap() > 0.0);
    let last = sample(&merged, "lifeguard_envoy_admin_last_success_timestamp_seconds").unwrap();
    assert!(last > 1.7e9, "{last}");
    // The admin latency histogram names its endpoint.
    assert!(
        merged
            .lines()
            .any(|l| l.starts_with("lifeguard_envoy_admin_request_duration_seconds_bucket{endpoint=\"stats\",")),
        "{}",
        ours_only(&merged)
    );
    // Process metrics of lifeguard itself.
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        assert!(sample(&merged, name).is_some(), "{name} missing");
    }
    // No duplicate of Envoy's own server state, and no drain values before a drain.
    for absent in [
        "lifeguard_envoy_server_state",
        "lifeguard_drain_started_timestamp_seconds",
        "lifeguard_drain_active_connections",
        "lifeguard_drain_left_at_stop",
        "lifeguard_drain_cut_by_deadline",
    ] {
        assert!(!merged.contains(absent), "{absent} before any drain");
    }

    // promtool parses it (exit 1 is a parse error). Envoy's own names break
    // Prometheus naming conventions (exit 3, lint findings); ours never do.
    let (code, out) = promtool(&merged);
    assert!(
        code == 0 || code == 3,
        "promtool failed to parse the merged scrape ({code}):\n{out}"
    );
    for finding in out.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            finding.starts_with("envoy_"),
            "promtool finding about our part: {finding}"
        );
    }

    // Our part alone is clean.
    let (code, out) = promtool(&ours_only(&merged));
    assert_eq!(code, 0, "{out}");
}

#[test]
fn our_part_alone_passes_promtool_when_merging_is_off() {
    let ports = Ports::new();
    let _envoy = start_envoy(&bootstrap(&ports));
    let _agent = Agent::builder()
        .on(&ports)
        .args(&["--merge-envoy-metrics", "false"])
        .start();
    wait_status(ports.agent.addr(), "/healthz/ready", 200, Duration::from_secs(30));
    let body = scrape(ports.agent.addr());
    assert!(families(&body).iter().all(|f| ours(f)), "merging is off");
    let (code, out) = promtool(&body);
    assert_eq!(code, 0, "{out}");
    // /metrics is the same scrape: the same families as a scrape of
    // /stats/prometheus beside it. Compared until two agree: a family
    // appears when what it shows first exists (the drain wait's budget, once
    // a checker is learned), which can fall between the two reads (seen
    // once in a full run: the budget's two families in the second only).
    let set = |s: &str| families(s).into_iter().map(str::to_owned).collect::<HashSet<_>>();
    wait_for(
        "/metrics and /stats/prometheus to show the same families",
        Duration::from_secs(10),
        || {
            let (status, alias) = get(ports.agent.addr(), "/metrics").map_err(|e| e.to_string())?;
            let scraped = scrape(ports.agent.addr());
            if status == 200 && set(&alias) == set(&scraped) {
                Ok(())
            } else {
                Err(format!(
                    "{status}; only in /metrics: {:?}; only in /stats/prometheus: {:?}",
                    set(&alias).difference(&set(&scraped)).collect::<Vec<_>>(),
                    set(&scraped).difference(&set(&alias)).collect::<Vec<_>>()
                ))
            }
        },
    );
}

#[test]
fn with_envoy_down_the_scrape_still_answers_and_counts_the_failure() {
    let ports = Ports::new();
    let _agent = Agent::builder().on(&ports).start();
    wait_status(ports.agent.addr(), "/healthz/ready", 503, Duration::from_secs(10));
    let first = scrape(ports.agent.addr());
    let second = scrape(ports.agent.addr());
    let failures = |s: &str| {
        sample(
            s,
            "lifeguard_envoy_admin_requests_total{endpoint=\"stats_prometheus\",outcome=\"error\"}",
        )
        .unwrap()
    };
    assert!(failures(&first) >= 1.0, "{first}");
    assert!(failures(&second) > failures(&first));
    assert_eq!(sample(&second, "lifeguard_ready"), Some(0.0));
    // Never answered, never ready: no value rather than a 0 that reads as 1970.
    assert_eq!(
        sample(&second, "lifeguard_envoy_admin_last_success_timestamp_seconds"),
        None
    );
    assert_eq!(sample(&second, "lifeguard_time_to_first_ready_seconds"), None);
    let (code, out) = promtool(&second);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn scrapes_follow_the_drain_from_draining_to_drained() {
    let mut pod = Pod::start(Agent::builder().args(&[
        "--exit-on-zero-active-connections",
        "true",
        "--minimum-drain-duration",
        "200ms",
    ]));
    let ports = &pod.ports;
    let before = scrape(ports.agent.addr());
    assert_eq!(sample(&before, "lifeguard_drain_phase{phase=\"serving\"}"), Some(1.0));
    assert_eq!(sample(&before, "lifeguard_drain_phase{phase=\"draining\"}"), Some(0.0));
    assert_eq!(sample(&before, "lifeguard_drain_active_connections"), None);
    assert_eq!(
        sample(&before, "lifeguard_drain_policy{policy=\"connections\"}"),
        Some(1.0)
    );

    // One slow request in flight, then the native-sidecar drain (4 s: the
    // scrapes below see it on a busy machine).
    let slow = pod.request_in_flight("/delay/4");
    let agent_addr = pod.ports.agent.addr();
    let drain = thread::spawn(move || http("POST", agent_addr, "/drain"));

    // During the drain: phase 2 with the connection counted.
    let during = wait_for(
        "a scrape showing the drain with 1 connection",
        Duration::from_secs(5),
        || {
            let s = scrape(agent_addr);
            match (
                sample(&s, "lifeguard_drain_phase{phase=\"draining\"}"),
                sample(&s, "lifeguard_drain_active_connections"),
            ) {
                (Some(1.0), Some(1.0)) => Ok(s),
                other => Err(other),
            }
        },
    );
    assert!(sample(&during, "lifeguard_drain_started_timestamp_seconds").unwrap() > 1.0e9);
    assert!(sample(&during, "lifeguard_drain_deadline_timestamp_seconds").unwrap() > 1.0e9);
    assert_eq!(sample(&during, "lifeguard_ready"), Some(0.0));

    assert_eq!(slow.join().unwrap().0.unwrap().0, 200);
    let (code, _) = drain.join().unwrap().unwrap();
    assert_eq!(code, 200);

    // Drained: the count fell to zero, the duration is known, nothing was cut.
    let after = scrape(agent_addr);
    assert_eq!(sample(&after, "lifeguard_drain_phase{phase=\"drained\"}"), Some(1.0));
    assert_eq!(sample(&after, "lifeguard_drain_phase{phase=\"draining\"}"), Some(0.0));
    assert_eq!(sample(&after, "lifeguard_drain_active_connections"), Some(0.0));
    let took = sample(&after, "lifeguard_drain_duration_seconds").unwrap();
    assert!(took > 0.2 && took < 10.0, "drain duration {took}");
    assert_eq!(sample(&after, "lifeguard_drain_cut_by_deadline"), Some(0.0));
    // Envoy is not stopped yet: nothing was left at a stop.
    assert_eq!(sample(&after, "lifeguard_drain_left_at_stop"), None);
    let (code, out) = promtool(&ours_only(&after));
    assert_eq!(code, 0, "{out}");

    // The scrape keeps answering while Envoy is stopped.
    pod.sigterm();
    assert_eq!(pod.agent.exit_code(Duration::from_secs(10)), 0);
}
