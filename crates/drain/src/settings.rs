//! The drain's settings (the grace period, the margin, the delays, the
//! policy and its times, which listeners drain), and the [`Plan`] they
//! make once the rules across them hold ([`PlanError`] when one does not).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use clap::Args;
use lifeguard_base::duration::{DurationError, GoDuration};
use lifeguard_base::grace::{Grace, GraceError};
use lifeguard_base::settings::{GoBool, PositiveSpan, SettingError, Span};
use serde::Serialize;

use crate::{DrainScope, DrainUntil, NodeChecks, Plan, SetAside, TerminatingReadiness};

/// The pod's grace period: a duration, or a bare number of seconds as
/// Kubernetes writes terminationGracePeriodSeconds (`30`); greater than
/// zero. Shown as a duration (`30s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GracePeriod(PositiveSpan);

impl GracePeriod {
    pub fn get(self) -> Duration {
        self.0.get()
    }
}

impl FromStr for GracePeriod {
    type Err = DurationError;
    fn from_str(s: &str) -> Result<GracePeriod, DurationError> {
        let bare = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let span = if bare { format!("{s}s").parse() } else { s.parse() };
        span.map(GracePeriod)
    }
}

impl fmt::Display for GracePeriod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

lifeguard_base::serialize_as_display!(GracePeriod);

/// The drain's settings. In the file: the section `[drain]`, a key a field.
#[derive(Debug, Clone, Args, Serialize)]
#[group(skip)]
pub struct Settings {
    /// The pod's terminationGracePeriodSeconds (a bare number counts as
    /// seconds); the drain ends by this minus the shutdown margin.
    #[arg(long, env = "TERMINATION_GRACE_PERIOD", value_name = "DURATION", default_value = "30s")]
    pub termination_grace_period: GracePeriod,

    /// Time kept back from the grace period to stop Envoy and exit (at
    /// least 100ms): the drain's deadline is the grace period less this.
    /// Envoy gets the rest of the grace period between SIGTERM and SIGKILL
    /// (less a quarter of this, for lifeguard's own exit).
    #[arg(long, env = "LIFEGUARD_SHUTDOWN_MARGIN", value_name = "DURATION", default_value = "2s")]
    pub shutdown_margin: Span,

    /// Pause after readiness turns 503 and before Envoy starts draining, so
    /// endpoint removal can propagate.
    #[arg(long, env = "LIFEGUARD_DRAIN_DELAY", value_name = "DURATION", default_value = "0s")]
    pub drain_delay: Span,

    /// Start Envoy's drain at once but keep readiness answering the load
    /// balancers as Envoy does for this long (the opposite order of
    /// --drain-delay), as Envoy Gateway's healthCheckFailureDelay: they
    /// see the 503 only then.
    #[arg(long, env = "LIFEGUARD_READINESS_FAIL_DELAY", value_name = "DURATION", default_value = "0s")]
    pub readiness_fail_delay: Span,

    /// Fixed policy: how long Envoy drains before it is stopped (5s when
    /// not given; given, it makes the fixed policy the default).
    #[arg(long, env = "TERMINATION_DRAIN_DURATION", value_name = "DURATION")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub termination_drain_duration: Option<Span>,

    /// Stop Envoy once its active downstream connections reach zero (true
    /// or false; makes --drain-until default to connections).
    #[arg(long, env = "EXIT_ON_ZERO_ACTIVE_CONNECTIONS", value_name = "BOOL", default_value = "false")]
    pub exit_on_zero_active_connections: GoBool,

    /// Exit-on-zero policies: the shortest drain.
    #[arg(long, env = "MINIMUM_DRAIN_DURATION", value_name = "DURATION", default_value = "5s")]
    pub minimum_drain_duration: Span,

    /// What the drain waits for: app-exit (Envoy idle and the app gone),
    /// out-of-rotation (a gateway: every load balancer has taken the pod
    /// out, then no request in flight), time (fixed), connections or
    /// requests (zero active). When not given: connections if
    /// --exit-on-zero-active-connections is true, time if
    /// --termination-drain-duration is given, out-of-rotation with
    /// --drain-scope all, app-exit otherwise (and out-of-rotation when the
    /// drain begins in a pod where no app was ever seen).
    #[arg(long, env = "LIFEGUARD_DRAIN_UNTIL", value_name = "WHAT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_until: Option<DrainUntil>,

    /// Which of Envoy's listeners drain: inbound (a sidecar:
    /// `drain_listeners?inboundonly`) or all (an ingress gateway, whose
    /// listeners carry no traffic direction).
    #[arg(long, env = "LIFEGUARD_DRAIN_SCOPE", value_name = "SCOPE", default_value = "inbound")]
    pub drain_scope: DrainScope,

    /// How the kubelet's readiness probe (User-Agent kube-probe/...) is
    /// answered in a drain the pod's termination started (a signal, or
    /// the preStop hook): serving (200 while Envoy is ready and accepts
    /// new connections, for the node's load balancers' time at most
    /// (--load-balancer-checks), so kube-proxy's terminating-endpoint
    /// fallback has somewhere to go until they let the node go, then 503,
    /// so announcers such as MetalLB withdraw the node; Envoy is not
    /// stopped before the load balancers' verdict, whatever the policy
    /// but app-exit) or failing (503 from the drain's start, as every
    /// other prober). Load balancers get 503 from the drain's start either
    /// way; an operator's POST /drain gives everyone 503.
    #[arg(long, env = "LIFEGUARD_TERMINATING_READINESS", value_name = "ANSWER", default_value = "serving")]
    pub terminating_readiness: TerminatingReadiness,
}

/// The fixed policy's drain when none is given (Istio's
/// `terminationDrainDuration` default).
pub(crate) const DEFAULT_TERMINATION_DRAIN_DURATION: Duration = Duration::from_secs(5);

/// How the drain reads Envoy: one admin call's timeout, and the interval
/// the fixed policy reads the counts at (the Envoy crate's settings).
#[derive(Debug, Clone, Copy)]
pub struct Reads {
    pub admin_timeout: Duration,
    pub poll_interval: Duration,
}

/// A rule across the drain's settings that does not hold.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Margin(#[from] GraceError),
    #[error("cannot be used with drain_delay: readiness fails first with drain_delay, last with readiness_fail_delay")]
    BothDelays(Duration),
}

impl SettingError for PlanError {
    fn key(&self) -> &'static str {
        match self {
            PlanError::Margin(_) => "shutdown_margin",
            PlanError::BothDelays(_) => "readiness_fail_delay",
        }
    }

    fn value(&self) -> String {
        let d = match self {
            PlanError::Margin(e) => e.margin(),
            PlanError::BothDelays(d) => *d,
        };
        GoDuration(d).to_string()
    }
}

impl Settings {
    /// The pod's grace period and the margin kept back from it.
    pub fn grace(&self) -> Result<Grace, GraceError> {
        Grace::new(self.termination_grace_period.get(), self.shutdown_margin.get())
    }

    /// The drain's plan; `reads` are the Envoy crate's, `node_checks` the
    /// drain wait's (`--load-balancer-checks`). The policy not given
    /// follows what was: the zero-connections flag, a fixed drain's
    /// duration, the scope.
    pub fn plan(&self, reads: Reads, node_checks: NodeChecks) -> Result<Plan, PlanError> {
        let grace = self.grace()?;
        let (drain_delay, readiness_fail_delay) = (self.drain_delay.get(), self.readiness_fail_delay.get());
        if !drain_delay.is_zero() && !readiness_fail_delay.is_zero() {
            return Err(PlanError::BothDelays(readiness_fail_delay));
        }
        let drain_until = match self.drain_until {
            Some(asked) => asked,
            None if self.exit_on_zero_active_connections.get() => DrainUntil::Connections,
            None if self.termination_drain_duration.is_some() => DrainUntil::Time,
            // A gateway: no app to wait for.
            None if self.drain_scope == DrainScope::All => DrainUntil::OutOfRotation,
            None => DrainUntil::AppExit,
        };
        // What was given and has no say under that policy: said, not
        // silently dropped (Istio's mesh-wide `terminationDrainDuration`
        // beside a pod's `EXIT_ON_ZERO_ACTIVE_CONNECTIONS` is common).
        let mut set_aside = Vec::new();
        if self.exit_on_zero_active_connections.get() && drain_until != DrainUntil::Connections {
            set_aside.push(SetAside {
                key: "exit_on_zero_active_connections",
                value: self.exit_on_zero_active_connections.to_string(),
            });
        }
        if let Some(given) = self
            .termination_drain_duration
            .filter(|_| drain_until != DrainUntil::Time)
        {
            set_aside.push(SetAside {
                key: "termination_drain_duration",
                value: given.to_string(),
            });
        }
        Ok(Plan {
            drain_until,
            asked: self.drain_until.is_some(),
            scope: self.drain_scope,
            drain_delay,
            readiness_fail_delay,
            termination_drain_duration: self
                .termination_drain_duration
                .map_or(DEFAULT_TERMINATION_DRAIN_DURATION, Span::get),
            minimum_drain_duration: self.minimum_drain_duration.get(),
            grace,
            admin_timeout: reads.admin_timeout,
            poll_interval: reads.poll_interval,
            terminating_readiness: self.terminating_readiness,
            node_checks,
            set_aside,
        })
    }
}

impl Plan {
    /// The time policy, asked for, with every other setting at its
    /// default (Envoy's reads: a 1 s timeout, every second): for the
    /// status service's tests, the drain's own and the fuzz targets'.
    #[cfg(any(test, feature = "testing"))]
    pub fn for_status_tests() -> Plan {
        let settings = Settings {
            drain_until: Some(DrainUntil::Time),
            ..lifeguard_base::settings::defaults()
        };
        let reads = Reads {
            admin_timeout: Duration::from_secs(1),
            poll_interval: Duration::from_secs(1),
        };
        settings.plan(reads, NodeChecks::default()).expect("the defaults hold")
    }
}
