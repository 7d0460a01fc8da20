//! Reaping as PID 1: a container's entrypoint is the parent of every
//! orphaned process in the container and must reap them, or they stay
//! zombies. Only zombies are reaped, one pid at a time, and never a child
//! lifeguard waits for itself (Envoy): a blind `waitpid(-1)` would steal
//! Envoy's exit status.

use procfs::process::Process;
use rustix::process::{waitpid, Pid, WaitOptions};

/// Reaps every zombie child of this process but `own_children`; returns
/// how many. A zombie's pid cannot be reused until it is reaped, so the
/// pid read from /proc is still that zombie when `waitpid` gets it.
pub fn reap_orphans(own_children: &[i32]) -> usize {
    let mut reaped = 0;
    for pid in zombie_children() {
        if !own_children.contains(&pid) && reap(pid) {
            tracing::debug!(pid, "reaped an orphaned process");
            reaped += 1;
        }
    }
    reaped
}

/// Reaps process `pid` if it has exited (without blocking); whether it was
/// reaped.
fn reap(pid: i32) -> bool {
    let Some(pid) = Pid::from_raw(pid) else { return false };
    matches!(waitpid(Some(pid), WaitOptions::NOHANG), Ok(Some((reaped, _))) if reaped == pid)
}

/// The pids of this process's children that have exited and are not
/// reaped yet, from /proc.
fn zombie_children() -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(all) = procfs::process::all_processes() else {
        return Vec::new();
    };
    all.flatten()
        .filter(|p: &Process| p.stat().is_ok_and(|s| s.state == 'Z' && s.ppid == me))
        .map(|p| p.pid)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exited_child_is_listed_until_its_waiter_reaps_it() {
        // Reaping itself is shown with lifeguard as PID 1 (tests/hostile.rs):
        // here, other tests' children must not be reaped under them.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !zombie_children().contains(&pid) {
            assert!(std::time::Instant::now() < deadline, "the child did not exit");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(child.wait().unwrap().success());
        assert!(!zombie_children().contains(&pid));
    }
}
