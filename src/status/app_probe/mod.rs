//! The app's own probes and hooks, served on the status port.

pub mod spec;
