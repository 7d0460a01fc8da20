//! The vocabulary every layer of lifeguard shares, and nothing of what
//! lifeguard does: a crate with no lifeguard crate under it, and no HTTP,
//! log subscriber or system call (`lifeguard_http`, `lifeguard_logging`
//! and `lifeguard_sys` hold those, for the crates that use them), so the
//! drain builds on it alone.
//!
//! - [`duration`]: durations as Go (and Istio's users) write them.
//! - [`url`]: loopback URLs and Unix sockets, the only places lifeguard
//!   sends a request.
//! - [`peer`]: the one key of a peer, for every per-peer limit and table.
//! - [`throttle`]: a log line that can repeat, let through once a period.
//! - [`grace`]: the pod's grace period and the shutdown margin, one
//!   value the drain, the drain wait and the budget share.
//! - [`reason`]: counting by reason, one value per reason of a closed set.
//! - [`settings`]: what every crate's settings are made of: the value
//!   types clap and the file read alike (durations, Go's booleans), the
//!   error of a rule across settings.

/// `Display` for a clap `ValueEnum`: the value as the user types it
/// (`app-exit`, `inbound`, `json`). The crate that calls it names `clap`.
#[macro_export]
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

/// Serializes a type as its `Display` words (`GET /drain`'s JSON writes
/// typed states as the words the log shows).
#[macro_export]
macro_rules! serialize_as_display {
    ($t:ty) => {
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
    };
}

pub mod duration;
pub mod grace;
pub mod peer;
pub mod reason;
pub mod settings;
pub mod throttle;
pub mod url;
