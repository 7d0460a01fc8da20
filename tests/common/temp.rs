//! What a test makes and throws away: temporary directories, names
//! unique to a test process and call (namespaces, cgroups), and a lock
//! every test process shares (the test runner may run each test in a
//! process of its own: a `Mutex` would serialise nothing).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};

pub use tempfile::TempDir;

/// A name part unique to this test process and call (namespaces, cgroups).
pub fn unique() -> (u32, usize) {
    static N: AtomicUsize = AtomicUsize::new(0);
    (std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// A temporary directory named after `tag`, removed when it drops.
pub fn temp_dir(tag: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(&format!("lifeguard-test-{tag}-"))
        .tempdir()
        .unwrap()
}

/// Holds the machine-wide lock `name` (a `flock` on a file in the temp
/// directory) until the returned file drops: one holder at a time across
/// every thread and test process. Waits for it.
pub fn exclusive(name: &str) -> File {
    let dir = std::env::temp_dir().join("lifeguard-test-locks");
    std::fs::create_dir_all(&dir).unwrap();
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(name))
        .unwrap();
    // SAFETY: flock on a file descriptor we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "flock {name}: {}", std::io::Error::last_os_error());
    file
}
