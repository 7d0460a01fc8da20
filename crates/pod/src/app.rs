//! What the app still holds: the evidence the `app-exit` drain policy and
//! `lifeguard wait-app-exit` wait on.
//!
//! The pod's app is everything in the pod's network namespace that is not
//! the proxy. The proxy is known by **process id**, never by name: Envoy
//! (lifeguard's child, or for an external Envoy the process that owns the
//! admin listener) and lifeguard itself. So:
//!
//! - **sockets**: every TCP socket of the namespace (IPv4 and IPv6,
//!   listening or connected) counts as the app's unless the proxy holds
//!   it. Only the proxy's descriptors are read: whoever else holds a
//!   socket (the app, unseen without a shared process namespace, where the
//!   socket table is the only signal) makes it the app's. So that no socket
//!   of the proxy is ever taken for the app's, even one that comes or goes
//!   while the pod is read:
//!   - a socket counts only when the table read **before** the proxy's
//!     descriptors and the table read **after** them both list it (the
//!     same inode): its file was open across that read, so a proxy process
//!     that held it was seen holding it. A connection Envoy accepts, opens
//!     or closes between two reads is gone from one table, and is left to
//!     the next scan;
//!   - the proxy is its **pids**: a socket a proxy process holds is the
//!     proxy's, whatever the process's name;
//!   - a connection whose local address is one the proxy **listens on**
//!     (a listening socket of the same table held by a proxy process, on
//!     that address or a wildcard) was accepted by the proxy: it is the
//!     proxy's even when its holder is not seen. The app's own call to
//!     Envoy's listener has an ephemeral local port, and stays the app's.
//!
//!   A socket no process holds any more (TIME_WAIT, and FIN_WAIT, CLOSING
//!   or LAST_ACK once closed: the kernel shows inode 0) counts for no one:
//!   its process closed it or exited. A half-closed socket its process
//!   still holds (CLOSE_WAIT: the peer closed first) is still its holder's.
//!   Connections to or from the control ports — lifeguard's status port
//!   and Envoy's admin port — are probes and hook commands, never the
//!   app's work; nor are sockets on ports the operator leaves out (other
//!   sidecars).
//! - **processes**: where the pod shares one process namespace
//!   (`shareProcessNamespace: true`, seen as PID 1 being the pod's `pause`
//!   process — `catatonit` in a podman pod — in another cgroup than
//!   lifeguard's), every process in another
//!   cgroup than lifeguard's — pause and the proxy aside — is the app's, and
//!   the app is done only when all of them have exited. That catches an app
//!   that holds no socket between two calls. Without a shared process
//!   namespace the sockets are the only signal.
//!
//! A scan reads `/proc`; it is synchronous and takes a few milliseconds in a
//! pod, so async callers run it on the blocking pool (`Watcher::scan`).
//!
//! Whether an app was **ever seen** tells a sidecar's pod from one whose
//! only container is the proxy (a gateway): until the drain, the pod is
//! looked at now and then ([`look_for_app`]), and every scan that finds
//! something of an app says so for good.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use procfs::process::{Process, StatFlags};

use crate::sockets::{self, Socket};
use lifeguard_drain::{AppControl, AppProcess, AppSocket, DrainUntil, Phase, Plan as DrainPlan, Status, Work};

/// Why the app cannot be watched here, or a look at it failed.
#[derive(Debug, thiserror::Error)]
pub enum AppWatchError {
    /// Outside a pod, "every socket not the proxy's" is every socket of
    /// the machine.
    #[error("not in a pod (no KUBERNETES_SERVICE_HOST, the host's PID and network namespaces)")]
    HostNamespaces,
    #[error("not in a pod (no KUBERNETES_SERVICE_HOST; the namespaces cannot be read)")]
    NamespacesUnread,
    #[error("the status port {port} belongs to pid {pid}, not to lifeguard")]
    StatusPortOwner { port: u16, pid: u32 },
    #[error("cannot see which process owns lifeguard's own socket in /proc")]
    OwnSocketUnseen,
    #[error("Envoy is not lifeguard's child and its admin is a Unix socket: its process cannot be told")]
    EnvoyUnknown,
    /// An external Envoy's admin port, whose owner is out of sight.
    #[error("Envoy's admin listener (port {0}) is held by a process lifeguard cannot see")]
    AdminOwnerUnseen(u16),
    #[error("cannot read /proc/net/tcp: {0}")]
    Proc(std::io::Error),
    /// The scan's task on the blocking pool.
    #[error("{0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Who the proxy is, and what is never the app's.
#[derive(Debug, Clone, Default)]
pub struct Proxy {
    /// Process ids of the proxy: lifeguard, Envoy, a hook's own process.
    pub pids: Vec<u32>,
    /// The status port and Envoy's admin port: control traffic.
    pub control_ports: Vec<u16>,
    /// Local ports left out (other sidecars), from the operator.
    pub ignored_ports: Vec<u16>,
}

/// The app's sockets, by the rules in the module doc: `before` is the
/// table read before the holders (socket inode → pid, of the proxy's
/// processes at least) were, `after` the table read after them (what was
/// held across the holders' read counts).
pub(crate) fn app_sockets(
    before: &[Socket],
    holders: &HashMap<u64, u32>,
    after: &[Socket],
    proxy: &Proxy,
) -> Vec<AppSocket> {
    let held_after: HashSet<u64> = after.iter().map(|s| s.inode).collect();
    let proxy_owns = |s: &Socket| holders.get(&s.inode).is_some_and(|pid| proxy.pids.contains(pid));
    let proxy_listens: Vec<SocketAddr> = before
        .iter()
        .filter(|s| s.listening && proxy_owns(s))
        .map(|s| s.local)
        .collect();
    let accepted_by_proxy = |s: &Socket| !s.listening && proxy_listens.iter().any(|l| accepts(*l, s.local));
    let control = |port: u16| proxy.control_ports.contains(&port);
    let mut seen = HashSet::new();
    before
        .iter()
        .filter(|s| s.inode != 0 && held_after.contains(&s.inode) && seen.insert(s.inode))
        .filter(|s| !proxy.ignored_ports.contains(&s.local.port()))
        .filter(|s| !(control(s.local.port()) || (!s.listening && control(s.remote.port()))))
        .filter(|s| !proxy_owns(s) && !accepted_by_proxy(s))
        .map(|s| AppSocket {
            local: s.local,
            remote: (!s.listening).then_some(s.remote),
        })
        .collect()
}

/// Whether a socket listening on `listener` accepts connections to
/// `local`: the same port, and the same address or a wildcard one (an
/// IPv4 peer of a dual-stack listener shows as `::ffff:a.b.c.d`).
fn accepts(listener: SocketAddr, local: SocketAddr) -> bool {
    let ip = |a: SocketAddr| match a.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    listener.port() == local.port() && (listener.ip().is_unspecified() || ip(listener) == ip(local))
}

/// Whether this process shares the pod's process namespace: PID 1 is the
/// pod's `pause` process (the sandbox's, under containerd and CRI-O;
/// `catatonit -P` in a pod played by podman), in another cgroup than ours.
pub fn shares_pod_process_namespace() -> bool {
    let pause = Process::new(1)
        .and_then(|p| p.stat())
        .is_ok_and(|s| matches!(s.comm.as_str(), "pause" | "catatonit"));
    pause && cgroup_of(1).is_some_and(|c| Some(c) != cgroup_of(std::process::id() as i32))
}

/// A process's cgroups, as `hierarchy:controllers:path` lines.
fn cgroup_of(pid: i32) -> Option<Vec<String>> {
    let groups = Process::new(pid).and_then(|p| p.cgroups()).ok()?;
    let line = |g: &procfs::ProcessCGroup| format!("{}:{}:{}", g.hierarchy, g.controllers.join(","), g.pathname);
    Some(groups.0.iter().map(line).collect())
}

/// Processes of the app's containers: every process in another cgroup than
/// ours, but PID 1 (pause) and the proxy's, and but those that have exited
/// or begun to ([`still_running`]). Err when the processes cannot be read
/// (our own cgroup, or the process list): an app not seen is not gone.
pub(crate) fn app_processes(proxy: &Proxy) -> std::io::Result<Vec<AppProcess>> {
    let ours = cgroup_of(std::process::id() as i32)
        .ok_or_else(|| std::io::Error::other("lifeguard's own cgroup cannot be read"))?;
    let all = procfs::process::all_processes()
        .map_err(|e| std::io::Error::other(format!("the process list cannot be read: {e}")))?;
    let mut out: Vec<AppProcess> = all
        .flatten()
        .filter(|p| p.pid != 1 && !proxy.pids.contains(&(p.pid as u32)))
        .filter(|p| cgroup_of(p.pid).is_some_and(|c| c != ours))
        .filter_map(|p| {
            let stat = p.stat().ok()?;
            still_running(stat.state, stat.flags).then_some(AppProcess {
                pid: p.pid as u32,
                name: stat.comm,
            })
        })
        .collect();
    out.sort_by_key(|p| p.pid);
    Ok(out)
}

/// Whether a process, by its `/proc/<pid>/stat` state and flags, still
/// runs. A zombie has exited (only its parent's wait is missing); a process
/// that has begun to exit (`PF_EXITING`, never cleared) is closing its
/// files and has left its cgroup for the root one, so it would otherwise
/// look like a process of another container: a hook of the proxy's own
/// container was named an app process in its last moments.
fn still_running(state: char, flags: u32) -> bool {
    !matches!(state, 'Z' | 'X') && flags & StatFlags::PF_EXITING.bits() == 0
}

/// The kernel's initial PID namespace, as `/proc/self/ns/pid` names it
/// (its inode number is fixed: `PROC_PID_INIT_INO`).
const INITIAL_PID_NAMESPACE: &str = "pid:[4026531836]";

/// Whether lifeguard runs in a pod, and why not when it does not.
/// Kubernetes sets `KUBERNETES_SERVICE_HOST` in every container; a
/// container has a PID namespace of its own; a network namespace built
/// around lifeguard (a test's pod) is not the host's, which kernel threads
/// (`kthreadd`, PID 2 in the host's PID namespace) always live in and which
/// may be read where PID 1 may not. Outside a pod, "every socket not the
/// proxy's" is every socket of the machine, which the app-exit policy must
/// not wait on.
pub fn in_a_pod() -> Result<(), AppWatchError> {
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        return Ok(());
    }
    let ns = |pid: &str, kind: &str| std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).ok();
    if ns("self", "pid").is_some_and(|p| p.as_os_str() != INITIAL_PID_NAMESPACE) {
        return Ok(());
    }
    let kthreadd = std::fs::read_to_string("/proc/2/comm").is_ok_and(|c| c.trim() == "kthreadd");
    let host = if kthreadd { ns("2", "net") } else { ns("1", "net") };
    match (ns("self", "net"), host) {
        (Some(ours), Some(host)) if ours != host => Ok(()),
        (Some(_), Some(_)) => Err(AppWatchError::HostNamespaces),
        _ => Err(AppWatchError::NamespacesUnread),
    }
}

/// The proxy's own processes as a hook sees them, without asking the
/// agent: this process, every other process in this container (this
/// cgroup) that runs this same program (the agent), and their descendants
/// (the Envoy it launched). The hook's own children are not the proxy's.
pub fn own_proxy_processes() -> Vec<u32> {
    let me = std::process::id() as i32;
    let (Some(ours), Ok(exe)) = (cgroup_of(me), std::fs::read_link("/proc/self/exe")) else {
        return vec![me as u32];
    };
    let Ok(all) = procfs::process::all_processes() else {
        return vec![me as u32];
    };
    let stats: Vec<_> = all
        .flatten()
        .filter_map(|p| Some((p.pid, p.stat().ok()?.ppid, p)))
        .collect();
    let mut proxy: Vec<i32> = stats
        .iter()
        .filter(|(pid, _, p)| *pid != me && p.exe().is_ok_and(|e| e == exe) && cgroup_of(*pid).as_ref() == Some(&ours))
        .map(|(pid, _, _)| *pid)
        .collect();
    // Descendants, generation by generation.
    let mut grew = true;
    while grew {
        let more: Vec<i32> = stats
            .iter()
            .filter(|(pid, ppid, _)| proxy.contains(ppid) && !proxy.contains(pid))
            .map(|(pid, _, _)| *pid)
            .collect();
        grew = !more.is_empty();
        proxy.extend(more);
    }
    proxy.push(me);
    proxy.into_iter().map(|p| p as u32).collect()
}

/// The pid that owns a listening socket on `port` in this namespace.
pub fn listener_owner(port: u16) -> Option<u32> {
    let sockets = sockets::sockets().ok()?;
    listening_on(&sockets, &sockets::holders(None), port)
}

/// The pid holding a socket of `sockets` listening on `port`.
fn listening_on(sockets: &[Socket], holders: &HashMap<u64, u32>, port: u16) -> Option<u32> {
    sockets
        .iter()
        .filter(|s| s.listening && s.local.port() == port)
        .find_map(|s| holders.get(&s.inode).copied())
}

/// Scans the app's work, with the process rule when `processes` is set.
/// Only the proxy's descriptors are read: who else holds a socket does not
/// matter. With `envoy_admin_port`, the process that owns that listener is
/// the proxy's too (an Envoy lifeguard did not launch: every process is
/// read to find it). The socket table is read again after the holders only
/// when the first reading found some socket of the app's: an empty one
/// needs no second look.
pub fn scan(proxy: &Proxy, processes: bool, envoy_admin_port: Option<u16>) -> std::io::Result<Work> {
    let before = sockets::sockets()?;
    let mut proxy = proxy.clone();
    let holders = match envoy_admin_port {
        Some(port) => {
            let all = sockets::holders(None);
            proxy.pids.extend(listening_on(&before, &all, port));
            all
        }
        None => sockets::holders(Some(&proxy.pids)),
    };
    let mut found = app_sockets(&before, &holders, &before, &proxy);
    if !found.is_empty() {
        found = app_sockets(&before, &holders, &sockets::sockets()?, &proxy);
    }
    Ok(Work {
        sockets: found,
        processes: if processes { app_processes(&proxy)? } else { Vec::new() },
        processes_seen: processes,
    })
}

/// The app as the drain sees it: who the proxy is, and whether the process
/// rule applies in this pod.
#[derive(Debug, Clone)]
pub struct Watcher {
    proxy: Proxy,
    processes: bool,
    /// For an external Envoy: its admin port, whose owner is Envoy.
    envoy_admin_port: Option<u16>,
    /// Whether a scan ever found something of an app, and when the pod
    /// was first looked at (shared by clones).
    seen: Arc<Seen>,
}

/// What the scans have found of an app so far.
#[derive(Debug, Default)]
struct Seen {
    app: AtomicBool,
    first_look: std::sync::OnceLock<tokio::time::Instant>,
}

impl Watcher {
    /// The watcher of this pod, for an agent whose status listener is on
    /// `status_port`. `envoy` is Envoy's pid when lifeguard launched it;
    /// otherwise Envoy is the owner of the admin listener on `admin_port`
    /// (None: Envoy's admin is a Unix socket).
    /// Err when sockets cannot be attributed to processes here (no /proc
    /// access, or an external Envoy whose process cannot be seen).
    pub fn for_pod(
        status_port: u16,
        admin_port: Option<u16>,
        envoy: Option<u32>,
        ignored_ports: Vec<u16>,
    ) -> Result<Watcher, AppWatchError> {
        let me = std::process::id();
        match listener_owner(status_port) {
            Some(pid) if pid == me => {}
            Some(pid) => {
                let port = status_port;
                return Err(AppWatchError::StatusPortOwner { port, pid });
            }
            None => return Err(AppWatchError::OwnSocketUnseen),
        }
        if let (None, None) = (envoy, admin_port) {
            return Err(AppWatchError::EnvoyUnknown);
        }
        if let (None, Some(admin_port)) = (envoy, admin_port) {
            let sockets = sockets::sockets().map_err(AppWatchError::Proc)?;
            let admin = sockets.iter().find(|s| s.listening && s.local.port() == admin_port);
            if admin.is_some_and(|s| !sockets::holders(None).contains_key(&s.inode)) {
                return Err(AppWatchError::AdminOwnerUnseen(admin_port));
            }
        }
        let proxy = Proxy {
            pids: std::iter::once(me).chain(envoy).collect(),
            control_ports: std::iter::once(status_port).chain(admin_port).collect(),
            ignored_ports,
        };
        Ok(Watcher {
            proxy,
            processes: shares_pod_process_namespace(),
            envoy_admin_port: admin_port.filter(|_| envoy.is_none()),
            seen: Arc::default(),
        })
    }

    /// A watcher for drains whose policy does not look at the app.
    pub fn inert() -> Watcher {
        Watcher {
            proxy: Proxy::default(),
            processes: false,
            envoy_admin_port: None,
            seen: Arc::default(),
        }
    }

    /// Whether the process rule applies.
    pub fn watches_processes(&self) -> bool {
        self.processes
    }

    /// One scan, on the blocking pool.
    pub(crate) async fn scan(&self) -> Result<Work, AppWatchError> {
        let proxy = self.proxy.clone();
        let processes = self.processes;
        let admin = self.envoy_admin_port;
        let work = tokio::task::spawn_blocking(move || scan(&proxy, processes, admin))
            .await?
            .map_err(AppWatchError::Proc)?;
        self.seen.first_look.get_or_init(tokio::time::Instant::now);
        if !work.is_done() && !self.seen.app.swap(true, Ordering::Relaxed) {
            tracing::info!("the pod has an app: {work}");
        }
        Ok(work)
    }
}

impl AppControl for Watcher {
    type Error = AppWatchError;
    async fn work(&self) -> Result<Work, AppWatchError> {
        self.scan().await
    }
    async fn changed(&self, processes: Vec<AppProcess>) {
        crate::exits::one_exits(&processes).await;
    }
    fn has_app(&self) -> Option<bool> {
        if self.seen.app.load(Ordering::Relaxed) {
            return Some(true);
        }
        let looked = self.seen.first_look.get().map(tokio::time::Instant::elapsed);
        looked.is_some_and(|l| l >= LOOKED_LONG_ENOUGH).then_some(false)
    }
}

/// What the drain watches of the app, and the drain's plan under the
/// policy in force: the one planned, except that `app-exit` falls back to
/// `requests` (with a warning) when the app's sockets cannot be attributed
/// here (`status_port`: lifeguard's; `admin_port`: Envoy's, when on TCP;
/// `envoy`: Envoy's pid when lifeguard launched it; `ignored`: ports of
/// other sidecars). The other policies watch nothing.
pub fn for_drain(
    drain: &DrainPlan,
    status_port: u16,
    admin_port: Option<u16>,
    envoy: Option<u32>,
    ignored: Vec<u16>,
) -> (Watcher, DrainPlan) {
    let drain = drain.clone();
    if drain.drain_until() != DrainUntil::AppExit {
        return (Watcher::inert(), drain);
    }
    let asked = drain.asked();
    let instead = (Watcher::inert(), drain.clone().in_force(DrainUntil::Requests));
    if let Err(why) = in_a_pod() {
        if !asked {
            tracing::info!("{why}: draining until zero requests (app-exit would wait on every socket of the machine)");
            return instead;
        }
        tracing::warn!("{why}: app-exit, as asked, waits on every socket of this machine that is not the proxy's");
    }
    match Watcher::for_pod(status_port, admin_port, envoy, ignored) {
        Ok(app) => {
            let processes = app.watches_processes();
            let and = if processes {
                " and processes (shared process namespace)"
            } else {
                ""
            };
            tracing::info!(processes, "app-exit: waiting for the app's sockets{and}");
            (app, drain)
        }
        Err(why) => {
            tracing::warn!("the app's sockets cannot be attributed ({why}): draining until zero requests instead");
            instead
        }
    }
}

/// A pod looked at this long with nothing of an app ever seen has none:
/// its app container, if it had one, would have started beside or soon
/// after the proxy.
const LOOKED_LONG_ENOUGH: Duration = Duration::from_secs(5);

/// Looks at the pod every `LOOK_EVERY` (every `LOOK_EVERY_AT_FIRST`
/// in its first `FIRST_LOOKS`: an app container starts beside or after
/// the proxy) until something of an app is seen, the drain begins or
/// `shutdown`: whether the pod has an app is known when the drain begins.
/// Costs a read of the socket table and of the proxy's descriptors a look.
pub async fn look_for_app(
    watcher: Watcher,
    mut drain: tokio::sync::watch::Receiver<Status>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let started = tokio::time::Instant::now();
    while watcher.has_app() != Some(true) {
        let every = match started.elapsed() < FIRST_LOOKS {
            true => LOOK_EVERY_AT_FIRST,
            false => LOOK_EVERY,
        };
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = drain.wait_for(|s| s.phase != Phase::Serving) => return,
            _ = shutdown.cancelled() => return,
        }
        if let Err(why) = watcher.scan().await {
            tracing::debug!(error = %why, "cannot look for the pod's app");
        }
    }
}

/// How often the pod is looked at for an app, once past its first
/// [`FIRST_LOOKS`].
const LOOK_EVERY: Duration = Duration::from_secs(10);
/// ... and within them.
const LOOK_EVERY_AT_FIRST: Duration = Duration::from_secs(1);
const FIRST_LOOKS: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn socket(local: &str, remote: &str, inode: u64) -> Socket {
        Socket {
            local: local.parse().unwrap(),
            remote: remote.parse().unwrap(),
            listening: remote.ends_with(":0"),
            inode,
        }
    }

    fn proxy() -> Proxy {
        Proxy {
            pids: vec![100, 200],
            control_ports: vec![15020, 15000],
            ignored_ports: vec![9901],
        }
    }

    #[test]
    fn the_proxy_is_known_by_pid_not_by_name() {
        let sockets = [
            socket("0.0.0.0:15006", "0.0.0.0:0", 1),         // Envoy (pid 100)
            socket("0.0.0.0:8080", "0.0.0.0:0", 2),          // the app, named "envoy"
            socket("127.0.0.1:41234", "127.0.0.1:15001", 3), // the app calling out
            socket("127.0.0.1:15001", "127.0.0.1:41234", 4), // Envoy's end of it
            socket("10.0.0.5:8080", "10.0.0.9:50000", 5),    // owner not visible
            socket("127.0.0.1:8080", "127.0.0.1:50001", 0),  // TIME_WAIT: no one's
            socket("127.0.0.1:50002", "127.0.0.1:15020", 6), // a hook talking to lifeguard
            socket("127.0.0.1:50003", "127.0.0.1:15000", 7), // a hook talking to Envoy's admin
            socket("0.0.0.0:9901", "0.0.0.0:0", 8),          // another sidecar, left out
            socket("0.0.0.0:15020", "0.0.0.0:0", 9),         // lifeguard (pid 200)
        ];
        let owners = HashMap::from([
            (1, 100),
            (2, 300),
            (3, 300),
            (4, 100),
            (6, 400),
            (7, 400),
            (8, 500),
            (9, 200),
        ]);
        let got = app_sockets(&sockets, &owners, &sockets, &proxy());
        assert_eq!(
            texts(&got),
            [
                "0.0.0.0:8080 listening",
                "127.0.0.1:41234 -> 127.0.0.1:15001",
                "10.0.0.5:8080 -> 10.0.0.9:50000"
            ]
        );
    }

    #[test]
    fn a_socket_listed_twice_counts_once() {
        let sockets = [socket("0.0.0.0:8080", "0.0.0.0:0", 3), socket("[::]:8080", "[::]:0", 3)];
        assert_eq!(app_sockets(&sockets, &HashMap::new(), &sockets, &proxy()).len(), 1);
    }

    fn texts(sockets: &[AppSocket]) -> Vec<String> {
        sockets.iter().map(ToString::to_string).collect()
    }

    /// Envoy (pid 100) listening on 15006 and on the status port 15021,
    /// and the app (pid 300) on 8080, as every case below starts.
    fn listeners() -> Vec<Socket> {
        vec![
            socket("0.0.0.0:15006", "0.0.0.0:0", 1),
            socket("[::]:15021", "[::]:0", 2),
            socket("127.0.0.1:8080", "0.0.0.0:0", 3),
        ]
    }

    fn listener_owners() -> HashMap<u64, u32> {
        HashMap::from([(1, 100), (2, 100), (3, 300)])
    }

    #[test]
    fn a_socket_that_vanishes_between_the_reads_is_no_ones() {
        // Envoy closed these after the first table and before its
        // descriptors were read: no owner, and gone from the second table.
        let mut before = listeners();
        before.extend([
            socket("10.203.0.6:41000", "10.203.0.9:8080", 10), // Envoy's upstream call
            socket("127.0.0.1:40000", "127.0.0.1:8080", 11),   // Envoy's connection to the app
        ]);
        let after = listeners();
        let got = app_sockets(&before, &listener_owners(), &after, &proxy());
        assert_eq!(texts(&got), ["127.0.0.1:8080 listening"]);
        // Read once only, they would have been the app's.
        assert_eq!(app_sockets(&before, &listener_owners(), &before, &proxy()).len(), 3);
    }

    #[test]
    fn a_socket_that_appears_between_the_reads_waits_for_the_next_scan() {
        // Opened after the first table: its owner may or may not have been
        // seen; it is read whole at the next scan.
        let before = listeners();
        let mut after = listeners();
        after.push(socket("127.0.0.1:40001", "127.0.0.1:8080", 12));
        let got = app_sockets(&before, &listener_owners(), &after, &proxy());
        assert_eq!(texts(&got), ["127.0.0.1:8080 listening"]);
    }

    #[test]
    fn a_connection_envoy_accepted_is_envoys_even_when_its_owner_is_unseen() {
        let mut sockets = listeners();
        sockets.extend([
            // Accepted by Envoy on its wildcard listeners (the second one
            // dual-stack: an IPv4 peer shows as ::ffff:a.b.c.d): no owner seen.
            socket("10.203.0.6:15006", "10.203.0.5:39076", 20),
            socket("[::ffff:10.203.0.6]:15021", "[::ffff:10.203.0.5]:39077", 21),
            // The app's call to Envoy (its end, owner unseen) stays the app's.
            socket("127.0.0.1:41234", "127.0.0.1:15006", 22),
            // The app's own listener and a connection it accepted.
            socket("10.203.0.6:9000", "0.0.0.0:0", 23),
            socket("10.203.0.6:9000", "10.203.0.5:39078", 24),
        ]);
        let got = app_sockets(&sockets, &listener_owners(), &sockets, &proxy());
        assert_eq!(
            texts(&got),
            [
                "127.0.0.1:8080 listening",
                "127.0.0.1:41234 -> 127.0.0.1:15006",
                "10.203.0.6:9000 listening",
                "10.203.0.6:9000 -> 10.203.0.5:39078"
            ]
        );
        // Only a proxy process's listener says so: the app's own listener
        // on 8080 does not make its accepted connections anyone else's.
        let app_side = [socket("127.0.0.1:8080", "127.0.0.1:40002", 25)];
        let both: Vec<Socket> = listeners().into_iter().chain(app_side).collect();
        let got = app_sockets(&both, &listener_owners(), &both, &proxy());
        assert_eq!(
            texts(&got),
            ["127.0.0.1:8080 listening", "127.0.0.1:8080 -> 127.0.0.1:40002"]
        );
    }

    #[test]
    fn an_envoy_listener_on_one_address_leaves_the_same_port_elsewhere_to_the_app() {
        let sockets = [
            socket("127.0.0.1:15001", "0.0.0.0:0", 1),                         // Envoy
            socket("127.0.0.1:15001", "127.0.0.1:41234", 2),                   // accepted by Envoy
            socket("10.0.0.5:15001", "0.0.0.0:0", 3),                          // the app's
            socket("10.0.0.5:15001", "10.0.0.9:50000", 4),                     // accepted by the app
            socket("[::ffff:127.0.0.1]:15001", "[::ffff:127.0.0.1]:41235", 5), // Envoy's, v4-mapped
        ];
        let owners = HashMap::from([(1, 100)]);
        let got = app_sockets(&sockets, &owners, &sockets, &proxy());
        assert_eq!(
            texts(&got),
            ["10.0.0.5:15001 listening", "10.0.0.5:15001 -> 10.0.0.9:50000"]
        );
    }

    #[test]
    fn closing_states_count_by_whether_a_process_still_holds_the_socket() {
        let sockets = [
            // TIME_WAIT, FIN_WAIT2 and LAST_ACK once closed: inode 0.
            socket("127.0.0.1:8080", "127.0.0.1:50001", 0),
            socket("127.0.0.1:41234", "127.0.0.1:15001", 0),
            // CLOSE_WAIT: Envoy closed the app's pooled connection, the app
            // (owner unseen) has not yet: it still holds it.
            socket("127.0.0.1:41236", "127.0.0.1:15001", 30),
        ];
        let got = app_sockets(&sockets, &HashMap::new(), &sockets, &proxy());
        assert_eq!(texts(&got), ["127.0.0.1:41236 -> 127.0.0.1:15001"]);
    }

    #[test]
    fn work_says_what_it_waits_for() {
        let work = Work {
            sockets: vec![
                AppSocket {
                    local: "127.0.0.1:8080".parse().unwrap(),
                    remote: None,
                },
                AppSocket {
                    local: "127.0.0.1:41234".parse().unwrap(),
                    remote: Some("127.0.0.1:15001".parse().unwrap()),
                },
            ],
            processes: vec![AppProcess {
                pid: 7,
                name: "java".into(),
            }],
            processes_seen: true,
        };
        assert_eq!(
            work.to_string(),
            "2 app sockets (127.0.0.1:8080 listening; 127.0.0.1:41234 -> 127.0.0.1:15001), 1 app process (java pid 7)"
        );
        assert_eq!(work.count(), 3);
        assert!(!work.is_done());
        assert!(Work::default().is_done());
    }

    #[test]
    fn finds_its_own_sockets_and_leaves_them_out_by_pid() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (_server, _) = listener.accept().unwrap();
        let mine = |proxy: &Proxy| {
            scan(proxy, false, None)
                .unwrap()
                .sockets
                .into_iter()
                .filter(|s| s.local.port() == port || s.remote.is_some_and(|r| r.port() == port))
                .count()
        };
        // Ours count as the app's until our pid is the proxy's.
        assert_eq!(mine(&Proxy::default()), 3, "listener, client and server ends");
        let me = Proxy {
            pids: vec![std::process::id()],
            ..Proxy::default()
        };
        assert_eq!(mine(&me), 0);
        assert_eq!(listener_owner(port), Some(std::process::id()));
        drop(client);
    }

    #[test]
    fn a_process_that_has_begun_to_exit_is_gone() {
        let exiting = StatFlags::PF_EXITING.bits();
        assert!(still_running('S', 0x0040_0100));
        assert!(still_running('R', 0));
        assert!(
            !still_running('R', exiting | 0x0040_0000),
            "in its exit, out of its cgroup"
        );
        assert!(!still_running('D', exiting));
        assert!(!still_running('Z', 0));
        assert!(!still_running('X', 0));
    }

    #[test]
    fn our_own_cgroup_is_not_the_app() {
        // This test process and its threads share one cgroup: no app process
        // is ever found in it, whatever else runs on the machine.
        let me = std::process::id();
        assert!(app_processes(&Proxy::default()).unwrap().iter().all(|p| p.pid != me));
    }

    #[test]
    fn this_test_machine_is_a_pod_only_when_it_is_a_container() {
        // (A pod built from namespaces is shown in tests/pod.rs: app-exit
        // is in force there.)
        let container = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
            || std::fs::read_link("/proc/self/ns/pid").unwrap().as_os_str() != INITIAL_PID_NAMESPACE
            || std::fs::read_link("/proc/self/ns/net").ok() != std::fs::read_link("/proc/2/ns/net").ok();
        let here = in_a_pod();
        assert_eq!(here.is_ok(), container, "{here:?}");
        if let Err(why) = here {
            assert!(why.to_string().starts_with("not in a pod"), "{why}");
        }
    }
}
