//! lifeguard: a sidecar agent that owns Envoy's readiness, drain and exit.
//!
//! The tree reads like the architecture, one folder per concern; each
//! module's doc says what it owns and why. Arrows run one way: the
//! composition root ([`agent`]) knows everything; the adapters ([`envoy`],
//! [`pod`]) implement the [`drain`]'s ports; [`drain`], [`istio`] and the
//! leaves (`duration`, `url`, `logging`) import nothing of the rest
//! (`tests/layout.rs` keeps it so).
//!
//! - [`agent`]: the composition root: every piece built from the settings
//!   and wired; signals.
//! - [`cli`]: the command line, parsed into what to run.
//! - [`config`]: every setting declared once; its layers and parsers.
//! - [`drain`]: the drain state machine, its value types and its ports.
//! - [`envoy`]: the admin client, the stats, readiness and its poller, the
//!   Envoy process.
//! - [`pod`]: what the app holds in the pod, from `/proc`; the reaper.
//! - [`drain_wait`]: the drain wait, whether the load balancers have taken
//!   the pod out of rotation (who checks the pod, the traffic, the rule).
//! - [`status`]: the status port's server, routes and connection slots.
//! - [`metrics`]: our families, their exposition, the merged scrape.
//! - [`exit`]: how the process ends: its exit code, decided in one place
//!   from how any run ended; the exit summary, the termination message,
//!   the linger.
//! - [`hooks`]: the pod hook helpers (`wait`, `wait-app-exit`, `drain`).
//! - [`inject`]: `lifeguard inject`, the pod's probes rewritten to the
//!   status port.
//! - [`istio`]: Istio's formats (the app probers, the Prometheus
//!   annotations, `PROXY_CONFIG`), read by config, status, metrics and
//!   inject.
//! - `duration`, `url`, `logging`, `peer`: Go durations, loopback URLs, log
//!   lines, the one key of a peer.
//! - `sys`: the `unsafe` calls (a pre-exec hook, one socket option, the
//!   allocator's collect) and the process's memory settings.

#![deny(unsafe_code)]
// No function over clippy.toml's too-many-lines-threshold (80 lines of
// code): a function reads in one screen. The agent's code only: a test's
// scenario may run longer.
#![warn(clippy::too_many_lines)]

// The fuzz targets name the agent `lifeguard::`; the unit tests run them
// (src/fuzzing.rs, the seeds' replay), so the crate answers to its name.
#[cfg(test)]
extern crate self as lifeguard;

/// `Display` for a clap `ValueEnum`: the value as the user types it
/// (`app-exit`, `inbound`, `json`).
macro_rules! display_as_value {
    ($t:ty) => {
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let value = clap::ValueEnum::to_possible_value(self).expect("no variant is skipped");
                f.write_str(value.get_name())
            }
        }
    };
}
pub(crate) use display_as_value;

pub mod agent;
pub mod cli;
pub mod config;
pub mod drain;
pub mod drain_wait;
pub mod duration;
pub mod envoy;
pub mod exit;
#[cfg(any(fuzzing, test))]
#[doc(hidden)]
pub mod fuzzing;
pub mod hooks;
pub mod inject;
pub mod istio;
pub mod local_http;
pub mod logging;
pub mod metrics;
pub mod peer;
pub mod pod;
pub mod status;
#[allow(unsafe_code)]
mod sys;
pub mod url;
