//! The app's exit → Envoy stopped, and the drain policies side by side, in
//! the pod the integration tests build (`tests/common/pod.rs`: network and
//! pid namespaces, a cgroup per container, the real Envoy, clients and a
//! peer service across a veth pair). Needs root.
//!
//! `bench/app_exit.sh [RUNS=20] [RUNS_PER_OTHER_POLICY=3]`, or
//! `cargo bench --bench app_exit -- RUNS OTHERS`.
//!
//! One run: a downstream client holds an idle keep-alive connection to the
//! pod and has a 1 s request in flight; the kubelet sends SIGTERM to the app
//! and to lifeguard at one instant; the app finishes the request, calls the
//! peer through Envoy's outbound listener every 100 ms for 2 s, and exits.
//! Grace period 10 s, shutdown margin 2 s, minimum drain 1 s, fixed drain
//! 5 s (the defaults). Measured: SIGTERM → app exit, app exit → Envoy
//! stopped (negative: Envoy stopped while the app still worked), the app's
//! failed outbound calls, whether the request in flight got its answer, and
//! lifeguard's exit code.
//!
//! `app-exit` runs RUNS times without and RUNS times with a shared process
//! namespace (the app's calls then use a new connection each); the other
//! policies run RUNS_PER_OTHER_POLICY times.

use std::time::{Duration, Instant};

use common::pod;
use pod::*;

struct Run {
    app_exit: Duration,
    /// Envoy stopped minus app exit, in milliseconds (negative: before).
    envoy_after_app_ms: f64,
    ok: u64,
    failed: u64,
    inbound_ok: bool,
    code: i32,
}

fn one(policy: &str, shared: bool) -> Run {
    let mut args = vec![
        "--termination-grace-period",
        "10s",
        "--shutdown-margin",
        "2s",
        "--minimum-drain-duration",
        "1s",
        "--drain-until",
        policy,
    ];
    if policy == "time" {
        args.extend(["--termination-drain-duration", "5s"]);
    }
    let mut pod = TestPod::start(&PodSpec::new(shared, &args));
    let mode = if shared { AppMode::Fresh } else { AppMode::Pooled };
    let app = pod.start_app(mode, 2.0, "");
    let addr = pod.net.pod_addr(INBOUND);
    let idle = pod
        .net
        .peer
        .run(move || common::idle_keepalive_connection(addr, "/work/0"));
    let inflight = pod.request("/work/1");
    pod.wait_app_says("inbound /work/1");
    let app_exit = ExitWatch::new(app, Duration::from_secs(30));
    let envoy_exit = ExitWatch::new(pod.envoy_pid, Duration::from_secs(30));
    let sigterm = pod.kubelet_sigterm();
    let app_gone = app_exit.wait().expect("the app exits");
    let envoy_gone = envoy_exit.wait().expect("Envoy is stopped");
    let code = pod.agent.exit_code(Duration::from_secs(15));
    let (answer, _) = inflight.join().unwrap();
    let _ = pod.app.as_mut().unwrap().wait_exit(Duration::from_secs(5));
    drop(idle);
    let out = pod.app_output();
    let line = out
        .lines()
        .find(|l| l.starts_with("calls "))
        .unwrap_or("calls 0 ok 0 failed");
    let words: Vec<&str> = line.split(' ').collect();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Run {
        app_exit: app_gone - sigterm,
        envoy_after_app_ms: if envoy_gone >= app_gone {
            ms(envoy_gone - app_gone)
        } else {
            -ms(app_gone - envoy_gone)
        },
        ok: words[1].parse().unwrap_or(0),
        failed: words[3].parse().unwrap_or(0),
        inbound_ok: matches!(answer, Ok((200, _))),
        code,
    }
}

/// The value at quantile `q` (nearest rank) of sorted `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn report(label: &str, runs: &[Run]) {
    let mut lag: Vec<f64> = runs.iter().map(|r| r.envoy_after_app_ms).collect();
    lag.sort_by(f64::total_cmp);
    let app: f64 = runs.iter().map(|r| r.app_exit.as_secs_f64()).sum::<f64>() / runs.len() as f64;
    let (ok, failed): (u64, u64) = (runs.iter().map(|r| r.ok).sum(), runs.iter().map(|r| r.failed).sum());
    let inbound = runs.iter().filter(|r| r.inbound_ok).count();
    let mut codes: Vec<i32> = runs.iter().map(|r| r.code).collect();
    codes.sort();
    codes.dedup();
    println!(
        "| {label} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {app:.2} s | {failed} of {} | {inbound}/{} | {codes:?} |",
        runs.len(),
        quantile(&lag, 0.5),
        quantile(&lag, 0.99),
        lag[0],
        lag[lag.len() - 1],
        ok + failed,
        runs.len(),
    );
}

fn main() {
    let numbers: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let runs = numbers.first().copied().unwrap_or(20);
    let others = numbers.get(1).copied().unwrap_or(3);
    let started = Instant::now();
    println!("| policy | runs | app exit → Envoy stopped p50 (ms) | p99 | min | max | SIGTERM → app exit (mean) | failed outbound calls | request in flight answered | lifeguard exit codes |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let cases = [
        ("app-exit", false, runs),
        ("app-exit", true, runs),
        ("requests", false, others),
        ("connections", false, others),
        ("time", false, others),
    ];
    for (policy, shared, n) in cases {
        if n == 0 {
            continue;
        }
        let results: Vec<Run> = (0..n).map(|_| one(policy, shared)).collect();
        let label = if shared {
            format!("`{policy}`, shared process namespace, a new connection per call")
        } else {
            format!("`{policy}`")
        };
        report(&label, &results);
    }
    eprintln!("took {:?}", started.elapsed());
}
