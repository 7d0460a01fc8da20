//! Issue #27: the third user, the load balancer that health-checks the pod.
//! A rolling restart behind a real HAProxy (see `common/lb.rs`: HAProxy on
//! a host of its own, health-checking each pod through Envoy's status
//! listener and sending it traffic at 200 requests a second; pods of
//! `common/pod.rs`, each the real Envoy, lifeguard and an app that stops
//! listening at SIGTERM), the app's preStop hook `GET /drain/wait` called
//! as the kubelet calls it, the app's SIGTERM when it answers.
//!
//! What a user would check: no request fails, whatever the load balancer's
//! check settings, and no fixed sleep was guessed: each hook answers after
//! its load balancer marked the pod down, and within 2 s of it (the figure
//! is printed). Needs root (namespaces, cgroups) and HAProxy.

mod common;
#[path = "common/lb.rs"]
mod lb;
#[path = "common/pod.rs"]
mod pod;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use lb::*;
use pod::*;

/// One rolling restart at a time: each drives 200 requests a second and
/// measures against its load balancer's clock.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const GRACE: Duration = Duration::from_secs(30);

/// A pod of the rollout, joined to the LAN at its slot, its app serving.
/// Joined once the app serves: a load balancer that checks Envoy's
/// readiness cannot tell whether the app behind it is up.
fn pod_at(lan: &Lan, slot: u8) -> (TestPod, Ipv4Addr) {
    let mut pod = TestPod::start(&PodSpec::new(false, &[]));
    pod.start_app(AppMode::Pooled, 0.3, "");
    let ip = lan.attach(&pod, slot);
    (pod, ip)
}

/// What one pod's deletion looked like from the load balancers.
struct Left {
    deletion: Deletion,
    /// When each load balancer marked the pod down.
    down: Vec<SystemTime>,
}

/// Replaces `replace` of 3 pods one by one (the new one ready in every
/// load balancer before the old one is deleted, as a Deployment's rolling
/// update with maxSurge 1 and maxUnavailable 0), with a client sending 200
/// requests a second through every load balancer in turn; every request's
/// answer and each old pod's deletion.
/// A rolling restart's record.
struct Run {
    sent: Vec<Sent>,
    left: Vec<Left>,
    /// What the load balancers said, with when.
    events: Vec<(SystemTime, String)>,
}

fn rolling_restart(checks: &[Check], hook: &Hook, replace: u8) -> Run {
    let lan = Lan::new();
    let mut old: Vec<Option<(TestPod, Ipv4Addr)>> = (0..3).map(|slot| Some(pod_at(&lan, slot))).collect();
    let servers: Vec<(String, Ipv4Addr)> = (0..3u8)
        .map(|k| (format!("old{k}"), lan.slot_ip(k)))
        .chain((0..3u8).map(|k| (format!("new{k}"), lan.slot_ip(3 + k))))
        .collect();
    let lbs: Vec<Haproxy> = checks
        .iter()
        .zip(1..)
        .map(|(check, source)| Haproxy::start(&lan, *check, &servers, source))
        .collect();
    for lb in &lbs {
        for k in 0..3 {
            lb.wait_marked(&format!("new{k}"), "DOWN", Duration::from_secs(10));
        }
    }
    let targets: Vec<SocketAddr> = lbs.iter().map(|lb| lb.frontend).collect();
    let load = Load::start(&lan.host, &targets, 200);
    let mut new = Vec::new();
    let mut left = Vec::new();
    for k in 0..replace {
        new.push(pod_at(&lan, 3 + k));
        for lb in &lbs {
            lb.wait_marked(&format!("new{k}"), "UP", Duration::from_secs(30));
        }
        let (mut pod, ip) = old[k as usize].take().unwrap();
        let deletion = delete_pod(&mut pod, &lan.host, ip, hook, GRACE);
        if std::env::var_os("LB_DEBUG").is_some() {
            eprintln!("{}", pod.agent.output());
        }
        let down = lbs
            .iter()
            .map(|lb| lb.marked(&format!("old{k}"), "DOWN"))
            .collect::<Option<Vec<_>>>();
        let down = down.unwrap_or_else(|| panic!("a load balancer never marked old{k} down: {deletion:?}"));
        left.push(Left { deletion, down });
    }
    let sent = load.stop();
    let events = lbs.iter().flat_map(Haproxy::events).collect();
    Run { sent, left, events }
}

/// Every request answered 200; when not, the failures on a timeline with
/// the load balancers' state changes and the pods' deletions.
fn assert_nothing_lost(run: &Run) {
    let failed: Vec<&Sent> = run.sent.iter().filter(|s| s.answer != Ok(200)).collect();
    eprintln!("requests: {} sent, {} failed", run.sent.len(), failed.len());
    assert!(
        run.sent.len() > 1000,
        "the client sent only {} requests",
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
    panic!(
        "{} of {} requests failed (timeline above)",
        failed.len(),
        run.sent.len()
    );
}

/// Each hook said the pod is out of rotation, after the last load balancer
/// marked it down and within 2 s of it; lifeguard exited 0.
fn assert_left_in_time(left: &[Left]) {
    for (k, l) in left.iter().enumerate() {
        let d = &l.deletion;
        let last_down = *l.down.iter().max().unwrap();
        let after = secs(last_down, d.hook_returned);
        let downs: Vec<String> = l.down.iter().map(|t| format!("{:.2}", secs(d.started, *t))).collect();
        eprintln!(
            "old{k}: SIGTERM -> marked down {} s, hook returned {:.2} s ({after:.2} s after the last), gone {:.2} s; {}",
            downs.join(" / "),
            secs(d.started, d.hook_returned),
            secs(d.started, d.gone),
            d.hook_answer
        );
        assert!(
            d.hook_answer.starts_with("200 out of rotation: "),
            "old{k}: {}",
            d.hook_answer
        );
        assert!(
            after >= 0.0,
            "old{k}: the hook returned {:.3} s before the load balancer marked the pod down",
            -after
        );
        assert!(
            after <= 2.0,
            "old{k}: the hook returned {after:.3} s after the load balancer marked the pod down"
        );
        assert_eq!(d.exit_code, 0, "old{k}: lifeguard's exit code");
    }
}

#[test]
fn a_rolling_restart_behind_a_fast_checking_load_balancer_loses_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let fast = Check {
        inter: Duration::from_secs(1),
        fall: 2,
        rise: 2,
    };
    let run = rolling_restart(&[fast], &Hook::Get("/drain/wait".into()), 3);
    assert_nothing_lost(&run);
    assert_left_in_time(&run.left);
}

#[test]
fn a_rolling_restart_behind_a_slow_checking_load_balancer_loses_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let slow = Check {
        inter: Duration::from_secs(2),
        fall: 3,
        rise: 2,
    };
    let run = rolling_restart(&[slow], &Hook::Get("/drain/wait".into()), 3);
    assert_nothing_lost(&run);
    assert_left_in_time(&run.left);
}

#[test]
fn with_two_load_balancers_the_hook_waits_for_the_slower() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let fast = Check {
        inter: Duration::from_secs(1),
        fall: 2,
        rise: 2,
    };
    let slow = Check {
        inter: Duration::from_secs(2),
        fall: 3,
        rise: 2,
    };
    let run = rolling_restart(&[fast, slow], &Hook::Get("/drain/wait".into()), 1);
    assert_nothing_lost(&run);
    assert_left_in_time(&run.left);
    let l = &run.left[0];
    assert!(
        l.down[1] > l.down[0],
        "the slow load balancer marked the pod down first: {:?}",
        l.down
    );
}
