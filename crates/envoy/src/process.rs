//! The Envoy process lifeguard looks after.
//!
//! Two shapes:
//! - **child**: `lifeguard run -- envoy -c ...` launches Envoy and owns it.
//!   Envoy runs in its own process group, so a Ctrl-C in a terminal (or any
//!   signal sent to lifeguard's group) reaches lifeguard only: the agent
//!   decides when Envoy stops. Envoy is also told by the kernel to die if
//!   lifeguard dies, so it is never orphaned. It is stopped with SIGTERM
//!   (Envoy flushes its logs and exits), then SIGKILL if it does not exit in
//!   time.
//! - **external**: Envoy runs beside lifeguard (another container). It is
//!   stopped with `POST /quitquitquit` on its admin API; whether it exited
//!   can only be seen through that API.
//!
//! [`Envoy`] is the real implementation of the drain's [`EnvoyControl`]:
//! the drain itself never calls the admin API or sends a signal.

use std::process::ExitStatus;
use std::time::Duration;

use rustix::process::{kill_process, Pid, Signal};
use tokio::process::Command;
use tokio::sync::watch;

use crate::admin::{AdminClient, AdminError, Endpoint};
use crate::counts::{active, control_error, CountsReader};
use lifeguard_drain::{ActiveRead, ControlError, DrainScope, EnvoyControl, Exit};

/// Envoy, as lifeguard sees it: its admin API, and the process when
/// lifeguard launched it.
pub struct Envoy {
    admin: AdminClient,
    /// The active counts, read with the drain wait's.
    counts: CountsReader,
    process: Option<Child>,
    /// Listener ports left out of the active counts.
    ignored_ports: Vec<u16>,
}

impl Envoy {
    /// An Envoy that runs beside lifeguard (another container).
    pub fn external(admin: AdminClient, ignored_ports: Vec<u16>) -> Self {
        Self {
            counts: CountsReader::new(admin.clone()),
            admin,
            process: None,
            ignored_ports,
        }
    }

    /// An Envoy launched by lifeguard.
    pub(crate) fn child(child: Child, admin: AdminClient, ignored_ports: Vec<u16>) -> Self {
        Self {
            counts: CountsReader::new(admin.clone()),
            admin,
            process: Some(child),
            ignored_ports,
        }
    }

    /// The Envoy of these settings: launched from `command` (with the drain
    /// flags added when missing), or, when `command` is empty, the one
    /// running beside lifeguard.
    /// `drain_time` is Envoy's `--drain-time-s` (the pod's grace period
    /// unless configured); `ignored` the listener ports left out of the
    /// active counts.
    pub fn start(
        command: Vec<String>,
        drain_time: Duration,
        admin: AdminClient,
        ignored: Vec<u16>,
    ) -> Result<Envoy, LaunchError> {
        if command.is_empty() {
            return Ok(Envoy::external(admin, ignored));
        }
        let mut command = command;
        let extra = drain_flags(&command, drain_time);
        if !extra.is_empty() {
            tracing::info!("adding {} to Envoy's command line", extra.join(" "));
            command.extend(extra);
        }
        let child = Child::spawn(&command).map_err(|source| LaunchError {
            program: command[0].clone(),
            source,
        })?;
        tracing::info!(pid = child.pid(), command = %command.join(" "), "Envoy started");
        Ok(Envoy::child(child, admin, ignored))
    }

    /// The reader of the active counts, to share with the drain wait.
    pub fn counts(&self) -> CountsReader {
        self.counts.clone()
    }

    /// The pid of the Envoy lifeguard launched.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|c| c.pid as u32)
    }
}

/// Envoy's command could not be launched.
#[derive(Debug, thiserror::Error)]
#[error("cannot start Envoy ({program})")]
pub struct LaunchError {
    pub(crate) program: String,
    #[source]
    pub(crate) source: std::io::Error,
}

/// A launched Envoy: its pid and a watch that turns `Some` when it exits.
pub(crate) struct Child {
    pid: i32,
    exited: watch::Receiver<Option<ExitStatus>>,
}

/// Flags lifeguard adds to Envoy's command line when the user did not set
/// them: drain every connection from the start of the drain (Envoy's own
/// default, `gradual`, would mark only a few responses `connection: close`
/// early in a long drain window), and do not let Envoy's drain timer close
/// the listeners before lifeguard's deadline.
pub(crate) fn drain_flags(command: &[String], drain_time: Duration) -> Vec<String> {
    let has = |flag: &str| command.iter().any(|a| a == flag || a.starts_with(&format!("{flag}=")));
    let mut extra = Vec::new();
    if !has("--drain-strategy") {
        extra.extend(["--drain-strategy".to_owned(), "immediate".to_owned()]);
    }
    if !has("--drain-time-s") {
        extra.extend(["--drain-time-s".to_owned(), drain_time.as_secs().max(1).to_string()]);
    }
    extra
}

impl Child {
    /// Launches `command` (program and arguments). Must be called from a
    /// thread that lives as long as lifeguard (the main thread): the
    /// kernel's parent-death signal is tied to the thread that forks.
    pub(crate) fn spawn(command: &[String]) -> std::io::Result<Child> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty Envoy command"))?;
        let mut cmd = Command::new(program);
        cmd.args(args).stdin(std::process::Stdio::null()).process_group(0);
        lifeguard_sys::kill_child_when_parent_dies(&mut cmd);
        let mut child = cmd.spawn()?;
        let pid = child.id().expect("a just-spawned child has a pid") as i32;
        let (tx, rx) = watch::channel(None);
        tokio::spawn(async move {
            let status = child.wait().await;
            match status {
                Ok(status) => {
                    let _ = tx.send(Some(status));
                }
                Err(e) => tracing::error!(error = %e, "cannot wait for Envoy"),
            }
        });
        Ok(Child { pid, exited: rx })
    }

    pub(crate) fn pid(&self) -> i32 {
        self.pid
    }

    /// Resolves when Envoy has exited (at once if it already has).
    pub(crate) async fn exited(&self) -> ExitStatus {
        let mut rx = self.exited.clone();
        let status = match rx.wait_for(Option::is_some).await {
            Ok(status) => *status,
            Err(_) => None,
        };
        match status {
            Some(status) => status,
            // The waiter task is gone without a status: never resolve.
            None => std::future::pending().await,
        }
    }

    pub(crate) fn exit_status(&self) -> Option<ExitStatus> {
        *self.exited.borrow()
    }

    fn signal(&self, sig: Signal) {
        // Our own child, not reaped yet (the waiter has not seen it exit):
        // its pid cannot have been reused.
        if let (None, Some(pid)) = (self.exit_status(), Pid::from_raw(self.pid)) {
            let _ = kill_process(pid, sig);
        }
    }

    /// SIGTERM, then SIGKILL after `bound`; returns the exit status.
    pub(crate) async fn stop(&self, bound: Duration) -> ExitStatus {
        tracing::info!(
            pid = self.pid,
            "SIGTERM to Envoy (SIGKILL if it has not exited within {})",
            lifeguard_base::duration::GoDuration(bound)
        );
        self.signal(Signal::TERM);
        match tokio::time::timeout(bound, self.exited()).await {
            Ok(status) => status,
            Err(_) => {
                tracing::warn!(
                    pid = self.pid,
                    threads = %threads(self.pid),
                    "Envoy did not exit within {} of SIGTERM; sending SIGKILL",
                    lifeguard_base::duration::GoDuration(bound)
                );
                self.signal(Signal::KILL);
                self.exited().await
            }
        }
    }
}

/// Each thread of process `pid` as `/proc` shows it: its name, its state
/// (R running, S sleeping, D in the kernel, ...) and where in the kernel
/// it waits. Said before a SIGKILL: a thread busy (an admin call, a
/// starved CPU) or one waiting forever tell two causes apart.
fn threads(pid: i32) -> String {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return "unknown (no /proc entry)".to_owned();
    };
    let read = |path: std::path::PathBuf| std::fs::read_to_string(path).unwrap_or_default();
    let mut seen: Vec<String> = tasks
        .flatten()
        .map(|task| {
            let dir = task.path();
            let stat = read(dir.join("stat"));
            // The state follows the parenthesised name, which may hold spaces.
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.split(' ').next())
                .unwrap_or("?");
            let wchan = read(dir.join("wchan"));
            let wchan = match wchan.trim() {
                "" | "0" => String::new(),
                at => format!(" in {at}"),
            };
            format!("{} {state}{wchan}", read(dir.join("comm")).trim())
        })
        .collect();
    seen.sort();
    seen.join(", ")
}

impl Envoy {
    /// After an external Envoy acknowledged `/quitquitquit`: waits, within
    /// `bound`, until its admin refuses connections (it has exited), so
    /// that "stopped" means stopped (a container beside lifeguard's gets the
    /// kubelet's SIGTERM only then: `GET /drain/stopped`). Whether it was
    /// gone within `bound`.
    async fn gone_within(&self, bound: Duration) -> bool {
        let gone = async {
            while !matches!(self.answering().await, Err(ControlError::Refused(_))) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(bound, gone).await.is_ok()
    }

    /// Stops an external Envoy: `/quitquitquit`, then waits within `bound`
    /// for its admin to refuse connections.
    async fn quit(&self, bound: Duration) -> Exit {
        tracing::info!(
            "stopping Envoy: POST /quitquitquit (waited for {} to exit)",
            lifeguard_base::duration::GoDuration(bound)
        );
        match self.admin.post(Endpoint::Quit, "/quitquitquit").await {
            Ok(_) => {
                if !self.gone_within(bound).await {
                    tracing::warn!(
                        "Envoy still answered {} after /quitquitquit",
                        lifeguard_base::duration::GoDuration(bound)
                    );
                }
                Exit::Quit
            }
            // The request went out and its answer was lost: an Envoy that
            // begins to exit may close the connection (or stall its main
            // thread) before it answers. Gone within the bound, it quit.
            Err(e @ (AdminError::Timeout { .. } | AdminError::Http(_))) => {
                if self.gone_within(bound).await {
                    tracing::warn!(error = %e, "Envoy's answer to /quitquitquit was lost; its admin refuses connections since: it quit");
                    Exit::Quit
                } else {
                    tracing::warn!(error = %e, "cannot stop Envoy through its admin API: no answer to /quitquitquit, and it still answered {} after it", lifeguard_base::duration::GoDuration(bound));
                    Exit::Unreachable
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot stop Envoy through its admin API");
                Exit::Unreachable
            }
        }
    }
}

impl EnvoyControl for Envoy {
    async fn drain_listeners(&self, scope: DrainScope, skip_exit: bool) -> Result<(), ControlError> {
        let path = match (scope, skip_exit) {
            (DrainScope::Inbound, true) => "/drain_listeners?inboundonly&graceful&skip_exit",
            (DrainScope::Inbound, false) => "/drain_listeners?inboundonly&graceful",
            (DrainScope::All, true) => "/drain_listeners?graceful&skip_exit",
            (DrainScope::All, false) => "/drain_listeners?graceful",
        };
        self.admin
            .post(Endpoint::DrainListeners, path)
            .await
            .map(drop)
            .map_err(control_error)
    }

    fn read_timeout(&self) -> Duration {
        self.counts.read_timeout()
    }

    async fn active(&self, timeout: Duration) -> Result<ActiveRead, ControlError> {
        let reading = self.counts.read_now(timeout).await;
        let body = reading.body?;
        Ok(ActiveRead {
            active: active(&body, &self.ignored_ports),
            took: reading.took,
        })
    }

    async fn stop(&self, bound: Duration) -> Exit {
        match &self.process {
            Some(child) => Exit::Status(child.stop(bound).await),
            None => self.quit(bound).await,
        }
    }

    /// Never resolves for an external Envoy, whose exit lifeguard cannot see.
    async fn exited(&self) -> ExitStatus {
        match &self.process {
            Some(child) => child.exited().await,
            None => std::future::pending().await,
        }
    }

    fn is_child(&self) -> bool {
        self.process.is_some()
    }

    async fn answering(&self) -> Result<(), ControlError> {
        self.admin
            .get_any(Endpoint::Ready, "/ready", 64)
            .await
            .map(drop)
            .map_err(control_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn adds_drain_flags_only_when_missing() {
        let grace = Duration::from_secs(30);
        assert_eq!(
            drain_flags(&strings(&["envoy", "-c", "x.yaml"]), grace),
            strings(&["--drain-strategy", "immediate", "--drain-time-s", "30"])
        );
        assert_eq!(
            drain_flags(
                &strings(&["envoy", "--drain-strategy", "gradual", "--drain-time-s=45"]),
                grace
            ),
            Vec::<String>::new()
        );
    }

    #[tokio::test]
    async fn a_child_that_exits_is_seen_with_its_status() {
        let child = Child::spawn(&strings(&["sh", "-c", "exit 3"])).unwrap();
        let status = tokio::time::timeout(Duration::from_secs(10), child.exited())
            .await
            .unwrap();
        assert_eq!(status.code(), Some(3));
    }

    #[tokio::test]
    async fn stop_escalates_to_sigkill() {
        // A child that ignores SIGTERM, and says so once its trap is set.
        let marker = std::env::temp_dir().join(format!("lifeguard-trap-{}", std::process::id()));
        let _ = std::fs::remove_file(&marker);
        let script = format!("trap '' TERM; touch {}; while :; do sleep 0.05; done", marker.display());
        let child = Child::spawn(&strings(&["sh", "-c", &script])).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !marker.exists() {
            assert!(std::time::Instant::now() < deadline, "the child never set its trap");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let status = tokio::time::timeout(Duration::from_secs(10), child.stop(Duration::from_millis(200)))
            .await
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        let _ = std::fs::remove_file(&marker);
    }

    /// What is said of a process's threads before a SIGKILL: each one's
    /// name and state (this test's own threads: the runner's, at least).
    #[test]
    fn a_process_threads_are_named_with_their_state() {
        let said = threads(std::process::id() as i32);
        assert!(
            said.split(", ")
                .all(|t| t.split(' ').nth(1).is_some_and(|s| s.len() == 1)),
            "{said}"
        );
        assert!(said.contains(" R") || said.contains(" S"), "{said}");
        assert_eq!(threads(i32::MAX), "unknown (no /proc entry)");
    }
}
