//! Drain reaction times and idle footprint against the real Envoy.
//! `cargo run --profile dist --example reaction -- [RUNS=20] [IDLE_SECONDS=30]`
//! (bench/reaction.sh sets ENVOY_BIN and runs it).
//!
//! Each run starts `lifeguard run -- envoy ...` (exit-on-zero connections,
//! no minimum) with a slow app behind Envoy's inbound listener, and times:
//! - start-up: Envoy's own `/ready` says LIVE → lifeguard says 200;
//! - SIGTERM → the first 503 seen by a client probing lifeguard in a tight
//!   loop on a keep-alive connection;
//! - the last connection closed (a 300 ms request in flight at SIGTERM; the
//!   client reads the answer and closes) → the Envoy process gone.
//!
//! Then one idle lifeguard (Envoy ready beside it) for IDLE_SECONDS: resident
//! memory and CPU time, from /proc. Loopback only, on ports leased the way
//! the tests lease theirs. Processes, the app and the ports come from the
//! test kit (tests/common).

use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// How often the timed conditions are checked: the figures are in
/// milliseconds.
const FINE: Duration = Duration::from_micros(200);

#[allow(clippy::too_many_lines)] // one scenario, read top to bottom
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let runs: usize = args.get(1).map_or(20, |s| s.parse().expect("RUNS"));
    let idle: u64 = args.get(2).map_or(30, |s| s.parse().expect("IDLE_SECONDS"));
    let ports = Ports::new();
    let _app = App::start(&ports.app);
    let (yaml, prometheus) = (bootstrap(&ports), ports.prometheus.port.to_string());
    let start = |extra: &[&str]| {
        Agent::builder()
            .on(&ports)
            .args(&["--ignore-listener-port", &prometheus])
            .args(extra)
            .envoy(&yaml)
            .spawn()
    };
    let (admin, agent_addr, inbound) = (ports.admin.addr(), ports.agent.addr(), ports.inbound.addr());

    let (mut startup, mut first_503, mut gone) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        let mut agent = start(&[
            "--exit-on-zero-active-connections",
            "true",
            "--minimum-drain-duration",
            "0s",
        ]);
        wait_for_every("Envoy /ready LIVE", Duration::from_secs(30), FINE, || {
            match get(admin, "/ready") {
                Ok((200, body)) if body.trim() == "LIVE" => Ok(()),
                other => Err(other),
            }
        });
        let live = Instant::now();
        wait_for_every("lifeguard ready", Duration::from_secs(10), FINE, || {
            match get(agent_addr, "/healthz/ready") {
                Ok((200, _)) => Ok(()),
                other => Err(other),
            }
        });
        startup.push(live.elapsed());

        // A 300 ms request in flight, a tight probe loop, then SIGTERM.
        let inflight = thread::spawn(move || {
            let answer = http_timeout("GET", inbound, "/delay/0.3", Duration::from_secs(10));
            (answer, Instant::now())
        });
        wait_inflight(&ports, 1);
        let (probing, first_answer) = std::sync::mpsc::channel();
        let prober = thread::spawn(move || {
            let client = KeepAliveClient::new();
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let (status, _) = client
                    .get(agent_addr, "/healthz/ready", Duration::from_secs(2))
                    .expect("probe answered");
                let _ = probing.send(());
                if status == 503 {
                    return Instant::now();
                }
                assert!(Instant::now() < deadline, "no 503 within 10 s of probing");
            }
        });
        first_answer
            .recv_timeout(Duration::from_secs(5))
            .expect("the prober's first answer");
        let envoy_pid = envoy_pid(&agent);
        let sent = Instant::now();
        agent.signal(libc::SIGTERM);
        first_503.push(prober.join().unwrap().saturating_duration_since(sent));
        let (answer, closed) = inflight.join().unwrap();
        assert_eq!(
            answer.as_ref().ok().map(|a| a.0),
            Some(200),
            "run {run}: the request in flight failed: {answer:?}"
        );
        wait_for_every("Envoy gone", Duration::from_secs(10), FINE, || {
            if process_alive(envoy_pid) {
                Err(envoy_pid)
            } else {
                Ok(())
            }
        });
        gone.push(closed.elapsed());
        let code = agent.wait_exit(Duration::from_secs(10)).and_then(|s| s.code());
        assert_eq!(code, Some(0), "run {run}: lifeguard exit code\n{}", agent.output());
    }
    println!("runs: {runs}");
    report("Envoy /ready LIVE -> lifeguard 200 (start-up)", &mut startup);
    report("SIGTERM -> first 503 (tight probe loop)", &mut first_503);
    report("last connection closed -> Envoy gone (exit-on-zero)", &mut gone);

    // Idle footprint.
    let mut agent = start(&[]);
    wait_status(agent_addr, "/healthz/ready", 200, Duration::from_secs(30));
    let pid = agent.pid();
    let cpu0 = cpu_ticks(pid);
    let t0 = Instant::now();
    thread::sleep(Duration::from_secs(idle));
    let cpu = (cpu_ticks(pid) - cpu0) as f64 / ticks_per_second();
    let secs = t0.elapsed().as_secs_f64();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .map(|l| l.split_whitespace().nth(1).unwrap_or("?").to_owned())
            .unwrap_or_default()
    };
    println!(
        "idle lifeguard over {secs:.0} s (Envoy ready, default 1 s poll): RSS {} kB (peak {} kB), CPU {:.3} s = {:.3} % of one core, threads {}",
        field("VmRSS:"),
        field("VmHWM:"),
        cpu,
        cpu / secs * 100.0,
        field("Threads:")
    );
    agent.signal(libc::SIGTERM);
    agent.wait_exit(Duration::from_secs(10));
}

fn report(what: &str, samples: &mut [Duration]) {
    samples.sort();
    let pct = |p: f64| samples[((samples.len() as f64 * p).ceil() as usize).clamp(1, samples.len()) - 1];
    println!(
        "{what}: p50 {:.2} ms, p99 {:.2} ms, min {:.2} ms, max {:.2} ms",
        ms(pct(0.5)),
        ms(pct(0.99)),
        ms(samples[0]),
        ms(samples[samples.len() - 1])
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = stat.rsplit(')').next().unwrap();
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime), counted from after the comm field.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn ticks_per_second() -> f64 {
    procfs::ticks_per_second() as f64
}
