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
//! - who checks the pod is `lifeguard_checkers`' table: every readiness
//!   probe is recorded against its checker (its address, forwarded by
//!   Envoy's status listener, and its agent), which teaches each checker's
//!   interval and counts its failures in a row; a table no prober can make
//!   forget a checker it has learned;
//! - `quiet`: the traffic the pod had before the drain, and how long "no
//!   new request" must last to be evidence rather than chance;
//! - [`rule`]: out of rotation once every checker has failed its threshold
//!   of probes in a row (or stopped probing, or held the wait as long as a
//!   checker may) and no new request has reached Envoy's inbound listeners
//!   for the quiet period (the [`Traffic`] port, read through the admin API
//!   by `lifeguard_envoy::inbound`);
//! - [`budget`]: whether the grace period leaves the slowest learned
//!   checker its time, said once it is learned;
//! - `task`: the task that samples the traffic before the drain, fails
//!   the load balancers' checks of Envoy's `health_check` filter when
//!   readiness turns 503, applies the rule from the start of the drain and
//!   publishes a [`DrainWaitStatus`] (`GET /drain` shows it);
//! - `handle`: the [`DrainWait`] handle whose `wait` answers the hook,
//!   and whose verdict a gateway's own drain (`out-of-rotation`) waits
//!   for;
//! - `settings`: the drain wait's settings, which make its plan;
//! - `plan`: what the wait runs with ([`DrainWaitPlan`]).
//!
//! Nothing here starts a drain: the hook may come before the proxy's own
//! SIGTERM (or `POST /drain`), and waits for it.

pub mod budget;
mod handle;
mod plan;
mod quiet;
pub mod rule;
mod settings;
mod task;

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use lifeguard_drain::ControlError;

pub use handle::{DrainWait, DrainWaitStatus, HealthChecks, RemoteWait, WaitEnd, WaitState, WaitWhy};
pub use plan::DrainWaitPlan;
pub use settings::{
    AddressRange, Checks, ChecksSetting, KubeletProbe, LoadBalancerChecks, NotAChecks, NotAProbe, NotARange,
    NotAThreshold, PlanError, Settings, Threshold,
};
pub use task::run;

/// A duration to the millisecond: words are for people.
pub(crate) fn ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

/// How often the rule looks at Envoy's inbound traffic while the wait goes
/// on: the drain's own count reads serve when fresh, and a read made for
/// the wait alone costs Envoy's admin thread at most about a tenth of its
/// time (`lifeguard_envoy::counts::CountsReader`).
pub const READ_EVERY: Duration = Duration::from_millis(100);

/// What the rule needs from Envoy: the requests reaching its inbound
/// listeners. `lifeguard_envoy::inbound::Inbound` is the real one.
pub trait Traffic: Send + 'static {
    /// Learns which listeners count (once; again when Envoy's listeners
    /// change); says which, in words, for the log.
    fn learn(&mut self) -> impl Future<Output = String> + Send;
    /// When the last learn failed: when it is due again (None: it did not
    /// fail). Before the drain, the samples are 10 s apart; the learn is
    /// tried again at this time instead, no sooner than a second after the
    /// last try.
    fn learn_due(&self) -> Option<tokio::time::Instant> {
        None
    }
    /// The requests that have arrived so far on those listeners.
    fn arrivals(&mut self) -> impl Future<Output = Result<Arrivals, TrafficError>> + Send;
    /// Whether Envoy's status listener appends each prober's own address to
    /// `x-forwarded-for` (its last entry is then the prober, whatever the
    /// prober wrote there), as learned.
    fn peer_forwarded(&self) -> bool;
    /// Makes Envoy answer 503 to the load balancers' checks its
    /// `health_check` filter recognises (`POST /healthcheck/fail`), when a
    /// counted listener has that filter: Ok(true) once done, Ok(false)
    /// when none has it (not called: Envoy would drain-close every
    /// listener, outbound ones too, for nothing).
    fn fail_health_checks(&mut self) -> impl Future<Output = Result<bool, TrafficError>> + Send;
}

/// Requests arrived on the counted listeners, as one read of Envoy's
/// counts found them: only whether the total moved matters (it may dip a
/// moment: a check is counted when it arrives and taken off when it ends),
/// totals of two generations (other listeners counted) are not compared,
/// and a read is evidence of the time it was made, not of the time it was
/// looked at (a read is shared and kept while fresh).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrivals {
    /// Which read of Envoy this is (the same read looked at again has the
    /// same number: it is no new evidence).
    pub seq: u64,
    pub total: u64,
    pub generation: u64,
    /// When the read began, and how long Envoy took to answer it: the
    /// counts were taken somewhere in between.
    pub read: Instant,
    pub took: Duration,
}

impl Arrivals {
    /// A number for a new read of the tests' making.
    #[cfg(test)]
    pub(crate) fn next_seq() -> u64 {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// The latest the counts can have been taken.
    pub(crate) fn read_end(&self) -> Instant {
        self.read + self.took
    }
}

/// Why Envoy's inbound total could not be read: the read of its counts,
/// shared with the drain, failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(transparent)]
pub struct TrafficError(#[from] pub ControlError);
