//! The one thing lifeguard does that needs `unsafe`: a hook that runs in
//! the forked child before Envoy's `exec` (`Command::pre_exec` is unsafe by
//! its contract). The crate root denies `unsafe` everywhere else; the other
//! system calls (signals, limits, reaping) go through `rustix`'s safe
//! wrappers where they are used.

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
