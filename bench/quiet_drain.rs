//! What a quiet pod's drain costs: the drain's time against the traffic the
//! pod had before it. Since the kubelet is told a terminating pod serves
//! (for kube-proxy's fallback), every policy waits for the drain wait's
//! verdict, whose quiet period is the gap that comes by chance at most
//! once in a thousand at the pod's rate (`ln(1000) / rate`), and the
//! wait's bound at the most: a sparse pod drains to the bound. A gateway's
//! `out-of-rotation` drain and a sidecar's `GET /drain/wait` hook wait for
//! the same quiet period.
//!
//! `bench/quiet_drain.sh`, or `cargo bench --bench quiet_drain`. Each row:
//! a pod of the integration tests (`tests/common/local_pod.rs`: the real
//! Envoy, lifeguard, an app on loopback), the `requests` policy and a 30 s
//! grace period (the wait's bound 23 s), new requests through Envoy's
//! inbound listener at a fixed rate for 60 s, then SIGTERM; the drain's
//! time, its quiet period and its outcome from the exit summary. Side by
//! side: lifeguard's defaults, and `--drain-wait-max-quiet-period 5s`
//! (a gap of 5 s then ends the wait: at 0.5 requests a second one comes by
//! chance 8 % of the time, so a load balancer still sending at that rate
//! loses its requests that often). The rows of one setting run at once,
//! each in its own pod.

use std::time::{Duration, Instant};

use common::*;

/// One drain: the pod's traffic at `rate` a second for `steady`, then
/// SIGTERM. The exit summary.
fn one(rate: f64, extra: &'static [&'static str], steady: Duration) -> serde_json::Value {
    let dir = temp_dir("quiet-drain");
    let msg = dir.path().join("termination-log");
    let msg_arg = msg.display().to_string();
    let mut args = vec![
        "--termination-grace-period",
        "30s",
        "--drain-until",
        "requests",
        "--termination-message-path",
        &msg_arg,
    ];
    args.extend_from_slice(extra);
    let mut pod = Pod::start(Agent::builder().args(&args));
    let inbound = pod.ports.inbound.addr();
    let every = Duration::from_secs_f64(1.0 / rate);
    let start = Instant::now();
    let mut due = start;
    while start.elapsed() < steady {
        let _ = get(inbound, "/delay/0");
        due += every;
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
    }
    pod.sigterm();
    pod.agent.exit_code(Duration::from_secs(40));
    let text = std::fs::read_to_string(&msg).unwrap_or_default();
    serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
}

fn main() {
    let rates = [0.1, 0.3, 0.5, 1.0, 2.0, 10.0, 100.0];
    let settings: [(&str, &'static [&'static str]); 2] = [
        ("defaults", &[]),
        (
            "--drain-wait-max-quiet-period 5s",
            &["--drain-wait-max-quiet-period", "5s"],
        ),
    ];
    println!("| setting | new requests a second | quiet period | drain (SIGTERM to Envoy stopped) | outcome |");
    println!("| --- | --- | --- | --- | --- |");
    for (name, extra) in settings {
        let runs: Vec<_> = rates
            .iter()
            .map(|&rate| std::thread::spawn(move || (rate, one(rate, extra, Duration::from_secs(60)))))
            .collect();
        for run in runs {
            let (rate, summary) = run.join().unwrap();
            println!(
                "| {name} | {rate} | {} s | {} s | {} |",
                summary["load_balancers"]["quiet_period_seconds"], summary["duration_seconds"], summary["outcome"]
            );
        }
    }
}
