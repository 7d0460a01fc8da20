//! The drain: one state machine that owns the phase, the deadline and the
//! policy, and is the only place that decides when Envoy stops.
//!
//! It runs as one task ([`Drain::run`]) fed by `handle::Event`s — signals,
//! `POST /drain`, `POST /quitquitquit` — through a [`DrainHandle`], and talks
//! to Envoy only through [`EnvoyControl`] (drain the listeners, read the
//! active counts, stop, notice an exit). Time is tokio's clock, so the whole
//! machine runs in virtual time in the unit tests below, against a scripted
//! Envoy.
//!
//! The sequence on the first SIGTERM or SIGINT:
//!
//! 1. the phase leaves `serving`, and readiness, which reads the published
//!    phase, answers 503 `draining` before any network call is made;
//! 2. optional pre-drain delay: Envoy keeps serving while endpoint removal
//!    propagates;
//! 3. Envoy's inbound listeners drain gracefully (retried; a failure is
//!    logged and the sequence goes on);
//! 4. the policy: a fixed time, or nothing left (connections, requests, or
//!    the app's work) after a minimum time, read every 50 ms on a small
//!    Envoy and less often on a slow one; only a count read *now* can end it;
//! 5. Envoy is stopped gracefully. One deadline (grace period less the
//!    shutdown margin, counted from the start of the drain) bounds steps 2–4.
//!
//! Under `out-of-rotation` (a gateway: no app to wait for), Envoy serves
//! as before between steps 2 and 3 until the drain wait's verdict (every
//! load balancer has taken the pod out, no new request for the quiet
//! period), then drains and stops once no request is in flight.
//!
//! `POST /drain` runs steps 1–4 with `skip_exit` and answers when the policy
//! is satisfied; Envoy keeps running until a signal, which then stops it at
//! once. Every wait ends early when Envoy exits on its own.
//!
//! The phase is published once, in a `watch` channel ([`Status`]); readiness,
//! `GET /drain` and the metrics all derive from it; the phase alone also
//! in a [`PhaseCell`], which the probe reads without a lock, with how the
//! kubelet is answered in this drain (`kubelet`: in a drain the pod's
//! termination started, the kubelet is answered as Envoy is, while every
//! other prober gets 503).
//!
//! The drain's settings ([`Settings`]) make its [`Plan`], or a
//! [`PlanError`] naming the rule that does not hold.

mod handle;
mod kubelet;
mod machine;
mod plan;
mod policy;
mod ports;
mod rotation;
mod settings;
mod status;
#[cfg(test)]
mod tests;
mod trigger;

pub use handle::DrainHandle;
pub use kubelet::{
    Audience, Checks, ChecksError, Kubelet, KubeletAnswer, NodeChecks, NotServingBecause, ReadyOrNot,
    TerminatingReadiness, KUBE_PROXY_LAG,
};
pub use machine::Drain;
pub use plan::DrainUntil;
pub use plan::{DrainScope, Plan, SetAside};
pub use policy::Patience;
pub use ports::{Active, ActiveRead};
pub use ports::{AppControl, AppProcess, AppSocket, ControlError, EnvoyControl, Exit, Work};
pub use rotation::{CheckerKey, Conclusion, Pending, Rotation, RotationVerdict, WaitingOn};
pub use settings::{GracePeriod, PlanError, Reads, Settings};
pub use status::Outcome;
pub use status::{Awaiting, Left, Phase, PhaseCell, Published, Remaining, Status};
pub use trigger::{Asker, Signal, Trigger};

use std::time::Duration;

/// How often active connections or requests are read while waiting for zero,
/// so Envoy stops within about this long after the last one ends.
pub(crate) const ZERO_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// With `app-exit`, how long every read must have found nothing left (no
/// request in Envoy, no socket or process of the app) before Envoy stops:
/// an app between two steps of its shutdown may hold no socket for a
/// moment (with a shared process namespace its processes still show).
pub(crate) const APP_QUIET: Duration = Duration::from_millis(100);
/// With `app-exit`, how often the app alone is looked at between two reads
/// of Envoy while it still holds something (a look costs Envoy nothing:
/// `/proc` only), so that its end is seen when it happens, not at Envoy's
/// next paced read; at most: a look also starts no sooner than [`PACE`]
/// times the recent looks' duration after the one before. A look reads
/// the namespace's socket table, and the kernel walks the host's whole TCP
/// hash table to list it (4-5 ms of kernel time for `tcp` and `tcp6` on a
/// 262,144-bucket table, however few sockets the pod has): at 25 ms that
/// was a fifth of a core for the whole drain. Where its processes are
/// seen, their exits wake the drain at once.
pub const APP_SCAN: Duration = Duration::from_millis(25);
/// The longest time between two looks at the app while it holds
/// something, however long the looks take (a busy node's CPU, a huge
/// socket table): its end is seen within this and a look.
pub const APP_SCAN_MAX: Duration = Duration::from_secs(1);
/// A drain read starts this many times the recent reads' duration after the
/// one before: Envoy's admin thread spends at most 1/PACE (about 9 %) of its
/// time on the drain's reads, whatever the size of its config.
pub const PACE: u32 = 11;
/// How long an external Envoy's admin API may refuse connections during a
/// drain before lifeguard concludes Envoy is gone.
pub(crate) const EXTERNAL_GONE_AFTER: Duration = Duration::from_secs(1);
/// Tries of the `drain_listeners` call.
pub(crate) const DRAIN_CALL_TRIES: u32 = 3;
/// The shortest time between two progress lines (what is awaited changed).
pub(crate) const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// The longest time without a progress line while the drain waits.
pub(crate) const PROGRESS_HEARTBEAT: Duration = Duration::from_secs(5);
/// Time between two repeats of one warning.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(10);
