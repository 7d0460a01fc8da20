//! Waiting on a condition with a deadline: polled, and a panic that says
//! what was awaited and what was last seen when the deadline passes.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::clients::get;

/// Calls `f` every `every` until it returns `Some`, for at most `timeout`
/// (and at least once).
pub(super) fn poll<T>(timeout: Duration, every: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
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
