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
//!   which teaches each checker's interval and counts its failures in a
//!   row; a table no prober can make forget a checker it has learned;
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
//! - `settings`: the drain wait's settings and its [`DrainWaitPlan`].
//!
//! Nothing here starts a drain: the hook may come before the proxy's own
//! SIGTERM (or `POST /drain`), and waits for it.

pub mod budget;
pub mod checkers;
mod handle;
mod quiet;
pub mod rule;
mod settings;
mod task;

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use ipnet::IpNet;
use lifeguard_base::grace::Grace;
use lifeguard_drain::{ControlError, DrainUntil};

pub use checkers::Checkers;
pub use handle::{DrainWait, DrainWaitStatus, HealthChecks, RemoteWait, WaitEnd, WaitState, WaitWhy};
pub use settings::{
    AddressRange, Checks, ChecksSetting, KubeletProbe, LoadBalancerChecks, NotAChecks, NotAProbe, NotARange,
    NotAThreshold, PlanError, Settings, Threshold,
};
pub use task::run;

/// What other crates' tests read of the checker table (the `testing`
/// feature; never in the binary).
#[cfg(feature = "testing")]
pub mod testing {
    use super::checkers::{Checker, Checkers};

    /// Every checker the table heard from, as the rule reads them.
    pub fn checkers_seen(checkers: &Checkers) -> Vec<Checker> {
        checkers.snapshot()
    }

    /// Tells the table whether Envoy's status listener appends the
    /// prober's address to `x-forwarded-for`.
    pub fn trust_forwarded(checkers: &Checkers, appended: bool) {
        checkers.trust_forwarded(appended);
    }
}

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

/// The rule's settings.
#[derive(Debug, Clone)]
pub struct DrainWaitPlan {
    /// Failed probes in a row after which a checker has taken the pod out,
    /// for checkers whose software does not fix it (Envoy's: 1).
    pub unhealthy_threshold: u32,
    /// The shortest quiet period: no new request for this long at the
    /// least, however busy the pod was.
    pub min_quiet_period: Duration,
    /// No checker holds the wait longer than this after the drain began.
    pub checker_timeout: Duration,
    /// Readiness answers 503 this long after the drain began: the drain's
    /// readiness-fail delay (zero: at once). The checkers fail from then,
    /// which the budget counts.
    pub fails_after: Duration,
    /// Only probes from these ranges count as a checker's (empty: any
    /// peer but the kubelet).
    pub checker_ranges: Vec<IpNet>,
    /// The pod's grace period and lifeguard's shutdown margin, the drain's
    /// (its deadline bounds the wait; the budget weighs the checkers
    /// against the period).
    pub grace: Grace,
    /// Time kept for the app between the wait's end and the deadline: the
    /// wait never outlasts the deadline less `app_time`, counted from the
    /// drain's start or from the hook's arrival, whichever is first.
    pub app_time: Duration,
    /// The load balancers that check the node (`--load-balancer-checks`,
    /// or assumed), the drain's: for the budget of each way a node gets
    /// its traffic, which the drain wait cannot learn.
    pub node_checks: lifeguard_drain::NodeChecks,
    /// The kubelet's readiness probe as declared (`--kubelet-probe`; None:
    /// Kubernetes' defaults assumed), for the announcers' budget.
    pub kubelet_probe: Option<Checks>,
    /// Whether the kubelet is told a terminating pod serves
    /// (`--terminating-readiness serving`).
    pub kubelet_served: bool,
    /// The longest quiet period (None: the wait's bound).
    pub max_quiet_period: Option<Duration>,
}

#[cfg(any(test, feature = "testing"))]
impl DrainWaitPlan {
    /// The defaults' plan, within the drain's defaults, for tests
    /// (threshold 3, a 500 ms quiet period, a 20 s checker timeout, a 30 s
    /// grace period less a 2 s margin, 5 s for the app).
    pub fn for_tests() -> DrainWaitPlan {
        let settings: Settings = lifeguard_base::settings::defaults();
        settings
            .plan(&lifeguard_drain::Plan::for_status_tests())
            .expect("the defaults hold")
    }
}

impl DrainWaitPlan {
    /// How long the wait may last: the deadline less the app's time.
    pub(crate) fn bound(&self) -> Duration {
        self.grace.deadline().saturating_sub(self.app_time)
    }

    /// The app's time under the drain's `policy`: none for a gateway
    /// (`out-of-rotation`: there is no app, and Envoy itself waits).
    pub(crate) fn app_time_under(&self, policy: DrainUntil) -> Duration {
        match policy {
            DrainUntil::OutOfRotation => Duration::ZERO,
            _ => self.app_time,
        }
    }

    /// The wait's bound under the drain's `policy`.
    pub(crate) fn bound_under(&self, policy: DrainUntil) -> Duration {
        self.grace.deadline().saturating_sub(self.app_time_under(policy))
    }

    /// The longest quiet period under the drain's `policy`: the wait's
    /// bound, or `--drain-wait-max-quiet-period` when shorter.
    pub(crate) fn quiet_ceiling(&self, policy: DrainUntil) -> Duration {
        let bound = self.bound_under(policy);
        self.max_quiet_period.map_or(bound, |max| max.min(bound))
    }

    /// From the drain's start, how long the slowest declared load balancer
    /// (`--load-balancer-checks`) may go on sending new connections: the
    /// readiness-fail delay, its interval × threshold, and the second the
    /// change takes to reach it (zero when none is declared: what is
    /// assumed for the kubelet's answer does not hold a gateway's
    /// kept-alive clients). The sum the budget weighs.
    pub(crate) fn declared_let_go(&self) -> Duration {
        self.node_checks
            .declared()
            .iter()
            .map(|checks| self.fails_after + checks.takes() + lifeguard_drain::KUBE_PROXY_LAG)
            .max()
            .unwrap_or_default()
    }
}
