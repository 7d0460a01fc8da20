//! What the drain wait still waits for, and how Envoy's own health checks
//! stand: values the wait publishes at each read, put in words only where
//! they are shown (`GET /drain`, the log, the drain's verdict).

use std::fmt;
use std::time::Duration;

use super::checkers::CheckerKey;
use super::rule::ms;
use lifeguard_base::duration::GoDuration;

/// What the wait still waits for, as of its last read.
#[derive(Debug, Clone, PartialEq)]
pub enum WaitingOn {
    /// Before the drain: its start.
    DrainToBegin,
    /// The readiness-fail delay: readiness to turn 503.
    ReadinessToFail,
    /// Checkers still checking, and whether probers too many to follow
    /// hold the wait too.
    Checkers { pending: Vec<Pending>, unfollowed: bool },
    /// Probers too many to follow only, held until the checker timeout,
    /// `left` from the read.
    Unfollowed { left: Duration },
    /// No new request for `quiet`; none for `so_far` at the read.
    Quiet { quiet: Duration, so_far: Duration },
}

/// A checker still checking, as the read found it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    pub key: CheckerKey,
    /// Counted among the checkers (false: the table had no room).
    pub counted: bool,
    pub failures_in_row: u32,
    /// Its threshold: the configured one, or its software's own.
    pub threshold: u32,
    pub interval: Duration,
}

impl fmt::Display for WaitingOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitingOn::DrainToBegin => f.write_str("the drain to begin (the proxy's SIGTERM or POST /drain)"),
            WaitingOn::ReadinessToFail => f.write_str("readiness to turn 503 (--readiness-fail-delay)"),
            WaitingOn::Checkers { pending, unfollowed } => {
                let noun = if pending.len() == 1 { "checker" } else { "checkers" };
                write!(f, "{} {noun}: ", pending.len())?;
                for (i, c) in pending.iter().enumerate() {
                    write!(
                        f,
                        "{}{}{} ({} of {} failures in a row, every {})",
                        if i > 0 { ", " } else { "" },
                        c.key,
                        if c.counted { "" } else { " [not counted: no room]" },
                        c.failures_in_row,
                        c.threshold,
                        GoDuration(ms(c.interval))
                    )?;
                }
                if *unfollowed {
                    f.write_str("; and probers too many to follow")?;
                }
                Ok(())
            }
            WaitingOn::Unfollowed { left } => write!(
                f,
                "probers whose probes were not counted and too many to follow (a flood of agents?): held until the checker timeout, {} from now",
                GoDuration(ms(*left))
            ),
            WaitingOn::Quiet { quiet, so_far } => write!(
                f,
                "no new request for {} (none for {} so far)",
                GoDuration(ms(*quiet)),
                GoDuration(ms(*so_far))
            ),
        }
    }
}

lifeguard_base::serialize_as_display!(WaitingOn);

/// How Envoy's own answers to the load balancers' checks stand (its
/// `health_check` filter, failed with `POST /healthcheck/fail` once
/// readiness turns 503).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthChecks {
    /// Before the drain's 503: Envoy passes them.
    Passing,
    /// Envoy fails them, wherever they are sent.
    Failing,
    /// No inbound listener has the filter: nothing to fail.
    NoFilter,
    /// Asking Envoy failed (asked again every second), and why.
    NotFailedYet(String),
}

/// In JSON, its words: `passing`, `failing`, ...
impl fmt::Display for HealthChecks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HealthChecks::Passing => f.write_str("passing"),
            HealthChecks::Failing => f.write_str("failing"),
            HealthChecks::NoFilter => f.write_str("passing: no inbound listener has Envoy's health_check filter"),
            HealthChecks::NotFailedYet(why) => write!(f, "could not fail them yet: {why}"),
        }
    }
}

lifeguard_base::serialize_as_display!(HealthChecks);
