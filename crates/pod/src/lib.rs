//! The pod around the proxy, as `/proc` shows it: what the app still holds
//! and the processes lifeguard must reap.
//!
//! - `sockets`: the namespace's TCP sockets and their owning processes.
//! - [`app`]: what the app still holds (sockets, processes by cgroup), the
//!   proxy known by pid: the drain's real [`lifeguard_drain::AppControl`] and
//!   `wait-app-exit`'s evidence.
//! - `exits`: the app's processes' exits as they happen (pidfds), which
//!   wake the drain.
//! - [`reaper`]: reaping orphaned zombies as PID 1.

pub mod app;
mod exits;
pub mod reaper;
mod sockets;

/// What the app-exit policy leaves out of the app. In the file: the
/// section `[pod]`, a key a field.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
#[group(skip)]
pub struct Settings {
    /// Local port of another sidecar whose sockets the app-exit policy and
    /// wait-app-exit leave out (repeatable).
    #[arg(long = "ignore-app-port", env = "LIFEGUARD_IGNORE_APP_PORTS", value_name = "PORT", value_delimiter = ',', value_parser = clap::value_parser!(u16).range(1..))]
    pub ignore_app_ports: Vec<u16>,
}
