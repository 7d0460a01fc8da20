//! Drain reaction times and idle footprint against the real Envoy.
//! `cargo run --release --example reaction -- [RUNS=20] [IDLE_SECONDS=30]`
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
//! memory and CPU time, from /proc. Loopback only; ports 31100-31199.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const ADMIN: u16 = 31100;
const STATUS: u16 = 31121;
const AGENT: u16 = 31120;
const INBOUND: u16 = 31106;
const APP: u16 = 31180;
const PROM: u16 = 31190;

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let runs: usize = args.get(1).map_or(20, |s| s.parse().expect("RUNS"));
    let idle: u64 = args.get(2).map_or(30, |s| s.parse().expect("IDLE_SECONDS"));
    let envoy = std::env::var("ENVOY_BIN").expect("ENVOY_BIN (bench/reaction.sh sets it)");
    let lifeguard = std::env::var("LIFEGUARD_BIN").unwrap_or_else(|_| "target/release/lifeguard".into());
    let dir = std::env::temp_dir().join(format!("lifeguard-reaction-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("envoy.yaml");
    std::fs::write(&config, bootstrap()).unwrap();
    let _app = SlowApp::start(APP);

    let (mut startup, mut first_503, mut gone) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        let mut agent = Agent::start(
            &lifeguard,
            &envoy,
            &config,
            &[
                "--exit-on-zero-active-connections",
                "true",
                "--minimum-drain-duration",
                "0s",
            ],
        );
        let live = wait_until(
            Duration::from_secs(30),
            || matches!(get(addr(ADMIN), "/ready"), Some((200, b)) if b.trim() == "LIVE"),
        );
        let ready = wait_until(Duration::from_secs(10), || {
            matches!(get(addr(AGENT), "/healthz/ready"), Some((200, _)))
        });
        startup.push(ready.saturating_duration_since(live));

        // A 300 ms request in flight, a tight probe loop, then SIGTERM.
        let inflight = thread::spawn(|| {
            let mut s = TcpStream::connect(addr(INBOUND)).unwrap();
            s.write_all(b"GET /delay HTTP/1.1\r\nHost: app\r\n\r\n").unwrap();
            let answer = read_response(&mut s);
            let closed = Instant::now();
            drop(s);
            (answer, closed)
        });
        thread::sleep(Duration::from_millis(50));
        let stop = Arc::new(AtomicBool::new(false));
        let prober = {
            let stop = stop.clone();
            thread::spawn(move || {
                let mut s = TcpStream::connect(addr(AGENT)).unwrap();
                s.set_nodelay(true).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    s.write_all(b"GET /healthz/ready HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
                    let (status, _) = read_response(&mut s).expect("probe answered");
                    if status == 503 {
                        return Instant::now();
                    }
                }
                Instant::now()
            })
        };
        thread::sleep(Duration::from_millis(20));
        let envoy_pid = agent.envoy_pid();
        let sent = Instant::now();
        agent.signal(libc::SIGTERM);
        first_503.push(prober.join().unwrap().saturating_duration_since(sent));
        stop.store(true, Ordering::Relaxed);
        let (answer, closed) = inflight.join().unwrap();
        assert_eq!(
            answer.map(|a| a.0),
            Some(200),
            "run {run}: the request in flight failed"
        );
        let gone_at = wait_until(Duration::from_secs(10), || !alive(envoy_pid));
        gone.push(gone_at.saturating_duration_since(closed));
        let code = agent.wait(Duration::from_secs(10));
        assert_eq!(code, Some(0), "run {run}: lifeguard exit code");
    }
    println!("runs: {runs}");
    report("Envoy /ready LIVE -> lifeguard 200 (start-up)", &mut startup);
    report("SIGTERM -> first 503 (tight probe loop)", &mut first_503);
    report("last connection closed -> Envoy gone (exit-on-zero)", &mut gone);

    // Idle footprint.
    let mut agent = Agent::start(&lifeguard, &envoy, &config, &[]);
    wait_until(Duration::from_secs(30), || {
        matches!(get(addr(AGENT), "/healthz/ready"), Some((200, _)))
    });
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
    agent.wait(Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&dir);
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

/// Polls `f` every 0.2 ms; returns when it first held.
fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> Instant {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return Instant::now();
        }
        assert!(Instant::now() < deadline, "timed out");
        thread::sleep(Duration::from_micros(200));
    }
}

fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'),
        Err(_) => false,
    }
}

fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = stat.rsplit(')').next().unwrap();
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime), counted from after the comm field.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf with a valid name.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as f64 }
}

/// One GET on a fresh connection, closed after the answer.
fn get(a: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&a, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
    read_response(&mut s)
}

/// Reads one response framed by content-length or chunked encoding.
fn read_response(s: &mut TcpStream) -> Option<(u16, String)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let status = head.split(' ').nth(1)?.parse().ok()?;
            let body = &buf[end + 4..];
            if let Some(len) = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
            {
                if body.len() >= len {
                    return Some((status, String::from_utf8_lossy(&body[..len]).into_owned()));
                }
            } else if body.ends_with(b"0\r\n\r\n") {
                let text = String::from_utf8_lossy(body);
                let inner = text.split("\r\n").nth(1).unwrap_or("").to_owned();
                return Some((status, inner));
            }
        }
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// lifeguard with Envoy as its child; killed on drop.
struct Agent {
    child: Child,
    log: std::path::PathBuf,
}

impl Agent {
    fn start(lifeguard: &str, envoy: &str, config: &std::path::Path, extra: &[&str]) -> Agent {
        let log = config.with_file_name("lifeguard.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(lifeguard)
            .args([
                "run",
                "--status-addr",
                &addr(AGENT).to_string(),
                "--admin-url",
                &format!("http://127.0.0.1:{ADMIN}"),
            ])
            .args([
                "--ignore-listener-port",
                &STATUS.to_string(),
                "--ignore-listener-port",
                &PROM.to_string(),
            ])
            .args(extra)
            .arg("--")
            .arg(envoy)
            .args([
                "-c",
                config.to_str().unwrap(),
                "--disable-hot-restart",
                "-l",
                "error",
                "--concurrency",
                "1",
            ])
            .env("LIFEGUARD_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("lifeguard");
        Agent { child, log }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn envoy_pid(&self) -> i32 {
        let text = std::fs::read_to_string(&self.log).unwrap();
        text.lines()
            .find(|l| l.contains("Envoy started"))
            .and_then(|l| l.split("pid=").nth(1))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|p| p.parse().ok())
            .expect("Envoy's pid in lifeguard's log")
    }

    fn signal(&self, sig: i32) {
        // SAFETY: our own unreaped child.
        unsafe {
            libc::kill(self.pid(), sig);
        }
    }

    fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            if Instant::now() > deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The app: every request answered after 300 ms.
struct SlowApp {
    stop: Arc<AtomicBool>,
}

impl SlowApp {
    fn start(port: u16) -> SlowApp {
        let listener = TcpListener::bind(addr(port)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        thread::spawn(move || {
                            s.set_nonblocking(false).unwrap();
                            let mut buf = [0u8; 4096];
                            let mut have = Vec::new();
                            while let Ok(n) = s.read(&mut buf) {
                                if n == 0 {
                                    return;
                                }
                                have.extend_from_slice(&buf[..n]);
                                while let Some(end) = have.windows(4).position(|w| w == b"\r\n\r\n") {
                                    have.drain(..end + 4);
                                    thread::sleep(Duration::from_millis(300));
                                    if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\ndone\n")
                                        .is_err()
                                    {
                                        return;
                                    }
                                }
                            }
                        });
                    }
                    Err(_) => thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        SlowApp { stop }
    }
}

impl Drop for SlowApp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// config/envoy-bootstrap.yaml with this benchmark's ports, on 127.0.0.1.
fn bootstrap() -> String {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/envoy-bootstrap.yaml")).unwrap();
    let mut out = text.replace("0.0.0.0", "127.0.0.1");
    for (from, to) in [
        (15000, ADMIN),
        (15021, STATUS),
        (15020, AGENT),
        (15006, INBOUND),
        (8080, APP),
        (15090, PROM),
    ] {
        out = out.replace(&format!("port_value: {from} "), &format!("port_value: {to} "));
    }
    out
}
