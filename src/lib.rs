//! lifeguard: a sidecar agent that owns Envoy's readiness, drain and exit.
//!
//! Layout, one module per concern:
//! - [`config`]: flags, env, TOML file and defaults, merged and validated once.
//! - [`duration`]: Go-style durations (`500ms`, `1m30s`).
//! - [`app`]: what the app still holds (sockets, processes), attributed by pid.
//! - [`admin`]: the Envoy admin API client (timeouts, bounded bodies).
//! - [`stats`]: the parser of Envoy's `/stats` text.
//! - [`readiness`]: the snapshot the poller writes and the probe reads.
//! - [`poller`]: the background task that reads Envoy and writes the snapshot.
//! - [`drain`]: the drain state machine: phase, deadline, policy, stopping Envoy.
//! - [`envoy`]: the Envoy process (child or external).
//! - [`metrics`]: our Prometheus metrics.
//! - [`scrape`]: the merged scrape: Envoy's metrics streamed, shared, gzipped.
//! - [`outcome`]: the exit summary, kept in the termination message.
//! - [`linger`]: after Envoy stops, waiting for a last scrape.
//! - [`logging`]: log lines as text or JSON.
//! - [`server`]: the status server on 15020 (tower service on hyper).
//! - [`connections`]: connection slots shared fairly between peers, and the
//!   write timeout of a status connection.
//! - [`hooks`]: the pod hook helpers (`wait`, `wait-app-exit`, `drain`).
//! - [`sockets`]: listening sockets and their owners, from /proc.
//! - [`cli`]: the command line of the `lifeguard` binary.
//! - [`signals`]: process signals, handed to the drain.
//! - `sys`: the few raw system calls; the only module with `unsafe`.

#![deny(unsafe_code)]

pub mod admin;
pub mod app;
pub mod cli;
pub mod config;
pub mod connections;
pub mod drain;
pub mod duration;
pub mod envoy;
pub mod hooks;
pub mod linger;
pub mod logging;
pub mod metrics;
pub mod outcome;
pub mod poller;
pub mod readiness;
pub mod scrape;
pub mod server;
pub mod signals;
pub(crate) mod sockets;
pub mod stats;
#[allow(unsafe_code)]
mod sys;
pub mod url;
