//! A load balancer in front of pods, as an operator runs one, for the tests
//! and the benchmark of the drain wait (`tests/lb.rs`, `bench/rolling.rs`):
//!
//! - the **LB host**, a network namespace of its own with a bridge (the
//!   node's network, in miniature): each pod of `common/pod.rs` is joined
//!   to it by a second veth pair, at an address known before the pod
//!   exists (a slot), on a /24 of 10/8 that exists only inside the test's
//!   namespaces;
//! - **HAProxy** (Debian's, `apt-get install haproxy`; scripts/test
//!   installs it) on the LB host: a frontend on the LB host's own loopback,
//!   a backend of every slot, each health-checked through the pod's Envoy
//!   status listener (15021 `/healthz/ready`, where a kubelet probes) and
//!   sent traffic on Envoy's inbound listener (15006); `retries 0`, so a
//!   request the pod cannot take is a failure, not hidden by a retry. Its
//!   state changes (`Server be/old0 is DOWN`) are read from its stderr as
//!   they come and stamped with the time they were read: a record that
//!   stays;
//! - a **client** on the LB host sending requests at a fixed rate through
//!   HAProxy, each on a new connection, every answer kept;
//! - the **kubelet's side** of deleting a classic-sidecar pod: SIGTERM to
//!   the proxy container (it has no preStop hook), the app container's
//!   preStop hook (`GET /drain/wait` on the pod's address and 15020, from
//!   the LB host, as the kubelet calls it from the node; or a fixed sleep),
//!   then SIGTERM to the app when the hook returns.
//!
//! Everything is stopped and removed on drop (HAProxy killed, the LB host's
//! namespace deleted, which deletes the veth ends in it). Needs root.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use crate::common::netns::{ip, Netns};
use crate::common::{http_timeout, temp_dir, unique, wait_for, TempDir};
use crate::pod::{signal, AppMode, PodSpec, TestPod, AGENT, INBOUND, STATUS};

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

    /// Joins `pod` to the LAN at `slot`: a veth pair, one end in the pod's
    /// network namespace with the slot's address, the other on the bridge.
    pub fn attach(&self, pod: &TestPod, slot: u8) -> Ipv4Addr {
        let host_dev = format!("slot{slot}");
        let pod_ns = &pod.net.pod.name;
        ip(&[
            "-n",
            pod_ns,
            "link",
            "add",
            POD_DEV,
            "type",
            "veth",
            "peer",
            "name",
            &host_dev,
            "netns",
            &self.host.name,
        ]);
        let addr = self.slot_ip(slot);
        ip(&["-n", pod_ns, "addr", "add", &format!("{addr}/24"), "dev", POD_DEV]);
        ip(&["-n", pod_ns, "link", "set", POD_DEV, "up"]);
        ip(&["-n", &self.host.name, "link", "set", &host_dev, "master", BRIDGE]);
        ip(&["-n", &self.host.name, "link", "set", &host_dev, "up"]);
        addr
    }
}

/// The second byte of the LAN's /24: one per test process (10.200-249).
fn prefix_byte(pid: u32) -> u8 {
    200 + (pid % 50) as u8
}

/// How a load balancer checks each pod.
#[derive(Debug, Clone, Copy)]
pub struct Check {
    pub inter: Duration,
    /// Failed checks in a row that mark a server down.
    pub fall: u32,
    pub rise: u32,
}

/// HAProxy on the LB host, its state changes as they came.
pub struct Haproxy {
    child: Child,
    events: Arc<Mutex<Vec<(SystemTime, String)>>>,
    reader: Option<JoinHandle<()>>,
    pub frontend: SocketAddr,
    _dir: TempDir,
}

/// The frontend's port on the LB host's loopback (its own namespace: no
/// other process can hold it).
pub const FRONTEND_PORT: u16 = 8000;

impl Haproxy {
    /// Balances `servers` (name, pod address) round-robin, checking each as
    /// `check` says, from the LB host's address `source` (1 or 2); the
    /// frontend listens on the LB host's 127.0.0.1:`FRONTEND_PORT + source`.
    pub fn start(lan: &Lan, check: Check, servers: &[(String, Ipv4Addr)], source: u8) -> Haproxy {
        let dir = temp_dir("haproxy");
        let frontend = SocketAddr::from(([127, 0, 0, 1], FRONTEND_PORT + source as u16));
        let ms = |d: Duration| d.as_millis();
        let mut cfg = format!(
            "global\n  maxconn 2000\n\
             defaults\n  mode http\n  timeout connect 1s\n  timeout client 10s\n  timeout server 10s\n  retries 0\n\
             frontend fe\n  bind {frontend}\n  default_backend be\n\
             backend be\n  balance roundrobin\n  source {}\n  option httpchk\n\
             \x20 http-check send meth GET uri /healthz/ready ver HTTP/1.1 hdr Host pod\n\
             \x20 default-server inter {}ms fall {} rise {} check port {STATUS}\n",
            lan.host_ip(source),
            ms(check.inter),
            check.fall,
            check.rise,
        );
        for (name, addr) in servers {
            cfg.push_str(&format!("  server {name} {addr}:{INBOUND}\n"));
        }
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, cfg).unwrap();
        let mut cmd = lan.host.command("haproxy");
        cmd.arg("-f").arg(&path).arg("-db");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start haproxy (apt-get install haproxy): {e}"));
        let events = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = events.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push((SystemTime::now(), line));
            }
        });
        Haproxy {
            child,
            events,
            reader: Some(reader),
            frontend,
            _dir: dir,
        }
    }

    /// When HAProxy said `server` became `state` (UP or DOWN), the latest
    /// time it did.
    pub fn marked(&self, server: &str, state: &str) -> Option<SystemTime> {
        let needle = format!("Server be/{server} is {state}");
        let events = self.events.lock().unwrap();
        events.iter().rev().find(|(_, l)| l.contains(&needle)).map(|(t, _)| *t)
    }

    /// Waits until HAProxy says `server` became `state`; returns when.
    pub fn wait_marked(&self, server: &str, state: &str, timeout: Duration) -> SystemTime {
        wait_for(&format!("HAProxy to mark {server} {state}"), timeout, || {
            self.marked(server, state).ok_or_else(|| self.log())
        })
    }

    /// Everything HAProxy said, each line with its time.
    pub fn events(&self) -> Vec<(SystemTime, String)> {
        self.events.lock().unwrap().clone()
    }

    /// Everything HAProxy said.
    pub fn log(&self) -> String {
        let events = self.events.lock().unwrap();
        events.iter().map(|(_, l)| format!("{l}\n")).collect()
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        if std::thread::panicking() {
            eprintln!("----- haproxy -----\n{}", self.log());
        }
    }
}

/// One request of the client: when it was sent, which load balancer it
/// went through, and its status or error (and the start of the body of an
/// answer that is not 200: who said it).
#[derive(Debug, Clone)]
pub struct Sent {
    pub at: SystemTime,
    pub through: SocketAddr,
    pub answer: Result<u16, String>,
    pub said: String,
}

/// A client on the LB host: requests at a fixed rate through `targets`
/// (in turn), each on a new connection, every answer kept.
pub struct Load {
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<Vec<Sent>>>,
}

impl Load {
    /// `rate` requests a second, spread over 8 workers (a request slower
    /// than a worker's share never holds the others up).
    pub fn start(host: &Netns, targets: &[SocketAddr], rate: u32) -> Load {
        const WORKERS: u32 = 8;
        let stop = Arc::new(AtomicBool::new(false));
        let every = Duration::from_secs(1) * WORKERS / rate;
        let begin = Instant::now() + Duration::from_millis(50);
        let workers = (0..WORKERS)
            .map(|w| {
                let (stop, targets) = (stop.clone(), targets.to_vec());
                host.spawn(move || {
                    let mut sent = Vec::new();
                    let mut due = begin + every * w / WORKERS;
                    let mut n = w as usize;
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(due.saturating_duration_since(Instant::now()));
                        let target = targets[n % targets.len()];
                        let at = SystemTime::now();
                        let (answer, said) = match http_timeout("GET", target, "/", Duration::from_secs(5)) {
                            Ok((200, _)) => (Ok(200), String::new()),
                            Ok((status, body)) => (Ok(status), body.chars().take(160).collect()),
                            Err(e) => (Err(e.to_string()), String::new()),
                        };
                        sent.push(Sent {
                            at,
                            through: target,
                            answer,
                            said,
                        });
                        due += every;
                        n += WORKERS as usize;
                    }
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

/// The app container's preStop hook.
#[derive(Debug, Clone)]
pub enum Hook {
    /// `httpGet` to the pod's address, port 15020, this path.
    Get(String),
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
    /// When lifeguard exited: the pod is gone.
    pub gone: SystemTime,
    pub exit_code: i32,
}

/// The kubelet deletes a classic-sidecar pod: SIGTERM to lifeguard (the
/// proxy container has no preStop hook) and, at the same instant, the app
/// container's preStop hook, run from the LB host to `pod_ip` as the
/// kubelet runs it from the node; the app's SIGTERM when the hook returns.
/// Waits until lifeguard exits (SIGKILL to the pod at `grace`).
pub fn delete_pod(pod: &mut TestPod, host: &Netns, pod_ip: Ipv4Addr, hook: &Hook, grace: Duration) -> Deletion {
    let started = SystemTime::now();
    let t0 = Instant::now();
    signal(pod.agent_pid, libc::SIGTERM);
    let hook_answer = match hook {
        Hook::Get(path) => {
            let (addr, path) = (SocketAddr::from((pod_ip, AGENT)), path.clone());
            host.run(move || match http_timeout("GET", addr, &path, grace) {
                Ok((status, body)) => format!("{status} {}", body.trim_end()),
                Err(e) => format!("the hook failed: {e}"),
            })
        }
        Hook::Sleep(d) => {
            std::thread::sleep(*d);
            format!("slept {d:?}")
        }
    };
    let hook_returned = SystemTime::now();
    if let Some(app) = pod.app_pid {
        signal(app, libc::SIGTERM);
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
    Deletion {
        started,
        hook_returned,
        hook_answer,
        gone: SystemTime::now(),
        exit_code,
    }
}

// ---------------------------------------------------------------------------
// The rolling restart

/// The pods' grace period.
pub const GRACE: Duration = Duration::from_secs(30);

/// A pod of the rollout, joined to the LAN at its slot, its app serving.
/// Joined once the app serves: a load balancer that checks Envoy's
/// readiness cannot tell whether the app behind it is up.
pub fn pod_at(lan: &Lan, slot: u8) -> (TestPod, Ipv4Addr) {
    let mut pod = TestPod::start(&PodSpec::new(false, &[]));
    pod.start_app(AppMode::Pooled, 0.3, "");
    let ip = lan.attach(&pod, slot);
    (pod, ip)
}

/// What one pod's deletion looked like from the load balancers.
pub struct Left {
    pub deletion: Deletion,
    /// When each load balancer marked the pod down.
    pub down: Vec<SystemTime>,
}

/// A rolling restart's record.
pub struct Run {
    pub sent: Vec<Sent>,
    pub left: Vec<Left>,
    /// What the load balancers said, with when.
    pub events: Vec<(SystemTime, String)>,
}

/// Replaces `replace` of 3 pods one by one (the new one ready in every
/// load balancer before the old one is deleted, as a Deployment's rolling
/// update with maxSurge 1 and maxUnavailable 0), with a client sending 200
/// requests a second through every load balancer in turn; every request's
/// answer and each old pod's deletion.
pub fn rolling_restart(checks: &[Check], hook: &Hook, replace: u8) -> Run {
    let lan = Lan::new();
    let mut old: Vec<Option<(TestPod, Ipv4Addr)>> = (0..3).map(|slot| Some(pod_at(&lan, slot))).collect();
    let servers: Vec<(String, Ipv4Addr)> = (0..3u8)
        .map(|k| (format!("old{k}"), lan.slot_ip(k)))
        .chain((0..3u8).map(|k| (format!("new{k}"), lan.slot_ip(3 + k))))
        .collect();
    let lbs: Vec<Haproxy> = checks
        .iter()
        .zip(1..)
        .map(|(check, source)| Haproxy::start(&lan, *check, &servers, source))
        .collect();
    for lb in &lbs {
        for k in 0..3 {
            lb.wait_marked(&format!("new{k}"), "DOWN", Duration::from_secs(10));
        }
    }
    let targets: Vec<SocketAddr> = lbs.iter().map(|lb| lb.frontend).collect();
    let load = Load::start(&lan.host, &targets, 200);
    let mut new = Vec::new();
    let mut left = Vec::new();
    for k in 0..replace {
        new.push(pod_at(&lan, 3 + k));
        for lb in &lbs {
            lb.wait_marked(&format!("new{k}"), "UP", Duration::from_secs(30));
        }
        let (mut pod, ip) = old[k as usize].take().unwrap();
        let deletion = delete_pod(&mut pod, &lan.host, ip, hook, GRACE);
        let down = lbs
            .iter()
            .map(|lb| lb.marked(&format!("old{k}"), "DOWN"))
            .collect::<Option<Vec<_>>>();
        let down = down.unwrap_or_else(|| panic!("a load balancer never marked old{k} down: {deletion:?}"));
        left.push(Left { deletion, down });
    }
    let sent = load.stop();
    let events = lbs.iter().flat_map(Haproxy::events).collect();
    Run { sent, left, events }
}

/// Seconds from `a` to `b` (negative when `b` is earlier).
pub fn secs(a: SystemTime, b: SystemTime) -> f64 {
    match b.duration_since(a) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}
