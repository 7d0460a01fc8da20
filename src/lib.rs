//! lifeguard: a sidecar agent that owns Envoy's readiness, drain and exit.
//!
//! This crate is the binary's: its command line ([`cli`]: the subcommands,
//! each made of its crate's options, and `check`'s report), and [`agent`],
//! its composition root, which wires the crates of the workspace (one per
//! concern, drawn in docs/architecture.md) and decides nothing of its own.
//! Each crate is re-exported here under its concern's name
//! (`lifeguard::envoy` is `lifeguard_envoy`), for the tests, the
//! benchmarks and the fuzz targets.

pub mod agent;
pub mod cli;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod fuzzing;

pub use lifeguard_base::{duration, peer, url};
pub use lifeguard_checkers as checkers;
pub use lifeguard_config as config;
pub use lifeguard_drain as drain;
pub use lifeguard_drain_wait as drain_wait;
pub use lifeguard_envoy as envoy;
pub use lifeguard_exit as exit;
pub use lifeguard_hooks as hooks;
pub use lifeguard_http as http;
pub use lifeguard_inject as inject;
pub use lifeguard_istio as istio;
pub use lifeguard_logging as logging;
pub use lifeguard_metrics as metrics;
pub use lifeguard_pod as pod;
pub use lifeguard_scrape as scrape;
pub use lifeguard_status as status;
pub use lifeguard_sys as sys;
