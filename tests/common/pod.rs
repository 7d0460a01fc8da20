//! A Kubernetes pod, modelled with the kernel's own pieces, around the real
//! Envoy and the lifeguard binary:
//!
//! - the pod's **network namespace**, joined by a veth pair to a **peer
//!   namespace** that plays the rest of the cluster (the kit's
//!   [`crate::netns::Net`]): downstream clients call the pod
//!   from there, and a peer service there answers the app's outbound calls;
//! - **containers** as cgroups (a pids-hierarchy cgroup each: the proxy, the
//!   app, and pause when there is one) and **pid namespaces**: without
//!   `shareProcessNamespace`, lifeguard (PID 1) and Envoy get a pid
//!   namespace of their own and the app stays outside it, invisible to
//!   lifeguard as in Kubernetes; with it, PID 1 of the pod's pid namespace
//!   is a process named `pause` in its own cgroup, and lifeguard, Envoy and
//!   the app all live in that namespace, each container in its own cgroup;
//! - the **app**, a python3 script (`tests/fixtures/pod_app.py`): it serves HTTP on
//!   127.0.0.1:8080 behind Envoy's inbound listener; on SIGTERM it stops
//!   accepting, finishes its requests in flight, then calls the peer
//!   through Envoy's outbound listener (127.0.0.1:15001) for a while and
//!   exits 0 when every call succeeded;
//! - the **kubelet**: SIGTERM to the app and to lifeguard at one instant,
//!   SIGKILL at the grace period.
//!
//! Everything created here is removed on drop, also when a test panics:
//! cgroups are emptied with SIGKILL and removed, then the namespaces are
//! deleted (which deletes the veth pair). Names carry the test process's
//! pid and a counter (`unique`), so parallel tests never collide. Needs
//! root.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use crate::gateway::{gateway_bootstrap, Gateway, TrafficListener, EG_ADMIN, EG_STATUS, GATEWAY_PORT};
pub use crate::netns::{Net, Netns};
use crate::{
    children, envoy_command, lifeguard_bin, reply, temp_dir, unique, wait_for, KeepAliveClient, Proc, TempDir,
    TestServer,
};

/// Ports inside the pod's network namespace: the real ones, since the
/// namespace is the test's alone.
pub const ADMIN: u16 = 15000;
pub const OUTBOUND: u16 = 15001;
pub const INBOUND: u16 = 15006;
pub const AGENT: u16 = 15020;
pub const STATUS: u16 = 15021;
pub const PEER_PORT: u16 = 8080;
/// A TCP-proxy outbound listener (no HTTP) to the peer.
pub const OUTBOUND_TCP: u16 = 15002;

// ---------------------------------------------------------------------------
// Containers: cgroups

/// A cgroup of the v1 `pids` hierarchy, standing for one container. On drop
/// every process still in it is killed, then it is removed.
pub struct Cgroup {
    pub path: PathBuf,
}

impl Cgroup {
    pub fn new(role: &str) -> Cgroup {
        let (pid, n) = unique();
        let path = PathBuf::from(format!("/sys/fs/cgroup/pids/lifeguard-test-{pid}-{n}-{role}"));
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        Cgroup { path }
    }

    pub fn procs(&self) -> String {
        self.path.join("cgroup.procs").display().to_string()
    }

    pub fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.procs())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// SIGKILL to every process in it (the kubelet at the grace period).
    pub fn kill_all(&self) {
        for pid in self.pids() {
            // SAFETY: plain kill(2) on processes this test put in its cgroup.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            self.kill_all();
            if std::fs::remove_dir(&self.path).is_ok() || !self.path.exists() {
                return;
            }
            if Instant::now() >= deadline {
                eprintln!(
                    "could not remove cgroup {}: {:?} still in it",
                    self.path.display(),
                    self.pids()
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

// ---------------------------------------------------------------------------
// Processes in the pod

/// How a process enters the pod.
pub enum Enter<'a> {
    /// The pod's network namespace; the host's pid namespace (invisible to
    /// a lifeguard in a pid namespace of its own).
    Net(&'a Netns),
    /// The pod's network namespace and a new pid namespace, with the
    /// process as its PID 1 and /proc mounted for it.
    NewPidNs(&'a Netns),
    /// The pid, network and mount namespaces of a running process.
    Join(i32),
}

fn only_child(pid: i32, what: &str) -> i32 {
    wait_for(
        &format!("the process of {what}"),
        Duration::from_secs(10),
        || match children(pid).as_slice() {
            [child] => Ok(*child),
            other => Err(other.to_vec()),
        },
    )
}

/// Starts `argv` in `cgroup`, entering the pod as `how` says. The
/// cgroup is joined first, before any namespace is entered: every process
/// that appears in the pod is in its container from its first instruction,
/// as when a container runtime starts it (a hook in the pod's process
/// namespace was briefly seen in another cgroup, an app process named
/// `lifeguard`, otherwise). Returns the process handle (whose exit code is
/// the program's) and the program's pid as this test sees it.
pub fn spawn_in(
    name: &'static str,
    cgroup: &Cgroup,
    how: Enter<'_>,
    argv: &[String],
    env: &[(&str, &str)],
) -> (Proc, i32) {
    // `$$` is read in this test's pid namespace, as cgroup.procs expects.
    let join = format!("echo $$ > {} && exec \"$@\"", cgroup.procs());
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &join, "sh", "nsenter"]);
    match how {
        Enter::Net(ns) => {
            cmd.arg(format!("--net={}", ns.path()));
        }
        Enter::NewPidNs(ns) => {
            cmd.arg(format!("--net={}", ns.path()))
                .args(["unshare", "--pid", "--fork", "--mount-proc"]);
        }
        Enter::Join(pid) => {
            cmd.args(["-t", &pid.to_string(), "-p", "-n", "-m"]);
        }
    }
    cmd.args(argv);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let proc = Proc::spawn(name, cmd, temp_dir(name));
    let pid = match how {
        // nsenter without -p execs: the program has its pid.
        Enter::Net(_) => proc.pid(),
        // unshare --fork and nsenter -p fork once.
        Enter::NewPidNs(_) | Enter::Join(_) => only_child(proc.pid(), name),
    };
    wait_for(&format!("{name} in its cgroup"), Duration::from_secs(10), || {
        if cgroup.pids().contains(&pid) {
            Ok(())
        } else {
            Err(cgroup.pids())
        }
    });
    (proc, pid)
}

/// A signal to a process of the pod.
pub fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a process this test started.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// When `pid` exits (None: not within `within`), seen through a pidfd, so
/// the instant is exact and not a polling artefact.
pub struct ExitWatch(JoinHandle<Option<Instant>>);

impl ExitWatch {
    pub fn new(pid: i32, within: Duration) -> ExitWatch {
        // SAFETY: pidfd_open(2) returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        assert!(fd >= 0, "pidfd_open {pid}: {}", std::io::Error::last_os_error());
        ExitWatch(std::thread::spawn(move || {
            let deadline = Instant::now() + within;
            let exited = loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                let rc = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
                if rc > 0 {
                    break Some(Instant::now());
                }
                if rc == 0 {
                    break None;
                }
            };
            // SAFETY: closing the descriptor opened above.
            unsafe {
                libc::close(fd);
            }
            exited
        }))
    }

    pub fn wait(self) -> Option<Instant> {
        self.0.join().unwrap()
    }

    pub fn has_exited(&self) -> bool {
        self.0.is_finished()
    }
}

// ---------------------------------------------------------------------------
// Envoy's configuration

/// config/envoy-bootstrap.yaml, plus an OUTBOUND HTTP listener on
/// 127.0.0.1:15001 and a TCP-proxy one on 15002, both to the peer service;
/// with `internal`, an internal listener `inner` (its own HTTP connection
/// manager, to the peer) reached by the outbound route `/via-inner`.
pub fn pod_bootstrap(peer: Ipv4Addr, internal: bool) -> String {
    let path = crate::root().join("config/envoy-bootstrap.yaml");
    with_outbound(&std::fs::read_to_string(path).unwrap(), peer, internal)
}

/// `shipped` (a bootstrap of config/, either form) with the listeners and
/// clusters [`pod_bootstrap`] adds. A sidecar's outbound listeners come
/// from its control plane; these stand for them.
pub fn with_outbound(shipped: &str, peer: Ipv4Addr, internal: bool) -> String {
    let router = r#"
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"#;
    let hcm = "envoy.filters.network.http_connection_manager
        typed_config:
          \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
    let via_inner = if internal {
        "
              - match: { prefix: /via-inner }
                route: { cluster: to_inner, timeout: 0s }"
    } else {
        ""
    };
    let mut listeners = format!(
        r#"
  - name: outbound
    traffic_direction: OUTBOUND
    address:
      socket_address: {{ address: 127.0.0.1, port_value: {OUTBOUND} }}
    filter_chains:
    - filters:
      - name: {hcm}
          stat_prefix: outbound_http
          route_config:
            name: outbound
            virtual_hosts:
            - name: peer
              domains: ["*"]
              routes:{via_inner}
              - match: {{ prefix: / }}
                route: {{ cluster: peer, timeout: 0s }}{router}

  - name: outbound_tcp
    traffic_direction: OUTBOUND
    address:
      socket_address: {{ address: 127.0.0.1, port_value: {OUTBOUND_TCP} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: outbound_tcp
          cluster: peer
"#
    );
    let mut clusters = format!(
        r#"
  - name: peer
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: peer
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {{ address: {peer}, port_value: {PEER_PORT} }}
"#
    );
    let mut head = String::new();
    if internal {
        head = r#"bootstrap_extensions:
- name: envoy.bootstrap.internal_listener
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener

"#
        .to_owned();
        listeners.push_str(&format!(
            r#"
  - name: inner
    internal_listener: {{}}
    filter_chains:
    - filters:
      - name: {hcm}
          stat_prefix: inner
          route_config:
            name: inner
            virtual_hosts:
            - name: inner
              domains: ["*"]
              routes:
              - match: {{ prefix: / }}
                route: {{ cluster: peer, timeout: 0s }}{router}
"#
        ));
        clusters.push_str(
            r#"
  - name: to_inner
    connect_timeout: 1s
    load_assignment:
      cluster_name: to_inner
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              envoy_internal_address: { server_listener_name: inner }
"#,
        );
    }
    let out = shipped
        .replacen("  listeners:\n", &format!("  listeners:{listeners}\n"), 1)
        .replacen("  clusters:\n", &format!("  clusters:{clusters}\n"), 1);
    assert!(
        out.contains("name: outbound_tcp") && out.contains("name: peer"),
        "bootstrap layout changed"
    );
    format!("{head}{out}")
}

// ---------------------------------------------------------------------------
// The app

/// The app: HTTP on 127.0.0.1:8080 (`GET /work/SECONDS` answers `done\n`
/// after that long; keep-alive); prints `ready`, `inbound PATH`,
/// `answered PATH`. On SIGTERM: `sigterm`, stops accepting, finishes what
/// is in flight and closes its connections (`inbound done`), then calls the
/// peer through Envoy's outbound listener every 100 ms for CALL_SECONDS,
/// and exits 0 when every call was answered 200 `peer\n` (`calls N ok M
/// failed`). Modes: `pooled` (one keep-alive connection for the calls),
/// `fresh` (a new connection per call, none held between calls),
/// `stubborn` (ignores SIGTERM, serves until killed). NAME, when given,
/// becomes the process name.
pub const APP: &str = include_str!("../fixtures/pod_app.py");

/// How the app behaves after SIGTERM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppMode {
    Pooled,
    Fresh,
    Stubborn,
}

impl AppMode {
    fn arg(self) -> &'static str {
        match self {
            AppMode::Pooled => "pooled",
            AppMode::Fresh => "fresh",
            AppMode::Stubborn => "stubborn",
        }
    }
}

// ---------------------------------------------------------------------------
// The peer service

/// The peer service: HTTP/1.1 in the peer namespace on PEER_IP:8080,
/// answering `peer\n` to everything, keep-alive unless a request says
/// `connection: close`. Stops on drop.
pub fn peer_service(net: &Net) -> TestServer {
    let addr = SocketAddr::from((net.peer_ip, PEER_PORT));
    let listener = net.peer.run(move || TcpListener::bind(addr).unwrap());
    // `/slow`: a request that is still in flight 3 s later.
    TestServer::serve(listener, |req| async move {
        if req.uri().path() == "/slow" {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        reply(200, "peer\n")
    })
}

// ---------------------------------------------------------------------------
// Watching the drain

/// Reads `GET /drain` from the agent over and over (from the peer, as a
/// dashboard would), keeping every distinct answer, until the agent stops
/// answering or the watch is finished.
pub struct DrainWatch {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<serde_json::Value>>>,
    /// Answers every read, how many it took.
    thread: Option<JoinHandle<u64>>,
}

impl DrainWatch {
    /// `every`: pause between two reads (zero: as fast as answers come).
    pub fn start(net: &Net, every: Duration) -> DrainWatch {
        let addr = net.pod_addr(AGENT);
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (flag, list) = (stop.clone(), seen.clone());
        // The client's connections are made in this thread, so in the peer
        // namespace.
        let thread = net.peer.spawn(move || {
            let client = KeepAliveClient::new();
            let (mut failed, mut taken) = (0, 0);
            while !flag.load(Ordering::Relaxed) {
                match client.get(addr, "/drain", Duration::from_secs(2)) {
                    Ok((200, body)) => {
                        failed = 0;
                        taken += 1;
                        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
                        let mut list = list.lock().unwrap();
                        if list.last() != Some(&json) {
                            list.push(json);
                        }
                    }
                    // Once more on a new connection (the agent may have
                    // closed the idle one); a second failure: it is gone.
                    _ => {
                        failed += 1;
                        if failed == 2 {
                            return taken;
                        }
                        continue;
                    }
                }
                if !every.is_zero() {
                    std::thread::sleep(every);
                }
            }
            taken
        });
        DrainWatch {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    /// Every distinct answer so far.
    pub fn seen(&self) -> Vec<serde_json::Value> {
        self.seen.lock().unwrap().clone()
    }

    /// Stops watching (or waits until the agent is gone) and returns
    /// every distinct answer.
    pub fn finish(self) -> Vec<serde_json::Value> {
        self.finish_counted().0
    }

    /// `finish`, and how many answers were read (each one equal to one of
    /// the distinct answers: consecutive repeats are kept once).
    pub fn finish_counted(mut self) -> (Vec<serde_json::Value>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let taken = self.thread.take().map_or(0, |t| t.join().unwrap_or(0));
        (self.seen(), taken)
    }
}

impl Drop for DrainWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A client outside the pod that sends `GET path` to one of the pod's ports
/// over and over, a new connection each time (as the kubelet and load
/// balancers probe, and as clients that do not keep connections do),
/// `every` apart, until finished. Stops on drop.
pub struct Prober {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Prober {
    pub fn start(net: &Net, port: u16, path: &str, every: Duration) -> Prober {
        let addr = net.pod_addr(port);
        let path = path.to_owned();
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU64::new(0));
        let (flag, count) = (stop.clone(), answered.clone());
        let thread = net.peer.spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                if crate::http_timeout("GET", addr, &path, Duration::from_secs(1)).is_ok() {
                    count.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(every);
            }
        });
        Prober {
            stop,
            answered,
            thread: Some(thread),
        }
    }

    /// How many requests were answered so far (any status).
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// Stops it: how many requests were answered.
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.answered()
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------
// The pod

/// What kind of pod to build.
#[derive(Debug, Clone)]
pub struct PodSpec {
    /// `shareProcessNamespace: true`.
    pub shared_pids: bool,
    /// Flags for `lifeguard run`.
    pub agent_args: Vec<String>,
    /// Envoy gets an internal listener (see [`pod_bootstrap`]).
    pub internal_listener: bool,
    /// The locked form: Envoy's admin and lifeguard's control on Unix
    /// sockets in a directory only the proxy's user may open (the emptyDir
    /// only the proxy container mounts), `--loopback-control false`; the
    /// app runs as another user (nobody).
    pub locked: bool,
    /// An ingress gateway: Envoy with this bootstrap, its traffic listener
    /// routing to the peer service; the pod has no app container.
    pub gateway: Option<Gateway>,
}

impl PodSpec {
    pub fn new(shared_pids: bool, agent_args: &[&str]) -> PodSpec {
        PodSpec {
            shared_pids,
            agent_args: agent_args.iter().map(|s| s.to_string()).collect(),
            internal_listener: false,
            locked: false,
            gateway: None,
        }
    }

    /// An ingress gateway's pod (its only container the proxy), its Envoy
    /// shaped as `kind`.
    pub fn gateway(kind: Gateway, agent_args: &[&str]) -> PodSpec {
        PodSpec {
            gateway: Some(kind),
            ..PodSpec::new(false, agent_args)
        }
    }

    /// The same pod, in the locked form.
    pub fn locked(self) -> PodSpec {
        PodSpec { locked: true, ..self }
    }
}

/// The locked form's sockets.
pub struct Sockets {
    pub admin: PathBuf,
    pub control: PathBuf,
}

/// A pod: the proxy container (lifeguard running Envoy) and, once started,
/// the app container, in the pod's namespaces; the peer service outside.
pub struct TestPod {
    // Drop order matters: the cgroups first (every process of the pod is
    // killed), then the wrappers are reaped, then the namespaces go.
    proxy_cgroup: Cgroup,
    app_cgroup: Cgroup,
    _pause_cgroup: Option<Cgroup>,
    /// Envoy's own container, when it runs beside lifeguard's (Envoy
    /// Gateway's shape), and its process.
    envoy_container: Option<(Cgroup, Proc)>,
    pub agent: Proc,
    /// lifeguard's pid (PID 1 of its pid namespace when not shared).
    pub agent_pid: i32,
    pub envoy_pid: i32,
    pub app: Option<Proc>,
    pub app_pid: Option<i32>,
    pause: Option<(Proc, i32)>,
    _peer_service: TestServer,
    pub net: Net,
    pub dir: TempDir,
    /// The locked form's sockets.
    pub sockets: Option<Sockets>,
}

impl TestPod {
    /// Builds the pod and waits until Envoy is ready through its status
    /// listener, probed from outside the pod as the kubelet would.
    pub fn start(spec: &PodSpec) -> TestPod {
        let net = Net::new();
        let peer_service = peer_service(&net);
        let dir = temp_dir("pod");
        let proxy_cgroup = Cgroup::new("proxy");
        let app_cgroup = Cgroup::new("app");
        let (pause_cgroup, pause) = if spec.shared_pids {
            let cgroup = Cgroup::new("pause");
            let bin = dir.path().join("pause");
            std::fs::copy("/bin/sleep", &bin).unwrap();
            let argv = [bin.display().to_string(), "infinity".into()];
            let pause = spawn_in("pause", &cgroup, Enter::NewPidNs(&net.pod), &argv, &[]);
            wait_for("pause to be PID 1", Duration::from_secs(10), || {
                let comm = std::fs::read_to_string(format!("/proc/{}/comm", pause.1)).unwrap_or_default();
                if comm.trim() == "pause" {
                    Ok(())
                } else {
                    Err(comm)
                }
            });
            (Some(cgroup), Some(pause))
        } else {
            (None, None)
        };

        let mut argv: Vec<String> = vec![lifeguard_bin().display().to_string(), "run".into()];
        argv.extend(spec.agent_args.iter().cloned());
        let mut bootstrap = match spec.gateway {
            Some(kind) => gateway_bootstrap(kind, net.peer_ip, PEER_PORT, dir.path()),
            None => pod_bootstrap(net.peer_ip, spec.internal_listener),
        };
        let sockets = spec.locked.then(|| {
            // The app (nobody) may read its script in the pod's directory,
            // and may not enter the sockets' one.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            let run = dir.path().join("run");
            std::fs::create_dir(&run).unwrap();
            std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
            let sockets = Sockets {
                admin: run.join("admin.sock"),
                control: run.join("control.sock"),
            };
            bootstrap = crate::admin_on_pipe(&bootstrap, &sockets.admin);
            argv.extend([
                "--admin-url".into(),
                format!("unix://{}", sockets.admin.display()),
                "--control-socket".into(),
                sockets.control.display().to_string(),
                "--loopback-control".into(),
                "false".into(),
            ]);
            sockets
        });
        // The exit summary, kept as the kubelet keeps it.
        if !spec
            .agent_args
            .iter()
            .any(|a| a.starts_with("--termination-message-path"))
        {
            let message = dir.path().join("termination-log");
            argv.extend(["--termination-message-path".into(), message.display().to_string()]);
        }
        // Envoy in a container of its own beside lifeguard's (which looks
        // after it over its admin), or lifeguard's child.
        let beside = spec.gateway.is_some_and(Gateway::envoy_beside);
        let envoy_container = beside.then(|| {
            let cgroup = Cgroup::new("envoy");
            let (envoy, pid) = spawn_in(
                "envoy",
                &cgroup,
                Enter::NewPidNs(&net.pod),
                &envoy_command(&bootstrap, &dir),
                &[],
            );
            (cgroup, envoy, pid)
        });
        match beside {
            true => argv.extend(
                // As config/k8s/envoy-gateway/envoyproxy.yaml sets them.
                [
                    "--admin-url",
                    &format!("http://localhost:{EG_ADMIN}"),
                    "--status-addr",
                    &format!("0.0.0.0:{EG_STATUS}"),
                    "--drain-scope",
                    "all",
                    "--ignore-listener-port",
                    "19001,19003",
                ]
                .map(String::from),
            ),
            false => {
                argv.push("--".into());
                argv.extend(envoy_command(&bootstrap, &dir));
            }
        }
        let how = match &pause {
            Some((_, pid)) => Enter::Join(*pid),
            None => Enter::NewPidNs(&net.pod),
        };
        let env = [("LIFEGUARD_LOG", "info")];
        let (agent, agent_pid) = spawn_in("lifeguard", &proxy_cgroup, how, &argv, &env);
        let (envoy_pid, envoy_container) = match envoy_container {
            Some((cgroup, envoy, pid)) => (pid, Some((cgroup, envoy))),
            None => (only_child(agent_pid, "Envoy"), None),
        };
        let status = net.pod_addr(if beside { EG_STATUS } else { STATUS });
        net.peer.run(move || {
            crate::wait_status(status, "/healthz/ready", 200, Duration::from_secs(30));
        });
        TestPod {
            proxy_cgroup,
            app_cgroup,
            _pause_cgroup: pause_cgroup,
            envoy_container,
            agent,
            agent_pid,
            envoy_pid,
            app: None,
            app_pid: None,
            pause,
            _peer_service: peer_service,
            net,
            dir,
            sockets,
        }
    }

    /// Starts the app container and waits until it listens. `name`: the
    /// process name it gives itself ("" keeps python's).
    pub fn start_app(&mut self, mode: AppMode, call_seconds: f64, name: &str) -> i32 {
        let script = self.dir.path().join("app.py");
        std::fs::write(&script, APP).unwrap();
        let argv = [
            "python3".to_owned(),
            script.display().to_string(),
            mode.arg().into(),
            call_seconds.to_string(),
            name.into(),
        ];
        let how = match &self.pause {
            Some((_, pid)) => Enter::Join(*pid),
            None => Enter::Net(&self.net.pod),
        };
        let (app, pid) = spawn_in("app", &self.app_cgroup, how, &self.as_app_user(&argv), &[]);
        app.wait_output("ready", Duration::from_secs(10));
        self.app = Some(app);
        self.app_pid = Some(pid);
        pid
    }

    /// `argv` as the app's user: nobody in the locked form (with the
    /// system's python, which nobody may run: a python of root's home is
    /// out of its reach).
    fn as_app_user(&self, argv: &[String]) -> Vec<String> {
        if self.sockets.is_none() {
            return argv.to_vec();
        }
        let mut out: Vec<String> = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
            .map(String::from)
            .into();
        let system_python = Path::new("/usr/bin/python3");
        for (i, arg) in argv.iter().enumerate() {
            match (i, arg.as_str()) {
                (0, "python3") if system_python.exists() => out.push(system_python.display().to_string()),
                _ => out.push(arg.clone()),
            }
        }
        out
    }

    /// Runs `argv` as another process of the app's container: its cgroup,
    /// its user, the pod's network.
    pub fn run_in_app(&self, name: &'static str, argv: &[String]) -> Proc {
        let how = match &self.pause {
            Some((_, pid)) => Enter::Join(*pid),
            None => Enter::Net(&self.net.pod),
        };
        spawn_in(name, &self.app_cgroup, how, &self.as_app_user(argv), &[]).0
    }

    /// Runs `lifeguard ARGS...` as a hook of the proxy container: its pid,
    /// network and mount namespaces, its cgroup, its environment (in the
    /// locked form, the control socket).
    pub fn hook(&self, name: &'static str, args: &[&str]) -> Proc {
        let mut argv = vec![lifeguard_bin().display().to_string()];
        argv.extend(args.iter().map(|s| s.to_string()));
        let control = self.sockets.as_ref().map(|s| s.control.display().to_string());
        let env: Vec<(&str, &str)> = control
            .iter()
            .map(|c| ("LIFEGUARD_CONTROL_SOCKET", c.as_str()))
            .collect();
        spawn_in(name, &self.proxy_cgroup, Enter::Join(self.agent_pid), &argv, &env).0
    }

    /// lifeguard's exit summary, as it wrote it to the termination message
    /// (None when there is none).
    pub fn termination_message(&self) -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(self.dir.path().join("termination-log")).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// The app's output so far.
    pub fn app_output(&self) -> String {
        self.app.as_ref().map(Proc::output).unwrap_or_default()
    }

    /// Waits until the app prints `line`.
    pub fn wait_app_says(&self, line: &str) {
        wait_for(&format!("the app to say {line:?}"), Duration::from_secs(10), || {
            let out = self.app_output();
            if out.lines().any(|l| l == line) {
                Ok(())
            } else {
                Err(out)
            }
        });
    }

    /// The kubelet deletes the pod: SIGTERM to the app and to lifeguard at
    /// the same instant.
    pub fn kubelet_sigterm(&self) -> Instant {
        // Taken before the signals, so that what the agent times from
        // SIGTERM ends after it, however late this thread runs again.
        let sent = Instant::now();
        if let Some(app) = self.app_pid {
            signal(app, libc::SIGTERM);
        }
        signal(self.agent_pid, libc::SIGTERM);
        sent
    }

    /// The kubelet at the end of the grace period: SIGKILL to what is left.
    pub fn kubelet_sigkill(&self) {
        self.app_cgroup.kill_all();
        self.proxy_cgroup.kill_all();
        if let Some((cgroup, _)) = &self.envoy_container {
            cgroup.kill_all();
        }
    }

    /// The output of Envoy's own container, when Envoy runs beside
    /// lifeguard (its log, at warning level: a SIGTERM Envoy handles says
    /// "caught ENVOY_SIGTERM").
    pub fn envoy_output(&self) -> Option<String> {
        self.envoy_container.as_ref().map(|(_, envoy)| envoy.output())
    }

    /// Where the kubelet probes the pod's readiness: Envoy's status
    /// listener, or lifeguard's own status port when Envoy runs beside it.
    pub fn status_port(&self) -> u16 {
        match self.envoy_container {
            Some(_) => EG_STATUS,
            None => STATUS,
        }
    }

    /// The pid of the container whose preStop hook the kubelet runs
    /// before its SIGTERM, when there is one: the app's, or Envoy's own
    /// container beside lifeguard's.
    pub fn hooked_pid(&self) -> Option<i32> {
        self.app_pid.or(self.envoy_container.as_ref().map(|_| self.envoy_pid))
    }

    /// `n` idle keep-alive connections from a client outside the pod to
    /// Envoy's inbound listener: each has had one answer and stays open
    /// until dropped.
    pub fn idle_clients(&self, n: usize) -> Vec<std::net::TcpStream> {
        let addr = self.net.pod_addr(INBOUND);
        (0..n)
            .map(|_| {
                self.net
                    .peer
                    .run(move || crate::idle_keepalive_connection(addr, "/work/0"))
            })
            .collect()
    }

    /// A request from a downstream client outside the pod, in a thread:
    /// the answer and when it came.
    pub fn request(&self, path: &str) -> JoinHandle<(std::io::Result<(u16, String)>, Instant)> {
        let addr = self.net.pod_addr(INBOUND);
        let path = path.to_owned();
        self.net.peer.spawn(move || {
            let r = crate::http_timeout("GET", addr, &path, Duration::from_secs(20));
            (r, Instant::now())
        })
    }

    /// Envoy's admin `GET path`, from inside the pod (over its socket in
    /// the locked form).
    pub fn admin_get(&self, path: &str) -> String {
        if let Some(sockets) = &self.sockets {
            return crate::unix_get(&sockets.admin, path)
                .map(|(_, body)| body)
                .unwrap_or_default();
        }
        let path = path.to_owned();
        self.net.pod.run(move || {
            let addr = SocketAddr::from(([127, 0, 0, 1], ADMIN));
            crate::get(addr, &path).map(|(_, body)| body).unwrap_or_default()
        })
    }
}

/// A process's pid inside its own pid namespace (what lifeguard there sees).
pub fn ns_pid(pid: i32) -> i32 {
    let status = procfs::process::Process::new(pid).and_then(|p| p.status()).unwrap();
    *status.nspid.expect("NSpid in /proc/PID/status").last().unwrap()
}
