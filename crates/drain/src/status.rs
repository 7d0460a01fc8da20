//! The drain's published state: its [`Phase`], the [`Status`] that
//! readiness, `GET /drain` and the metrics all derive from, and how the
//! agent ends ([`Outcome`]; `lifeguard_exit` makes it the exit code).

use std::fmt;
use std::process::ExitStatus;
use std::time::Duration;

use lifeguard_base::duration::GoDuration;
use serde::Serialize;

use tokio::time::Instant;

use super::kubelet::{Kubelet, KubeletAnswer, KubeletRecord, NotServingBecause};
use super::plan::DrainUntil;
use super::ports::{Exit, Work};
use super::rotation::WaitingOn;
use super::trigger::{Signal, Trigger};

/// The drain's phases, in order (`lifeguard_drain_phase{phase}` names them).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    strum::EnumIter,
    strum::IntoStaticStr,
    strum::FromRepr,
    serde::Serialize,
)]
#[strum(serialize_all = "snake_case")]
#[serde(into = "&'static str")]
pub enum Phase {
    /// Not draining.
    Serving,
    /// Readiness is 503; waiting out the pre-drain delay (`--drain-delay`).
    Delaying,
    /// Envoy's listeners are draining while readiness still answers as
    /// Envoy does, for the readiness-fail delay (`--readiness-fail-delay`;
    /// under `out-of-rotation`, Envoy serves as before meanwhile).
    DrainingReady,
    /// `out-of-rotation`: readiness is 503 and Envoy serves as before,
    /// until every load balancer has taken the pod out.
    LeavingRotation,
    /// Envoy's listeners are draining; waiting as the policy says.
    Draining,
    /// The policy is satisfied (after `POST /drain`); waiting for a signal.
    Drained,
    /// Envoy is being stopped.
    Stopping,
    /// Envoy has stopped; lifeguard is exiting.
    Stopped,
}

impl Phase {
    /// Whether readiness answers the load balancers 503 `draining` in
    /// this phase, whatever Envoy says (the kubelet: see
    /// [`Phase::envoy_accepts`]).
    pub fn fails_readiness(self) -> bool {
        !matches!(self, Phase::Serving | Phase::DrainingReady)
    }

    /// Whether Envoy still accepts new connections in this phase: until
    /// the drain stops it (a drain the pod's termination started keeps
    /// Envoy's listeners open: `drain_listeners?graceful&skip_exit`).
    pub fn envoy_accepts(self) -> bool {
        self < Phase::Stopping
    }
}

/// What readiness reads of the drain, published on its own for the
/// probe's path: the phase and how the kubelet is answered in this drain,
/// in one atomic the machine stores each time it publishes, read with one
/// load, no lock shared with the machine's writes of the whole
/// [`Status`]; when the kubelet's window ends; and what the probe answered
/// the kubelet since the drain began, written back by the probe. Cloning
/// shares it.
#[derive(Debug, Clone)]
pub struct PhaseCell(std::sync::Arc<Cell>);

#[derive(Debug, Default)]
struct Cell {
    /// The phase's number (its place in [`Phase`]), and
    /// [`PhaseCell::KUBELET_FOLLOWS_ENVOY`].
    state: std::sync::atomic::AtomicU8,
    kubelet: KubeletRecord,
}

/// The drain as the probe reads it: one load of a [`PhaseCell`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    pub phase: Phase,
    /// The kubelet is answered as Envoy is ([`KubeletAnswer::FollowsEnvoy`]),
    /// while its window is open ([`PhaseCell::kubelet_window`]).
    pub kubelet_follows_envoy: bool,
}

impl PhaseCell {
    /// The bit beside the phase's number: the kubelet follows Envoy.
    const KUBELET_FOLLOWS_ENVOY: u8 = 0x10;

    /// A cell that says `serving` (before any drain, and for good when no
    /// drain stands behind it).
    pub fn serving() -> PhaseCell {
        PhaseCell(std::sync::Arc::default())
    }

    /// Publishes the phase, and how the kubelet is answered (None: no
    /// drain yet).
    pub fn set(&self, phase: Phase, kubelet: Option<KubeletAnswer>) {
        let n = phase as u8;
        let follows = match kubelet {
            Some(KubeletAnswer::FollowsEnvoy) => Self::KUBELET_FOLLOWS_ENVOY,
            _ => 0,
        };
        self.0.state.store(n | follows, std::sync::atomic::Ordering::Release);
    }

    #[inline]
    pub fn get(&self) -> Phase {
        self.load().phase
    }

    /// The phase and how the kubelet is answered, read together.
    #[inline]
    pub fn load(&self) -> Published {
        let state = self.0.state.load(std::sync::atomic::Ordering::Acquire);
        Published {
            phase: Phase::from_repr(usize::from(state & 0x0f)).unwrap_or(Phase::Serving),
            kubelet_follows_envoy: state & Self::KUBELET_FOLLOWS_ENVOY != 0,
        }
    }

    /// The kubelet's window (while it is answered as Envoy is) ends at
    /// `at` `because`, unless it already ends sooner (the drain machine
    /// sets it).
    pub fn kubelet_window_ends(&self, at: Instant, because: NotServingBecause) {
        self.0.kubelet.window_ends(at, because);
    }

    /// Whether the kubelet's window is open now (always, when none was
    /// set), or why it closed: one load and a clock read, no lock.
    #[inline]
    pub fn kubelet_window(&self) -> Result<(), NotServingBecause> {
        self.0.kubelet.window()
    }

    /// The probe answered the kubelet during the drain: counted, and a 200
    /// dated.
    #[inline]
    pub fn kubelet_answered(&self, ready: bool) {
        self.0.kubelet.answered(ready);
    }

    /// Fills `status.kubelet` in with what the probe answered the kubelet.
    pub fn fill_kubelet(&self, status: &mut Status) {
        let started_at = status.started_at;
        if let Some(kubelet) = &mut status.kubelet {
            self.0.kubelet.fill(kubelet, started_at);
        }
    }
}

/// What `GET /drain` shows: the drain as the machine last published it.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub phase: Phase,
    /// What started the drain: `SIGTERM`, `SIGINT`, `preStop hook` or
    /// `POST /drain`.
    pub trigger: Option<Trigger>,
    /// How the kubelet's readiness probe is answered in this drain, and
    /// what it was answered (None: no drain yet).
    pub kubelet: Option<Kubelet>,
    /// Unix time (seconds) the drain began.
    pub started_at: Option<f64>,
    /// Unix time (seconds) by which Envoy is stopped.
    pub deadline: Option<f64>,
    pub policy: DrainUntil,
    /// When the drain is done under its policy, in words (`zero active
    /// connections, after at least 5s`).
    pub drained_when: String,
    pub active_connections: Option<u64>,
    pub active_requests: Option<u64>,
    /// TCP-proxy (non-HTTP) connections active in Envoy.
    pub active_tcp: Option<u64>,
    /// Sockets and processes the app still holds (`app-exit`).
    pub app_sockets: Option<u64>,
    pub app_processes: Option<u64>,
    /// What the drain waits on right now (in JSON, its words: `3 requests
    /// in flight` or `2 app sockets (127.0.0.1:8080 listening; ...)`).
    pub waiting_on: Option<Remaining>,
    /// What the drain awaits, for its progress line ([`Status::progress`],
    /// written when asked).
    #[serde(skip)]
    pub awaiting: Option<Awaiting>,
    /// What the drain waited on last, kept once the count reached zero (the
    /// exit summary's "waited for last").
    pub waited_on_last: Option<Remaining>,
    /// Why the last read of the active counts failed, if it did.
    pub last_read_error: Option<String>,
    /// Whether a signal asked for Envoy to be stopped once drained.
    pub stop_requested: bool,
    /// The signal that asked for Envoy's stop (`SIGTERM`, ...): with a
    /// drain started by `POST /drain`, it says when the kubelet came.
    pub stop_signal: Option<Signal>,
    /// Whether the deadline cut the drain (or, `out-of-rotation`, the
    /// load balancers had not taken the pod out by it).
    pub cut_by_deadline: bool,
    /// `out-of-rotation`: seconds from the drain's start to the drain
    /// wait's verdict, once it came.
    pub out_of_rotation_after_seconds: Option<f64>,
    /// `out-of-rotation`: what the drain wait still waited for when its
    /// bound came before the verdict (which checkers held it).
    pub held_by: Option<WaitingOn>,
    /// What the policy counts (connections, requests, or work in flight and
    /// app sockets and processes) still active when Envoy was stopped.
    pub left_at_stop: Option<u64>,
    /// Seconds from the start of the drain to drained, while Envoy keeps
    /// running after `POST /drain`; to Envoy's stop once it has stopped.
    pub duration_seconds: Option<f64>,
}

impl Status {
    /// Before any drain.
    pub fn initial(policy: DrainUntil, drained_when: String) -> Status {
        Status {
            phase: Phase::Serving,
            trigger: None,
            kubelet: None,
            started_at: None,
            deadline: None,
            policy,
            drained_when,
            active_connections: None,
            active_requests: None,
            active_tcp: None,
            app_sockets: None,
            app_processes: None,
            waiting_on: None,
            awaiting: None,
            waited_on_last: None,
            last_read_error: None,
            stop_requested: false,
            stop_signal: None,
            cut_by_deadline: false,
            out_of_rotation_after_seconds: None,
            held_by: None,
            left_at_stop: None,
            duration_seconds: None,
        }
    }
}

impl Status {
    /// The drain's progress line as of `now` (unix seconds): what it still
    /// awaits and the time left to the deadline, the line the log shows,
    /// written when asked; None before the drain waits for anything.
    pub fn progress(&self, now: f64) -> Option<String> {
        let awaiting = self.awaiting.as_ref()?;
        // To the millisecond first: a unix time less another is not exact.
        let left = |end: Option<f64>| {
            let secs = end.map_or(0.0, |end| (end - now).max(0.0));
            Duration::from_millis((secs * 1000.0).round().min(u64::MAX as f64) as u64)
        };
        let own = match awaiting {
            Awaiting::Policy { own_time_ends, .. } => *own_time_ends,
            _ => None,
        };
        Some(awaiting.line(self.policy, left(own), left(self.deadline)))
    }
}

/// What the drain waits on at one read: the count the policy counts in
/// Envoy (`counted` names it) and what the app still holds. A value the
/// drain compares as one; put in words only where it is shown (`GET
/// /drain`, the progress line, the exit summary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remaining {
    pub envoy: u64,
    /// What the policy counts in Envoy (`requests in flight`, ...).
    pub counted: &'static str,
    /// What the app holds (None: nothing, or not watched).
    pub app: Option<Work>,
}

impl Remaining {
    /// What is left at a read (None: nothing).
    pub(crate) fn of(envoy: u64, counted: &'static str, app: Option<&Work>) -> Option<Remaining> {
        let app = app.filter(|w| !w.is_done()).cloned();
        (envoy > 0 || app.is_some()).then_some(Remaining { envoy, counted, app })
    }
}

/// `3 requests in flight; 2 app sockets (127.0.0.1:8080 listening; ...)`.
impl fmt::Display for Remaining {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.envoy > 0 {
            write!(f, "{} {}", self.envoy, self.counted)?;
        }
        if let Some(app) = &self.app {
            let sep = if self.envoy > 0 { "; " } else { "" };
            write!(f, "{sep}{app}")?;
        }
        Ok(())
    }
}

lifeguard_base::serialize_as_display!(Remaining);

/// What the policy has left at a read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Left {
    Nothing,
    On(Remaining),
    /// The read failed: no count.
    Unknown,
}

impl fmt::Display for Left {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Left::Nothing => f.write_str("nothing left"),
            Left::On(on) => write!(f, "waiting for {on}"),
            Left::Unknown => f.write_str("no count: the last read failed"),
        }
    }
}

/// What the drain awaits, as its progress line says it. The line itself,
/// with the time left, is written when it is asked for ([`Status::progress`],
/// `GET /drain`) or logged, not each time the drain reads Envoy.
#[derive(Debug, Clone, PartialEq)]
pub enum Awaiting {
    /// What the policy still awaits (in words `waiting for 2 requests`,
    /// `nothing left`), and the end of the policy's own time (the fixed
    /// drain time, or the minimum) while it runs, unix seconds.
    Policy { left: Left, own_time_ends: Option<f64> },
    /// The load balancers' verdict (`out-of-rotation`, Envoy serving; or
    /// another policy while the kubelet follows Envoy): what the drain
    /// wait still awaits.
    Rotation(WaitingOn),
    /// Done before its time, and why.
    Said(&'static str),
}

impl Awaiting {
    /// The progress line, with `own_left` of the policy's own time and
    /// `to_deadline` left (to the tenth of a second: the line is for people).
    pub(crate) fn line(&self, policy: DrainUntil, own_left: Duration, to_deadline: Duration) -> String {
        let tenths = |d: Duration| GoDuration(Duration::from_millis(d.as_millis() as u64 / 100 * 100));
        let (own_left, to_deadline) = (tenths(own_left), tenths(to_deadline));
        match self {
            Awaiting::Said(words) => (*words).to_owned(),
            Awaiting::Rotation(waiting) if policy == DrainUntil::OutOfRotation => {
                format!("leaving rotation, Envoy serving: waiting for {waiting}; {to_deadline} to the deadline")
            }
            Awaiting::Rotation(waiting) => format!(
                "Envoy draining, accepting what kube-proxy still sends until the load balancers let go: \
                 waiting for {waiting}; {to_deadline} to the deadline"
            ),
            Awaiting::Policy { left, .. } if policy == DrainUntil::Time => {
                format!("{own_left} of drain time left, {left}; {to_deadline} to the deadline")
            }
            Awaiting::Policy { left, .. } if !own_left.0.is_zero() => {
                format!("{left}; the minimum drain time ends in {own_left}; {to_deadline} to the deadline")
            }
            Awaiting::Policy { left, .. } => format!("{left}; {to_deadline} to the deadline"),
        }
    }
}

/// How the agent ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Drained by the policy, then Envoy stopped.
    Drained(Exit),
    /// The wait for the load balancers' verdict ended at its bound
    /// (`held_by` says what it still waited for); then drained by the
    /// policy with nothing left, and Envoy stopped.
    WaitBound(Exit),
    /// The deadline cut the drain with `left` still active (None: unknown).
    Cut { left: Option<u64>, exit: Exit },
    /// The fixed policy's time ran out with `left` requests in flight.
    Unfinished { left: u64, exit: Exit },
    /// `POST /quitquitquit`.
    Quit(Exit),
    /// Envoy exited on its own.
    EnvoyExited(ExitStatus),
    /// An external Envoy stopped answering during the drain.
    EnvoyGone,
}
