//! The small pieces the drain's wait is made of, each named for its one
//! rule: when the policy is satisfied ([`DoneRule`]), how far apart reads
//! are ([`Pacer`]), what the drain waits on in words ([`waiting_on`]) and
//! its progress log ([`Progress`]).

use std::time::Duration;

use tokio::time::Instant;

use super::plan::{DrainUntil, Plan};
use super::ports::Work;
use super::{APP_QUIET, PACE, PROGRESS_EVERY, ZERO_POLL_INTERVAL};
use crate::duration::Display as D;

/// When the policy is satisfied. Only counts read *now* can satisfy it: an
/// older zero may be stale (a graceful drain still accepts connections).
pub(crate) struct DoneRule {
    policy: DrainUntil,
    /// The fixed policy's end, or the exit-on-zero policies' earliest end.
    min_end: Instant,
    /// How often to read when nothing else sets the pace.
    period: Duration,
    /// Since when every read said nothing is left (None: the last read
    /// found work, or failed).
    zero_since: Option<Instant>,
}

impl DoneRule {
    pub(crate) fn new(plan: &Plan, drain_began: Instant) -> Self {
        let (period, min_end) = match plan.policy {
            DrainUntil::Time => (plan.report_every, drain_began + plan.drain_time),
            _ => (ZERO_POLL_INTERVAL, drain_began + plan.minimum),
        };
        Self {
            policy: plan.policy,
            min_end,
            period,
            zero_since: None,
        }
    }

    /// Whether the drain is over at `now`, given the count the policy counts
    /// as read now (None: unknown now).
    pub(crate) fn done(&mut self, now: Instant, count_now: Option<u64>) -> bool {
        self.zero_since = match count_now {
            Some(0) => self.zero_since.or(Some(now)),
            _ => None,
        };
        match self.policy {
            DrainUntil::Time => now >= self.min_end,
            // The app may hold nothing for a moment between two steps of
            // its shutdown (its last answer, its first call out): it is done
            // when nothing was seen for APP_QUIET.
            DrainUntil::AppExit => {
                now >= self.min_end && self.zero_since.is_some_and(|t| now.duration_since(t) >= APP_QUIET)
            }
            _ => now >= self.min_end && count_now == Some(0),
        }
    }

    /// When the next read may start at the latest: the fixed policy reads
    /// once more when its time is up.
    pub(crate) fn cap(&self, next: Instant) -> Instant {
        match self.policy {
            DrainUntil::Time => next.min(self.min_end),
            _ => next,
        }
    }

    pub(crate) fn period(&self) -> Duration {
        self.period
    }
}

/// Spaces the drain's reads. Envoy answers admin calls on its main thread,
/// the one that applies xDS: a read starts [`PACE`] times the median of the
/// last three answered reads' time after the one before (the shortest,
/// until there are three), and never closer than the policy's period. So
/// one read slowed by a busy CPU here does not stall the drain, while a
/// config that makes every read slow is paced by it. A read that timed out
/// says nothing of what a read costs Envoy (it may have waited behind
/// something else) and is left out.
#[derive(Default)]
pub(crate) struct Pacer {
    recent: Vec<Duration>,
}

impl Pacer {
    /// An answered read took `took`.
    pub(crate) fn answered(&mut self, took: Duration) {
        if self.recent.len() == 3 {
            self.recent.remove(0);
        }
        self.recent.push(took);
    }

    /// The gap from the start of one read to the start of the next.
    pub(crate) fn gap(&self, period: Duration) -> Duration {
        let mut sorted = self.recent.clone();
        sorted.sort_unstable();
        let cost = match sorted.len() {
            3 => sorted[1],
            _ => sorted.first().copied().unwrap_or(Duration::ZERO),
        };
        period.max(cost.saturating_mul(PACE))
    }
}

/// The drain's progress log: one line per change of the count, at most one
/// a second; a change that comes too soon is logged once a line is due, so
/// the last change is not lost.
#[derive(Default)]
pub(crate) struct Progress {
    logged: Option<u64>,
    last_line: Option<Instant>,
}

impl Progress {
    pub(crate) fn observe(&mut self, now: Instant, count: u64, counting: &'static str) {
        let due = self.last_line.is_none_or(|t| now.duration_since(t) >= PROGRESS_EVERY);
        if self.logged != Some(count) && due {
            tracing::info!(active = count, counting, "draining");
            self.logged = Some(count);
            self.last_line = Some(now);
        }
    }
}

/// What the drain waits on now, in words; None when nothing.
pub(crate) fn waiting_on(plan: &Plan, envoy: u64, app: Option<&Work>) -> Option<String> {
    let mut parts = Vec::new();
    if envoy > 0 {
        parts.push(format!("{envoy} {}", plan.counted()));
    }
    if let Some(work) = app.filter(|w| !w.is_done()) {
        parts.push(work.to_string());
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// The line that says the policy is satisfied.
pub(crate) fn log_done(plan: &Plan, left: Option<u64>, took: Duration) {
    match plan.policy {
        DrainUntil::Time => tracing::info!(in_flight = left, "drain time ({}) is over", D(plan.drain_time)),
        DrainUntil::AppExit => tracing::info!(took = %D(took), "the app is done and Envoy is idle"),
        until => tracing::info!(took = %D(took), "zero active {until}"),
    }
}
