//! Network namespaces, for tests that need another host: a named namespace
//! (`ip netns add`), and a pair of them, a pod and a peer, joined by a veth
//! pair whose addresses exist only inside the two. The pair is created
//! inside the pod's namespace, one end moved to the peer's: the test's own
//! namespace never sees it. Everything is deleted on drop, also when a test
//! panics (a namespace goes once the last process in it has exited, the veth
//! pair with it). Needs root.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::thread::JoinHandle;

use super::temp::{exclusive, unique};

/// Runs `ip ARGS...`; panics with its stderr when it fails.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run ip: {e}"));
    assert!(
        out.status.success(),
        "ip {}: {} (this test needs root)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A named network namespace (`ip netns add`) with its loopback up; deleted
/// on drop.
pub struct Netns {
    pub name: String,
}

/// `ip netns add` mounts /run/netns the first time: one at a time, across
/// every test process.
const NETNS_LOCK: &str = "netns";

impl Netns {
    pub fn new(name: String) -> Netns {
        let _one = exclusive(NETNS_LOCK);
        ip(&["netns", "add", &name]);
        let ns = Netns { name };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    /// A name for the network namespace of the running process `pid`
    /// (`ip netns attach`): a container engine's, say. Deleting the name
    /// (on drop) leaves the namespace to the processes in it.
    pub fn attach(name: String, pid: i32) -> Netns {
        let _one = exclusive(NETNS_LOCK);
        ip(&["netns", "attach", &name, &pid.to_string()]);
        Netns { name }
    }

    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// `program` run inside this namespace (`ip netns exec` execs it: the
    /// process's pid is the program's).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// Runs `f` in a thread that has entered this namespace: the sockets it
    /// creates belong to the namespace, wherever they are used afterwards.
    pub fn spawn<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
        let path = self.path();
        std::thread::spawn(move || {
            let ns = File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            // SAFETY: setns on a descriptor we own; it moves this thread only.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
            f()
        })
    }

    /// `spawn`, then wait for the answer (a panic inside is re-raised here).
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        match self.spawn(f).join() {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let out = Command::new("ip").args(["netns", "del", &self.name]).output();
        if !out.is_ok_and(|o| o.status.success()) {
            eprintln!("could not delete network namespace {}", self.name);
        }
    }
}

/// The veth end in the pod's namespace, and the one in the peer's.
const POD_DEV: &str = "veth-pod";
const PEER_DEV: &str = "veth-peer";

/// Two network namespaces, `pod` and `peer`, joined by a veth pair:
/// `pod_ip` (.1) in the pod, `peer_ip` (.2) in the peer, on a /24 of 10/8
/// that exists nowhere but inside these two namespaces (the pod reaches the
/// whole /24 over the veth, so more peer addresses from it need no route).
pub struct Net {
    pub pod: Netns,
    pub peer: Netns,
    pub pod_ip: Ipv4Addr,
    pub peer_ip: Ipv4Addr,
}

impl Net {
    pub fn new() -> Net {
        let (pid, n) = unique();
        Net::around(Netns::new(format!("lifeguard-{pid}-{n}-pod")), Net::addresses())
    }

    /// The pod's (.1) and the peer's (.2) addresses for a new pair, on a
    /// /24 of 10/8 of this test process's own.
    pub fn addresses() -> (Ipv4Addr, Ipv4Addr) {
        let (pid, n) = unique();
        let net = |host| Ipv4Addr::new(10, 100 + (pid % 100) as u8, n as u8, host);
        (net(1), net(2))
    }

    /// The peer namespace and the veth pair, joined to `pod`, which may
    /// have been made elsewhere (a container engine's pod, named with
    /// [`Netns::attach`]), on `addresses` (see [`Net::addresses`]).
    pub fn around(pod: Netns, (pod_ip, peer_ip): (Ipv4Addr, Ipv4Addr)) -> Net {
        let (pid, n) = unique();
        let net = Net {
            pod,
            peer: Netns::new(format!("lifeguard-{pid}-{n}-peer")),
            pod_ip,
            peer_ip,
        };
        ip(&[
            "-n",
            &net.pod.name,
            "link",
            "add",
            POD_DEV,
            "type",
            "veth",
            "peer",
            "name",
            PEER_DEV,
            "netns",
            &net.peer.name,
        ]);
        for (ns, dev, addr) in [(&net.pod, POD_DEV, net.pod_ip), (&net.peer, PEER_DEV, net.peer_ip)] {
            ip(&["-n", &ns.name, "addr", "add", &format!("{addr}/24"), "dev", dev]);
            ip(&["-n", &ns.name, "link", "set", dev, "up"]);
        }
        net
    }

    /// An address of the pod, as the peer reaches it.
    pub fn pod_addr(&self, port: u16) -> SocketAddr {
        SocketAddr::from((self.pod_ip, port))
    }

    /// Gives the peer `n` more addresses on its veth end, from the same /24
    /// (.16 on): to the pod, `n` more remote peers.
    pub fn add_peer_addresses(&self, n: u8) -> Vec<Ipv4Addr> {
        assert!(n <= 200);
        let [x, y, z, _] = self.peer_ip.octets();
        let addrs: Vec<Ipv4Addr> = (0..n).map(|i| Ipv4Addr::new(x, y, z, 16 + i)).collect();
        for addr in &addrs {
            ip(&[
                "-n",
                &self.peer.name,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                PEER_DEV,
            ]);
        }
        addrs
    }
}
