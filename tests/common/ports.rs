//! Loopback ports leased to one test (a `flock` per port, so parallel
//! tests, test processes and worktrees never share one), and binding a
//! leased port.

use std::fs::{File, OpenOptions};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::wait::wait_for;

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

/// Binds a leased port. The lease checked that the port was free, yet two
/// full runs saw this bind fail at once with AddrInUse (what held the port
/// for that moment was not found): retried every 20 ms for up to 3 s, then
/// the bind's error.
pub fn bind_leased(port: &Port) -> TcpListener {
    wait_for("a free leased port", Duration::from_secs(3), || {
        TcpListener::bind(port.addr())
    })
}
