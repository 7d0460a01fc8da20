//! A rolling restart behind a real load balancer, the app's preStop hook
//! side by side: none, a fixed `sleep` of 1, 3 and 10 s, and lifeguard's
//! drain wait (`GET /drain/wait`). The rollout of `tests/lb.rs`
//! (`tests/common/lb.rs`): HAProxy health-checking each pod through Envoy's
//! status listener, a client at 200 requests a second through it, 3 pods
//! replaced one by one, the app stopping to listen at SIGTERM. Needs root
//! and HAProxy.
//!
//! `bench/rolling.sh`, or `cargo bench --bench rolling -- [ROUNDS=1]`.
//!
//! For each load balancer setting (fast: checks every 1 s, down after 2
//! failures; slow: every 2 s, after 3) and each hook: the requests that
//! failed, and per pod the time from its deletion to its app's SIGTERM (the
//! hook's return) and to the pod gone (lifeguard exited), medians over the
//! pods.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/common/lb.rs"]
mod lb;
#[path = "../tests/common/pod.rs"]
mod pod;

use std::time::Duration;

use lb::*;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    let lbs = [
        (
            "1 s x 2",
            Check {
                inter: Duration::from_secs(1),
                fall: 2,
                rise: 2,
            },
        ),
        (
            "2 s x 3",
            Check {
                inter: Duration::from_secs(2),
                fall: 3,
                rise: 2,
            },
        ),
    ];
    let hooks = [
        ("none", Hook::Sleep(Duration::ZERO)),
        ("sleep 1", Hook::Sleep(Duration::from_secs(1))),
        ("sleep 3", Hook::Sleep(Duration::from_secs(3))),
        ("sleep 10", Hook::Sleep(Duration::from_secs(10))),
        ("GET /drain/wait", Hook::Get("/drain/wait".into())),
    ];
    println!("| load balancer | app's preStop hook | requests failed (of sent) | deletion -> app's SIGTERM, median | deletion -> pod gone, median | load balancer marked down, median |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for (lb_name, check) in lbs {
        for (hook_name, hook) in &hooks {
            for _ in 0..rounds {
                let run = rolling_restart(&[check], hook, 3);
                let failed = run.sent.iter().filter(|s| s.answer != Ok(200)).count();
                let to_sigterm = median(
                    run.left
                        .iter()
                        .map(|l| secs(l.deletion.started, l.deletion.hook_returned))
                        .collect(),
                );
                let to_gone = median(
                    run.left
                        .iter()
                        .map(|l| secs(l.deletion.started, l.deletion.gone))
                        .collect(),
                );
                let to_down = median(run.left.iter().map(|l| secs(l.deletion.started, l.down[0])).collect());
                println!(
                    "| {lb_name} | {hook_name} | {failed} (of {}) | {to_sigterm:.2} s | {to_gone:.2} s | {to_down:.2} s |",
                    run.sent.len()
                );
            }
        }
    }
}
