//! What a test makes and throws away: temporary directories, and names
//! unique to a test process and call (namespaces, cgroups).

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
