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

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use lb::*;

/// One rolling restart at a time: each drives 200 requests a second and
/// measures against its load balancer's clock.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

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

/// The two settings of the issue: checks every 1 s, down after 2; every
/// 2 s, down after 3.
const FAST: Check = Check {
    inter: Duration::from_secs(1),
    fall: 2,
    rise: 2,
};
const SLOW: Check = Check {
    inter: Duration::from_secs(2),
    fall: 3,
    rise: 2,
};

#[test]
fn a_rolling_restart_behind_a_fast_checking_load_balancer_loses_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let run = rolling_restart(&[FAST], &Hook::Get("/drain/wait".into()), 3);
    assert_nothing_lost(&run);
    assert_left_in_time(&run.left);
}

#[test]
fn a_rolling_restart_behind_a_slow_checking_load_balancer_loses_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let run = rolling_restart(&[SLOW], &Hook::Get("/drain/wait".into()), 3);
    assert_nothing_lost(&run);
    assert_left_in_time(&run.left);
}

#[test]
fn with_two_load_balancers_the_hook_waits_for_the_slower() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let run = rolling_restart(&[FAST, SLOW], &Hook::Get("/drain/wait".into()), 1);
    assert_nothing_lost(&run);
    assert_left_in_time(&run.left);
    let l = &run.left[0];
    assert!(
        l.down[1] > l.down[0],
        "the slow load balancer marked the pod down first: {:?}",
        l.down
    );
}
