//! The third user, the load balancer: the app's preStop hook
//! `GET /drain/wait` must hold the app's SIGTERM until every load balancer
//! has taken the pod out and the traffic it sent has stopped, behind every
//! kind of load balancer and traffic (issues #27, #34). Rolling restarts
//! behind real load balancers (`common/lb.rs`: HAProxy checking each pod's
//! 15021 or its traffic port, HAProxy that never checks while the pod
//! leaves its endpoints 0.5-3 s after deletion, Envoy as the front proxy
//! checking 15021), at 200 and at 2 requests a second; pods of
//! `common/pod.rs`, each the real Envoy, lifeguard and an app that stops
//! listening at SIGTERM; the hook called as the kubelet calls it, the
//! app's SIGTERM when it answers. And a hostile peer on the LAN probing
//! the pod with any headers while the real load balancer checks it.
//!
//! What a user would check: no request fails, and no fixed sleep was
//! guessed: each hook answers after its load balancers took the pod out
//! (and, at 200 a second, within the quiet period + 3 s of it; the figure
//! is printed); a prober cannot move the answer earlier, nor hold it past
//! the bound set.
//! Needs root, HAProxy and Envoy.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::{lb, pod, request, wait_for};
use lb::*;
use pod::Gateway;

/// One busy rolling restart at a time: each drives 200 requests a second
/// and measures against its load balancers' clocks. The sparse ones (2 a
/// second) and the controls spend their time waiting and run beside the
/// others.
static ONE_BUSY_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A control's rate: it must lose requests with the rule that loses, which
/// takes dropped traffic, not load. The shortest window of losses, an
/// announced node's between Envoy's stop and its withdrawal, measured
/// about 0.3 s (5 lost at 20 a second, 14 at 50).
const CONTROL_RATE: u32 = 50;

/// Every request answered 200; when not, the failures on a timeline with
/// the load balancers' state changes and the pods' deletions.
fn assert_nothing_lost(run: &Run) {
    let failed: Vec<&Sent> = run.sent.iter().filter(|s| s.answer != Ok(200)).collect();
    eprintln!(
        "requests at {}/s: {} sent, {} failed",
        run.rate,
        run.sent.len(),
        failed.len()
    );
    // The load was carried: at least half the rate. On a busy machine the
    // client falls behind (79.5 % of 200 a second seen with a busy loop
    // beside the suite); half of it is still twice CONTROL_RATE, at which
    // a losing rule loses requests.
    let span = secs(run.sent[0].at, run.sent[run.sent.len() - 1].at);
    assert!(
        run.sent.len() as f64 >= span * run.rate as f64 * 0.5,
        "the client sent only {} requests in {span:.1} s",
        run.sent.len()
    );
    if failed.is_empty() {
        return;
    }
    let mut timeline: Vec<(SystemTime, String)> = run.events.clone();
    for (k, l) in run.left.iter().enumerate() {
        let d = &l.deletion;
        timeline.push((d.started, format!("old{k}: SIGTERM to lifeguard, hook called")));
        timeline.push((d.hook_returned, format!("old{k}: hook returned, SIGTERM to the app")));
        timeline.push((d.gone, format!("old{k}: lifeguard exited")));
    }
    for s in &failed {
        timeline.push((s.at, format!("FAILED through {}: {:?} {}", s.through, s.answer, s.said)));
    }
    timeline.sort_by_key(|(t, _)| *t);
    let t0 = timeline[0].0;
    for (t, what) in &timeline {
        eprintln!("{:8.3} {what}", secs(t0, *t));
    }
    for (k, l) in run.left.iter().enumerate() {
        eprintln!("----- old{k}: lifeguard -----\n{}", l.log);
    }
    panic!(
        "{} of {} requests failed (timeline above)",
        failed.len(),
        run.sent.len()
    );
}

/// Each hook said the pod is out of rotation, no earlier than the last
/// load balancer took it out (and, when `within` is given, no later than
/// the quiet period the hook waited plus that after it); lifeguard
/// exited 0.
fn assert_left_in_time(run: &Run, within: Option<f64>) {
    for (k, l) in run.left.iter().enumerate() {
        let d = &l.deletion;
        let last_down = *l.down.iter().max().unwrap();
        let after = secs(last_down, d.hook_returned);
        let downs: Vec<String> = l.down.iter().map(|t| format!("{:.2}", secs(d.started, *t))).collect();
        eprintln!(
            "old{k}: SIGTERM -> taken out {} s, hook returned {:.2} s ({after:.2} s after the last), gone {:.2} s; {}",
            downs.join(" / "),
            secs(d.started, d.hook_returned),
            secs(d.started, d.gone),
            d.hook_answer
        );
        assert!(
            d.hook_answer.starts_with("200 out of rotation: "),
            "old{k}: {}\n{}",
            d.hook_answer,
            l.log
        );
        assert!(
            after >= 0.0,
            "old{k}: the hook returned {:.3} s before the load balancer took the pod out\n{}",
            -after,
            l.log
        );
        if let Some(margin) = within {
            let quiet = quiet_period_said(&d.hook_answer);
            assert!(
                after <= quiet + margin,
                "old{k}: the hook returned {after:.3} s after the load balancer took the pod out (quiet period \
                 {quiet:.2} s, {:.2} s allowed)\n{}",
                quiet + margin,
                l.log
            );
        }
        assert_eq!(d.exit_code, 0, "old{k}: lifeguard's exit code\n{}", l.log);
    }
}

/// The quiet period a hook's answer says it waited ("no new request came
/// for 500ms").
fn quiet_period_said(answer: &str) -> f64 {
    let said = answer
        .split("no new request came for ")
        .nth(1)
        .and_then(|rest| rest.split([' ', ',', ')']).next())
        .unwrap_or_else(|| panic!("no quiet period in the hook's answer: {answer}"));
    let (number, unit) = said.split_at(said.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(said.len()));
    let number: f64 = number
        .parse()
        .unwrap_or_else(|_| panic!("a quiet period of {said:?}: {answer}"));
    match unit {
        "ms" => number / 1000.0,
        "s" => number,
        _ => panic!("a quiet period of {said:?}: {answer}"),
    }
}

/// A rolling restart at 200 requests a second behind `balancers`: nothing
/// lost, each hook within the quiet period and 3 s of the last load
/// balancer's verdict (the drain's reads of Envoy's counters are paced at
/// 11 times what one takes, a second or more apart on a busy machine; 1.0
/// to 2.0 s seen, the figure printed).
fn busy(balancers: &[Balancer], replace: u8) -> Run {
    let _one = ONE_BUSY_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let run = rolling_restart(&Rollout {
        replace,
        ..Rollout::drain_wait(balancers)
    });
    assert_nothing_lost(&run);
    assert_left_in_time(&run, Some(3.0));
    run
}

/// A rolling restart at 2 requests a second behind `balancer`, the pods
/// having had that traffic for 20 s: a quiet second is chance there;
/// nothing lost.
fn sparse(balancer: Balancer) {
    let run = rolling_restart(&Rollout {
        replace: 2,
        rate: 2,
        steady: Duration::from_secs(20),
        ..Rollout::drain_wait(&[balancer])
    });
    assert_nothing_lost(&run);
    assert_left_in_time(&run, None);
}

const FAST: Check = Check::FAST;
const SLOW: Check = Check::SLOW;
/// Slower than the 5 s minimum drain of the peers: every 5 s, down after 3
/// (up after 1, so that a new pod is in rotation within a check).
const SLOWER: Check = Check {
    inter: Duration::from_secs(5),
    fall: 3,
    rise: 1,
    terminates: false,
};
/// Envoy as the front proxy, checking every second.
const FRONT_ENVOY: Balancer = Balancer::Envoy {
    inter: Duration::from_secs(1),
    http2: false,
};

#[test]
fn behind_haproxy_checking_fast_a_rolling_restart_loses_nothing() {
    busy(&[Balancer::Haproxy(FAST)], 3);
}

#[test]
fn behind_haproxy_checking_slowly_a_rolling_restart_loses_nothing() {
    busy(&[Balancer::Haproxy(SLOW)], 3);
}

#[test]
fn with_two_load_balancers_the_hook_waits_for_the_slower() {
    let run = busy(&[Balancer::Haproxy(FAST), Balancer::Haproxy(SLOW)], 1);
    let l = &run.left[0];
    assert!(
        l.down[1] > l.down[0],
        "the slow load balancer took the pod out first: {:?}",
        l.down
    );
}

/// Envoy takes a host out at its first failed check: the wait counts one
/// failure for it, not three.
#[test]
fn behind_envoy_as_the_front_proxy_a_rolling_restart_loses_nothing() {
    let run = busy(&[FRONT_ENVOY], 3);
    for l in &run.left {
        assert!(
            l.log.contains("(Envoy/HC") && l.log.contains("failed 1 probes in a row: it has taken the pod out"),
            "{}",
            l.log
        );
    }
}

/// No checks: only the traffic tells; the pod leaves the endpoints 3 s,
/// 0.5 s and 1.75 s after its deletion.
#[test]
fn behind_a_load_balancer_that_never_checks_a_rolling_restart_loses_nothing() {
    busy(&[Balancer::Endpoints], 3);
}

/// The checks go to the traffic port, through Envoy to the app: from the
/// drain's start Envoy's health_check filter fails them while real
/// requests are still served, and they are not counted as traffic.
#[test]
fn behind_a_load_balancer_checking_the_traffic_port_a_rolling_restart_loses_nothing() {
    let run = busy(&[Balancer::TrafficPort(FAST)], 2);
    for l in &run.left {
        assert!(l.log.contains("(POST /healthcheck/fail)"), "{}", l.log);
    }
}

#[test]
fn sparse_traffic_behind_haproxy_checking_15021_loses_nothing() {
    sparse(Balancer::Haproxy(FAST));
}

#[test]
fn sparse_traffic_behind_envoy_as_the_front_proxy_loses_nothing() {
    sparse(FRONT_ENVOY);
}

#[test]
fn sparse_traffic_behind_a_load_balancer_that_never_checks_loses_nothing() {
    sparse(Balancer::Endpoints);
}

#[test]
fn sparse_traffic_behind_a_load_balancer_checking_the_traffic_port_loses_nothing() {
    sparse(Balancer::TrafficPort(FAST));
}

/// Probes from a peer on the LAN, as many as it likes, with any
/// `x-forwarded-for` (claiming to be the real load balancer): one worker
/// keeps probing under 4 names (they establish a checker each, the
/// address's share), another under a new name each time (60 of them).
fn hostile_prober(host: &common::netns::Netns, target: std::net::SocketAddr, claim: String) -> Prober {
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let workers = [(4, 0), (60, 40)]
        .into_iter()
        .map(|(names, pause_ms)| {
            let (stop, sent, claim) = (stop.clone(), sent.clone(), claim.clone());
            host.spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let agent = format!("hostile-{names}-{}", i % names);
                    let headers = [("user-agent", agent.as_str()), ("x-forwarded-for", claim.as_str())];
                    let _ = request(target, "GET", "/healthz/ready", &headers, Duration::from_secs(1));
                    sent.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                    std::thread::sleep(Duration::from_millis(pause_ms));
                }
            })
        })
        .collect();
    Prober { stop, sent, workers }
}

struct Prober {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The attack: a real load balancer checking every 3 s (it takes
/// the pod out at its 3rd failure, 6-9 s into the drain), while a peer
/// sends about 100 probes a second under 64 names with a forged
/// `x-forwarded-for`, another does the same from the real load balancer's
/// own address (its probes crowded out of the address's
/// share), and another peer probes every 8 s, as a slow checker would:
/// the hook answers no earlier than the real checker's verdict, and the
/// slow one is let go at the checker timeout (12 s here), not at its 3rd
/// failure (16-24 s).
#[test]
#[allow(clippy::too_many_lines)] // one scenario, read top to bottom
fn a_hostile_prober_can_neither_end_the_wait_early_nor_hold_it() {
    let _one = ONE_BUSY_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let lan = Lan::new();
    let (mut pod, pod_ip) = pod_at(&lan, 0, &["--drain-wait-checker-timeout", "12s"]);
    let real = Check {
        inter: Duration::from_secs(3),
        fall: 3,
        rise: 1,
        terminates: false,
    };
    let servers = [("old0".to_owned(), pod_ip)];
    let front = Front::start(&lan, Balancer::Haproxy(real), &servers, 1, pod::INBOUND);
    let load = Load::start(&lan.host, &[front.frontend], 20);
    let (peer, _) = lan.peer_host(0);
    let status = std::net::SocketAddr::from((pod_ip, pod::STATUS));
    let flood = hostile_prober(&peer, status, lan.host_ip(1).to_string());
    let same_address = hostile_prober(&lan.host, status, lan.host_ip(1).to_string());
    let (slow_peer, slow_ip) = lan.peer_host(1);
    let slow_stop = Arc::new(AtomicBool::new(false));
    let slow = {
        let stop = slow_stop.clone();
        slow_peer.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let headers = [("user-agent", "slow-checker/1.0")];
                let _ = request(status, "GET", "/healthz/ready", &headers, Duration::from_secs(1));
                for _ in 0..80 {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        })
    };
    // Every checker established: two of the real one's probes and the slow one's.
    let agent = std::net::SocketAddr::from((pod_ip, pod::AGENT));
    wait_for("the slow checker's second probe", Duration::from_secs(30), || {
        let drain = lan.host.run(move || common::get(agent, "/drain"));
        let drain = drain.map_err(|e| e.to_string())?.1;
        let seen = serde_json::from_str::<serde_json::Value>(&drain).map_err(|e| e.to_string())?;
        let probes = |ua: &str| {
            seen["drain_wait"]["checkers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| c["user_agent"].as_str().is_some_and(|a| a.starts_with(ua)))
                .map(|c| c["probes"].as_u64().unwrap_or(0))
                .max()
                .unwrap_or(0)
        };
        match (probes("slow-checker"), probes("HAProxy")) {
            (s, _) if s < 2 => Err(format!("slow checker: {s} probes")),
            _ => Ok(()),
        }
    });
    let deletion = delete_pod(
        &mut pod,
        &lan.host,
        pod_ip,
        &Hook::Get("/drain/wait".into()),
        GRACE,
        || {},
    );
    slow_stop.store(true, Ordering::Relaxed);
    let _ = slow.join();
    let sent = flood.sent.load(Ordering::Relaxed) + same_address.sent.load(Ordering::Relaxed);
    drop((flood, same_address));
    load.stop();
    let down = front.wait_marked("old0", false, Duration::from_secs(5));
    let log = pod.agent.output();
    let after_verdict = secs(down, deletion.hook_returned);
    let took = secs(deletion.started, deletion.hook_returned);
    eprintln!(
        "{sent} hostile probes; the real load balancer took the pod out {:.2} s after deletion, \
         the hook answered {took:.2} s after deletion ({after_verdict:.2} s after the verdict): {}",
        secs(deletion.started, down),
        deletion.hook_answer
    );
    assert!(sent > 600, "the hostile peers sent only {sent} probes");
    assert!(
        deletion.hook_answer.starts_with("200 out of rotation: "),
        "{}\n{log}",
        deletion.hook_answer
    );
    assert!(
        after_verdict >= 0.0,
        "the hook answered {:.2} s before the real load balancer's verdict\n{log}",
        -after_verdict
    );
    assert!(
        (12.0..16.0).contains(&took),
        "the slow checker should be let go at the 12 s checker timeout (and a quiet period): {took:.2} s\n{log}"
    );
    let slow_ip = slow_ip.to_string();
    assert!(
        log.contains(&format!("checker {slow_ip} (slow-checker/1.0)")) && log.contains("no longer waited for"),
        "{log}"
    );
    assert!(log.contains("was not counted as a load balancer's"), "{log}");
    assert!(
        deletion
            .hook_answer
            .contains("probers too many to follow held the wait"),
        "{}",
        deletion.hook_answer
    );
    assert_eq!(deletion.exit_code, 0, "{log}");
}

/// The checkers the pod at `pod_ip` lists in `GET /drain` (counted or
/// followed apart), as JSON.
fn listed_checkers(lan: &Lan, pod_ip: std::net::Ipv4Addr) -> Result<Vec<serde_json::Value>, String> {
    let agent = std::net::SocketAddr::from((pod_ip, pod::AGENT));
    let drain = lan.host.run(move || common::get(agent, "/drain"));
    let drain = drain.map_err(|e| e.to_string())?.1;
    let seen = serde_json::from_str::<serde_json::Value>(&drain).map_err(|e| e.to_string())?;
    Ok(seen["drain_wait"]["checkers"].as_array().cloned().unwrap_or_default())
}

/// An attack on a gateway's probe table: 64 `User-Agent`s probing 15021 from
/// the real checker's own address (an address's share of the table is 4)
/// while that checker probes every 3 s and takes the pod out at its 3rd
/// failure. Its probes, crowded out of the table, are followed apart: the
/// gateway serves until its verdict (6-9 s into the drain), never stops
/// before it, and stops within 3 s and the quiet period of it or of the
/// flood's own agents' failures (they too are followed apart, and hold
/// the wait), not at the checker timeout (20 s).
#[test]
fn a_flood_of_agents_at_the_checkers_own_address_cannot_end_a_gateways_drain_early() {
    let _one = ONE_BUSY_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let lan = Lan::new();
    let (mut pod, pod_ip) = gateway_at(&lan, 0, Gateway::Shipped, SCOPE_ALL);
    let real = Check {
        inter: Duration::from_secs(3),
        fall: 3,
        rise: 1,
        terminates: false,
    };
    let servers = [("old0".to_owned(), pod_ip)];
    let front = Front::start(&lan, Balancer::Haproxy(real), &servers, 1, pod::GATEWAY_PORT);
    let load = Load::start(&lan.host, &[front.frontend], 20);
    let status = std::net::SocketAddr::from((pod_ip, pod::STATUS));
    let flood = hostile_prober(&lan.host, status, lan.host_ip(1).to_string());
    let checker_ip = lan.host_ip(1).to_string();
    wait_for("the real checker's second probe", Duration::from_secs(30), || {
        let real = listed_checkers(&lan, pod_ip)?
            .into_iter()
            .find(|c| c["peer"] == checker_ip.as_str() && c["user_agent"].is_null());
        match real.as_ref().and_then(|c| c["probes"].as_u64()) {
            Some(n) if n >= 2 => Ok(()),
            other => Err(format!("the real checker's probes: {other:?}")),
        }
    });
    let deletion = delete_pod(&mut pod, &lan.host, pod_ip, &Hook::None, GRACE, || {});
    let sent = flood.sent.load(Ordering::Relaxed);
    drop(flood);
    load.stop();
    let down = front.wait_marked("old0", false, Duration::from_secs(5));
    let log = pod.agent.output();
    let exited = deletion.envoy_stopped.expect("Envoy stopped");
    let stopped = common::lb::envoy_stop_sent(&log).unwrap_or_else(|| panic!("Envoy was not stopped\n{log}"));
    let summary = pod.termination_message().expect("the exit summary");
    let lbs = &summary["load_balancers"];
    let quiet = lbs["quiet_period_seconds"].as_f64().unwrap_or(0.0);
    let (after, took) = (secs(down, stopped), secs(deletion.started, stopped));
    eprintln!(
        "{sent} hostile probes; the real load balancer took the pod out {:.2} s after deletion, lifeguard stopped \
         Envoy {took:.2} s after deletion ({after:.2} s after the verdict), Envoy gone {:.2} s after deletion; {lbs}",
        secs(deletion.started, down),
        secs(deletion.started, exited),
    );
    assert!(sent > 300, "the hostile peer sent only {sent} probes");
    assert!(
        after >= 0.0,
        "Envoy stopped {:.2} s before the real verdict\n{log}",
        -after
    );
    // The flood's own agents, followed apart (no room), hold the wait until
    // each has failed its threshold too: on an idle machine each probes
    // about as often as the real load balancer; on a busy one half as
    // often (every 6 s: 18 s for three failures, seen). So Envoy stops
    // within the quiet period and 3 s of the later of the real verdict and
    // the last prober done, as the log times it, and never at the checker
    // timeout.
    let last_done = log
        .lines()
        .filter(|l| {
            [
                "it has taken the pod out",
                "counted as done",
                "no longer waited for",
                "every checker is done",
            ]
            .iter()
            .any(|done| l.contains(done))
        })
        .filter_map(|l| l.split_whitespace().next().and_then(common::lb::parse_utc))
        .max()
        .unwrap_or_else(|| panic!("no checker done in the log\n{log}"));
    let settled = secs(down.max(last_done), stopped);
    eprintln!("Envoy stopped {settled:.2} s after the last of the verdict and the probers done");
    assert!(
        settled <= quiet + 3.0,
        "Envoy stopped {settled:.2} s after the last of the verdict and the probers done\n{log}"
    );
    assert!(took < 20.0, "held to the checker timeout: {took:.2} s\n{log}");
    assert_eq!(lbs["out_of_rotation"], true, "{summary}");
    assert!(log.contains("was not counted as a load balancer's"), "{log}");
    assert!(
        log.contains(&format!("checker {checker_ip} [not counted: no room]"))
            || log.contains(&format!("checker {checker_ip} (every")),
        "the real checker's verdict is in the log\n{log}"
    );
    assert_eq!(deletion.exit_code, 0, "{log}");
}

/// The drain's budget, checked ahead: a load balancer checking every 30 s and taking the
/// pod out after 2 failures (an ALB target group's defaults) needs 60 s,
/// the quiet period and the shutdown margin (and a sidecar's app its
/// time): said once it is learned, long before any drain, in the log,
/// `GET /drain` and the metrics, for a sidecar with a 30 s grace period;
/// silent for a gateway whose grace period (90 s) fits it.
#[test]
#[allow(clippy::too_many_lines)] // one scenario, read top to bottom
fn the_budget_names_a_checker_the_grace_period_cannot_fit_and_is_silent_when_it_fits() {
    let lan = Lan::new();
    let threshold = ["--drain-wait-unhealthy-threshold", "2"];
    let (sidecar, sidecar_ip) = pod_at(&lan, 0, &threshold);
    let mut fits_args = threshold.to_vec();
    fits_args.extend([
        "--drain-scope",
        "all",
        "--termination-grace-period",
        "90s",
        "--drain-wait-checker-timeout",
        "70s",
    ]);
    let (gateway, gateway_ip) = gateway_at(&lan, 1, Gateway::Shipped, &fits_args);
    // Each agent has read Envoy's config: the checker is known by its own
    // address from its first probe.
    for pod in [&sidecar, &gateway] {
        pod.agent
            .wait_output("appends each prober's own address", Duration::from_secs(20));
    }
    // The checker: an ALB's, every 30 s (two probes make its interval).
    let probe = |ip: std::net::Ipv4Addr| {
        let status = std::net::SocketAddr::from((ip, pod::STATUS));
        let ua = [("user-agent", "ELB-HealthChecker/2.0")];
        lan.host
            .run(move || request(status, "GET", "/healthz/ready", &ua, Duration::from_secs(2)).map(|a| a.status))
    };
    // Each pod's second probe 30 s after the start of its first (the
    // scenario's interval, not a wait for a condition): not 30 s after
    // the other pod's probe, which a busy machine makes slow.
    let mut first = Vec::new();
    for ip in [sidecar_ip, gateway_ip] {
        first.push(std::time::Instant::now());
        assert_eq!(probe(ip).unwrap(), 200);
    }
    for (ip, first) in [sidecar_ip, gateway_ip].into_iter().zip(first) {
        std::thread::sleep((first + Duration::from_secs(30)).saturating_duration_since(std::time::Instant::now()));
        assert_eq!(probe(ip).unwrap(), 200);
    }
    let budget_of = |ip: std::net::Ipv4Addr| {
        let agent = std::net::SocketAddr::from((ip, pod::AGENT));
        let drain = lan
            .host
            .run(move || common::get(agent, "/drain"))
            .map_err(|e| e.to_string())?;
        let json: serde_json::Value = serde_json::from_str(&drain.1).map_err(|e| e.to_string())?;
        match &json["drain_wait"]["budget"] {
            serde_json::Value::Null => Err("no budget yet".to_owned()),
            budget => Ok(budget.clone()),
        }
    };
    // A sample every 10 s looks at the checkers.
    let short = wait_for("the sidecar's budget", Duration::from_secs(20), || {
        budget_of(sidecar_ip)
    });
    let fits = wait_for("the gateway's budget", Duration::from_secs(20), || {
        budget_of(gateway_ip)
    });
    let checker = format!("{} (ELB-HealthChecker/2.0)", lan.host_ip(1));
    eprintln!(
        "sidecar: {short}
gateway: {fits}"
    );
    // The interval is measured between arrivals: a busy machine delays
    // one probe more than the other (29.95 s was seen), so the checker's
    // time is 60 s give or take half a second, and what is needed follows
    // from the time measured.
    let takes = |budget: &serde_json::Value| {
        let takes = budget["checker_takes_seconds"].as_f64().unwrap_or(f64::NAN);
        assert!((takes - 60.0).abs() <= 0.5, "2 failures 30 s apart: {budget}");
        takes
    };
    assert_eq!(short["fits"], false);
    assert_eq!(short["checker"], checker.as_str());
    assert_eq!(
        short["needed_grace_period_seconds"].as_f64(),
        Some((takes(&short) + 7.5).ceil()),
        "the checker's time + 0.5 + the 2 s margin + the app's 5 s, up to a whole second: {short}"
    );
    assert_eq!(short["grace_period_seconds"], 30.0);
    assert_eq!(fits["fits"], true);
    assert_eq!(
        fits["needed_grace_period_seconds"].as_f64(),
        Some((takes(&fits) + 2.5).ceil()),
        "a gateway keeps no time for an app: {fits}"
    );
    let log = sidecar.agent.output();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("it needs a grace period of"))
        .collect();
    assert_eq!(
        said.len(),
        1,
        "said once
{log}"
    );
    let needed = short["needed_grace_period_seconds"].as_f64().unwrap_or_default();
    let every = said[0]
        .split_once(&format!("checker {checker} probes every "))
        .and_then(|(_, rest)| rest.split_once("s and takes"))
        .and_then(|(every, _)| every.parse::<f64>().ok());
    assert!(
        every.is_some_and(|e| (e - 30.0).abs() <= 0.25)
            && said[0].contains(&format!("a grace period of {needed}s"))
            && said[0].contains("the pod's is 30s"),
        "{}",
        said[0]
    );
    let quiet = gateway.agent.output();
    assert!(!quiet.contains("it needs a grace period"), "{quiet}");
    for (ip, want) in [
        (sidecar_ip, "lifeguard_drain_wait_budget_fits 0"),
        (gateway_ip, "lifeguard_drain_wait_budget_fits 1"),
    ] {
        let agent = std::net::SocketAddr::from((ip, pod::AGENT));
        let scrape = lan.host.run(move || common::get(agent, "/stats/prometheus")).unwrap().1;
        assert!(scrape.lines().any(|l| l == want), "{ip}: no {want:?}");
    }
}

// ---------------------------------------------------------------------------
// The ingress gateway: a pod whose only container is the
// proxy, the load balancer's own target. Its drain is out-of-rotation:
// Envoy serves until its load balancers have taken it out and the traffic
// has stopped, then stops. The upstream lives outside the pods.

/// Each gateway's Envoy was stopped once its load balancers had taken the
/// pod out (never before: it served until then), lifeguard's SIGTERM (or
/// `/quitquitquit`) to it within 3 s of that and the quiet period (its
/// exit, printed, is Envoy's own: 3.5 s after the SIGTERM seen on a busy
/// machine); lifeguard's summary says it was out of rotation, and it
/// exited 0.
fn assert_gateway_left_in_time(run: &Run) {
    for (k, l) in run.left.iter().enumerate() {
        let d = &l.deletion;
        let last_down = *l.down.iter().max().unwrap();
        let exited = d
            .envoy_stopped
            .unwrap_or_else(|| panic!("old{k}: Envoy did not stop\n{}", l.log));
        let stopped =
            common::lb::envoy_stop_sent(&l.log).unwrap_or_else(|| panic!("old{k}: Envoy was not stopped\n{}", l.log));
        let summary = l
            .summary
            .as_ref()
            .unwrap_or_else(|| panic!("old{k}: no exit summary\n{}", l.log));
        let lbs = &summary["load_balancers"];
        let quiet = lbs["quiet_period_seconds"].as_f64().unwrap_or(0.0);
        let after = secs(last_down, stopped);
        eprintln!(
            "old{k}: SIGTERM -> taken out {:.2} s, Envoy stopped by lifeguard {:.2} s ({after:.2} s after, the quiet \
             period {quiet:.2} s), Envoy exited {:.2} s; {lbs}",
            secs(d.started, last_down),
            secs(d.started, stopped),
            secs(d.started, exited),
        );
        assert_eq!(summary["policy"], "out-of-rotation", "old{k}: {summary}\n{}", l.log);
        assert_eq!(lbs["out_of_rotation"], true, "old{k}: {summary}\n{}", l.log);
        assert!(
            after >= 0.0,
            "old{k}: lifeguard stopped Envoy {:.3} s before the load balancer took the pod out\n{}",
            -after,
            l.log
        );
        assert!(
            after <= quiet + 3.0,
            "old{k}: lifeguard stopped Envoy {after:.3} s after the load balancer took the pod out (quiet period \
             {quiet:.2} s)\n{}",
            l.log
        );
        assert_eq!(d.exit_code, 0, "old{k}: lifeguard's exit code\n{}", l.log);
    }
}

/// A rolling restart of gateways of `kind` at 200 requests a second behind
/// `balancer`, lifeguard run with `args`: nothing lost, each Envoy stopped
/// in time.
fn busy_gateway(balancer: Balancer, kind: Gateway, args: &[&str]) -> Run {
    let _one = ONE_BUSY_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let balancers = [balancer];
    // Nothing said, lifeguard tells a gateway by the app it never saw: a pod
    // it has looked at for some seconds (a pod deleted moments after its
    // start keeps app-exit).
    let steady = match args.is_empty() {
        true => Duration::from_secs(6),
        false => Duration::ZERO,
    };
    let run = rolling_restart(&Rollout {
        agent_args: args,
        steady,
        ..Rollout::gateway(&balancers, kind)
    });
    assert_nothing_lost(&run);
    assert_gateway_left_in_time(&run);
    run
}

/// The same at 2 requests a second, the pods having had that traffic for
/// 20 s (a quiet second is chance there), two pods replaced, with a grace
/// period of `grace` (the checker's time and the quiet period must fit it:
/// the budget).
fn sparse_gateway(balancer: Balancer, kind: Gateway, args: &[&str], grace: Duration) {
    let balancers = [balancer];
    let grace_arg = format!("{}s", grace.as_secs());
    let mut args = args.to_vec();
    args.extend(["--termination-grace-period", &grace_arg]);
    let run = rolling_restart(&Rollout {
        agent_args: &args,
        replace: 2,
        rate: 2,
        steady: Duration::from_secs(20),
        grace,
        ..Rollout::gateway(&balancers, kind)
    });
    assert_nothing_lost(&run);
    assert_gateway_left_in_time(&run);
}

/// The shipped manifest's form: `--drain-scope all`.
const SCOPE_ALL: &[&str] = &["--drain-scope", "all"];
/// Nothing said: a pod where no app was ever seen is a gateway.
const DEFAULTS: &[&str] = &[];

#[test]
fn a_gateway_behind_haproxy_checking_fast_serves_until_taken_out() {
    busy_gateway(Balancer::Haproxy(FAST), Gateway::Shipped, SCOPE_ALL);
}

#[test]
fn a_gateway_behind_haproxy_checking_slowly_serves_until_taken_out() {
    busy_gateway(Balancer::Haproxy(SLOW), Gateway::IstioShaped, DEFAULTS);
}

/// Slower than every peer's fixed 5 s (or 10 s) drain: 10-15 s to go.
#[test]
fn a_gateway_behind_haproxy_checking_every_5s_serves_until_taken_out() {
    busy_gateway(Balancer::Haproxy(SLOWER), Gateway::FileXds, SCOPE_ALL);
}

#[test]
fn a_gateway_behind_envoy_as_the_front_proxy_serves_until_taken_out() {
    busy_gateway(FRONT_ENVOY, Gateway::Shipped, DEFAULTS);
}

/// The front Envoy pools HTTP/2 connections to the gateways: after the
/// verdict each is closed by a GOAWAY, never under a request it sent.
#[test]
fn a_gateway_behind_envoy_over_http2_loses_nothing_and_resets_no_stream() {
    let front = Balancer::Envoy {
        inter: Duration::from_secs(1),
        http2: true,
    };
    let run = busy_gateway(front, Gateway::Shipped, SCOPE_ALL);
    eprintln!("the front Envoy's resets: {:?}", run.resets);
    assert!(!run.resets.is_empty(), "the front Envoy's stats were not read");
    assert!(run.resets.iter().all(|(_, n)| *n == 0), "{:?}", run.resets);
}

#[test]
fn a_gateway_behind_a_load_balancer_that_never_checks_serves_until_taken_out() {
    busy_gateway(Balancer::Endpoints, Gateway::IstioShaped, SCOPE_ALL);
}

/// An ALB's checks of the traffic port: Envoy's health_check filter
/// fails them from the drain's start; the traffic goes on being served.
#[test]
fn a_gateway_behind_a_load_balancer_checking_the_traffic_port_serves_until_taken_out() {
    let run = busy_gateway(Balancer::TrafficPort(FAST), Gateway::Shipped, SCOPE_ALL);
    for l in &run.left {
        assert!(l.log.contains("(POST /healthcheck/fail)"), "{}", l.log);
    }
}

#[test]
fn sparse_traffic_to_a_gateway_behind_haproxy_checking_fast_loses_nothing() {
    sparse_gateway(Balancer::Haproxy(FAST), Gateway::Shipped, SCOPE_ALL, GRACE);
}

#[test]
fn sparse_traffic_to_a_gateway_behind_haproxy_checking_slowly_loses_nothing() {
    sparse_gateway(Balancer::Haproxy(SLOW), Gateway::IstioShaped, DEFAULTS, GRACE);
}

#[test]
fn sparse_traffic_to_a_gateway_behind_haproxy_checking_every_5s_loses_nothing() {
    // 10-15 s for the checker and about 16 s of quiet: more than 30 s.
    let grace = Duration::from_secs(45);
    sparse_gateway(Balancer::Haproxy(SLOWER), Gateway::FileXds, SCOPE_ALL, grace);
}

#[test]
fn sparse_traffic_to_a_gateway_behind_envoy_as_the_front_proxy_loses_nothing() {
    sparse_gateway(FRONT_ENVOY, Gateway::Shipped, DEFAULTS, GRACE);
}

#[test]
fn sparse_traffic_to_a_gateway_behind_a_load_balancer_that_never_checks_loses_nothing() {
    sparse_gateway(Balancer::Endpoints, Gateway::IstioShaped, SCOPE_ALL, GRACE);
}

#[test]
fn sparse_traffic_to_a_gateway_behind_a_load_balancer_checking_the_traffic_port_loses_nothing() {
    sparse_gateway(Balancer::TrafficPort(FAST), Gateway::Shipped, SCOPE_ALL, GRACE);
}

// ---------------------------------------------------------------------------
// The ways a node gets its traffic with `externalTrafficPolicy: Local`,
// kube-proxy's rules between them and the pods (`common::nodes`): a load
// balancer that checks the node (its health-check port fails as soon as
// its only endpoint terminates; the load balancer takes the node out at its
// own pace, and until then kube-proxy sends the node's new connections to
// the terminating pod only while the kubelet's readiness probe of it
// passes), and an announcer that follows the EndpointSlice (MetalLB: the
// node announced while an endpoint on it is ready or serving, withdrawn
// once none is). Both read the kubelet's answer, and want opposite things
// of it: lifeguard answers the kubelet as Envoy is for the node's load
// balancers' time (10 s x 3 assumed, and a second), then 503; Envoy serves
// until the traffic has stopped. The same defaults, a 90 s grace period.

use common::nodes::{
    can_serve, choose, node_rolling_restart, Choice, Conditions, NodeRollout, NodeRun, NodeWay, ProbeSpec,
};

/// kube-proxy's rules as the model applies them: a ready endpoint first;
/// else a terminating one only while it is serving; else the node drops
/// the connection. The announcer's: a node with an endpoint ready or
/// serving is announced, terminating or not.
#[test]
fn the_models_kube_proxy_sends_to_ready_then_to_serving_terminating_else_drops() {
    let ep = |port: u16, serving: bool, terminating: bool| {
        let addr = std::net::SocketAddr::from(([10, 0, 0, 1], port));
        (format!("pod{port}"), addr, Conditions { serving, terminating })
    };
    let both = [ep(1, true, true), ep(2, true, false)];
    assert_eq!(choose(&both, 0), (Choice::Ready, Some(both[1].1)));
    let old = [ep(1, true, true)];
    assert_eq!(choose(&old, 0), (Choice::TerminatingServing, Some(old[0].1)));
    let failed = [ep(1, false, true), ep(2, false, false)];
    assert_eq!(choose(&failed, 0), (Choice::Dropped, None));
    assert_eq!(choose(&[], 0), (Choice::Dropped, None));
    assert!(can_serve(&old), "terminating but serving: announced");
    assert!(!can_serve(&failed) && !can_serve(&[]), "none serving: withdrawn");
}

/// lifeguard stopped the pod's Envoy after its node was let go (it served
/// until then), within the quiet period and 3 s of it (its log line's
/// time), and Envoy was gone within `gone_within` of it when given; the
/// kubelet was answered 200 while the pod terminated, then 503 `because`,
/// never before the node was let go but by the node's load balancers'
/// time (which an announcer's withdrawal follows); lifeguard exited 0.
fn assert_node_left_in_time(run: &NodeRun, gone_within: Option<f64>) {
    let l = &run.run.left[0];
    let d = &l.deletion;
    let let_go = l.down[0];
    let exited = d
        .envoy_stopped
        .unwrap_or_else(|| panic!("Envoy did not stop\n{}", l.log));
    let stopped = common::lb::envoy_stop_sent(&l.log).unwrap_or_else(|| panic!("Envoy was not stopped\n{}", l.log));
    let summary = l
        .summary
        .as_ref()
        .unwrap_or_else(|| panic!("no exit summary\n{}", l.log));
    let quiet = summary["load_balancers"]["quiet_period_seconds"]
        .as_f64()
        .unwrap_or(0.0);
    let (after, gone) = (secs(let_go, stopped), secs(let_go, exited));
    eprintln!(
        "SIGTERM -> the node let go {:.2} s, Envoy stopped by lifeguard {:.2} s ({after:.2} s after, the quiet \
         period {quiet:.2} s), Envoy gone {:.2} s ({gone:.2} s after); kubelet: {}; {}",
        secs(d.started, let_go),
        secs(d.started, stopped),
        secs(d.started, exited),
        summary["kubelet"],
        run.nodes.join("; ")
    );
    assert!(
        after >= 0.0,
        "lifeguard stopped Envoy {:.3} s before the node was let go\n{}",
        -after,
        l.log
    );
    assert!(
        after <= quiet + 3.0,
        "lifeguard stopped Envoy {after:.3} s after the node was let go (quiet period {quiet:.2} s)\n{}",
        l.log
    );
    if let Some(within) = gone_within {
        assert!(
            gone <= within,
            "Envoy gone {gone:.3} s after the node was let go ({within:.2} s allowed)\n{}",
            l.log
        );
    }
    let kubelet = &summary["kubelet"];
    assert_eq!(kubelet["answer"], "follows_envoy", "{summary}");
    assert!(kubelet["ready_probes"].as_u64() >= Some(1), "{summary}");
    let turned = kubelet["not_serving_after_seconds"].as_f64().unwrap_or(f64::MAX);
    assert!(
        turned >= secs(d.started, let_go) - 1.0 || kubelet["not_serving_because"] == "node_load_balancers_time",
        "the kubelet's answer turned before the node was let go: {summary}"
    );
    assert_eq!(d.exit_code, 0, "lifeguard's exit code\n{}", l.log);
}

/// A pod (a gateway of `gateway`'s shape, or a sidecar's with the drain
/// wait's hook) replaced with its node's traffic coming `way`, at `rate`
/// requests a second, lifeguard's defaults and a 90 s grace period:
/// nothing lost, Envoy gone in time.
fn behind(way: NodeWay, gateway: Option<Gateway>, rate: u32) -> NodeRun {
    let busy = rate > 10;
    let _one = busy.then(|| ONE_BUSY_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner()));
    let args: &[&str] = match gateway {
        Some(_) => &["--drain-scope", "all", "--termination-grace-period", "90s"],
        None => &["--termination-grace-period", "90s"],
    };
    let run = node_rolling_restart(&NodeRollout {
        way,
        rate,
        steady: match busy {
            true => Duration::ZERO,
            false => Duration::from_secs(20),
        },
        gateway,
        agent_args: args,
        grace: Duration::from_secs(90),
        kubelet: ProbeSpec::SHIPPED,
        client: Client::NEW_CONNECTIONS,
    });
    assert_nothing_lost(&run.run);
    let within = match (way, busy, gateway) {
        // The bound: a gateway's Envoy gone within 4 s of its
        // node's withdrawal.
        (NodeWay::Announced { .. }, true, Some(_)) => Some(4.0),
        _ => None,
    };
    assert_node_left_in_time(&run, within);
    if let NodeWay::Announced { .. } = way {
        let kubelet = &run.run.left[0].summary.as_ref().unwrap()["kubelet"];
        assert_eq!(kubelet["not_serving_because"], "node_load_balancers_time", "{kubelet}");
        assert_eq!(kubelet["not_serving_after_seconds"], 31.0, "{kubelet}");
    }
    run
}

/// Every 10 s, out after 3 (the AWS Load Balancer Controller's own
/// defaults for instance targets under `Local` take a node out after 2:
/// `tests/overlays.rs` plays those, from the overlay).
const NODE_EVERY_10S: Check = Check {
    inter: Duration::from_secs(10),
    fall: 3,
    rise: 1,
    terminates: false,
};
/// Every 5 s, out after 3.
const NODE_EVERY_5S: Check = Check {
    inter: Duration::from_secs(5),
    fall: 3,
    rise: 1,
    terminates: false,
};

#[test]
fn a_gateway_behind_a_load_balancer_checking_its_node_every_10s_loses_nothing() {
    behind(NodeWay::Checked(NODE_EVERY_10S), Some(Gateway::Shipped), 200);
}

#[test]
fn a_sidecars_pod_behind_a_load_balancer_checking_its_node_every_5s_loses_nothing() {
    behind(NodeWay::Checked(NODE_EVERY_5S), None, 200);
}

#[test]
fn sparse_traffic_to_a_gateway_behind_a_load_balancer_checking_its_node_every_5s_loses_nothing() {
    behind(NodeWay::Checked(NODE_EVERY_5S), Some(Gateway::IstioShaped), 2);
}

#[test]
fn sparse_traffic_to_a_sidecars_pod_behind_a_load_balancer_checking_its_node_every_10s_loses_nothing() {
    behind(NodeWay::Checked(NODE_EVERY_10S), None, 2);
}

/// Issue #51: behind an announcer (MetalLB), the same defaults: the node
/// is withdrawn once the kubelet has seen the pod fail (after the node's
/// load balancers' time), nothing is lost, and Envoy is gone within 4 s of
/// the withdrawal.
#[test]
fn a_gateway_behind_an_announcer_loses_nothing_and_stops_once_its_node_is_withdrawn() {
    behind(NodeWay::METALLB, Some(Gateway::Shipped), 200);
}

#[test]
fn a_sidecars_pod_behind_an_announcer_loses_nothing() {
    behind(NodeWay::METALLB, None, 200);
}

#[test]
fn sparse_traffic_to_a_gateway_behind_an_announcer_loses_nothing() {
    behind(NodeWay::METALLB, Some(Gateway::IstioShaped), 2);
}

#[test]
fn sparse_traffic_to_a_sidecars_pod_behind_an_announcer_loses_nothing() {
    behind(NodeWay::METALLB, None, 2);
}

/// The model tells the two rules apart behind a load balancer that checks
/// the node: a pod that fails the kubelet's probe at SIGTERM
/// (`--terminating-readiness failing`, the older rule; Istio's) has opted
/// out of kube-proxy's fallback, and the node drops what its load balancer
/// still sends once the kubelet has seen the failures (here every 2 s, 2
/// failures: before the load balancer's 5 s x 3), while Envoy itself would
/// still serve.
#[test]
fn a_pod_failing_the_kubelets_probe_at_sigterm_loses_the_nodes_traffic() {
    let run = node_rolling_restart(&NodeRollout {
        way: NodeWay::Checked(NODE_EVERY_5S),
        rate: CONTROL_RATE,
        steady: Duration::ZERO,
        gateway: Some(Gateway::Shipped),
        agent_args: &["--drain-scope", "all", "--terminating-readiness", "failing"],
        grace: GRACE,
        kubelet: ProbeSpec {
            period: Duration::from_secs(2),
            failure_threshold: 2,
            timeout: Duration::from_secs(1),
        },
        client: Client::NEW_CONNECTIONS,
    });
    let failed = run.run.sent.iter().filter(|s| s.answer != Ok(200)).count();
    let l = &run.run.left[0];
    eprintln!(
        "{failed} of {} lost; {}; kubelet: {}",
        run.run.sent.len(),
        run.nodes.join("; "),
        l.summary.as_ref().map_or("-".into(), |s| s["kubelet"].to_string())
    );
    assert!(failed > 0, "nothing lost\n{}", run.nodes.join("\n"));
    assert!(run.dropped[0] > 0, "node0 dropped nothing: {}", run.nodes[0]);
    assert_eq!(l.summary.as_ref().unwrap()["kubelet"]["answer"], "not_serving");
}

/// And behind an announcer: a pod that stays serving for the kubelet
/// until Envoy stops (#45's rule; here the node's load balancers' time,
/// 31 s, is longer than the 28 s drain's deadline of a 30 s grace period,
/// which lifeguard check says does not fit an announcer) keeps its node
/// announced: the traffic never stops, the wait runs to its bound, Envoy
/// stops while the node is still announced, and the node drops what
/// arrives until the kubelet has seen its failures and the node is
/// withdrawn.
#[test]
fn a_pod_serving_for_the_kubelet_until_envoy_stops_loses_an_announced_nodes_traffic() {
    let run = node_rolling_restart(&NodeRollout {
        way: NodeWay::METALLB,
        rate: CONTROL_RATE,
        steady: Duration::ZERO,
        gateway: Some(Gateway::Shipped),
        agent_args: &["--drain-scope", "all"],
        grace: GRACE,
        kubelet: ProbeSpec::SHIPPED,
        client: Client::NEW_CONNECTIONS,
    });
    let failed = run.run.sent.iter().filter(|s| s.answer != Ok(200)).count();
    let l = &run.run.left[0];
    let summary = l.summary.as_ref().expect("an exit summary");
    eprintln!(
        "{failed} of {} lost; {}; kubelet: {}; outcome {}",
        run.run.sent.len(),
        run.nodes.join("; "),
        summary["kubelet"],
        summary["outcome"]
    );
    assert!(failed > 0, "nothing lost\n{}", run.nodes.join("\n"));
    assert_eq!(summary["kubelet"]["not_serving_because"], "envoy_stopping");
    let stopped = l.deletion.envoy_stopped.expect("Envoy stopped");
    assert!(stopped < l.down[0], "Envoy stopped before its node was withdrawn");
}

// ---------------------------------------------------------------------------
// Envoy Gateway's pods with lifeguard in place of the shutdown manager
// (`config/k8s/envoy-gateway/envoyproxy.yaml`): Envoy in a container of its
// own, bootstrapped as Envoy Gateway bootstraps it (admin on 19000, the
// stats and ready listeners, the traffic listener over xDS), lifeguard
// beside it over the admin, on 19002. The kubelet's side of a deletion:
// the envoy container's preStop hook `GET :19002/drain/stopped`, lifeguard's
// SIGTERM at the same moment, Envoy's SIGTERM when the hook answers.

/// lifeguard's status port in Envoy Gateway's pods.
const EG_STATUS: u16 = common::pod::EG_STATUS;

/// Envoy Gateway's pods rolled behind HAProxy checking lifeguard's 19002:
/// nothing lost, each Envoy stopped once its load balancer took the pod
/// out (by lifeguard, through its admin API, before the kubelet's SIGTERM)
/// and within 3 s of it and the quiet period.
#[test]
fn envoy_gateways_pods_with_lifeguard_beside_envoy_roll_without_losing_a_request() {
    let _one = ONE_BUSY_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let balancers = [Balancer::HaproxyOn(FAST, EG_STATUS)];
    let run = rolling_restart(&Rollout {
        hook: Hook::GetAt(EG_STATUS, "/drain/stopped".into()),
        ..Rollout::gateway(&balancers, Gateway::EnvoyGatewayShaped)
    });
    assert_nothing_lost(&run);
    assert_gateway_left_in_time(&run);
    for (k, l) in run.left.iter().enumerate() {
        let d = &l.deletion;
        assert!(
            d.hook_answer.starts_with("200 Envoy stopped"),
            "old{k}: the envoy container's hook: {}\n{}",
            d.hook_answer,
            l.log
        );
        envoy_quit_before_the_kubelets_sigterm(&format!("old{k}"), d, l.envoy_log.as_deref(), &l.log);
        assert_eq!(
            l.summary.as_ref().unwrap()["envoy"],
            "quit through the admin API",
            "old{k}"
        );
    }
}

/// A request in flight when an Envoy Gateway pod is deleted is answered:
/// the envoy container's hook holds Envoy's SIGTERM until lifeguard has
/// drained and stopped it.
#[test]
fn a_request_in_flight_in_an_envoy_gateway_pod_is_answered() {
    let lan = Lan::new();
    let (mut pod, ip) = gateway_at(&lan, 0, Gateway::EnvoyGatewayShaped, &[]);
    let traffic = std::net::SocketAddr::from((ip, common::pod::GATEWAY_PORT));
    let request = lan.host.spawn(move || {
        let r = common::http_timeout("GET", traffic, "/slow", Duration::from_secs(20));
        (r, SystemTime::now())
    });
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], common::pod::EG_ADMIN));
    wait_for("the request to reach Envoy", Duration::from_secs(10), || {
        let read = pod
            .net
            .pod
            .run(move || common::get(admin, "/stats?filter=http-8080.downstream_rq_active"));
        match read {
            Ok((200, body)) if body.contains("downstream_rq_active: 1") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let hook = Hook::GetAt(EG_STATUS, "/drain/stopped".into());
    let deletion = delete_pod(&mut pod, &lan.host, ip, &hook, GRACE, || {});
    let (answer, _) = request.join().unwrap();
    assert_eq!(answer.unwrap(), (200, "peer\n".to_owned()), "the request in flight");
    eprintln!(
        "deleted -> the hook answered {:.2} s, Envoy stopped {:.2} s: {}",
        secs(deletion.started, deletion.hook_returned),
        deletion.envoy_stopped.map_or(f64::NAN, |t| secs(deletion.started, t)),
        deletion.hook_answer
    );
    assert_eq!(deletion.exit_code, 0, "{}", pod.agent.output());
    assert!(
        deletion.hook_answer.starts_with("200 Envoy stopped"),
        "{}",
        deletion.hook_answer
    );
    envoy_quit_before_the_kubelets_sigterm("the pod", &deletion, pod.envoy_output().as_deref(), &pod.agent.output());
}

/// Envoy's own container, stopped by lifeguard through its admin before
/// the hook returned: its main loop had ended (Envoy never handled the
/// kubelet's SIGTERM, which it logs as "caught ENVOY_SIGTERM"), and its
/// process was gone soon after the hook (the last milliseconds of its
/// teardown may see the SIGTERM: admin closed is the last sign of Envoy
/// a container beside it can read).
fn envoy_quit_before_the_kubelets_sigterm(name: &str, d: &Deletion, envoy_log: Option<&str>, log: &str) {
    let envoy_log = envoy_log.expect("Envoy in a container of its own");
    assert!(
        !envoy_log.contains("caught ENVOY_SIGTERM"),
        "{name}: the kubelet's SIGTERM stopped a running Envoy:\n{envoy_log}\n{log}"
    );
    let stopped = d.envoy_stopped.expect("Envoy exited within the grace period");
    let after = stopped.duration_since(d.hook_returned).map_or(0.0, |t| t.as_secs_f64());
    eprintln!("{name}: Envoy's process gone {after:.3} s after the hook returned");
    assert!(
        after < 5.0,
        "{name}: Envoy exited {after:.2} s after the hook\n{envoy_log}\n{log}"
    );
}
