//! The drain's outcome outlives the pod: the termination message, the last
//! log line, and the linger that lets a last scrape see the final state.
//! Against the real Envoy and a real slow app.

use std::time::{Duration, Instant};

use common::*;

/// Waits until `GET /drain` says Envoy has stopped (the port still answers:
/// lifeguard lingers); returns when that was first seen.
fn wait_stopped(pod: &Pod) -> Instant {
    wait_for(
        "GET /drain to show phase stopped",
        Duration::from_secs(15),
        || match get(pod.ports.agent.addr(), "/drain") {
            Ok((200, body)) if body.contains("\"phase\":\"stopped\"") => Ok(Instant::now()),
            other => Err(other),
        },
    )
}

fn message(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(text.len() <= 4096 && !text.contains('\n'), "{text:?}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn a_drain_cut_by_the_deadline_is_kept_in_the_termination_message_and_lingers_within_the_grace_period() {
    let dir = temp_dir("termination");
    let msg = dir.path().join("termination-log");
    let msg_arg = msg.display().to_string();
    let mut pod = Pod::start(
        Agent::builder()
            .args(&["--termination-grace-period", "4s", "--shutdown-margin", "1s"])
            .exit_on_zero("1s")
            .args(&[
                "--termination-message-path",
                &msg_arg,
                // Far longer than what the grace period leaves after the cut.
                "--linger",
                "30s",
            ]),
    );
    let req = pod.request_in_flight("/delay/10");
    let sent = pod.sigterm();
    let stopped = wait_stopped(&pod);
    // Written as Envoy stopped, before the linger (GET /drain may say
    // "stopped" a moment before the line is in the file, which the write
    // creates empty first: wait for the line).
    wait_for(
        "the termination message",
        Duration::from_secs(10),
        || match std::fs::read_to_string(&msg) {
            Ok(text) if !text.is_empty() => Ok(()),
            other => Err(other.map_err(|e| e.kind())),
        },
    );
    let json = message(&msg);
    let code = pod.agent.exit_code(Duration::from_secs(10));
    let took = sent.elapsed();
    eprintln!(
        "cut drain: Envoy stopped {:?} after SIGTERM, lifeguard exited {took:?} after (grace 4s)",
        stopped - sent
    );
    assert_eq!(code, 3, "{}", pod.agent.output());
    // The linger's plan, from the log: it ends with the grace period
    // (Envoy stopped `duration_seconds` after SIGTERM, then up to `up_to`).
    let out = pod.agent.output();
    let up_to = out
        .split("up_to=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .map(|d| match d.strip_suffix("ms") {
            Some(ms) => ms.parse::<f64>().unwrap() / 1000.0,
            None => d.strip_suffix('s').unwrap().parse::<f64>().unwrap(),
        })
        .unwrap_or_else(|| panic!("no linger in the log: {out}"));
    let ends = json["duration_seconds"].as_f64().unwrap() + up_to;
    assert!(
        (3.5..=4.01).contains(&ends),
        "the linger ends {ends}s after SIGTERM (grace 4s)"
    );
    assert!(took >= Duration::from_millis(3500), "did not linger: {took:?}");
    // What the test saw, with its own delays: a generous margin.
    assert!(
        took < Duration::from_secs(6),
        "lingered past the grace period: {took:?}"
    );

    assert_eq!(json["outcome"], "cut", "{json}");
    assert_eq!(json["exit_code"], 3, "{json}");
    assert_eq!(json["cut_by_deadline"], true, "{json}");
    assert!(json["left_at_stop"].as_u64().unwrap() >= 1, "{json}");
    assert_eq!(json["trigger"], "SIGTERM", "{json}");
    assert_eq!(json["policy"], "connections", "{json}");
    assert!(
        json["waited_on_last"].as_str().unwrap().contains("connections"),
        "{json}"
    );
    // Cut at the deadline (3 s: the grace period less the margin), Envoy
    // stopped within the grace period (4 s).
    let duration = json["duration_seconds"].as_f64().unwrap();
    assert!((2.9..4.0).contains(&duration), "{json}");

    // The same summary is the last log line.
    let out = pod.agent.output();
    let last = out.lines().rev().find(|l| !l.trim().is_empty()).unwrap();
    assert!(
        last.contains("lifeguard exiting")
            && last.contains("outcome=\"cut\"")
            && last.contains("cut_by_deadline=true")
            && last.contains("exit_code=3"),
        "{last}"
    );
    let (result, _) = req.join().unwrap();
    assert!(!matches!(result, Ok((200, _))), "the 10s request cannot have finished");
}

#[test]
fn a_scrape_after_envoy_stopped_sees_the_cut_and_ends_the_linger() {
    let mut pod = Pod::start(
        Agent::builder()
            .args(&["--termination-grace-period", "30s", "--shutdown-margin", "27s"])
            .exit_on_zero("1s")
            .args(&["--linger", "20s", "--termination-message-path", "none"]),
    );
    let req = pod.request_in_flight("/delay/10");
    pod.sigterm();
    wait_stopped(&pod);
    // Lingering: the probe says 503, the process is still there.
    assert_eq!(get(pod.ports.agent.addr(), "/healthz/ready").unwrap().0, 503);
    assert!(pod.agent.is_running());

    let (status, scrape) = get(pod.ports.agent.addr(), "/stats/prometheus").unwrap();
    let scraped = Instant::now();
    assert_eq!(status, 200);
    assert_eq!(
        sample(&scrape, "lifeguard_drain_phase{phase=\"stopped\"}"),
        Some(1.0),
        "{scrape}"
    );
    assert_eq!(sample(&scrape, "lifeguard_drain_phase{phase=\"draining\"}"), Some(0.0));
    assert_eq!(sample(&scrape, "lifeguard_drain_cut_by_deadline"), Some(1.0));
    assert!(sample(&scrape, "lifeguard_drain_left_at_stop").unwrap() >= 1.0);
    assert_eq!(sample(&scrape, "lifeguard_drain_active_connections"), Some(1.0));
    // Cut at the deadline (3 s), then Envoy's own exit (seconds on a busy
    // machine; its SIGKILL would wait for the grace period's end).
    let duration = sample(&scrape, "lifeguard_drain_duration_seconds").unwrap();
    assert!((2.9..6.0).contains(&duration), "{duration}");

    let code = pod.agent.exit_code(Duration::from_secs(10));
    let after = scraped.elapsed();
    eprintln!("scrape after Envoy's stop -> lifeguard exited {after:?} later");
    assert_eq!(code, 3);
    assert!(
        after < Duration::from_secs(4),
        "exit did not follow the scrape (the linger is 20 s): {after:?}"
    );
    let _ = req.join();
}

#[test]
fn without_a_scrape_the_linger_ends_after_its_time_and_json_logs_carry_the_summary() {
    let mut pod = Pod::start(Agent::builder().args(&[
        "--drain-until",
        "requests",
        "--minimum-drain-duration",
        "0s",
        "--linger",
        "1500ms",
        "--log-format",
        "json",
        "--termination-message-path",
        "none",
    ]));
    let sent = pod.sigterm();
    let stopped = wait_stopped(&pod);
    // GET /drain is not a scrape: the linger goes on.
    assert_eq!(get(pod.ports.agent.addr(), "/drain").unwrap().0, 200);
    let code = pod.agent.exit_code(Duration::from_secs(10));
    let (since_signal, since_seen) = (sent.elapsed(), stopped.elapsed());
    eprintln!("linger 1.5s without a scrape: exited {since_seen:?} after the stop was seen");
    assert_eq!(code, 0, "{}", pod.agent.output());
    assert!(since_signal >= Duration::from_millis(1500), "{since_signal:?}");
    assert!(since_seen < Duration::from_millis(3500), "{since_seen:?}");

    let out = pod.agent.output();
    let lifeguard_lines: Vec<serde_json::Value> = out
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let last = lifeguard_lines.last().expect("JSON log lines");
    let fields = &last["fields"];
    assert_eq!(fields["message"], "lifeguard exiting", "{last}");
    assert_eq!(fields["outcome"], "drained", "{last}");
    assert_eq!(fields["exit_code"], 0, "{last}");
    assert_eq!(fields["cut_by_deadline"], false, "{last}");
    assert_eq!(fields["left_at_stop"], 0, "{last}");
    assert_eq!(fields["policy"], "requests", "{last}");
    assert!(out.contains("no scrape came while lingering"), "{out}");
}

/// Issue #51: a `requests` drain of a pod with sparse traffic (a request
/// every 9 s through Envoy) and no load balancer ever seen. Before the
/// drain, `GET /drain` says such traffic makes a drain wait its bound, and
/// which setting shortens it. The drain waits for the traffic to be quiet
/// until the wait's bound (13 s of a 20 s grace period: the deadline less
/// the app's 5 s), then finds nothing in flight and stops Envoy: the
/// outcome says the wait's bound and what it still waited for, not a cut
/// by the deadline (which was 5 s away), and nothing lost.
#[test]
fn a_sparse_pods_drain_that_ends_at_the_waits_bound_says_so_truly() {
    let dir = temp_dir("sparse");
    let msg = dir.path().join("termination-log");
    let msg_arg = msg.display().to_string();
    let mut pod = Pod::start(Agent::builder().args(&[
        "--termination-grace-period",
        "20s",
        "--drain-until",
        "requests",
        "--termination-message-path",
        &msg_arg,
    ]));
    // A request every 9 s, until the drain wait's samples (every 10 s)
    // have measured the rate.
    let inbound = pod.ports.inbound.addr();
    let sparse = wait_for(
        "the drain wait to call the traffic sparse",
        Duration::from_secs(60),
        || {
            assert_eq!(get(inbound, "/delay/0").unwrap().0, 200);
            let (_, body) = get(pod.ports.agent.addr(), "/drain").unwrap();
            let drain: serde_json::Value = serde_json::from_str(&body).unwrap();
            match drain["drain_wait"]["sparse_traffic"].as_str() {
                Some(words) => Ok(words.to_owned()),
                None => {
                    std::thread::sleep(Duration::from_secs(9));
                    Err(drain["drain_wait"]["requests_per_second_before_drain"].clone())
                }
            }
        },
    );
    assert!(
        sparse.contains("a drain waits its bound (13s)") && sparse.contains("--drain-wait-max-quiet-period"),
        "{sparse}"
    );
    let sent = pod.sigterm();
    let code = pod.agent.exit_code(Duration::from_secs(25));
    let took = sent.elapsed();
    let out = pod.agent.output();
    assert_eq!(code, 0, "{out}");
    wait_for(
        "the termination message",
        Duration::from_secs(5),
        || match std::fs::read_to_string(&msg) {
            Ok(text) if !text.is_empty() => Ok(()),
            other => Err(other.map_err(|e| e.kind())),
        },
    );
    let json = message(&msg);
    eprintln!("SIGTERM -> exited {took:?}; {json}");
    assert_eq!(json["outcome"], "wait_bound", "{json}");
    assert_eq!(json["exit_code"], 0);
    assert_eq!(json["cut_by_deadline"], false, "the deadline was not reached");
    assert_eq!(json["left_at_stop"], 0);
    let held = json["load_balancers"]["held_by"].as_str().unwrap_or_default();
    assert!(held.starts_with("no new request for 13s"), "{json}");
    assert!(
        json["load_balancers"]["checkers"].as_array().is_some_and(Vec::is_empty),
        "{json}"
    );
    let duration = json["duration_seconds"].as_f64().unwrap();
    assert!(
        (13.0..15.0).contains(&duration),
        "ended at the wait's bound: {duration}"
    );
    assert!(
        out.contains("the drain wait's bound came before the load balancers' verdict")
            && out.contains("requests that still arrive once Envoy stops are refused")
            && !out.contains("requests the load balancers still send are lost"),
        "{out}"
    );
    assert!(
        out.contains(r#"lifeguard exiting outcome="wait_bound" exit_code=0"#),
        "{out}"
    );
}
