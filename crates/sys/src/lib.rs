//! Three of the four things lifeguard does that need `unsafe`: a hook
//! that runs in the forked child before Envoy's `exec` (`Command::pre_exec`
//! is unsafe by its contract), one socket option no safe wrapper offers
//! (`IP_BIND_ADDRESS_NO_PORT`), and handing a descriptor to the runtime's
//! reactor ([`readable`]: unsafe by its contract); the fourth, asking the
//! binary's allocator to give freed memory back, is the binary's own
//! (`src/agent`). Also the process's memory settings. `unsafe` is denied
//! everywhere else; the other system calls (signals, limits, reaping,
//! pidfds) go through `rustix`'s safe wrappers where they are used.
//!
//! A crate of its own, used by those who make these calls (Envoy's
//! process, the app's exits, the app probes' sockets, the binary's
//! start-up), so that the vocabulary (`lifeguard_base`) and the drain
//! need neither `libc` nor `rustix`.

// The workspace denies `unsafe_code`; this crate is where it is allowed,
// each `unsafe` block with its SAFETY comment.
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::process::{getppid, set_parent_process_death_signal, Pid, Signal};

/// Makes the command's process die with SIGKILL when the thread that
/// spawned it (lifeguard's main thread) dies, so Envoy is never orphaned.
pub fn kill_child_when_parent_dies(cmd: &mut tokio::process::Command) {
    let parent = Pid::from_raw(std::process::id() as i32);
    let thp_disabled = THP_WAS_DISABLED.load(Ordering::Relaxed);
    // SAFETY: the closure runs between fork and exec and makes only
    // async-signal-safe calls (prctl, getppid, _exit) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            set_parent_process_death_signal(Some(Signal::KILL))?;
            // Envoy's memory as lifeguard found it (see tune_memory).
            let _ = rustix::thread::disable_transparent_huge_pages(thp_disabled);
            // lifeguard died before the prctl took effect.
            if getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// Lets a socket bound to an address before `connect` take its port at
/// `connect`, for its destination (`IP_BIND_ADDRESS_NO_PORT`): otherwise
/// `bind` picks a port alone, and with many closed sockets in TIME_WAIT it
/// searches long for one that is free for every destination.
pub fn bind_address_no_port(socket: &impl AsRawFd) -> std::io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: setsockopt on a descriptor the caller owns, with a pointer to
    // a live c_int and its size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            std::ptr::from_ref(&on).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Whether transparent huge pages were disabled for lifeguard when it
/// started (inherited), to hand Envoy the same.
static THP_WAS_DISABLED: AtomicBool = AtomicBool::new(false);

/// The process tuned for a run of the agent, once, before its runtime
/// starts: its memory (`tune_memory`) and its open-files limit raised to
/// the hard one, so the status server's connection cap, not the kernel,
/// bounds it. Returns the open-files limit now in force (None: unknown or
/// unlimited).
pub fn tune_for_run() -> Option<u64> {
    tune_memory();
    raise_open_files_limit()
}

/// Raises the soft open-files limit to the hard one; the soft limit now in
/// force.
fn raise_open_files_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    let soft = limit.current?;
    if limit.current < limit.maximum || limit.maximum.is_none() {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return limit.maximum;
        }
    }
    Some(soft)
}

/// Keeps lifeguard's memory small: no transparent huge pages for its own
/// heap. mimalloc asks for huge pages on its arenas, so each one touched
/// costs 2 MiB of RSS (the figures: docs/benchmarks.md, the footprint).
/// Envoy gets back what lifeguard inherited
/// ([`kill_child_when_parent_dies`] restores it before `exec`).
fn tune_memory() {
    let inherited = rustix::thread::transparent_huge_pages_are_disabled().unwrap_or(false);
    THP_WAS_DISABLED.store(inherited, Ordering::Relaxed);
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        // Memory is larger, nothing else changes; logging is not up yet.
        eprintln!("lifeguard: cannot turn transparent huge pages off for itself: {e}");
    }
}

/// A monotonic clock read cheaply (`CLOCK_MONOTONIC_COARSE`: the kernel's
/// last tick, a few milliseconds coarse, no clock source read): for the
/// worker threads' park hook, which runs at every park.
pub fn coarse_monotonic() -> std::time::Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    std::time::Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32)
}

/// `fd`, owned, registered with the runtime's reactor for readability (a
/// pidfd: readable once its process has exited). Must be called within
/// the runtime.
pub fn readable(fd: OwnedFd) -> std::io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd's descriptor is open, and stays this file's, for
    // as long as the AsyncFd owns it.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}
