//! The small pieces the drain's wait is made of, each named for its one
//! rule: when the policy is satisfied ([`DoneRule`]), how far apart reads
//! are ([`Pacer`]) and its progress log ([`Progress`]).

use std::time::Duration;

use tokio::time::Instant;

use super::plan::{DrainUntil, Plan};
use super::ports::Work;
use super::status::{Awaiting, Remaining};
use super::{APP_QUIET, PACE, PROGRESS_EVERY, PROGRESS_HEARTBEAT, ZERO_POLL_INTERVAL};
use lifeguard_base::duration::GoDuration;

/// When the policy is satisfied. Only counts read *now* can satisfy it: an
/// older zero may be stale (a graceful drain still accepts connections).
pub(crate) struct DoneRule {
    policy: DrainUntil,
    /// The fixed policy's end, or the exit-on-zero policies' earliest end.
    pub(crate) min_end: Instant,
    /// How often to read when nothing else sets the pace.
    period: Duration,
    /// Since when every read said nothing is left (None: the last read
    /// found work, or failed).
    zero_since: Option<Instant>,
    /// How an `app-exit` drain began (None until its first reading of both
    /// Envoy and the app): with the app already gone, the minimum drain
    /// time, there for load balancers to see the 503 while the app still
    /// serves, is not waited out.
    began: Option<Began>,
}

/// How an `app-exit` drain began, decided once, from its first reading of
/// both Envoy and the app: that reading is exact (a socket counts only
/// when held across the read of the proxy's descriptors) and comes after
/// whatever told lifeguard to drain, so it says the same every time for
/// the same pod. Later readings do not change it: a moment of the app's
/// shutdown with nothing open, or a request from a load balancer, says
/// nothing of how the drain began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Began {
    /// The app's processes are seen (the pod shares its process namespace)
    /// and none is left, nor any app socket: a reading that cannot race
    /// with the app's last moments, as an exited process does not come
    /// back. Requests in Envoy then (a client still sending to the gone
    /// app: Envoy answers it 503 at once) are waited for, not the floor.
    Gone,
    /// What was there: the app's sockets or processes, requests in Envoy.
    Here(String),
    /// No app socket and no request, but the app's processes cannot be
    /// seen (no shared process namespace): an app that closed its listener
    /// at SIGTERM and has not yet made its next call looks the same as one
    /// that exited, so the minimum still applies.
    Unseen,
}

impl Began {
    /// How the drain began, from its first reading: `envoy`, the count the
    /// policy counts in Envoy; `work`, what the app held.
    pub(crate) fn from_reading(plan: &Plan, envoy: u64, work: &Work) -> Began {
        if work.gone() {
            return Began::Gone;
        }
        match Remaining::of(envoy, plan.counted(), Some(work)) {
            Some(what) => Began::Here(what.to_string()),
            None => Began::Unseen,
        }
    }

    /// Why the minimum drain time applies, for the log (None: it does not).
    pub(crate) fn why_the_minimum(&self) -> Option<String> {
        match self {
            Began::Gone => None,
            Began::Here(what) => Some(format!("the minimum drain time applies: the drain began with {what}")),
            Began::Unseen => Some(UNSEEN.to_owned()),
        }
    }
}

/// Why the minimum applies to a drain that began with nothing of the app
/// in sight.
const UNSEEN: &str = "the minimum drain time applies: the drain began with no app socket and no request in Envoy, but without a shared process namespace the app's processes cannot be seen: it may be between two steps of its shutdown";

impl DoneRule {
    pub(crate) fn new(plan: &Plan, drain_began: Instant) -> Self {
        let (period, min_end) = match plan.drain_until {
            DrainUntil::Time => (plan.poll_interval, drain_began + plan.termination_drain_duration),
            // The load balancers' verdict came before: no floor.
            DrainUntil::OutOfRotation => (ZERO_POLL_INTERVAL, drain_began),
            _ => (ZERO_POLL_INTERVAL, drain_began + plan.minimum_drain_duration),
        };
        Self {
            policy: plan.drain_until,
            min_end,
            period,
            zero_since: None,
            began: None,
        }
    }

    /// Takes a reading of both Envoy (`envoy`, the count the policy counts
    /// there) and the app: the first of an `app-exit` drain decides how it
    /// began, returned that once.
    pub(crate) fn first_reading(&mut self, plan: &Plan, envoy: u64, work: &Work) -> Option<Began> {
        if self.policy != DrainUntil::AppExit || self.began.is_some() {
            return None;
        }
        self.began = Some(Began::from_reading(plan, envoy, work));
        self.began.clone()
    }

    /// Whether the drain began with the app already gone.
    fn gone(&self) -> bool {
        self.began == Some(Began::Gone)
    }

    /// Whether the drain is over at `now`, given the count the policy counts
    /// as read by the read that began at `read_began` (None: unknown now).
    /// Nothing-left is dated from the start of the read that saw it: a read
    /// of the app's sockets takes a while, and two reads that each found
    /// nothing, begun `APP_QUIET` apart, show as much as their ends do.
    /// `app_gone`: that read saw the app's processes, and none is left.
    pub(crate) fn done(&mut self, read_began: Instant, now: Instant, count_now: Option<u64>, app_gone: bool) -> bool {
        self.zero_since = match count_now {
            Some(0) => self.zero_since.or(Some(read_began)),
            _ => None,
        };
        match self.policy {
            DrainUntil::Time => now >= self.min_end,
            // The app may hold nothing for a moment between two steps of
            // its shutdown (its last answer, its first call out): it is done
            // when nothing was seen for APP_QUIET. An app already gone when
            // the drain began needs no minimum: every new request fails
            // anyway, and the pod's other containers wait on Envoy.
            // Out of rotation: the load balancers have let go; what is in
            // flight ends (and, where the app is watched, nothing of it
            // shows), as for app-exit, with no floor.
            // An app whose processes are seen and all gone is not between
            // two steps: nothing left in Envoy then is enough.
            DrainUntil::AppExit | DrainUntil::OutOfRotation => {
                let quiet = self.zero_since.is_some_and(|t| now.duration_since(t) >= APP_QUIET);
                let settled = quiet || (app_gone && count_now == Some(0));
                settled && (now >= self.min_end || self.gone())
            }
            _ => now >= self.min_end && count_now == Some(0),
        }
    }

    /// Whether the drain ends before its minimum because the app was
    /// already gone when it began.
    pub(crate) fn floor_waived(&self, now: Instant) -> bool {
        self.gone() && now < self.min_end
    }

    /// When the next read may start at the latest: the fixed policy reads
    /// once more when its time is up; `app-exit`, once a read found nothing
    /// left, reads again as soon as that may end the drain (one read
    /// more, whatever the pacing: Envoy is stopped right after, or the
    /// streak is broken).
    pub(crate) fn cap(&self, next: Instant) -> Instant {
        match (self.policy, self.zero_since) {
            (DrainUntil::Time, _) => next.min(self.min_end),
            (DrainUntil::AppExit | DrainUntil::OutOfRotation, Some(since)) => {
                let may_end = (since + APP_QUIET).max(if self.gone() { since } else { self.min_end });
                next.min(may_end)
            }
            _ => next,
        }
    }

    pub(crate) fn period(&self) -> Duration {
        self.period
    }
}

/// How long a read of Envoy's stats is waited for, in its usual timeout
/// (the admin timeout): 1, then twice as long after each read in a row
/// that ran past it, up to 8 times. Envoy matches a `/stats` filter
/// against every stat it has (10,000 listeners: more than a second on a
/// busy node) and finishes a read its client gave up on: cut at the usual
/// timeout each time, a read that needs longer would cost Envoy that time
/// at every try and never be answered. The drain's count reads and the
/// drain wait's wait so, on one record the port keeps
/// ([`EnvoyControl::read_timeout`](crate::EnvoyControl::read_timeout)); the
/// readiness poller's stats reads, made only
/// until Envoy is first ready, double after timeouts and go back to the
/// usual timeout after any answer ([`Patience::reset`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Patience {
    /// Doublings of the usual timeout, 0 to 3.
    doublings: u32,
}

impl Patience {
    const MOST: u32 = 3;

    /// The next read's timeout when the usual one is `usual`.
    pub fn timeout(self, usual: Duration) -> Duration {
        usual.saturating_mul(1 << self.doublings)
    }

    /// A read ran past its timeout: the next waits twice as long.
    pub fn timed_out(&mut self) {
        self.doublings = (self.doublings + 1).min(Self::MOST);
    }

    /// A read answered after `took`: the next waits as long as this one
    /// needed, rounded up to a doubling of `usual`. A read that needed more
    /// than the usual timeout keeps its timeout: cut again at the usual
    /// one, every other read would be lost.
    pub fn answered(&mut self, took: Duration, usual: Duration) {
        self.doublings = (0..Self::MOST)
            .find(|&d| took <= usual.saturating_mul(1 << d))
            .unwrap_or(Self::MOST);
    }

    /// A read failed otherwise (refused, an error status): the next waits
    /// the usual timeout.
    pub fn reset(&mut self) {
        self.doublings = 0;
    }
}

/// Spaces the drain's reads (and, apart, its looks at the app: see
/// [`APP_SCAN`](crate::APP_SCAN)). Envoy answers admin calls on its main thread,
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

/// The drain's progress in the log: one line in words of what is still
/// awaited and the time left to the deadline, logged at once when what is
/// awaited changes (at most once per [`PROGRESS_EVERY`]) and every
/// [`PROGRESS_HEARTBEAT`] while it does not: a long wait is never silent.
#[derive(Default)]
pub(crate) struct Progress {
    /// What was awaited at the last line.
    logged: Option<Awaiting>,
    last_line: Option<Instant>,
}

impl Progress {
    /// Logs the line `line` writes if one is due; `awaited` is what it says
    /// is awaited (whose change is news).
    pub(crate) fn observe(&mut self, now: Instant, awaited: &Awaiting, line: impl FnOnce() -> String) {
        let since = self.last_line.map(|t| now.duration_since(t));
        let changed = self.logged.as_ref() != Some(awaited);
        let due = match since {
            None => true,
            Some(since) if changed => since >= PROGRESS_EVERY,
            Some(since) => since >= PROGRESS_HEARTBEAT,
        };
        if due {
            tracing::info!("draining: {}", line());
            self.logged = Some(awaited.clone());
            self.last_line = Some(now);
        }
    }
}

/// The line that says the policy is satisfied; `waived`: before the
/// minimum drain time, the app being gone from the start.
pub(crate) fn log_done(plan: &Plan, left: Option<u64>, took: Duration, waived: bool) {
    match plan.drain_until {
        DrainUntil::Time => tracing::info!(
            in_flight = left,
            "drain time ({}) is over",
            GoDuration(plan.termination_drain_duration)
        ),
        DrainUntil::AppExit if waived => tracing::info!(took = %GoDuration(took), "{GONE_BEFORE}"),
        DrainUntil::AppExit => tracing::info!(took = %GoDuration(took), "the app is done and Envoy is idle"),
        DrainUntil::OutOfRotation => {
            tracing::info!(took = %GoDuration(took), "out of rotation and no request in flight")
        }
        until => tracing::info!(took = %GoDuration(took), "zero active {until}"),
    }
}

/// Why an `app-exit` drain ended before its minimum time, with the reading
/// that said so.
pub(crate) const GONE_BEFORE: &str = "the app was already gone when the drain began (no process left in the app's containers, the pod sharing its process namespace; no app socket): Envoy stops once no request is in flight, without the minimum drain time";
