//! Out of rotation: whether the load balancers that send the pod traffic
//! have stopped, so the app may be told to stop (`GET /drain/wait`, the
//! app container's preStop hook).
//!
//! When a pod is deleted, a load balancer that learns of it only from its
//! own health checks keeps sending new requests until it has seen its
//! unhealthy threshold of failed checks; one driven by a controller, or a
//! mesh fed by the control plane, takes its own while. An app that stops
//! listening at SIGTERM loses every request sent meanwhile, and Envoy has
//! nowhere to route them; holding Envoy cannot help, holding the app's
//! SIGTERM can. A fixed `sleep` in the app's preStop hook guesses how long:
//! too short loses requests, too long slows every rollout. Here the wait is
//! measured instead:
//!
//! - [`checkers`]: every readiness probe is recorded against its checker
//!   (its address, forwarded by Envoy's status listener, and its agent),
//!   which teaches each checker's interval and counts its failures in a row;
//! - [`rule`]: out of rotation once every checker has failed its threshold
//!   of probes in a row (or stopped probing) and no new request has reached
//!   Envoy's inbound listeners for a quiet period (the [`Traffic`] port,
//!   read through the admin API by `crate::envoy::inbound`);
//! - [`watch`]: the task that applies the rule from the start of the drain
//!   and publishes a [`RotationStatus`] (`GET /drain` shows it), and the
//!   [`Rotation`] handle whose `wait` answers the hook.
//!
//! Nothing here starts a drain: the hook may come before the proxy's own
//! SIGTERM (or `POST /drain`), and waits for it.

pub mod checkers;
pub mod rule;
pub mod watch;

use std::future::Future;
use std::time::Duration;

use crate::drain::ControlError;

pub use checkers::Checkers;
pub use watch::{Rotation, RotationState, RotationStatus, WaitEnd};

/// How often the rule looks at Envoy's inbound traffic while the wait goes
/// on: the drain's own count reads serve when fresh, and a read made for
/// the wait alone costs Envoy's admin thread at most about a tenth of its
/// time (`crate::envoy::counts::CountsReader`).
pub(crate) const READ_EVERY: Duration = Duration::from_millis(100);

/// What the rule needs from Envoy: the requests reaching its inbound
/// listeners. `crate::envoy::inbound::Inbound` is the real one.
pub(crate) trait Traffic: Send + 'static {
    /// Learns which listeners count, once the drain begins; says which, in
    /// words, for the log.
    fn learn(&mut self) -> impl Future<Output = String> + Send;
    /// New connections and requests so far on those listeners: a total
    /// that only grows; only whether it moved matters.
    fn inbound_total(&mut self) -> impl Future<Output = Result<u64, TrafficError>> + Send;
}

/// Why Envoy's inbound total could not be read: the read of its counts,
/// shared with the drain, failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(transparent)]
pub(crate) struct TrafficError(#[from] pub(crate) ControlError);

/// The rule's settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RotationPlan {
    /// Failed probes in a row after which a checker has taken the pod out.
    pub(crate) lb_unhealthy_threshold: u32,
    /// No new request for this long: traffic has stopped.
    pub(crate) lb_quiet_period: Duration,
    /// The drain's deadline (grace period less the shutdown margin): the
    /// wait never outlasts it, counted from the drain's start or from the
    /// hook's arrival, whichever is first.
    pub(crate) drain_deadline: Duration,
}
