//! The rule that says the pod is out of rotation, in one place, free of
//! I/O so it runs in virtual time in the tests.
//!
//! From the start of the drain, at each read:
//!
//! 1. **Every checker is done.** A checker counts once it has probed twice
//!    (so it has an interval) and was still probing when the drain began.
//!    It is done when it has had its threshold of failed probes in a row
//!    (a load balancer that needs that many has taken the pod out: the
//!    configured threshold, or 1 for Envoy's checker, which takes a host
//!    out at its first failure), when it has not probed for twice its
//!    interval and a second (it stopped checking: deregistered the pod, or
//!    went away), or when it has held the wait for the checker timeout (no
//!    prober, real or not, holds the wait longer). Done stays done for the
//!    drain. A prober whose probes the table had no room to count
//!    (`Checker::counted` false) is waited for by the same rule: a probe
//!    not counted holds the wait, it never ends it; and while probes came
//!    that not even the second table could follow (`lifeguard_checkers`),
//!    the wait is held until the checker timeout.
//! 2. **No new request has arrived at Envoy's inbound listeners for the
//!    quiet period** (`quiet`: derived from the traffic before the
//!    drain), counted from the last read that saw one (a failed read counts
//!    as one: not knowing is not quiet; so does a read of other listeners
//!    than the last), and at the earliest from the start of the drain. This
//!    covers what the checkers cannot show: a load balancer that takes a
//!    while to act on its own verdict, a mesh or kube-proxy learning of the
//!    pod's removal from the control plane, and a load balancer that never
//!    health-checks.
//!
//! Out of rotation is both, at the same read. The rule never ends the wait
//! before the last checker is done; with traffic flowing, it ends a quiet
//! period after the traffic stopped. It also keeps when each checker was
//! done and when the last new request came: what the exit summary tells.

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::{ms, Arrivals, TrafficError};
use lifeguard_base::duration::GoDuration;
use lifeguard_checkers::Checker;
use lifeguard_drain::{CheckerKey, Conclusion, Pending, WaitingOn};

/// What a checker is, as the rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr, serde::Serialize)]
#[strum(serialize_all = "snake_case")]
#[serde(into = "&'static str")]
pub enum CheckerState {
    /// Probing, not yet failed enough times in a row: the wait waits for it.
    Checking,
    /// Failed its threshold of probes in a row: it has taken the pod out.
    Failed,
    /// Stopped probing during the drain: counted as done.
    Vanished,
    /// Held the wait for the checker timeout: no longer waited for.
    TimedOut,
    /// One probe only: no interval, not a checker (a person's curl).
    SeenOnce,
    /// Had stopped probing before the drain began: not counted.
    GoneBeforeDrain,
}

/// One checker in `GET /drain`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckerReport {
    /// The checker's address (the forwarded peer for probes through Envoy).
    pub peer: String,
    pub user_agent: Option<String>,
    /// Whether the address came from Envoy's `x-forwarded-for`.
    pub forwarded: bool,
    /// Whether its probes are counted (false: the table had no room for
    /// it; it holds the wait as a checker does, and never ends it).
    pub counted: bool,
    pub state: CheckerState,
    pub probes: u64,
    /// The longest recent gap between its probes.
    pub interval_seconds: Option<f64>,
    pub failures_in_row: u32,
    /// Its threshold: the configured one, or the one its software fixes.
    pub unhealthy_threshold: u32,
    pub last_probe_seconds_ago: f64,
    /// Seconds from the drain's start to when it was done (failed its
    /// threshold, stopped probing, or timed out).
    pub done_after_seconds: Option<f64>,
}

/// A step worth one log line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    /// A checker failed `failures` probes in a row.
    Failed { checker: String, failures: u32 },
    /// A checker stopped probing.
    Vanished { checker: String, silent: Duration },
    /// A checker held the wait for the checker timeout.
    TimedOut {
        checker: String,
        failures: u32,
        threshold: u32,
    },
    /// Probers too many to follow held the wait for the checker timeout.
    UnfollowedTimedOut,
    /// Every checker is done (how many); the quiet period decides now.
    CheckersDone { count: usize },
    /// A read of Envoy's inbound traffic failed.
    ReadFailed(TrafficError),
    /// Out of rotation.
    Out,
}

/// What one read concluded.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Evaluation {
    pub(crate) out: bool,
    pub(crate) checkers: Vec<CheckerReport>,
    /// What the wait still waits for (None when out).
    pub(crate) waiting_on: Option<WaitingOn>,
    /// How long the reads have shown no new request.
    pub(crate) quiet_for: Duration,
    pub(crate) steps: Vec<Step>,
}

/// The rule's terms for one drain (from the drain wait's plan and the
/// quiet period the traffic called for).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terms {
    /// Failed probes in a row that take the pod out, unless the checker's
    /// software fixes its own.
    pub(crate) threshold: u32,
    /// No checker holds the wait longer than this after the drain began.
    pub(crate) checker_timeout: Duration,
    /// No new request for this long: the traffic has stopped.
    pub(crate) quiet: Duration,
}

/// A checker done, how and when (sticky for the drain).
#[derive(Debug, Clone, Copy)]
struct Done {
    key: CheckerKey,
    counted: bool,
    state: CheckerState,
    at: Instant,
}

/// The rule's memory across reads, for one drain.
pub(crate) struct Rule {
    terms: Terms,
    began: Instant,
    done: Vec<Done>,
    /// Probers too many to follow held the wait until the checker
    /// timeout, and no longer do.
    unfollowed_done: bool,
    last: Option<Arrivals>,
    quiet_since: Instant,
    /// The end of the last read that saw a new request since the one
    /// before (None: none since the drain began).
    last_move: Option<Instant>,
    /// What the quiet was before the total last rose (see
    /// [`Rule::take_arrivals`]).
    before_rise: Option<BeforeRise>,
    all_done: bool,
    out: bool,
}

/// The rule's quiet before a rise of the inbound total: the total, when
/// the quiet began and when the last new request had been seen.
#[derive(Debug, Clone, Copy)]
struct BeforeRise {
    total: u64,
    quiet_since: Instant,
    last_move: Option<Instant>,
}

impl Rule {
    /// The rule for a drain that began at `began`.
    pub(crate) fn new(terms: Terms, began: Instant) -> Rule {
        Rule {
            terms: Terms {
                threshold: terms.threshold.max(1),
                ..terms
            },
            began,
            done: Vec::new(),
            unfollowed_done: false,
            last: None,
            quiet_since: began,
            last_move: None,
            before_rise: None,
            all_done: false,
            out: false,
        }
    }

    /// One read at `now`: the checkers as recorded, when the last probe
    /// came that no table could follow (`unfollowed`), and Envoy's inbound
    /// arrivals (Err: the read failed, with why).
    pub(crate) fn observe(
        &mut self,
        now: Instant,
        checkers: &[Checker],
        unfollowed: Option<Instant>,
        inbound: Result<Arrivals, TrafficError>,
    ) -> Evaluation {
        let mut steps = Vec::new();
        self.take_arrivals(now, inbound, &mut steps);
        let mut reports = Vec::with_capacity(checkers.len());
        let mut pending = Vec::new();
        for c in checkers {
            let state = self.state_of(c, now, &mut steps);
            if state == CheckerState::Checking {
                pending.push(c);
            }
            reports.push(self.report(c, state, now));
        }
        let unfollowed = self.unfollowed_holds(unfollowed, now, &mut steps);
        let counted = self.done.len();
        let all_done = pending.is_empty() && unfollowed.is_none();
        let newly_done = all_done && !self.all_done;
        self.all_done = all_done;
        let out = self.decide(pending.len(), unfollowed);
        match (out && !self.out, newly_done) {
            (true, _) => steps.push(Step::Out),
            (false, true) => steps.push(Step::CheckersDone { count: counted }),
            (false, false) => {}
        }
        self.out = out;
        let waiting_on = (!out).then(|| match (pending.is_empty(), unfollowed) {
            (false, _) => WaitingOn::Checkers {
                pending: pending.iter().map(|c| self.pending(c)).collect(),
                unfollowed: unfollowed.is_some(),
            },
            (true, Some(until)) => WaitingOn::Unfollowed {
                left: until.saturating_duration_since(now),
            },
            (true, None) => WaitingOn::Quiet {
                quiet: self.terms.quiet,
                so_far: self.quiet_for(),
            },
        });
        Evaluation {
            out,
            checkers: reports,
            waiting_on,
            quiet_for: self.quiet_for(),
            steps,
        }
    }

    /// The rule's one decision, as docs/drain.md's "The rule" states it:
    /// out of rotation once, at the same read, (1) every checker is done
    /// and (2) no new request came for the quiet period. Out stays out.
    /// Its inputs come from three places, each checkable on its own:
    /// `still_checking` counts the checkers [`Rule::state_of`] finds
    /// neither failed (its threshold of probes in a row), nor gone (no
    /// probe for its silence), nor timed out (the checker timeout since
    /// the drain began); `unfollowed_hold` is [`Rule::unfollowed_holds`]'s
    /// (probers no table could follow); and the quiet starts at the end of
    /// the last read that saw a new request ([`Rule::take_arrivals`]), so a
    /// read that began a quiet period later and found none shows it (the
    /// reads say so, not the clock).
    fn decide(&self, still_checking: usize, unfollowed_hold: Option<Instant>) -> bool {
        let every_checker_done = still_checking == 0 && unfollowed_hold.is_none();
        let quiet_until = self.quiet_since + self.terms.quiet;
        let no_new_request = self.last.is_some_and(|last| last.read >= quiet_until);
        self.out || (every_checker_done && no_new_request)
    }

    /// What a read of Envoy's inbound arrivals says of the quiet. A rise
    /// of the total is a new request: the quiet starts again at the end of
    /// the read that saw it. But Envoy counts a health check among the
    /// requests when it arrives and among the checks (subtracted) when it
    /// completes, so a read between the two sees a check in progress as a
    /// request, and the next read finds the total back down. Requests are
    /// never uncounted: a total back to (or below) the one before the last
    /// rise says nothing new came since, and the quiet is what it was
    /// before that rise. A fall alone is no new request.
    fn take_arrivals(&mut self, now: Instant, inbound: Result<Arrivals, TrafficError>, steps: &mut Vec<Step>) {
        match inbound {
            Ok(arrivals) => {
                match self.last {
                    // The same read again: nothing new is known.
                    Some(last) if last.seq == arrivals.seq => {}
                    // The same total, or a lower one, in a newer read: quiet
                    // up to when it began.
                    Some(last) if last.generation == arrivals.generation && arrivals.total <= last.total => {
                        if let Some(before) = self.before_rise.filter(|b| arrivals.total <= b.total) {
                            self.quiet_since = before.quiet_since;
                            self.last_move = before.last_move;
                            self.before_rise = None;
                        }
                        self.last = Some(arrivals);
                    }
                    // A first read, or the total rose: quiet counts from its
                    // end (nothing is known of the time before it).
                    previous => {
                        match previous.filter(|p| p.generation == arrivals.generation) {
                            Some(p) => {
                                self.before_rise = Some(BeforeRise {
                                    total: p.total,
                                    quiet_since: self.quiet_since,
                                    last_move: self.last_move,
                                });
                                self.last_move = Some(arrivals.read_end());
                            }
                            None => self.before_rise = None,
                        }
                        self.quiet_since = arrivals.read_end();
                        self.last = Some(arrivals);
                    }
                }
            }
            Err(why) => {
                // Not knowing is not quiet: the next read starts over.
                self.quiet_since = now;
                self.last = None;
                self.before_rise = None;
                steps.push(Step::ReadFailed(why));
            }
        }
    }

    /// Until when probers no table could follow hold the wait (None: they
    /// do not): one came since the checker timeout before the drain, and
    /// the checker timeout since it (or since the drain began) has not
    /// passed. Such a prober, if a checker with an interval no longer than
    /// the timeout, would have been heard from again within it.
    fn unfollowed_holds(&mut self, last: Option<Instant>, now: Instant, steps: &mut Vec<Step>) -> Option<Instant> {
        let last = last?;
        if self.unfollowed_done {
            return None;
        }
        let until = last.min(self.began) + self.terms.checker_timeout;
        if now < until {
            return Some(until);
        }
        if last + self.terms.checker_timeout > self.began {
            self.unfollowed_done = true;
            steps.push(Step::UnfollowedTimedOut);
        }
        None
    }

    /// How long the reads have shown no new request: from the last move to
    /// the newest read that found none.
    pub(crate) fn quiet_for(&self) -> Duration {
        self.last.map_or(Duration::ZERO, |last| {
            last.read.saturating_duration_since(self.quiet_since)
        })
    }

    /// When the last new request was seen after the drain began: the end
    /// of the read that first showed it (None: none came).
    pub(crate) fn traffic_stopped(&self) -> Option<Instant> {
        self.last_move
    }

    /// When the last checker was done (None: none was).
    pub(crate) fn last_checker_done(&self) -> Option<Instant> {
        self.done.iter().map(|d| d.at).max()
    }

    /// Out of rotation, once it is: how each checker ended, and the quiet
    /// period kept.
    pub(crate) fn conclusion(&self) -> Conclusion {
        let count = |state| self.done.iter().filter(|d| d.counted && d.state == state).count();
        Conclusion {
            failed: count(CheckerState::Failed),
            vanished: count(CheckerState::Vanished),
            timed_out: count(CheckerState::TimedOut),
            uncounted: self.done.iter().filter(|d| !d.counted).count(),
            unfollowed: self.unfollowed_done,
            quiet: self.terms.quiet,
        }
    }

    fn threshold_of(&self, key: &CheckerKey) -> u32 {
        key.fixed_threshold().unwrap_or(self.terms.threshold)
    }

    fn done_of(&self, c: &Checker) -> Option<&Done> {
        self.done.iter().find(|d| d.key == c.key && d.counted == c.counted)
    }

    fn state_of(&mut self, c: &Checker, now: Instant, steps: &mut Vec<Step>) -> CheckerState {
        if let Some(done) = self.done_of(c) {
            return done.state;
        }
        let Some(silent_after) = c.silent_after() else {
            return CheckerState::SeenOnce;
        };
        if c.last_seen + silent_after < self.began {
            return CheckerState::GoneBeforeDrain;
        }
        let threshold = self.threshold_of(&c.key);
        let state = if c.failures_in_row >= threshold {
            steps.push(Step::Failed {
                checker: describe(c),
                failures: c.failures_in_row,
            });
            CheckerState::Failed
        } else if now.saturating_duration_since(c.last_seen) > silent_after {
            steps.push(Step::Vanished {
                checker: describe(c),
                silent: now.saturating_duration_since(c.last_seen),
            });
            CheckerState::Vanished
        } else if now.saturating_duration_since(self.began) >= self.terms.checker_timeout {
            steps.push(Step::TimedOut {
                checker: describe(c),
                failures: c.failures_in_row,
                threshold,
            });
            CheckerState::TimedOut
        } else {
            return CheckerState::Checking;
        };
        self.done.push(Done {
            key: c.key,
            counted: c.counted,
            state,
            at: now,
        });
        state
    }

    /// `checker 10.0.0.5 (1 of 3 failures, every 1s)` for each pending one.
    fn pending(&self, c: &Checker) -> Pending {
        Pending {
            key: c.key,
            counted: c.counted,
            failures_in_row: c.failures_in_row,
            threshold: self.threshold_of(&c.key),
            interval: c.interval.unwrap_or_default(),
        }
    }

    fn report(&self, c: &Checker, state: CheckerState, now: Instant) -> CheckerReport {
        let done = self
            .done_of(c)
            .map(|d| d.at.saturating_duration_since(self.began).as_secs_f64());
        CheckerReport {
            peer: c.key.ip.to_string(),
            user_agent: c.key.agent(),
            forwarded: c.key.forwarded,
            counted: c.counted,
            state,
            probes: c.probes,
            interval_seconds: c.interval.map(|d| d.as_secs_f64()),
            failures_in_row: c.failures_in_row,
            unhealthy_threshold: self.threshold_of(&c.key),
            last_probe_seconds_ago: now.saturating_duration_since(c.last_seen).as_secs_f64(),
            done_after_seconds: done,
        }
    }
}

/// The wait held for probers too many to follow, in words.
/// The checkers as they stand before the drain, for `GET /drain`: each one
/// with an interval is checking (or was, if it has stopped), the others
/// were seen once.
pub(crate) fn before_drain(checkers: &[Checker], threshold: u32, now: Instant) -> Vec<CheckerReport> {
    let rule = Rule::new(
        Terms {
            threshold,
            checker_timeout: Duration::MAX,
            quiet: Duration::ZERO,
        },
        now,
    );
    checkers
        .iter()
        .map(|c| {
            let state = match c.silent_after() {
                None => CheckerState::SeenOnce,
                Some(after) if now.saturating_duration_since(c.last_seen) > after => CheckerState::GoneBeforeDrain,
                Some(_) => CheckerState::Checking,
            };
            rule.report(c, state, now)
        })
        .collect()
}

/// A checker for the log: `10.0.0.5 (every 1s)`.
fn describe(c: &Checker) -> String {
    let uncounted = if c.counted { "" } else { " [not counted: no room]" };
    format!(
        "{}{uncounted} (every {})",
        c.key,
        GoDuration(ms(c.interval.unwrap_or_default()))
    )
}

#[cfg(test)]
mod tests;
