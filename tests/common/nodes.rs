//! The ways a node gets a Service's traffic that no probe of the pod shows
//! (`externalTrafficPolicy: Local`): load balancers that check the node, not
//! the pod (an AWS NLB with instance targets, GKE's L4 load balancer without
//! NEGs, Azure's, HAProxy or F5 in front of NodePorts), and announcers that
//! follow the EndpointSlice (MetalLB's speaker, in L2 and BGP mode). Between
//! them and the pods, kube-proxy's rules (KEP-1669, GA in Kubernetes 1.28),
//! modelled on the LB host ([`crate::lb::Lan`]) for each node, at an address
//! of its own:
//!
//! - the **control plane** ([`Cluster`]): each pod of the Service is an
//!   endpoint whose conditions are the EndpointSlice's: `serving` = the
//!   kubelet's readiness probe passes, `terminating` = the pod was deleted,
//!   `ready` = serving and not terminating; every change stamped with its
//!   time, and seen by kube-proxy [`ENDPOINT_LAG`] later;
//! - the **kubelet** ([`Kubelet`]): it probes each pod's readiness as the
//!   shipped manifests say (`GET :15021/healthz/ready`, `User-Agent:
//!   kube-probe/1.34`, every 5 s, failure threshold 3, success threshold 1),
//!   before and through the pod's termination, and publishes `serving`;
//! - **kube-proxy** on each node ([`Node`]): its health-check node port
//!   (`GET /healthz` on [`HEALTH_CHECK_NODE_PORT`]) answers 200 while the
//!   node has a ready endpoint of the Service and 503 once every one is
//!   terminating, whatever their readiness (`localEndpoints` in its JSON
//!   body); its NodePort ([`NODE_PORT`]) sends each new connection to a
//!   ready local endpoint; with none, to a terminating one **only while it
//!   is serving**; with none of those either, the node drops it (here: a
//!   reset, at once). Each connection is proxied in user space, which
//!   changes nothing a pod sees but the peer's address;
//! - the **load balancer** is HAProxy in TCP mode (an L4 load balancer: one
//!   client connection, one connection to a node), health-checking each
//!   node's health-check port, its targets unhealthy until their first
//!   passed check ([`crate::lb::Balancer::Nodes`]);
//! - or the **announcer** ([`Announcer`]): MetalLB's speaker announces the
//!   Service's address from a node while an endpoint on it is ready **or
//!   serving** in the EndpointSlice (its `EndpointCanServe`; `ready`
//!   implies `serving`), and probes nothing. It withdraws a node
//!   [`ANNOUNCER_LAG`] after the slice says none can serve (before
//!   kube-proxy's rules follow); a node it announces anew is announced once
//!   kube-proxy there routes to the endpoint (an announcement that races
//!   kube-proxy drops a new node's first connections whatever the pod
//!   does, which is not what these tests look at). Here a router on the LB host sends each new client
//!   connection to an announced node (round robin, as BGP's ECMP; L2's one
//!   elected node is the case of one), and resets it when none is; a
//!   connection already routed stays where it went (a withdrawal moves new
//!   flows).
//!
//! Everything runs in the LB host's namespace and stops on drop.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use tokio::io::AsyncWriteExt;

use crate::gateway::{Gateway, GATEWAY_PORT};
use crate::lb::{delete_pod, gateway_at, pod_at, Balancer, Check, Client, Front, Hook, Lan, Left, Load, Run};
use crate::netns::Netns;
use crate::pod::{INBOUND, STATUS};

/// The Service's NodePort on every node.
pub const NODE_PORT: u16 = 30080;
/// The Service's `healthCheckNodePort`, served by kube-proxy on every node.
pub const HEALTH_CHECK_NODE_PORT: u16 = 32000;
/// How late an endpoint's change reaches kube-proxy.
pub const ENDPOINT_LAG: Duration = Duration::from_secs(1);
/// How late an endpoint's change reaches the announcer (MetalLB's speaker
/// watches the EndpointSlices and usually reacts before kube-proxy's
/// rules, which it rewrites at most once a second).
pub const ANNOUNCER_LAG: Duration = Duration::from_millis(500);

/// An endpoint's conditions, as the EndpointSlice gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conditions {
    /// The kubelet's readiness probe passes.
    pub serving: bool,
    /// The pod was deleted.
    pub terminating: bool,
}

impl Conditions {
    /// `ready`: serving and not terminating.
    pub fn ready(self) -> bool {
        self.serving && !self.terminating
    }
}

/// One pod of the Service: its node, its address, and its conditions as
/// they changed (None: the pod is gone).
struct Endpoint {
    name: String,
    node: usize,
    addr: SocketAddr,
    changes: Vec<(Instant, Option<Conditions>)>,
}

impl Endpoint {
    /// Its conditions as of `at` (None: not yet, or gone).
    fn at(&self, at: Instant) -> Option<Conditions> {
        self.changes.iter().rev().find(|(t, _)| *t <= at).and_then(|(_, c)| *c)
    }

    fn now(&self) -> Option<Conditions> {
        self.changes.last().and_then(|(_, c)| *c)
    }
}

/// The control plane's view of the Service's endpoints, and every change,
/// stamped (a record that stays).
#[derive(Clone, Default)]
pub struct Cluster {
    endpoints: Arc<Mutex<Vec<Endpoint>>>,
    events: Arc<Mutex<Vec<(SystemTime, String)>>>,
}

impl Cluster {
    /// A new pod `name` at `addr` on `node`: not serving until its first
    /// passed probe.
    pub fn add(&self, name: &str, node: usize, addr: SocketAddr) {
        self.endpoints.lock().unwrap().push(Endpoint {
            name: name.to_owned(),
            node,
            addr,
            changes: vec![(
                Instant::now(),
                Some(Conditions {
                    serving: false,
                    terminating: false,
                }),
            )],
        });
        self.note(format!("endpoints: {name} on node{node} (not serving yet)"));
    }

    /// Changes `name`'s conditions now (None: the pod is gone).
    fn change(&self, name: &str, f: impl FnOnce(Conditions) -> Option<Conditions>) {
        let mut endpoints = self.endpoints.lock().unwrap();
        let Some(endpoint) = endpoints.iter_mut().find(|e| e.name == name) else {
            return;
        };
        let Some(now) = endpoint.now() else { return };
        let next = f(now);
        if next != Some(now) {
            endpoint.changes.push((Instant::now(), next));
            drop(endpoints);
            self.note(format!("endpoints: {name} {next:?}"));
        }
    }

    /// The kubelet's readiness of `name`: the condition `serving`.
    pub fn serving(&self, name: &str, serving: bool) {
        self.change(name, |c| Some(Conditions { serving, ..c }));
    }

    /// `name` was deleted: terminating (its readiness still the kubelet's).
    pub fn terminating(&self, name: &str) {
        self.change(name, |c| Some(Conditions { terminating: true, ..c }));
    }

    /// `name` is gone (its containers have exited).
    pub fn gone(&self, name: &str) {
        self.change(name, |_| None);
    }

    /// The endpoints on `node` as a reader `lag` late sees them now
    /// (kube-proxy: [`ENDPOINT_LAG`]): name, address, conditions.
    fn seen_on(&self, node: usize, lag: Duration) -> Vec<(String, SocketAddr, Conditions)> {
        let at = Instant::now().checked_sub(lag).unwrap_or_else(Instant::now);
        let endpoints = self.endpoints.lock().unwrap();
        endpoints
            .iter()
            .filter(|e| e.node == node)
            .filter_map(|e| Some((e.name.clone(), e.addr, e.at(at)?)))
            .collect()
    }

    fn note(&self, line: String) {
        self.events.lock().unwrap().push((SystemTime::now(), line));
    }

    /// Every change, with its time.
    pub fn events(&self) -> Vec<(SystemTime, String)> {
        self.events.lock().unwrap().clone()
    }
}

/// Where a node sent a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    Ready,
    /// A terminating endpoint that is still serving (KEP-1669's fallback).
    TerminatingServing,
    /// No endpoint to send it to: dropped.
    Dropped,
}

/// kube-proxy's choice for a new connection among a node's endpoints,
/// the `n`th connection (round robin among equals).
pub fn choose(endpoints: &[(String, SocketAddr, Conditions)], n: u64) -> (Choice, Option<SocketAddr>) {
    let ready: Vec<SocketAddr> = endpoints.iter().filter(|e| e.2.ready()).map(|e| e.1).collect();
    if !ready.is_empty() {
        return (Choice::Ready, Some(ready[n as usize % ready.len()]));
    }
    let fallback: Vec<SocketAddr> = endpoints
        .iter()
        .filter(|e| e.2.serving && e.2.terminating)
        .map(|e| e.1)
        .collect();
    match fallback.is_empty() {
        false => (Choice::TerminatingServing, Some(fallback[n as usize % fallback.len()])),
        true => (Choice::Dropped, None),
    }
}

/// What a node did with the connections it got.
#[derive(Debug, Default)]
pub struct NodeCounts {
    pub to_ready: AtomicU64,
    pub to_terminating: AtomicU64,
    pub dropped: AtomicU64,
}

/// kube-proxy on one node: its health-check node port and its NodePort.
pub struct Node {
    pub index: usize,
    pub ip: Ipv4Addr,
    pub counts: Arc<NodeCounts>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// Dropped after the threads: the connections still open closed.
    _proxies: Arc<Proxies>,
}

impl Node {
    /// kube-proxy on node `index`, at `ip` on the LAN (an address the LB
    /// host gets for it), for `cluster`'s Service.
    pub fn start(lan: &Lan, index: usize, cluster: &Cluster) -> Node {
        let ip = lan.add_node(index as u8);
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(NodeCounts::default());
        let proxies = Arc::new(Proxies::new());
        let health = {
            let (stop, cluster) = (stop.clone(), cluster.clone());
            let listener = lan
                .host
                .run(move || TcpListener::bind((ip, HEALTH_CHECK_NODE_PORT)).unwrap());
            std::thread::spawn(move || serve_health(listener, index, &cluster, &stop))
        };
        let node_port = {
            let (stop, cluster, counts, proxies) = (stop.clone(), cluster.clone(), counts.clone(), proxies.clone());
            lan.host.spawn(move || {
                let listener = TcpListener::bind((ip, NODE_PORT)).unwrap();
                serve_node_port(listener, index, &cluster, &counts, &proxies, &stop)
            })
        };
        Node {
            index,
            ip,
            counts,
            stop,
            threads: vec![health, node_port],
            _proxies: proxies,
        }
    }

    /// `node3: 12 to ready endpoints, 40 to terminating ones, 0 dropped`.
    pub fn said(&self) -> String {
        let c = &self.counts;
        format!(
            "node{}: {} connections to ready endpoints, {} to terminating ones still serving, {} dropped",
            self.index,
            c.to_ready.load(Ordering::Relaxed),
            c.to_terminating.load(Ordering::Relaxed),
            c.dropped.load(Ordering::Relaxed)
        )
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Accepts on `listener` until `stop`, polling (the listener is made
/// non-blocking); each connection to `serve`.
fn accept_until(listener: &TcpListener, stop: &AtomicBool, mut serve: impl FnMut(TcpStream)) {
    listener.set_nonblocking(true).unwrap();
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).unwrap();
                serve(stream);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// The health-check node port: `GET /healthz`, 200 while the node has a
/// ready endpoint, else 503; kube-proxy's JSON body.
fn serve_health(listener: TcpListener, node: usize, cluster: &Cluster, stop: &AtomicBool) {
    accept_until(&listener, stop, |mut stream| {
        stream.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut request = Vec::new();
        let mut buf = [0u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => request.extend_from_slice(&buf[..n]),
            }
        }
        let local = cluster
            .seen_on(node, ENDPOINT_LAG)
            .iter()
            .filter(|e| e.2.ready())
            .count();
        let body = format!(
            "{{\"service\":{{\"namespace\":\"default\",\"name\":\"gateway\"}},\"localEndpoints\":{local},\"serviceProxyHealthy\":true}}"
        );
        let status = if local > 0 { "200 OK" } else { "503 Service Unavailable" };
        let answer = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(answer.as_bytes());
    });
}

/// The NodePort: each new connection to the endpoint kube-proxy's rules
/// choose, or dropped (a reset).
fn serve_node_port(
    listener: TcpListener,
    node: usize,
    cluster: &Cluster,
    counts: &NodeCounts,
    proxies: &Proxies,
    stop: &AtomicBool,
) {
    let mut n = 0u64;
    accept_until(&listener, stop, |client| {
        n += 1;
        let (choice, to) = choose(&cluster.seen_on(node, ENDPOINT_LAG), n);
        let counter = match choice {
            Choice::Ready => &counts.to_ready,
            Choice::TerminatingServing => &counts.to_terminating,
            Choice::Dropped => &counts.dropped,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        // Connected from this thread, which is in the LB host's namespace.
        let upstream = to.and_then(|to| TcpStream::connect_timeout(&to, Duration::from_millis(500)).ok());
        match upstream {
            Some(upstream) => proxies.proxy(client, upstream),
            None => reset(client),
        }
    });
}

/// The connections a node or the router passes on, copied both ways by
/// one thread (a runtime of one worker) for all of them. A thread each
/// way for each connection (four for every request through a router and
/// a node, at 200 a second) made the threads' starts, stops and wakeups
/// most of the test process's CPU.
struct Proxies(tokio::runtime::Runtime);

impl Proxies {
    fn new() -> Proxies {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("proxies")
            .enable_io()
            .build()
            .unwrap();
        Proxies(runtime)
    }

    /// Copies both ways until each side has closed: what one side sends
    /// until its end (or an error), then the end passed on (a FIN).
    fn proxy(&self, client: TcpStream, upstream: TcpStream) {
        let _in_runtime = self.0.enter();
        let tokio_stream = |s: TcpStream| {
            s.set_nonblocking(true).unwrap();
            tokio::net::TcpStream::from_std(s).unwrap()
        };
        let (client, upstream) = (tokio_stream(client), tokio_stream(upstream));
        self.0.spawn(async move {
            let (mut client_in, mut client_out) = client.into_split();
            let (mut upstream_in, mut upstream_out) = upstream.into_split();
            let up = async {
                let _ = tokio::io::copy(&mut client_in, &mut upstream_out).await;
                let _ = upstream_out.shutdown().await;
            };
            let down = async {
                let _ = tokio::io::copy(&mut upstream_in, &mut client_out).await;
                let _ = client_out.shutdown().await;
            };
            tokio::join!(up, down);
        });
    }
}

/// Closes `stream` with a reset (SO_LINGER 0): the node refuses it.
fn reset(stream: TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a socket this function owns, with a value of
    // the size given.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::addr_of!(linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(stream);
}

// ---------------------------------------------------------------------------
// An announcer that follows the EndpointSlice (MetalLB)

/// Whether an announcer announces a node with these endpoints: one of them
/// is ready or serving (MetalLB's `EndpointCanServe`; `ready` implies
/// `serving`, and a terminating endpoint may still be serving).
pub fn can_serve(endpoints: &[(String, SocketAddr, Conditions)]) -> bool {
    endpoints.iter().any(|e| e.2.ready() || e.2.serving)
}

/// MetalLB's speaker, modelled: each node announced while
/// [`can_serve`] holds for its endpoints as seen `lag` late, and a router
/// on the LB host sending each new client connection to an announced
/// node's NodePort (round robin), or resetting it when none is. Every
/// announcement and withdrawal stamped (a record that stays).
pub struct Announcer {
    /// Where clients connect: the LB host's 127.0.0.1, as a load
    /// balancer's frontend.
    pub frontend: SocketAddr,
    announced: Arc<Mutex<Vec<bool>>>,
    events: Arc<Mutex<Vec<(SystemTime, String)>>>,
    /// Connections that came while no node was announced.
    pub dropped: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// Dropped after the threads: the connections still open closed.
    _proxies: Arc<Proxies>,
}

impl Announcer {
    /// Announces `nodes` for `cluster`'s Service, withdrawing a node `lag`
    /// after the EndpointSlice says none of its endpoints can serve.
    pub fn start(lan: &Lan, nodes: &[Ipv4Addr], cluster: &Cluster, lag: Duration) -> Announcer {
        let frontend = SocketAddr::from(([127, 0, 0, 1], crate::lb::FRONTEND_PORT + 1));
        let stop = Arc::new(AtomicBool::new(false));
        let announced = Arc::new(Mutex::new(vec![false; nodes.len()]));
        let events = Arc::new(Mutex::new(Vec::new()));
        let dropped = Arc::new(AtomicU64::new(0));
        let speaker = {
            let (stop, announced, events, cluster) = (stop.clone(), announced.clone(), events.clone(), cluster.clone());
            let count = nodes.len();
            std::thread::spawn(move || {
                let announce_lag = lag.max(ENDPOINT_LAG + Duration::from_millis(100));
                while !stop.load(Ordering::Relaxed) {
                    for node in 0..count {
                        let serves = can_serve(&cluster.seen_on(node, lag));
                        let mut state = announced.lock().unwrap();
                        let now = match state[node] {
                            true => serves,
                            false => serves && can_serve(&cluster.seen_on(node, announce_lag)),
                        };
                        if state[node] != now {
                            state[node] = now;
                            let what = if now { "announced" } else { "withdrawn" };
                            events
                                .lock()
                                .unwrap()
                                .push((SystemTime::now(), format!("announcer: node{node} {what}")));
                        }
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        };
        let proxies = Arc::new(Proxies::new());
        let router = {
            let (stop, announced, dropped, nodes, proxies) = (
                stop.clone(),
                announced.clone(),
                dropped.clone(),
                nodes.to_vec(),
                proxies.clone(),
            );
            lan.host.spawn(move || {
                let listener = TcpListener::bind(frontend).unwrap();
                let mut n = 0usize;
                accept_until(&listener, &stop, |client| {
                    let up: Vec<usize> = {
                        let state = announced.lock().unwrap();
                        (0..state.len()).filter(|&i| state[i]).collect()
                    };
                    n += 1;
                    let to = (!up.is_empty()).then(|| SocketAddr::from((nodes[up[n % up.len()]], NODE_PORT)));
                    // Connected from this thread, which is in the LB host's namespace.
                    match to.and_then(|to| TcpStream::connect_timeout(&to, Duration::from_millis(500)).ok()) {
                        Some(upstream) => proxies.proxy(client, upstream),
                        None => {
                            dropped.fetch_add(1, Ordering::Relaxed);
                            reset(client);
                        }
                    }
                })
            })
        };
        Announcer {
            frontend,
            announced,
            events,
            dropped,
            stop,
            threads: vec![speaker, router],
            _proxies: proxies,
        }
    }

    /// When node `node` was last announced (`up`) or withdrawn, at or
    /// after `since`.
    fn changed(&self, node: usize, up: bool, since: SystemTime) -> Option<SystemTime> {
        let what = format!("announcer: node{node} {}", if up { "announced" } else { "withdrawn" });
        self.events
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(at, line)| *line == what && *at >= since)
            .map(|(at, _)| *at)
    }

    /// Waits until node `node` is announced (`up`) or withdrawn, at or
    /// after `since`; when it was.
    pub fn wait_changed(&self, node: usize, up: bool, since: SystemTime, timeout: Duration) -> SystemTime {
        let what = if up { "announce" } else { "withdraw" };
        crate::wait_for(&format!("the announcer to {what} node{node}"), timeout, || {
            self.changed(node, up, since)
                .ok_or_else(|| self.announced.lock().unwrap().clone())
        })
    }

    /// Every announcement and withdrawal, with its time.
    pub fn events(&self) -> Vec<(SystemTime, String)> {
        self.events.lock().unwrap().clone()
    }
}

impl Drop for Announcer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// The kubelet's readiness probe of a pod's proxy container.
#[derive(Debug, Clone, Copy)]
pub struct ProbeSpec {
    pub period: Duration,
    pub failure_threshold: u32,
    pub timeout: Duration,
}

impl ProbeSpec {
    /// The shipped manifests' readinessProbe: every 5 s, 3 failures, 3 s
    /// timeout.
    pub const SHIPPED: ProbeSpec = ProbeSpec {
        period: Duration::from_secs(5),
        failure_threshold: 3,
        timeout: Duration::from_secs(3),
    };
}

/// The kubelet probing one pod's readiness through its status listener
/// (15021) from the node, as `kube-probe/1.34`, until dropped; each change
/// of its verdict published as the endpoint's `serving`.
pub struct Kubelet {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Kubelet {
    pub fn start(host: &Netns, cluster: &Cluster, name: &str, pod_ip: Ipv4Addr, spec: ProbeSpec) -> Kubelet {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, cluster, name) = (stop.clone(), cluster.clone(), name.to_owned());
        let addr = SocketAddr::from((pod_ip, STATUS));
        let thread = host.spawn(move || {
            let (mut serving, mut failures) = (false, 0u32);
            while !flag.load(Ordering::Relaxed) {
                let started = Instant::now();
                let headers = [("user-agent", "kube-probe/1.34"), ("connection", "close")];
                let passed = crate::request(addr, "GET", "/healthz/ready", &headers, spec.timeout)
                    .is_ok_and(|a| (200..400).contains(&a.status));
                match passed {
                    true => {
                        failures = 0;
                        if !serving {
                            serving = true;
                            cluster.serving(&name, true);
                        }
                    }
                    false => {
                        failures += 1;
                        if serving && failures >= spec.failure_threshold {
                            serving = false;
                            cluster.serving(&name, false);
                        }
                    }
                }
                let next = started + spec.period;
                while !flag.load(Ordering::Relaxed) && Instant::now() < next {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        });
        Kubelet {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

// ---------------------------------------------------------------------------
// A rolling restart behind a load balancer that checks the nodes, or an
// announcer

/// How the nodes get the Service's traffic.
#[derive(Debug, Clone, Copy)]
pub enum NodeWay {
    /// A load balancer (HAProxy in TCP mode) checking each node's
    /// health-check node port so.
    Checked(Check),
    /// An announcer that follows the EndpointSlice, this late.
    Announced { lag: Duration },
}

impl NodeWay {
    /// An announcer as MetalLB's speaker usually is: [`ANNOUNCER_LAG`].
    pub const METALLB: NodeWay = NodeWay::Announced { lag: ANNOUNCER_LAG };
}

/// What to roll: the way the nodes get their traffic, the client's rate,
/// the pods (gateways of a shape, or sidecars' pods whose app has the
/// drain wait's preStop hook), lifeguard's flags, and the kubelet's probe.
pub struct NodeRollout<'a> {
    pub way: NodeWay,
    pub rate: u32,
    /// How long the client sends before the pod is replaced.
    pub steady: Duration,
    /// Gateways of this shape; None: sidecars' pods with the app's hook
    /// `GET /drain/wait`.
    pub gateway: Option<Gateway>,
    pub agent_args: &'a [&'a str],
    /// The pods' grace period (give lifeguard the same).
    pub grace: Duration,
    pub kubelet: ProbeSpec,
    /// How the client sends.
    pub client: Client,
}

/// How it went: the rollout's record (one pod replaced, `down` when the
/// load balancer let its node go, or the announcer withdrew it), and what
/// each node did.
pub struct NodeRun {
    pub run: Run,
    /// What each node did, in words.
    pub nodes: Vec<String>,
    /// The connections each node dropped (no endpoint it could send them
    /// to).
    pub dropped: Vec<u64>,
    /// The connections the announcer reset, no node being announced.
    pub unannounced: u64,
}

/// The front of the nodes: a load balancer or an announcer.
enum NodeFront {
    Checked(Front),
    Announced(Announcer),
}

impl NodeFront {
    fn frontend(&self) -> SocketAddr {
        match self {
            NodeFront::Checked(front) => front.frontend,
            NodeFront::Announced(announcer) => announcer.frontend,
        }
    }

    /// Waits until node `k` gets traffic (`up`) or no longer does, at or
    /// after `since`.
    fn wait(&self, k: usize, up: bool, since: SystemTime, timeout: Duration) -> SystemTime {
        match self {
            NodeFront::Checked(front) => front.wait_marked_since(&format!("node{k}"), up, since, timeout),
            NodeFront::Announced(announcer) => announcer.wait_changed(k, up, since, timeout),
        }
    }

    fn events(&self) -> Vec<(SystemTime, String)> {
        match self {
            NodeFront::Checked(front) => front.events(),
            NodeFront::Announced(announcer) => announcer.events(),
        }
    }
}

/// Two nodes, one pod of the Service on node 0; the nodes' front is a load
/// balancer that checks both (node 1 has no endpoint yet: unhealthy), or an
/// announcer (node 1 not announced yet). A new pod starts on node 1, ready
/// for the kubelet, taken in; then the old pod is deleted: every endpoint
/// on node 0 is terminating, its health-check port fails at once, and a
/// load balancer keeps sending it new connections until it has seen its
/// threshold of failures; an announcer keeps announcing it while the old
/// pod is serving; kube-proxy sends them to the old pod while the kubelet
/// sees it serving.
pub fn node_rolling_restart(rollout: &NodeRollout) -> NodeRun {
    let lan = Lan::new();
    let cluster = Cluster::default();
    let nodes: Vec<Node> = (0..2).map(|k| Node::start(&lan, k, &cluster)).collect();
    let (port, hook) = match rollout.gateway {
        Some(_) => (GATEWAY_PORT, Hook::None),
        None => (INBOUND, Hook::Get("/drain/wait".into())),
    };
    let pod = |slot: u8| match rollout.gateway {
        Some(kind) => gateway_at(&lan, slot, kind, rollout.agent_args),
        None => pod_at(&lan, slot, rollout.agent_args),
    };
    let (mut old, old_ip) = pod(0);
    cluster.add("old0", 0, SocketAddr::from((old_ip, port)));
    let old_kubelet = Kubelet::start(&lan.host, &cluster, "old0", old_ip, rollout.kubelet);
    let (front, taken_in, let_go) = match rollout.way {
        NodeWay::Checked(check) => {
            let servers: Vec<(String, Ipv4Addr)> = nodes.iter().map(|n| (format!("node{}", n.index), n.ip)).collect();
            let front = Front::start(&lan, Balancer::Nodes(check), &servers, 1, NODE_PORT);
            let taken_in = check.inter * 2 + rollout.kubelet.period + Duration::from_secs(10);
            // At its own pace, perhaps after the pod is gone (when the node
            // dropped its traffic before).
            (
                NodeFront::Checked(front),
                taken_in,
                check.inter * check.fall + Duration::from_secs(10),
            )
        }
        NodeWay::Announced { lag } => {
            let ips: Vec<Ipv4Addr> = nodes.iter().map(|n| n.ip).collect();
            let announcer = Announcer::start(&lan, &ips, &cluster, lag);
            let taken_in = rollout.kubelet.period * 2 + lag + Duration::from_secs(10);
            // Once the kubelet has seen the pod fail, whenever that is.
            (
                NodeFront::Announced(announcer),
                taken_in,
                rollout.grace + Duration::from_secs(10),
            )
        }
    };
    let t0 = SystemTime::UNIX_EPOCH;
    front.wait(0, true, t0, taken_in);
    let load = Load::with(&lan.host, &[front.frontend()], rollout.rate, rollout.client);
    // A scenario's length: the traffic the pod has had when it is replaced.
    std::thread::sleep(rollout.steady);
    let (_new, new_ip) = pod(3);
    cluster.add("new0", 1, SocketAddr::from((new_ip, port)));
    let _new_kubelet = Kubelet::start(&lan.host, &cluster, "new0", new_ip, rollout.kubelet);
    front.wait(1, true, t0, taken_in);
    let deletion = delete_pod(&mut old, &lan.host, old_ip, &hook, rollout.grace, || {
        cluster.terminating("old0")
    });
    cluster.gone("old0");
    drop(old_kubelet);
    let down = front.wait(0, false, deletion.started, let_go);
    let sent = load.stop();
    let mut events = front.events();
    events.extend(cluster.events());
    events.sort_by_key(|(t, _)| *t);
    let left = Left {
        deletion,
        down: vec![down],
        log: old.agent.output(),
        envoy_log: old.envoy_output(),
        summary: old.termination_message(),
    };
    NodeRun {
        run: Run {
            sent,
            left: vec![left],
            events,
            rate: rollout.rate,
            resets: Vec::new(),
        },
        nodes: nodes.iter().map(Node::said).collect(),
        dropped: nodes.iter().map(|n| n.counts.dropped.load(Ordering::Relaxed)).collect(),
        unannounced: match &front {
            NodeFront::Announced(announcer) => announcer.dropped.load(Ordering::Relaxed),
            NodeFront::Checked(_) => 0,
        },
    }
}
