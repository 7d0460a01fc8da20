//! The drain wait's settings: what counts as a load balancer's verdict
//! and how long it may take; the [`DrainWaitPlan`] they make with the
//! drain's plan (its deadline, grace period and margin).

use std::time::Duration;

use clap::Args;
use ipnet::IpNet;
use lifeguard_base::settings::{positive, span};
use serde::Serialize;

use crate::DrainWaitPlan;

/// Why a drain wait's value was refused.
#[derive(Debug, thiserror::Error)]
pub enum ValueError {
    #[error("expected an address range (CIDR), for example 35.191.0.0/16, or an address")]
    NotARange,
    #[error("expected a whole number from 1 to 100")]
    NotAThreshold,
    #[error("expected a load balancer's checks as INTERVALxTHRESHOLD, for example 10sx3 (every 10 s, out after 3 failures in a row)")]
    NotAChecks,
}

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
    #[arg(long = "drain-wait-unhealthy-threshold", env = "LIFEGUARD_DRAIN_WAIT_UNHEALTHY_THRESHOLD", value_name = "N", default_value = "3", value_parser = threshold::parse)]
    pub unhealthy_threshold: u32,

    /// The drain wait: the shortest quiet period. Once every checker has
    /// taken the pod out, no new request on Envoy's inbound listeners for
    /// the quiet period means the traffic has stopped; the quiet period is
    /// derived from the traffic before the drain (a gap that comes by
    /// chance at most once in a thousand), never shorter than this.
    #[arg(long = "drain-wait-min-quiet-period", env = "LIFEGUARD_DRAIN_WAIT_MIN_QUIET_PERIOD", value_name = "DURATION", default_value = "500ms", value_parser = positive::parse)]
    #[serde(serialize_with = "positive::serialize")]
    pub min_quiet_period: Duration,

    /// The drain wait: only readiness probes from these address ranges
    /// (CIDR, comma-separated; cloud health checkers publish theirs, e.g.
    /// GoogleHC's 35.191.0.0/16,130.211.0.0/22) count as a load balancer's
    /// checks; empty: probes from anywhere but the kubelet.
    #[arg(long = "drain-wait-checker-ranges", env = "LIFEGUARD_DRAIN_WAIT_CHECKER_RANGES", value_name = "CIDR", value_delimiter = ',', value_parser = range)]
    #[serde(serialize_with = "ranges_shown")]
    pub checker_ranges: Vec<IpNet>,

    /// The drain wait: no checker of the pod's readiness holds the wait
    /// longer than this after the drain began (a prober that checks
    /// rarely, or keeps probing without failing enough, cannot hold every
    /// rollout to the grace period).
    #[arg(long = "drain-wait-checker-timeout", env = "LIFEGUARD_DRAIN_WAIT_CHECKER_TIMEOUT", value_name = "DURATION", default_value = "20s", value_parser = positive::parse)]
    #[serde(serialize_with = "positive::serialize")]
    pub checker_timeout: Duration,

    /// The drain wait: time kept for the app between the wait's end and the
    /// drain's deadline, when the wait ends at its bound (at most half the
    /// deadline): the app gets its SIGTERM this long before Envoy is stopped.
    #[arg(long = "drain-wait-app-time", env = "LIFEGUARD_DRAIN_WAIT_APP_TIME", value_name = "DURATION", default_value = "5s", value_parser = span::parse)]
    #[serde(serialize_with = "span::serialize")]
    pub app_time: Duration,

    /// The health checks of the load balancers in front of the pod, as they
    /// are configured, each INTERVALxTHRESHOLD (10sx3: every 10 s, out
    /// after 3 failures in a row), comma-separated: `lifeguard check` and
    /// start-up say whether the grace period covers each (its interval x
    /// threshold, a second for the change to reach it, the quiet period
    /// and the shutdown margin), and a gateway keeps its kept-alive
    /// connections open until that long after the drain began. For a load
    /// balancer that checks the node (externalTrafficPolicy: Local), which
    /// the drain wait cannot learn.
    #[arg(long = "load-balancer-checks", env = "LIFEGUARD_LOAD_BALANCER_CHECKS", value_name = "INTERVALxTHRESHOLD", value_delimiter = ',', value_parser = checks::parse)]
    #[serde(serialize_with = "checks::serialize_all")]
    pub load_balancer_checks: Vec<Checks>,
}

/// A load balancer's checks as configured: every `interval`, out after
/// `threshold` failures in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checks {
    pub interval: Duration,
    pub threshold: u32,
}

impl Checks {
    /// How long it takes to let the pod go once its checks fail.
    pub fn takes(&self) -> Duration {
        self.interval.saturating_mul(self.threshold)
    }
}

impl std::fmt::Display for Checks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}x{}",
            lifeguard_base::duration::GoDuration(self.interval),
            self.threshold
        )
    }
}

/// A load balancer's checks: `10sx3`, `10s x 3`, `10s*3` or `10s×3`.
pub mod checks {
    use super::*;

    pub fn parse(s: &str) -> Result<Checks, ValueError> {
        let s = s.trim();
        let (interval, threshold) = ['×', '*', 'x']
            .into_iter()
            .find_map(|sep| s.rsplit_once(sep))
            .ok_or(ValueError::NotAChecks)?;
        let interval = lifeguard_base::duration::positive(interval.trim()).map_err(|_| ValueError::NotAChecks)?;
        let threshold = super::threshold::parse(threshold).map_err(|_| ValueError::NotAChecks)?;
        Ok(Checks { interval, threshold })
    }

    pub fn serialize_all<S: serde::Serializer>(v: &[Checks], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(ToString::to_string))
    }
}

impl Settings {
    /// The drain wait's plan, within the drain's.
    pub fn plan(&self, drain: &lifeguard_drain::Plan) -> DrainWaitPlan {
        let deadline = drain.grace().deadline();
        DrainWaitPlan {
            unhealthy_threshold: self.unhealthy_threshold,
            min_quiet_period: self.min_quiet_period,
            checker_timeout: self.checker_timeout,
            fails_after: drain.readiness_fail_delay(),
            checker_ranges: self.checker_ranges.clone(),
            grace: drain.grace(),
            // Never more than half the deadline: a short grace period
            // still leaves the wait half of it.
            app_time: self.app_time.min(deadline / 2),
            load_balancer_checks: self.load_balancer_checks.clone(),
        }
    }
}

/// A count of failed probes in a row, 1 to 100.
pub mod threshold {
    use super::*;

    /// From its text (a flag's, an env variable's, a file's).
    pub fn parse(s: &str) -> Result<u32, ValueError> {
        let n: u32 = s.trim().parse().map_err(|_| ValueError::NotAThreshold)?;
        check(n)
    }

    fn check(n: u32) -> Result<u32, ValueError> {
        match n {
            1..=100 => Ok(n),
            _ => Err(ValueError::NotAThreshold),
        }
    }
}

/// An address range: `35.191.0.0/16`, `2600:2d00:1:b029::/64`, or one
/// address (`10.0.0.5`, a range of one).
pub fn range(s: &str) -> Result<IpNet, ValueError> {
    let s = s.trim();
    if let Ok(net) = s.parse::<IpNet>() {
        return Ok(net.trunc());
    }
    s.parse::<std::net::IpAddr>()
        .map(IpNet::from)
        .map_err(|_| ValueError::NotARange)
}

/// Address ranges, as a user writes them.
fn ranges_shown<S: serde::Serializer>(v: &[IpNet], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(ToString::to_string))
}
