//! The app's processes' exits, seen when they happen: a pidfd per process
//! (Linux 5.3 and later), readable once the process has exited. Where the
//! pod shares its process namespace, the drain wakes on them instead of
//! waiting for its next look at `/proc`.

use std::future::{pending, poll_fn};
use std::os::fd::OwnedFd;
use std::task::Poll;

use rustix::io::Errno;
use rustix::process::{pidfd_open, Pid, PidfdFlags};
use tokio::io::unix::AsyncFd;

use lifeguard_drain::AppProcess;

/// The most processes watched at once: an app with more has the rest
/// seen by the drain's next look at `/proc` (every few tens of
/// milliseconds), not by their exits.
const WATCHED: usize = 64;

/// Resolves once one of `processes` (their pids are lifeguard's own PID
/// namespace's) has exited: at once when one is already gone; never when
/// none can be watched (no pidfd here).
pub(crate) async fn one_exits(processes: &[AppProcess]) {
    let mut fds = Vec::with_capacity(processes.len().min(WATCHED));
    for process in processes.iter().take(WATCHED) {
        match watch(process.pid) {
            Ok(Some(fd)) => fds.push(fd),
            Ok(None) => {}
            Err(Gone) => return,
        }
    }
    if fds.is_empty() {
        return pending().await;
    }
    poll_fn(|cx| match fds.iter().any(|fd| fd.poll_read_ready(cx).is_ready()) {
        true => Poll::Ready(()),
        false => Poll::Pending,
    })
    .await;
}

/// The process had already exited.
struct Gone;

/// A pidfd of `pid` registered with the runtime; None when it cannot be
/// had (an old kernel, no runtime I/O driver): that process is left to
/// the drain's looks.
fn watch(pid: u32) -> Result<Option<AsyncFd<OwnedFd>>, Gone> {
    let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return Ok(None);
    };
    match pidfd_open(pid, PidfdFlags::NONBLOCK) {
        Ok(fd) => Ok(lifeguard_sys::readable(fd).ok()),
        Err(Errno::SRCH) => Err(Gone),
        Err(_) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn process(pid: u32) -> AppProcess {
        AppProcess {
            pid,
            name: "sleep".into(),
        }
    }

    #[tokio::test]
    async fn resolves_when_a_process_exits_not_before() {
        // Taken before the spawn: `sleep` counts its second from its own
        // start, which may come well before this thread runs again (a
        // second leaves the check below 0.9 s of it).
        let started = tokio::time::Instant::now();
        let mut child = std::process::Command::new("sleep").arg("1").spawn().unwrap();
        let pid = child.id();
        let watched = [process(pid)];
        let mut exits = std::pin::pin!(one_exits(&watched));
        // Still running: not resolved.
        let early = tokio::time::timeout(Duration::from_millis(100), &mut exits).await;
        assert!(early.is_err(), "resolved while the process ran");
        tokio::time::timeout(Duration::from_secs(10), exits)
            .await
            .expect("the exit seen");
        assert!(started.elapsed() >= Duration::from_secs(1));
        child.wait().unwrap();
    }

    #[tokio::test]
    async fn a_process_already_gone_resolves_at_once_and_none_never() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        tokio::time::timeout(Duration::from_secs(1), one_exits(&[process(pid)]))
            .await
            .expect("a gone process: at once");
        let none = tokio::time::timeout(Duration::from_millis(50), one_exits(&[])).await;
        assert!(none.is_err(), "nothing to watch: never");
    }
}
