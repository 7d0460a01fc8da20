//! How lifeguard reaches and reads Envoy, and what it tells Envoy: the
//! admin API's address and timeout, the reads' intervals, what ready
//! requires, Envoy's own drain time and the listeners the drain leaves out;
//! the [`Plan`] they make.

use lifeguard_base::grace::Grace;
use std::time::Duration;

use clap::Args;
use lifeguard_base::duration::{self, GoDuration};
use lifeguard_base::settings::{positive, span};
use lifeguard_base::url::LoopbackUrl;
use serde::Serialize;

use crate::poller::Schedule;
use crate::state::XdsCheck;

lifeguard_base::setting_value!(
    /// A loopback URL or a Unix socket.
    pub url: LoopbackUrl = <LoopbackUrl as std::str::FromStr>::from_str, shown as |u: &LoopbackUrl| u.clone()
);
lifeguard_base::setting_value!(
    /// A poll interval: at least 10ms.
    pub poll: Duration = |s| duration::at_least(s, Duration::from_millis(10)), shown as |d: &Duration| GoDuration(*d)
);

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
    #[arg(long, env = "LIFEGUARD_ADMIN_URL", value_name = "URL", default_value = "http://127.0.0.1:15000", value_parser = url::parse)]
    #[serde(serialize_with = "url::serialize")]
    pub admin_url: LoopbackUrl,

    /// How often Envoy's admin is read once Envoy is ready (`/ready`; at
    /// least 10ms).
    #[arg(long, env = "LIFEGUARD_POLL_INTERVAL", value_name = "DURATION", default_value = "1s", value_parser = poll::parse)]
    #[serde(serialize_with = "poll::serialize")]
    pub poll_interval: Duration,

    /// How often Envoy's admin is read while Envoy is not ready (the full
    /// stats check; at least 10ms).
    #[arg(long, env = "LIFEGUARD_STARTUP_POLL_INTERVAL", value_name = "DURATION", default_value = "100ms", value_parser = poll::parse)]
    #[serde(serialize_with = "poll::serialize")]
    pub startup_poll_interval: Duration,

    /// Timeout of one admin API call: connect, request and body.
    #[arg(long, env = "LIFEGUARD_ADMIN_TIMEOUT", value_name = "DURATION", default_value = "1s", value_parser = positive::parse)]
    #[serde(serialize_with = "positive::serialize")]
    pub admin_timeout: Duration,

    /// Require the first CDS/LDS update: auto (when Envoy has those
    /// counters, as when fed by istiod), required, or off.
    #[arg(long, env = "LIFEGUARD_XDS_CHECK", value_name = "MODE", default_value = "auto")]
    pub xds_check: XdsCheck,

    /// Envoy's `--drain-time-s`, added to Envoy's command line unless it
    /// sets it: how long Envoy may take before it closes drained listeners
    /// (Istio's drainDuration). 0s: the grace period, so Envoy never closes
    /// them before lifeguard's deadline.
    #[arg(long, env = "LIFEGUARD_ENVOY_DRAIN_TIME", value_name = "DURATION", default_value = "0s", value_parser = span::parse)]
    #[serde(serialize_with = "span::serialize")]
    pub envoy_drain_time: Duration,

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
    pub fn reads(&self) -> lifeguard_drain::Reads {
        lifeguard_drain::Reads {
            admin_timeout: self.admin_timeout,
            poll_interval: self.poll_interval,
        }
    }

    /// Envoy's plan, in a pod of this grace period (Envoy's drain time
    /// when none is set).
    pub fn plan(&self, grace: Grace) -> Plan {
        let mut ignored = self.ignore_listener_ports.clone();
        ignored.extend(ALWAYS_IGNORED_PORTS);
        ignored.sort_unstable();
        ignored.dedup();
        Plan {
            admin_url: self.admin_url.clone(),
            admin_timeout: self.admin_timeout,
            schedule: Schedule {
                poll_interval: self.poll_interval,
                startup_poll_interval: self.startup_poll_interval,
                xds_check: self.xds_check,
            },
            stale_after: self.poll_interval * 3 + self.admin_timeout,
            drain_time: match self.envoy_drain_time {
                t if t.is_zero() => grace.period(),
                t => t,
            },
            ignored_listener_ports: ignored,
        }
    }
}
