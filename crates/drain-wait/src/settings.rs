//! The drain wait's settings: what counts as a load balancer's verdict
//! and how long it may take; the [`DrainWaitPlan`] they make with the
//! drain's plan (its deadline, grace period and margin).

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;
use std::time::Duration;

use clap::Args;
use ipnet::IpNet;
use lifeguard_base::duration::GoDuration;
use lifeguard_base::settings::{PositiveSpan, Span};
pub use lifeguard_drain::Checks;
use lifeguard_drain::NodeChecks;
use serde::Serialize;

use crate::DrainWaitPlan;

/// The drain wait's settings. In the file: the section `[drain_wait]`, a key a field
/// (the flags and variables keep `drain-wait` in their names: they share
/// one namespace; the file's keys once did too, and are still read).
#[derive(Debug, Clone, Args, Serialize)]
#[group(skip)]
pub struct Settings {
    /// The drain wait (GET /drain/wait): a checker of the pod's readiness
    /// (a load balancer) has taken the pod out once it has had this many
    /// failed probes in a row (HAProxy and the kubelet default to 3, AWS
    /// and GCP to 2).
    #[arg(
        long = "drain-wait-unhealthy-threshold",
        env = "LIFEGUARD_DRAIN_WAIT_UNHEALTHY_THRESHOLD",
        value_name = "N",
        default_value = "3"
    )]
    pub unhealthy_threshold: Threshold,

    /// The drain wait: the shortest quiet period. Once every checker has
    /// taken the pod out, no new request on Envoy's inbound listeners for
    /// the quiet period means the traffic has stopped; the quiet period is
    /// derived from the traffic before the drain (a gap that comes by
    /// chance at most once in a thousand), never shorter than this.
    #[arg(
        long = "drain-wait-min-quiet-period",
        env = "LIFEGUARD_DRAIN_WAIT_MIN_QUIET_PERIOD",
        value_name = "DURATION",
        default_value = "500ms"
    )]
    pub min_quiet_period: PositiveSpan,

    /// The drain wait: only readiness probes from these address ranges
    /// (CIDR, comma-separated; cloud health checkers publish theirs, e.g.
    /// GoogleHC's 35.191.0.0/16,130.211.0.0/22) count as a load balancer's
    /// checks; empty: probes from anywhere but the kubelet.
    #[arg(
        long = "drain-wait-checker-ranges",
        env = "LIFEGUARD_DRAIN_WAIT_CHECKER_RANGES",
        value_name = "CIDR",
        value_delimiter = ','
    )]
    pub checker_ranges: Vec<AddressRange>,

    /// The drain wait: no checker of the pod's readiness holds the wait
    /// longer than this after the drain began (a prober that checks
    /// rarely, or keeps probing without failing enough, cannot hold every
    /// rollout to the grace period).
    #[arg(
        long = "drain-wait-checker-timeout",
        env = "LIFEGUARD_DRAIN_WAIT_CHECKER_TIMEOUT",
        value_name = "DURATION",
        default_value = "20s"
    )]
    pub checker_timeout: PositiveSpan,

    /// The drain wait: time kept for the app between the wait's end and the
    /// drain's deadline, when the wait ends at its bound (at most half the
    /// deadline): the app gets its SIGTERM this long before Envoy is stopped.
    #[arg(
        long = "drain-wait-app-time",
        env = "LIFEGUARD_DRAIN_WAIT_APP_TIME",
        value_name = "DURATION",
        default_value = "5s"
    )]
    pub app_time: Span,

    /// The health checks of the load balancers that check the node
    /// (externalTrafficPolicy: Local: an NLB with instance targets, GKE's
    /// L4, HAProxy in front of NodePorts), as they are configured, each
    /// INTERVALxTHRESHOLD (10sx3: every 10 s, out after 3 failures in a
    /// row), comma-separated. While the pod terminates, the kubelet is
    /// told it serves for the slowest one's interval x threshold and a
    /// second (10sx3 assumed when not set: the common clouds'), so that
    /// kube-proxy sends the node's traffic to it until the load balancer
    /// has let the node go, then 503, so that announcers (MetalLB)
    /// withdraw the node. `lifeguard check` and start-up say whether the
    /// grace period covers each (its interval x threshold, a second for
    /// the change to reach it, the quiet period and the shutdown margin),
    /// and a gateway keeps its kept-alive connections open until that long
    /// after the drain began.
    #[arg(
        long = "load-balancer-checks",
        env = "LIFEGUARD_LOAD_BALANCER_CHECKS",
        value_name = "INTERVALxTHRESHOLD",
        value_delimiter = ','
    )]
    pub load_balancer_checks: Vec<LoadBalancerChecks>,

    /// The kubelet's readinessProbe of this container as the pod spec sets
    /// it, periodSeconds x failureThreshold (Kubernetes' defaults, 10sx3,
    /// when not set): an announcer that follows the EndpointSlice
    /// (MetalLB) withdraws the node only once the kubelet has seen that
    /// many failed probes, which `lifeguard check` and start-up weigh
    /// against the grace period (set, they hold the pod to it).
    #[arg(long = "kubelet-probe", env = "LIFEGUARD_KUBELET_PROBE", value_name = "PERIODxTHRESHOLD")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubelet_probe: Option<KubeletProbe>,

    /// The drain wait: the longest quiet period (not set: the wait's
    /// bound). At sparse traffic the quiet period that tells a stopped
    /// trickle from a pause is long (0.5 requests a second: 14 s; 0.3 or
    /// fewer: the bound); this shortens the drains of such pods, at a
    /// cost: a gap this long then comes by chance more often than once in
    /// a thousand, and a load balancer still sending after it loses those
    /// requests.
    #[arg(
        long = "drain-wait-max-quiet-period",
        env = "LIFEGUARD_DRAIN_WAIT_MAX_QUIET_PERIOD",
        value_name = "DURATION"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_quiet_period: Option<PositiveSpan>,
}

/// A rule across the drain wait's settings that does not hold.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("is shorter than min_quiet_period ({}): the longest quiet period cannot be shorter than the shortest", GoDuration(*.0))]
    MaxQuietBelowMin(Duration, Duration),
}

impl lifeguard_base::settings::SettingError for PlanError {
    fn key(&self) -> &'static str {
        match self {
            PlanError::MaxQuietBelowMin(..) => "max_quiet_period",
        }
    }

    fn value(&self) -> String {
        match self {
            PlanError::MaxQuietBelowMin(_, max) => GoDuration(*max).to_string(),
        }
    }
}

impl Settings {
    /// The load balancers that check the node, as declared: the drain's
    /// plan takes them (how long the kubelet is told a terminating pod
    /// serves).
    pub fn node_checks(&self) -> NodeChecks {
        NodeChecks::new(self.load_balancer_checks.iter().map(|c| c.get()).collect())
    }

    /// The drain wait's plan, within the drain's.
    pub fn plan(&self, drain: &lifeguard_drain::Plan) -> Result<DrainWaitPlan, PlanError> {
        let (min, max) = (
            self.min_quiet_period.get(),
            self.max_quiet_period.map(PositiveSpan::get),
        );
        if let Some(max) = max.filter(|max| *max < min) {
            return Err(PlanError::MaxQuietBelowMin(min, max));
        }
        let deadline = drain.grace().deadline();
        Ok(DrainWaitPlan {
            unhealthy_threshold: self.unhealthy_threshold.get(),
            min_quiet_period: min,
            checker_timeout: self.checker_timeout.get(),
            fails_after: drain.readiness_fail_delay(),
            checker_ranges: self.checker_ranges.iter().map(|r| r.get()).collect(),
            grace: drain.grace(),
            // Never more than half the deadline: a short grace period
            // still leaves the wait half of it.
            app_time: self.app_time.get().min(deadline / 2),
            node_checks: drain.node_checks().clone(),
            kubelet_probe: self.kubelet_probe.map(KubeletProbe::get),
            kubelet_served: drain.terminating_readiness() == lifeguard_drain::TerminatingReadiness::Serving,
            max_quiet_period: max,
        })
    }
}

/// A count of failed probes in a row, 1 to 100.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Threshold(u32);

/// A threshold that is not a whole number from 1 to 100.
#[derive(Debug, thiserror::Error)]
#[error("expected a whole number from 1 to 100")]
pub struct NotAThreshold;

impl Threshold {
    pub fn get(self) -> u32 {
        self.0
    }
}

impl FromStr for Threshold {
    type Err = NotAThreshold;
    fn from_str(s: &str) -> Result<Threshold, NotAThreshold> {
        match s.trim().parse() {
            Ok(n @ 1..=100) => Ok(Threshold(n)),
            _ => Err(NotAThreshold),
        }
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

lifeguard_base::serialize_as_display!(Threshold);

/// An address range: `35.191.0.0/16`, `2600:2d00:1:b029::/64`, or one
/// address (`10.0.0.5`, a range of one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressRange(IpNet);

/// Text that is neither an address range nor an address, or a range
/// written from an address inside it (`10.0.0.5/16`: which was meant, the
/// range or the address, is not ours to guess).
#[derive(Debug, thiserror::Error)]
pub enum NotARange {
    #[error("expected an address range (CIDR), for example 35.191.0.0/16, or an address")]
    Unreadable,
    #[error("an address inside its range, not the range's first: write {0}, or the address alone")]
    HostBits(IpNet),
}

impl AddressRange {
    pub fn get(self) -> IpNet {
        self.0
    }
}

impl FromStr for AddressRange {
    type Err = NotARange;
    fn from_str(s: &str) -> Result<AddressRange, NotARange> {
        let s = s.trim();
        if let Ok(net) = s.parse::<IpNet>() {
            return match net.trunc() {
                range if range == net => Ok(AddressRange(net)),
                range => Err(NotARange::HostBits(range)),
            };
        }
        let addr = s.parse::<std::net::IpAddr>().map_err(|_| NotARange::Unreadable)?;
        Ok(AddressRange(addr.into()))
    }
}

impl fmt::Display for AddressRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

lifeguard_base::serialize_as_display!(AddressRange);

/// [`Checks`] as a setting takes them (`10sx3`, `10s x 3`, `10s*3` or
/// `10s×3`), refused in that setting's words: `E`, the error of
/// `--load-balancer-checks` ([`LoadBalancerChecks`]) or of
/// `--kubelet-probe` ([`KubeletProbe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChecksSetting<E>(Checks, PhantomData<E>);

/// A load balancer's checks of the node.
pub type LoadBalancerChecks = ChecksSetting<NotAChecks>;

/// The kubelet's readiness probe, written as a load balancer's checks
/// (`5sx3`: periodSeconds 5, failureThreshold 3).
pub type KubeletProbe = ChecksSetting<NotAProbe>;

/// Text that is not a load balancer's checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, thiserror::Error)]
#[error("expected a load balancer's checks as INTERVALxTHRESHOLD, for example 10sx3 (every 10 s, out after 3 failures in a row; the threshold 1 to 100)")]
pub struct NotAChecks;

/// Text that is not the kubelet's probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, thiserror::Error)]
#[error("expected the kubelet's readiness probe as PERIODxFAILURE_THRESHOLD, for example 5sx3 (periodSeconds 5, failureThreshold 3; the threshold 1 to 100)")]
pub struct NotAProbe;

impl<E> ChecksSetting<E> {
    pub fn get(self) -> Checks {
        self.0
    }
}

impl<E: Default> FromStr for ChecksSetting<E> {
    type Err = E;
    fn from_str(s: &str) -> Result<ChecksSetting<E>, E> {
        let checks = s.parse().map_err(|_| E::default())?;
        Ok(ChecksSetting(checks, PhantomData))
    }
}

impl<E> fmt::Display for ChecksSetting<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<E> Serialize for ChecksSetting<E> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
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
