//! The few system calls lifeguard makes that Rust's standard library does
//! not wrap. This is the only module with `unsafe` code (the crate root
//! denies it everywhere else); each function is a small safe wrapper.

/// Raises the soft open-files limit to the hard one and returns the soft
/// limit now in force (None when it cannot be read).
pub(crate) fn raise_nofile_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a valid, initialised struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    Some(lim.rlim_cur)
}

/// Sends `sig` to process `pid`. The caller guarantees `pid` is its own
/// child that has not been reaped yet, so the pid cannot have been reused.
pub(crate) fn kill(pid: i32, sig: i32) {
    // SAFETY: kill(2) has no memory effects.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Makes the command's process die with SIGKILL when the thread that
/// spawned it (lifeguard's main thread) dies, so Envoy is never orphaned.
pub(crate) fn kill_child_when_parent_dies(cmd: &mut tokio::process::Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and makes only
    // async-signal-safe calls (prctl, getppid, _exit).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // lifeguard died before the prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// Reaps process `pid` if it has exited (`waitpid` without blocking);
/// whether it was reaped. Only for a child no one else waits for.
pub(crate) fn reap(pid: i32) -> bool {
    let mut status = 0;
    // SAFETY: waitpid(2) writes only the status int we pass.
    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) == pid }
}
