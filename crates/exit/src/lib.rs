//! The drain's outcome, kept where Kubernetes keeps it.
//!
//! lifeguard exits moments after Envoy stops, so whatever a scrape or a
//! `GET /drain` did not catch would be lost with the pod. On exit the
//! agent writes a one-line JSON [`Summary`] — trigger, policy, duration,
//! cut by the deadline or not, work left at stop, what it waited for last,
//! how the kubelet was answered, when the load balancers let the pod go,
//! exit code — to the container's
//! termination-message file, which the
//! kubelet copies into the pod's status (at most 4 KiB):
//!
//! ```text
//! kubectl get pod P -o jsonpath='{.status.containerStatuses[*].state.terminated.message}'
//! ```
//!
//! (`initContainerStatuses` for a native sidecar.) The same summary is the
//! last log line. Before it, the agent may linger for a last scrape.
//!
//! - `code`: the process exit code of every run of the binary,
//!   decided in one place from how it ended ([`Ended`], [`code()`]).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Serialize;

use lifeguard_drain::{DrainUntil, Exit, Kubelet, Outcome, Signal, Status, Trigger};
use lifeguard_drain_wait::rule::CheckerState;
use lifeguard_drain_wait::{DrainWaitStatus, WaitState};

mod code;

pub use code::{code, Ended};

/// The most the kubelet keeps of a termination message.
pub(crate) const MESSAGE_LIMIT: usize = 4096;

/// How the agent ended, in one line of JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// `drained`, `wait_bound` (drained with nothing left after the wait
    /// for the load balancers ended at its bound: `load_balancers.held_by`
    /// says what it still waited for), `cut` (the deadline), `unfinished`
    /// (the fixed policy's time ran out with requests in flight), `quit`
    /// (`POST /quitquitquit`),
    /// `envoy_exited` (on its own) or `envoy_gone` (an external Envoy
    /// stopped answering).
    pub(crate) outcome: Ending,
    /// lifeguard's exit code (0, 3 or 4: [`code()`]; docs/operations.md).
    pub(crate) exit_code: u8,
    /// What started the drain: `SIGTERM`, `SIGINT`, `POST /drain`; None
    /// when there was no drain.
    pub(crate) trigger: Option<Trigger>,
    /// The signal that asked for Envoy's stop, if one did (after
    /// `POST /drain`, the kubelet's SIGTERM: at the app's exit for a native
    /// sidecar, or at the end of the grace period).
    pub(crate) stop_signal: Option<Signal>,
    pub(crate) policy: DrainUntil,
    /// Unix time the drain began.
    pub(crate) started_at: Option<f64>,
    /// From the start of the drain to Envoy's stop, in seconds.
    pub(crate) duration_seconds: Option<f64>,
    pub(crate) cut_by_deadline: bool,
    /// What the policy counts still active when Envoy was stopped.
    pub(crate) left_at_stop: Option<u64>,
    /// What the drain waited on last, e.g. `1 connections` or
    /// `2 app sockets (…)`; None when it never waited on anything.
    pub(crate) waited_on_last: Option<String>,
    /// How Envoy ended, e.g. `exit status: 0` or `signal: 9 (SIGKILL)`.
    pub(crate) envoy: String,
    /// How the kubelet's readiness probe was answered during the drain,
    /// and when the drain turned it to 503 (None: no drain).
    pub(crate) kubelet: Option<Kubelet>,
    /// The load balancers, as the drain wait saw them: when each let the
    /// pod go, when the traffic stopped, when it was out of rotation (None:
    /// the drain wait never began).
    pub(crate) load_balancers: Option<LoadBalancers>,
}

/// How the run ended, by name in the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    Drained,
    WaitBound,
    Cut,
    Unfinished,
    Quit,
    EnvoyExited,
    EnvoyGone,
}

impl Ending {
    fn name(self) -> &'static str {
        match self {
            Ending::Drained => "drained",
            Ending::WaitBound => "wait_bound",
            Ending::Cut => "cut",
            Ending::Unfinished => "unfinished",
            Ending::Quit => "quit",
            Ending::EnvoyExited => "envoy_exited",
            Ending::EnvoyGone => "envoy_gone",
        }
    }
}

/// Its name, in the log and the JSON alike.
impl fmt::Display for Ending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

lifeguard_base::serialize_as_display!(Ending);

/// The drain wait's outcome, in the exit summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct LoadBalancers {
    /// Whether every checker took the pod out and the traffic stopped.
    pub(crate) out_of_rotation: bool,
    /// Seconds from the drain's start to out of rotation.
    pub(crate) out_after_seconds: Option<f64>,
    /// Seconds from the drain's start to the last new request seen.
    pub(crate) traffic_stopped_after_seconds: Option<f64>,
    /// How long no new request had to come (derived from the traffic
    /// before the drain).
    pub(crate) quiet_period_seconds: Option<f64>,
    /// The checkers, and when each was done (at most [`LISTED`]).
    pub(crate) checkers: Vec<CheckerOutcome>,
    /// Checkers not listed.
    pub(crate) more_checkers: usize,
    /// What the wait still waited for when the pod was not out (the
    /// checkers that held it).
    pub(crate) held_by: Option<String>,
}

/// One checker of the pod, and when it let the pod go.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct CheckerOutcome {
    /// `10.0.0.5 (HAProxy)`.
    pub(crate) checker: String,
    /// Whether its probes were counted (false: no room in the table).
    pub(crate) counted: bool,
    pub(crate) state: CheckerState,
    /// Seconds from the drain's start to when it was done.
    pub(crate) done_after_seconds: Option<f64>,
}

/// Checkers listed in the summary at most.
const LISTED: usize = 8;

impl LoadBalancers {
    /// From the drain wait's last status, and the drain's (`held_by`, when
    /// the out-of-rotation policy's wait ended without the verdict).
    fn of(wait: &DrainWaitStatus, status: &Status) -> Option<LoadBalancers> {
        if wait.state == WaitState::NotStarted {
            return None;
        }
        let out = wait.state == WaitState::Out;
        let checkers: Vec<CheckerOutcome> = wait
            .checkers
            .iter()
            .filter(|c| !matches!(c.state, CheckerState::SeenOnce | CheckerState::GoneBeforeDrain))
            .map(|c| CheckerOutcome {
                checker: match &c.user_agent {
                    Some(agent) => format!("{} ({agent})", c.peer),
                    None => c.peer.clone(),
                },
                counted: c.counted,
                state: c.state,
                done_after_seconds: c.done_after_seconds.map(millis),
            })
            .collect();
        let more = checkers.len().saturating_sub(LISTED);
        Some(LoadBalancers {
            out_of_rotation: out,
            out_after_seconds: wait.took_seconds.map(millis),
            traffic_stopped_after_seconds: wait.traffic_stopped_after_seconds.map(millis),
            quiet_period_seconds: wait.quiet_period_seconds.map(millis),
            checkers: checkers.into_iter().take(LISTED).collect(),
            more_checkers: more,
            held_by: match out {
                true => None,
                false => status
                    .held_by
                    .as_ref()
                    .or(wait.waiting_on.as_ref())
                    .map(ToString::to_string),
            },
        })
    }
}

impl Summary {
    /// The summary of `outcome`, with the drain's final `status` and the
    /// drain wait's.
    pub(crate) fn new(outcome: &Outcome, status: &Status, wait: Option<&DrainWaitStatus>) -> Summary {
        let (kind, envoy) = match outcome {
            Outcome::Drained(exit) => (Ending::Drained, exit_text(exit)),
            Outcome::WaitBound(exit) => (Ending::WaitBound, exit_text(exit)),
            Outcome::Cut { exit, .. } => (Ending::Cut, exit_text(exit)),
            Outcome::Unfinished { exit, .. } => (Ending::Unfinished, exit_text(exit)),
            Outcome::Quit(exit) => (Ending::Quit, exit_text(exit)),
            Outcome::EnvoyExited(status) => (Ending::EnvoyExited, status.to_string()),
            Outcome::EnvoyGone => (Ending::EnvoyGone, "its admin API stopped answering".to_owned()),
        };
        let left_at_stop = match outcome {
            Outcome::Cut { left, .. } => left.or(status.left_at_stop),
            Outcome::Unfinished { left, .. } => Some(*left),
            _ => status.left_at_stop,
        };
        Summary {
            outcome: kind,
            exit_code: code::of_outcome(outcome),
            trigger: status.trigger,
            stop_signal: status.stop_signal,
            policy: status.policy,
            started_at: status.started_at.map(millis),
            duration_seconds: status.duration_seconds.map(millis),
            cut_by_deadline: status.cut_by_deadline || matches!(outcome, Outcome::Cut { .. }),
            left_at_stop,
            waited_on_last: status.waited_on_last.as_ref().map(ToString::to_string),
            envoy,
            kubelet: status.kubelet.clone(),
            load_balancers: wait.and_then(|w| LoadBalancers::of(w, status)),
        }
    }

    /// The summary as one line of JSON of at most [`MESSAGE_LIMIT`] bytes:
    /// the one free-text field that can be long (what the drain waited for,
    /// which may list app sockets) is shortened to fit.
    pub(crate) fn to_json(&self) -> String {
        let json = serde_json::to_string(self).expect("a summary serializes");
        if json.len() <= MESSAGE_LIMIT {
            return json;
        }
        let mut short = self.clone();
        // Free text first: what held the load balancers' wait, to a line.
        if let Some(lb) = &mut short.load_balancers {
            if let Some(held) = &mut lb.held_by {
                let cut = (0..=held.len().min(200))
                    .rev()
                    .find(|&i| held.is_char_boundary(i))
                    .unwrap_or(0);
                if cut < held.len() {
                    held.truncate(cut);
                    held.push('…');
                }
            }
        }
        let json = serde_json::to_string(&short).expect("a summary serializes");
        if json.len() <= MESSAGE_LIMIT {
            return json;
        }
        let waited = self.waited_on_last.as_deref().unwrap_or("");
        let over = json.len() - MESSAGE_LIMIT;
        // "…" is 3 bytes in UTF-8 (and in JSON, unescaped).
        let keep = waited.len().saturating_sub(over + 3);
        let cut = (0..=keep).rev().find(|&i| waited.is_char_boundary(i)).unwrap_or(0);
        short.waited_on_last = Some(format!("{}…", &waited[..cut]));
        let json = serde_json::to_string(&short).expect("a summary serializes");
        if json.len() <= MESSAGE_LIMIT {
            return json;
        }
        // Escapes made the text longer than counted: leave it out.
        short.waited_on_last = None;
        serde_json::to_string(&short).expect("a summary serializes")
    }

    /// The last log line: the summary's fields as the log's own fields (so
    /// `--log-format json` gives them as JSON fields).
    pub fn log(&self) {
        tracing::info!(
            outcome = self.outcome.name(),
            exit_code = self.exit_code,
            trigger = self.trigger.map(|t| t.to_string()),
            stop_signal = self.stop_signal.map(Signal::name),
            policy = %self.policy,
            started_at = self.started_at,
            duration_seconds = self.duration_seconds,
            cut_by_deadline = self.cut_by_deadline,
            left_at_stop = self.left_at_stop,
            waited_on_last = self.waited_on_last.as_deref(),
            envoy = %self.envoy,
            kubelet = self.kubelet.as_ref().map(|k| serde_json::to_string(k).unwrap_or_default()),
            load_balancers = self.load_balancers.as_ref().map(|lb| serde_json::to_string(lb).unwrap_or_default()),
            "lifeguard exiting"
        );
    }
}

/// The summary of how the agent ends, once Envoy has stopped, written to
/// the termination message at once (a SIGKILL during the linger cannot
/// lose it); the caller logs it last ([`Summary::log`]).
pub fn record(
    outcome: &Outcome,
    status: &Status,
    wait: Option<&DrainWaitStatus>,
    message_path: Option<&Path>,
) -> Summary {
    let summary = Summary::new(outcome, status, wait);
    if let Some(path) = message_path {
        if let Err(e) = write_message(path, &summary.to_json()) {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the termination message");
        }
    }
    summary
}

/// Writes the summary line to the termination-message file (replacing what
/// was there, as Kubernetes reads the whole file).
pub(crate) fn write_message(path: &Path, line: &str) -> io::Result<()> {
    debug_assert!(line.len() <= MESSAGE_LIMIT);
    std::fs::write(path, line)
}

fn exit_text(exit: &Exit) -> String {
    exit.to_string()
}

/// Seconds rounded to the millisecond: the summary is for people.
fn millis(secs: f64) -> f64 {
    (secs * 1000.0).round() / 1000.0
}

/// Where the exit summary goes (Kubernetes' termination message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessagePath {
    /// `MessagePath::KUBERNETES_DEFAULT` when that file exists (the
    /// kubelet mounts it), else nowhere.
    Auto,
    /// Nowhere.
    Off,
    /// This file (created if missing, replaced if present).
    File(PathBuf),
}

impl MessagePath {
    /// Where the kubelet mounts the termination-message file by default.
    pub(crate) const KUBERNETES_DEFAULT: &'static str = "/dev/termination-log";

    /// The file to write, decided now: `auto` looks for the kubelet's file.
    pub fn resolve(&self) -> Option<PathBuf> {
        match self {
            MessagePath::Auto => Some(PathBuf::from(Self::KUBERNETES_DEFAULT)).filter(|p| p.exists()),
            MessagePath::Off => None,
            MessagePath::File(path) => Some(path.clone()),
        }
    }
}

/// Where the exit summary goes. In the file: the section `[exit]`, a key a field.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
#[group(skip)]
pub struct Settings {
    /// Where the exit summary (one line of JSON, at most 4 KiB) is written
    /// for Kubernetes to show as the container's termination message: auto
    /// (/dev/termination-log when that file exists), none, or a path.
    #[arg(long, env = "LIFEGUARD_TERMINATION_MESSAGE_PATH", value_name = "PATH", default_value = "auto")]
    pub termination_message_path: MessagePath,
}

/// Why a termination-message path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessagePathError {
    #[error("a path cannot contain NUL")]
    Nul,
    /// The kubelet reads the file at the path the container declares,
    /// from `/`; relative, it would land wherever the agent's working
    /// directory is, and the summary would be lost.
    #[error("not an absolute path (the container's terminationMessagePath is one)")]
    Relative,
}

impl FromStr for MessagePath {
    type Err = MessagePathError;
    fn from_str(s: &str) -> Result<Self, MessagePathError> {
        match s {
            "auto" => Ok(MessagePath::Auto),
            "none" | "" => Ok(MessagePath::Off),
            path if path.contains('\0') => Err(MessagePathError::Nul),
            path if !path.starts_with('/') => Err(MessagePathError::Relative),
            path => Ok(MessagePath::File(path.into())),
        }
    }
}

impl fmt::Display for MessagePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MessagePath::Auto => f.write_str("auto"),
            MessagePath::Off => f.write_str("none"),
            MessagePath::File(path) => write!(f, "{}", path.display()),
        }
    }
}

lifeguard_base::serialize_as_display!(MessagePath);

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;
    use std::time::Duration;

    use super::*;
    use lifeguard_drain::{AppProcess, CheckerKey, Pending, Remaining, WaitingOn, Work};

    fn stopped() -> Status {
        let mut s = Status::initial(DrainUntil::Connections, "zero active connections".into());
        s.phase = lifeguard_drain::Phase::Stopped;
        s.trigger = Some(Trigger::Signal(Signal::Term));
        s.started_at = Some(1_800_000_000.123_456);
        s.duration_seconds = Some(3.014_6);
        s.cut_by_deadline = true;
        s.left_at_stop = Some(1);
        s.waited_on_last = Some(Remaining {
            envoy: 1,
            counted: "connections",
            app: None,
        });
        s
    }

    /// What the drain waited on last, an app process named `name`.
    /// The wait held by `n` checkers at 10.0.0.6, 10.0.0.7, ... sending
    /// `agent`, each at 0 of 3 failures, probing every 30 s.
    fn checkers_pending(n: u8, agent: &[u8]) -> WaitingOn {
        let pending = (0..n)
            .map(|i| Pending {
                key: CheckerKey::new(std::net::IpAddr::from([10, 0, 0, 6u8.wrapping_add(i)]), true, agent).unwrap(),
                counted: true,
                failures_in_row: 0,
                threshold: 3,
                interval: std::time::Duration::from_secs(30),
            })
            .collect();
        WaitingOn::Checkers {
            pending,
            unfollowed: false,
        }
    }

    fn app_process(name: String) -> Option<Remaining> {
        let work = Work {
            processes: vec![AppProcess { pid: 7, name }],
            ..Work::default()
        };
        Some(Remaining {
            envoy: 0,
            counted: "requests in flight",
            app: Some(work),
        })
    }

    #[test]
    fn a_cut_drain_reads_as_one_line_of_json() {
        let exit = Exit::Status(ExitStatus::from_raw(0));
        let summary = Summary::new(&Outcome::Cut { left: Some(1), exit }, &stopped(), None);
        let line = summary.to_json();
        assert!(!line.contains('\n'));
        let json: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(json["outcome"], "cut");
        assert_eq!(json["exit_code"], 3);
        assert_eq!(json["trigger"], "SIGTERM");
        assert_eq!(json["policy"], "connections");
        assert_eq!(json["duration_seconds"], 3.015);
        assert_eq!(json["cut_by_deadline"], true);
        assert_eq!(json["left_at_stop"], 1);
        assert_eq!(json["waited_on_last"], "1 connections");
        assert_eq!(json["envoy"], "exit status: 0");
    }

    #[test]
    fn envoy_exiting_on_its_own_is_exit_4_without_a_drain() {
        let status = Status::initial(DrainUntil::AppExit, String::new());
        let summary = Summary::new(&Outcome::EnvoyExited(ExitStatus::from_raw(9)), &status, None);
        let json: serde_json::Value = serde_json::from_str(&summary.to_json()).unwrap();
        assert_eq!(json["outcome"], "envoy_exited");
        assert_eq!(json["exit_code"], 4);
        assert_eq!(json["trigger"], serde_json::Value::Null);
        assert_eq!(json["policy"], "app-exit");
        assert!(json["envoy"].as_str().unwrap().contains("9"), "{json}");
    }

    #[test]
    fn a_long_summary_is_shortened_to_4_kib_and_stays_json() {
        let mut status = stopped();
        // Multi-byte characters and escapes, so cuts must respect both.
        status.waited_on_last = app_process("é\"sockét; ".repeat(2000));
        let exit = Exit::Status(ExitStatus::from_raw(0));
        let line = Summary::new(&Outcome::Cut { left: Some(1), exit }, &status, None).to_json();
        assert!(line.len() <= MESSAGE_LIMIT, "{}", line.len());
        let json: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(json["left_at_stop"], 1);
        assert_eq!(json["cut_by_deadline"], true);
    }

    /// A gateway whose load balancers had not all let go by the deadline:
    /// the summary says which held it, and when the others let go.
    #[test]
    fn the_summary_says_when_each_load_balancer_let_go_and_who_held_the_drain() {
        use lifeguard_drain_wait::rule::CheckerReport;
        let mut status = stopped();
        status.policy = DrainUntil::OutOfRotation;
        status.held_by = Some(checkers_pending(1, b"HAProxy"));
        let checker = |last: u8, state, done: Option<f64>| CheckerReport {
            peer: format!("10.0.0.{last}"),
            user_agent: Some("HAProxy".into()),
            forwarded: true,
            counted: true,
            state,
            probes: 10,
            interval_seconds: Some(1.0),
            failures_in_row: 3,
            unhealthy_threshold: 3,
            last_probe_seconds_ago: 0.5,
            done_after_seconds: done,
        };
        let plan = lifeguard_drain_wait::DrainWaitPlan {
            app_time: Duration::ZERO,
            ..lifeguard_drain_wait::DrainWaitPlan::for_tests()
        };
        let (wait, publish) = lifeguard_drain_wait::DrainWait::new(&plan, lifeguard_checkers::Checkers::default());
        publish.send_modify(|s| {
            s.state = WaitState::Bound;
            s.traffic_stopped_after_seconds = Some(2.51234);
            s.checkers = vec![
                checker(5, CheckerState::Failed, Some(2.0012)),
                checker(6, CheckerState::Checking, None),
                checker(7, CheckerState::SeenOnce, None),
            ];
        });
        let exit = Exit::Status(ExitStatus::from_raw(0));
        let summary = Summary::new(&Outcome::Cut { left: Some(0), exit }, &status, Some(&wait.published()));
        let json: serde_json::Value = serde_json::from_str(&summary.to_json()).unwrap();
        let lb = &json["load_balancers"];
        assert_eq!(lb["out_of_rotation"], false);
        assert_eq!(lb["traffic_stopped_after_seconds"], 2.512);
        assert_eq!(
            lb["held_by"],
            "1 checker: 10.0.0.6 (HAProxy) (0 of 3 failures in a row, every 30s)"
        );
        let listed = lb["checkers"].as_array().unwrap();
        assert_eq!(listed.len(), 2, "not the one seen once: {lb}");
        assert_eq!(listed[0]["checker"], "10.0.0.5 (HAProxy)");
        assert_eq!(listed[0]["state"], "failed");
        assert_eq!(listed[0]["done_after_seconds"], 2.001);
        assert_eq!(listed[1]["state"], "checking");
        assert_eq!(json["cut_by_deadline"], true);
        // Many checkers and long words still fit the kubelet's 4 KiB.
        publish.send_modify(|s| {
            s.checkers = (0..32).map(|i| checker(i, CheckerState::Failed, Some(1.0))).collect();
        });
        status.held_by = Some(checkers_pending(250, &[b'x'; 40]));
        status.waited_on_last = app_process("y".repeat(10_000));
        let summary = Summary::new(&Outcome::Cut { left: Some(0), exit }, &status, Some(&wait.published()));
        let line = summary.to_json();
        assert!(line.len() <= MESSAGE_LIMIT, "{}", line.len());
        let json: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(json["load_balancers"]["more_checkers"], 24);
    }

    #[test]
    fn the_message_file_is_replaced_not_appended() {
        let path = std::env::temp_dir().join(format!("lifeguard-msg-{}", std::process::id()));
        std::fs::write(&path, "an older, longer message from a previous run").unwrap();
        write_message(&path, "{\"outcome\":\"drained\"}").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"outcome\":\"drained\"}");
        std::fs::remove_file(&path).unwrap();
    }
}
