//! The pod around the proxy, as `/proc` shows it: what the app still holds
//! and the processes lifeguard must reap.
//!
//! - [`sockets`]: the namespace's TCP sockets and their owning processes.
//! - [`app`]: what the app still holds (sockets, processes by cgroup), the
//!   proxy known by pid: the drain's real [`crate::drain::AppControl`] and
//!   `wait-app-exit`'s evidence.
//! - [`reaper`]: reaping orphaned zombies as PID 1.

pub mod app;
pub mod reaper;
pub mod sockets;
