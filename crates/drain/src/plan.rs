//! What the drain is told to do: the policy ([`DrainUntil`]), which
//! listeners drain ([`DrainScope`]) and the times ([`Plan`]), derived from
//! the settings in one place (`crate::agent`).

use std::time::Duration;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use super::ports::Active;
pub(crate) use super::ports::DrainScope;
use super::LAST_READ_TIMEOUT;
use crate::duration::GoDuration;

/// The drain's settings (`Settings::drain_plan` in [`crate::config`]).
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) drain_until: DrainUntil,
    /// `app-exit` by default (not asked for): a pod in which no socket or
    /// process of an app was ever seen when the drain begins is a pod whose
    /// only container is the proxy (a gateway), and drains `out-of-rotation`.
    pub(crate) gateway_without_app: bool,
    /// Which listeners Envoy drains.
    pub(crate) scope: DrainScope,
    /// Pause between readiness turning 503 and Envoy's drain.
    pub(crate) drain_delay: Duration,
    /// Time readiness keeps answering as Envoy does once Envoy's drain has
    /// begun (the opposite order of `delay`).
    pub(crate) readiness_fail_delay: Duration,
    /// The fixed policy's drain time.
    pub(crate) termination_drain_duration: Duration,
    /// The exit-on-zero policies' shortest drain.
    pub(crate) minimum_drain_duration: Duration,
    /// From the start of the drain to Envoy's stop, at the latest.
    pub(crate) drain_deadline: Duration,
    /// Timeout of one admin call.
    pub(crate) admin_timeout: Duration,
    /// How long Envoy gets to exit after SIGTERM before SIGKILL.
    pub(crate) shutdown_margin: Duration,
    /// How often the fixed policy reads the counts, for reporting.
    pub(crate) poll_interval: Duration,
}

impl Plan {
    /// The time policy with the defaults' durations: for the status
    /// service's tests and the fuzz targets, whose drain is never run.
    #[cfg(any(test, fuzzing))]
    pub(crate) fn for_status_tests() -> Plan {
        Plan {
            drain_until: DrainUntil::Time,
            gateway_without_app: false,
            scope: DrainScope::Inbound,
            drain_delay: Duration::ZERO,
            readiness_fail_delay: Duration::ZERO,
            termination_drain_duration: Duration::from_secs(5),
            minimum_drain_duration: Duration::from_secs(5),
            drain_deadline: Duration::from_secs(28),
            admin_timeout: Duration::from_secs(1),
            shutdown_margin: Duration::from_secs(2),
            poll_interval: Duration::from_secs(1),
        }
    }

    /// The timeout of a drain read at (or past) the deadline, the read that
    /// says what Envoy is stopped with: a quarter of the shutdown margin
    /// (the rest is Envoy's to exit in), at least [`LAST_READ_TIMEOUT`], at
    /// most one admin call's timeout. 100 ms alone was too short on a busy
    /// machine: the read came back unknown, and so did what Envoy was
    /// stopped with.
    pub(crate) fn last_read_timeout(&self) -> Duration {
        (self.shutdown_margin / 4)
            .max(LAST_READ_TIMEOUT)
            .min(self.admin_timeout)
    }

    /// What the drain waits for, in words.
    pub(crate) fn waiting_for(&self) -> String {
        match self.drain_until {
            DrainUntil::Time => format!("{} of drain time", GoDuration(self.termination_drain_duration)),
            DrainUntil::AppExit => format!(
                "no request in Envoy and no socket or process of the app, after at least {}",
                GoDuration(self.minimum_drain_duration)
            ),
            DrainUntil::OutOfRotation => {
                "the load balancers to take the pod out (the drain wait's verdict), then no request in Envoy".to_owned()
            }
            until => format!(
                "zero active {until}, after at least {}",
                GoDuration(self.minimum_drain_duration)
            ),
        }
    }

    /// What the count counts under this policy. The fixed policy counts the
    /// work it would cut: requests and TCP-proxy connections.
    pub(crate) fn counted(&self) -> &'static str {
        match self.drain_until {
            DrainUntil::Connections => "connections",
            DrainUntil::Requests => "requests",
            DrainUntil::Time | DrainUntil::AppExit | DrainUntil::OutOfRotation => "requests in flight",
        }
    }

    /// What the count that ends the drain counts: with `app-exit`, the
    /// app's sockets and processes too.
    pub(crate) fn counted_in_all(&self) -> &'static str {
        match self.drain_until {
            DrainUntil::AppExit => "requests in flight, app sockets and app processes",
            _ => self.counted(),
        }
    }

    pub(crate) fn count(&self, active: &Active) -> u64 {
        match self.drain_until {
            DrainUntil::Connections => active.connections,
            DrainUntil::Requests => active.requests,
            DrainUntil::Time | DrainUntil::AppExit | DrainUntil::OutOfRotation => active.work(),
        }
    }
}

/// What the drain waits for before Envoy is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DrainUntil {
    /// A fixed time: `termination_drain_duration`.
    Time,
    /// Zero active downstream connections (after the minimum duration).
    Connections,
    /// Zero active downstream HTTP requests (after the minimum duration):
    /// idle keep-alive connections do not hold the pod.
    Requests,
    /// After the minimum duration, no request (HTTP or TCP proxy, inbound
    /// or outbound) active in Envoy and nothing left of the app in the pod:
    /// no socket, and with a shared process namespace no process.
    #[serde(rename = "app-exit")]
    AppExit,
    /// For a pod whose only container is the proxy (an ingress gateway):
    /// Envoy serves as before until every load balancer has taken the pod
    /// out and no new request came for the quiet period (the drain wait's
    /// verdict), then closes its connections at a request boundary and
    /// stops once no request is in flight.
    #[serde(rename = "out-of-rotation")]
    OutOfRotation,
}

crate::display_as_value!(DrainUntil);
