//! How lifeguard reaches and reads Envoy, and what it tells Envoy: the
//! admin API's address and timeout, the reads' intervals, what ready
//! requires, Envoy's own drain time and the listeners the drain leaves out;
//! the [`Plan`] they make.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use clap::Args;
use lifeguard_base::duration::{self, DurationError, GoDuration};
use lifeguard_base::grace::Grace;
use lifeguard_base::settings::{PositiveSpan, Span};
use lifeguard_base::url::LoopbackUrl;
use serde::Serialize;

use lifeguard_drain::Reads;

use crate::poller::Schedule;
use crate::state::XdsCheck;

/// How often Envoy's admin is read: a duration of at least
/// [`PollInterval::MIN`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollInterval(Duration);

impl PollInterval {
    /// The shortest interval: 10ms.
    pub const MIN: Duration = Duration::from_millis(10);

    pub fn get(self) -> Duration {
        self.0
    }
}

impl FromStr for PollInterval {
    type Err = DurationError;
    fn from_str(s: &str) -> Result<PollInterval, DurationError> {
        duration::at_least(s, Self::MIN).map(PollInterval)
    }
}

impl fmt::Display for PollInterval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        GoDuration(self.0).fmt(f)
    }
}

lifeguard_base::serialize_as_display!(PollInterval);

/// Listener ports never waited for: Istio's status (15021) and Prometheus
/// (15090) listeners, whose own probe and scrape traffic never ends.
pub const ALWAYS_IGNORED_PORTS: [u16; 2] = [15021, 15090];

/// Envoy's settings. In the file: the section `[envoy]`, a key a field.
#[derive(Debug, Clone, Args, Serialize)]
#[group(skip)]
pub struct Settings {
    /// Envoy's admin API: a loopback URL (`localhost`: 127.0.0.1, else
    /// ::1), or a Unix socket (`unix:///PATH`, the locked form). Every
    /// admin call goes there: readiness, the drain, the counts, the merged
    /// scrape, the stop.
    #[arg(long, env = "LIFEGUARD_ADMIN_URL", value_name = "URL", default_value = "http://127.0.0.1:15000")]
    pub admin_url: LoopbackUrl,

    /// How often Envoy's admin is read once Envoy is ready (`/ready`; at
    /// least 10ms).
    #[arg(long, env = "LIFEGUARD_POLL_INTERVAL", value_name = "DURATION", default_value = "1s")]
    pub poll_interval: PollInterval,

    /// How often Envoy's admin is read while Envoy is not ready (the full
    /// stats check; at least 10ms).
    #[arg(long, env = "LIFEGUARD_STARTUP_POLL_INTERVAL", value_name = "DURATION", default_value = "100ms")]
    pub startup_poll_interval: PollInterval,

    /// Timeout of one admin API call: connect, request and body (the
    /// readiness, drain and drain wait reads of `/stats` wait twice as long
    /// after each that timed out, up to 8 times this).
    #[arg(long, env = "LIFEGUARD_ADMIN_TIMEOUT", value_name = "DURATION", default_value = "1s")]
    pub admin_timeout: PositiveSpan,

    /// Require the first CDS/LDS update: auto (when Envoy has those
    /// counters, as when fed by istiod), required, or off.
    #[arg(long, env = "LIFEGUARD_XDS_CHECK", value_name = "MODE", default_value = "auto")]
    pub xds_check: XdsCheck,

    /// Envoy's `--drain-time-s`, added to Envoy's command line unless it
    /// sets it: how long Envoy may take before it closes drained listeners
    /// (Istio's drainDuration). 0s: the grace period, so Envoy never closes
    /// them before lifeguard's deadline.
    #[arg(long, env = "LIFEGUARD_ENVOY_DRAIN_TIME", value_name = "DURATION", default_value = "0s")]
    pub envoy_drain_time: Span,

    /// Listener port whose connections the drain does not wait for
    /// (repeatable; 15021 and 15090 are always left out).
    #[arg(long = "ignore-listener-port", env = "LIFEGUARD_IGNORE_LISTENER_PORTS", value_name = "PORT", value_delimiter = ',', value_parser = clap::value_parser!(u16).range(1..))]
    pub ignore_listener_ports: Vec<u16>,
}

/// How lifeguard reads and runs Envoy.
#[derive(Debug, Clone)]
pub struct Plan {
    pub admin_url: LoopbackUrl,
    pub admin_timeout: Duration,
    /// When the poller reads, and what ready requires.
    pub schedule: Schedule,
    /// How old the last successful read may be before readiness stops
    /// trusting it: three poll intervals plus one read timeout.
    pub stale_after: Duration,
    /// Envoy's `--drain-time-s`.
    pub drain_time: Duration,
    /// The listener ports the drain does not wait for, the always ignored
    /// ones included; sorted.
    pub ignored_listener_ports: Vec<u16>,
}

impl Settings {
    /// How the drain reads Envoy.
    pub fn reads(&self) -> Reads {
        Reads {
            admin_timeout: self.admin_timeout.get(),
            poll_interval: self.poll_interval.get(),
        }
    }

    /// Envoy's plan, in a pod of this grace period (Envoy's drain time
    /// when none is set).
    pub fn plan(&self, grace: Grace) -> Plan {
        let mut ignored = self.ignore_listener_ports.clone();
        ignored.extend(ALWAYS_IGNORED_PORTS);
        ignored.sort_unstable();
        ignored.dedup();
        let Reads {
            admin_timeout,
            poll_interval,
        } = self.reads();
        Plan {
            admin_url: self.admin_url.clone(),
            admin_timeout,
            schedule: Schedule {
                poll_interval,
                startup_poll_interval: self.startup_poll_interval.get(),
                xds_check: self.xds_check,
            },
            stale_after: poll_interval * 3 + admin_timeout,
            drain_time: match self.envoy_drain_time.get() {
                t if t.is_zero() => grace.period(),
                t => t,
            },
            ignored_listener_ports: ignored,
        }
    }
}
