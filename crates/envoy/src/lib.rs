//! Everything lifeguard knows about Envoy, and the only place that talks to
//! it.
//!
//! - [`admin`]: the admin API client and its transport: one timeout per
//!   call, bounded bodies, an observer told of every call (it knows nothing
//!   of metrics).
//! - [`stats`]: the parser of the plain-text `/stats` answer.
//! - [`counts`]: the drain's active counts, each connection and request
//!   counted once.
//! - [`state`]: `/ready`'s states and the readiness verdict on one answer
//!   to the readiness stats (xDS included).
//! - [`readiness`]: the snapshot the poller writes and the probe reads.
//! - [`poller`]: the background task that keeps that snapshot fresh.
//! - [`process`]: the Envoy process (lifeguard's child, or external): the
//!   drain's real [`lifeguard_drain::EnvoyControl`].
//! - [`inbound`]: new requests on the inbound listeners: the real
//!   [`lifeguard_drain_wait::Traffic`], for the drain wait.
//! - [`listeners`]: Envoy's listeners read from its config dump (parsing
//!   only).
//! - `settings`: how lifeguard reaches and reads Envoy ([`Settings`]), and
//!   the [`Plan`] it makes.
//! - [`version`]: Envoy's version, read once and logged, and why nothing
//!   lifeguard sends depends on it.
//!
//! Arrows run one way: this crate implements the drain's and the
//! drain wait's ports and never
//! reaches the status server or the metrics (the poller reports through
//! [`poller::ReadinessEvents`]).

pub mod admin;
pub mod counts;
pub mod inbound;
pub mod listeners;
pub mod poller;
pub mod process;
pub mod readiness;
mod settings;
pub mod state;
pub mod stats;
pub mod version;

pub use settings::{Plan, PollInterval, Settings, ALWAYS_IGNORED_PORTS};
