//! Process signals, caught from start-up on: a SIGTERM during start-up must
//! drain too, not kill lifeguard with the default action.
//!
//! - SIGTERM, SIGINT and SIGQUIT are handed to the drain, which starts on
//!   the first and logs the rest.
//! - SIGHUP, SIGUSR1 and SIGUSR2 are logged and ignored: their default
//!   action would kill lifeguard at once, without a drain, and Envoy with it.
//! - As PID 1 (a container's entrypoint), lifeguard is the parent of every
//!   orphaned process in the container and must reap them, or they stay
//!   zombies. On each SIGCHLD it reaps its zombie children, except the ones
//!   it launched itself (Envoy), which their own waiter reaps: a blind
//!   `waitpid(-1)` would steal Envoy's exit status.

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;

use crate::drain::DrainHandle;

/// The signals lifeguard handles.
pub struct Signals {
    term: Signal,
    int: Signal,
    quit: Signal,
    hup: Signal,
    usr1: Signal,
    usr2: Signal,
    /// SIGCHLD, when lifeguard is PID 1 and so reaps orphans.
    child: Option<Signal>,
}

impl Signals {
    /// Installs the handlers. Call before anything that may take time.
    pub fn install() -> std::io::Result<Signals> {
        let pid1 = std::process::id() == 1;
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            quit: signal(SignalKind::quit())?,
            hup: signal(SignalKind::hangup())?,
            usr1: signal(SignalKind::user_defined1())?,
            usr2: signal(SignalKind::user_defined2())?,
            child: if pid1 { Some(signal(SignalKind::child())?) } else { None },
        })
    }

    /// Turns signals into drain events, and reaps orphans on SIGCHLD (as
    /// PID 1, leaving `own_children` to their waiters), until shutdown.
    pub async fn forward(mut self, drain: DrainHandle, own_children: Vec<i32>, shutdown: CancellationToken) {
        if self.child.is_some() {
            tracing::info!("running as PID 1: orphaned processes are reaped");
            reap_orphans(&own_children);
        }
        loop {
            let name = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.term.recv() => "SIGTERM",
                _ = self.int.recv() => "SIGINT",
                _ = self.quit.recv() => "SIGQUIT",
                _ = self.hup.recv() => "SIGHUP",
                _ = self.usr1.recv() => "SIGUSR1",
                _ = self.usr2.recv() => "SIGUSR2",
                Some(()) = recv(&mut self.child) => {
                    reap_orphans(&own_children);
                    continue;
                }
            };
            match name {
                "SIGTERM" | "SIGINT" | "SIGQUIT" => drain.signal(name),
                _ => tracing::info!(signal = name, "signal received; ignored"),
            }
        }
    }
}

/// The next signal of an optional stream; never resolves without one.
async fn recv(signal: &mut Option<Signal>) -> Option<()> {
    match signal {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}

/// Reaps every zombie child of this process but `own_children`; returns
/// how many. A zombie's pid cannot be reused until it is reaped, so the
/// pid read from /proc is still that zombie when `waitpid` gets it.
pub fn reap_orphans(own_children: &[i32]) -> usize {
    let mut reaped = 0;
    for pid in zombie_children() {
        if !own_children.contains(&pid) && crate::sys::reap(pid) {
            tracing::debug!(pid, "reaped an orphaned process");
            reaped += 1;
        }
    }
    reaped
}

/// The pids of this process's children that have exited and are not
/// reaped yet, from /proc.
fn zombie_children() -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| zombie_child_of(&stat, me)))
        .collect()
}

/// Whether a `/proc/<pid>/stat` line is a zombie whose parent is `parent`.
/// The command name (in parentheses) may hold spaces and parentheses: the
/// fields that follow are read after the last `)`.
fn zombie_child_of(stat: &str, parent: i32) -> bool {
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    let mut fields = rest.split_whitespace();
    let state = fields.next();
    let ppid = fields.next().and_then(|p| p.parse::<i32>().ok());
    state == Some("Z") && ppid == Some(parent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zombie_children_are_read_from_stat_lines() {
        assert!(zombie_child_of("42 (sleep) Z 1 42 42 0 -1 4228164 0", 1));
        assert!(!zombie_child_of("42 (sleep) S 1 42 42 0 -1 4228164 0", 1));
        assert!(!zombie_child_of("42 (sleep) Z 7 42 42 0 -1 4228164 0", 1));
        assert!(zombie_child_of("42 (a) Z (b)) Z 1 42 42 0", 1));
        assert!(!zombie_child_of("garbage", 1));
    }

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
