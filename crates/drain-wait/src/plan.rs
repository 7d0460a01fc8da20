//! What the drain wait runs with ([`DrainWaitPlan`]), made by its
//! settings within the drain's plan: the rule's thresholds, the bound of
//! the wait under each drain policy, and what the declared load balancers
//! may take to let go.

use std::time::Duration;

use ipnet::IpNet;
use lifeguard_base::grace::Grace;
use lifeguard_drain::{Checks, DrainUntil};

/// What the drain wait runs with: the rule's thresholds and bounds, the
/// grace period, the load balancers declared.
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
