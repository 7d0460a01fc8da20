//! The two things lifeguard does that need `unsafe`: a hook that runs in
//! the forked child before Envoy's `exec` (`Command::pre_exec` is unsafe by
//! its contract), and one socket option no safe wrapper offers
//! (`IP_BIND_ADDRESS_NO_PORT`). The crate root denies `unsafe` everywhere
//! else; the other system calls (signals, limits, reaping) go through
//! `rustix`'s safe wrappers where they are used.

use std::os::fd::AsRawFd;

use rustix::process::{getppid, set_parent_process_death_signal, Pid, Signal};

/// Makes the command's process die with SIGKILL when the thread that
/// spawned it (lifeguard's main thread) dies, so Envoy is never orphaned.
pub(crate) fn kill_child_when_parent_dies(cmd: &mut tokio::process::Command) {
    let parent = Pid::from_raw(std::process::id() as i32);
    // SAFETY: the closure runs between fork and exec and makes only
    // async-signal-safe calls (prctl, getppid, _exit) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            set_parent_process_death_signal(Some(Signal::KILL))?;
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
pub(crate) fn bind_address_no_port(socket: &impl AsRawFd) -> std::io::Result<()> {
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
