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
//!    that not even the second table could follow ([`super::checkers`]),
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

use super::checkers::Checker;
use super::{ms, Arrivals, TrafficError};
use lifeguard_base::duration::GoDuration;
use lifeguard_drain::{CheckerKey, Conclusion, Pending, WaitingOn};

/// What a checker is, as the rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::EnumIter, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
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

/// The rule's settings for one drain.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
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
    settings: Settings,
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
    all_done: bool,
    out: bool,
}

impl Rule {
    /// The rule for a drain that began at `began`.
    pub(crate) fn new(settings: Settings, began: Instant) -> Rule {
        Rule {
            settings: Settings {
                threshold: settings.threshold.max(1),
                ..settings
            },
            began,
            done: Vec::new(),
            unfollowed_done: false,
            last: None,
            quiet_since: began,
            last_move: None,
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
                quiet: self.settings.quiet,
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
        let quiet_until = self.quiet_since + self.settings.quiet;
        let no_new_request = self.last.is_some_and(|last| last.read >= quiet_until);
        self.out || (every_checker_done && no_new_request)
    }

    /// What a read of Envoy's inbound arrivals says of the quiet.
    fn take_arrivals(&mut self, now: Instant, inbound: Result<Arrivals, TrafficError>, steps: &mut Vec<Step>) {
        match inbound {
            Ok(arrivals) => {
                match self.last {
                    // The same read again: nothing new is known.
                    Some(last) if last.seq == arrivals.seq => {}
                    // The same total in a newer read: quiet up to when it began.
                    Some(last) if (last.total, last.generation) == (arrivals.total, arrivals.generation) => {
                        self.last = Some(arrivals);
                    }
                    // A first read, or the total moved: quiet counts from its
                    // end (nothing is known of the time before it).
                    previous => {
                        self.quiet_since = arrivals.read_end();
                        if previous.is_some_and(|p| p.generation == arrivals.generation) {
                            self.last_move = Some(arrivals.read_end());
                        }
                        self.last = Some(arrivals);
                    }
                }
            }
            Err(why) => {
                // Not knowing is not quiet: the next read starts over.
                self.quiet_since = now;
                self.last = None;
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
        let until = last.min(self.began) + self.settings.checker_timeout;
        if now < until {
            return Some(until);
        }
        if last + self.settings.checker_timeout > self.began {
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
            quiet: self.settings.quiet,
        }
    }

    fn threshold_of(&self, key: &CheckerKey) -> u32 {
        key.fixed_threshold().unwrap_or(self.settings.threshold)
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
        } else if now.saturating_duration_since(self.began) >= self.settings.checker_timeout {
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
        Settings {
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
mod tests {
    use super::*;
    use crate::checkers::checker_key;
    use crate::checkers::Checkers;
    use http::header::HeaderMap;
    use lifeguard_drain::ControlError;

    const SEC: Duration = Duration::from_secs(1);

    /// The default settings: threshold `threshold`, quiet for `quiet`, no
    /// checker held past 20 s.
    fn settings(threshold: u32, quiet: Duration) -> Settings {
        Settings {
            threshold,
            checker_timeout: Duration::from_secs(20),
            quiet,
        }
    }

    fn arrived(total: u64, read: Instant) -> Result<Arrivals, TrafficError> {
        Ok(Arrivals {
            seq: Arrivals::next_seq(),
            total,
            generation: 1,
            read,
            took: Duration::ZERO,
        })
    }

    fn key(last: u8) -> CheckerKey {
        checker_key(Some(([10, 0, 0, last], 4000).into()), &HeaderMap::new(), true).unwrap()
    }

    /// A load balancer's probes: every `every` from `from` to `until`,
    /// answered 200 before `fail_from` and 503 after.
    fn probes(
        k: CheckerKey,
        every: Duration,
        from: Instant,
        until: Instant,
        fail_from: Instant,
    ) -> Vec<(Instant, CheckerKey, bool)> {
        let mut out = Vec::new();
        let mut t = from;
        while t <= until {
            out.push((t, k, t < fail_from));
            t += every;
        }
        out
    }

    /// Runs the rule every 100 ms from `began` to `until`, the probes
    /// recorded as their time comes, with the inbound total given by
    /// `total(t)`; the instant it first said out, and every step.
    fn run(
        rule: &mut Rule,
        mut events: Vec<(Instant, CheckerKey, bool)>,
        began: Instant,
        until: Instant,
        total: impl Fn(Instant) -> Result<u64, TrafficError>,
    ) -> (Option<Instant>, Vec<Step>) {
        events.sort_by_key(|e| e.0);
        let checkers = Checkers::default();
        let mut events = events.into_iter().peekable();
        let mut steps = Vec::new();
        let mut t = began;
        while t <= until {
            while let Some((at, k, ok)) = events.next_if(|e| e.0 <= t) {
                checkers.record(k, at, ok);
            }
            let arrivals = total(t).map(|total| Arrivals {
                seq: Arrivals::next_seq(),
                total,
                generation: 1,
                read: t,
                took: Duration::ZERO,
            });
            let eval = rule.observe(t, &checkers.snapshot(), None, arrivals);
            steps.extend(eval.steps);
            if eval.out {
                return (Some(t), steps);
            }
            t += Duration::from_millis(100);
        }
        (None, steps)
    }

    /// Traffic at a fixed rate until `stop`: the total is the requests so far.
    fn traffic_until(began: Instant, stop: Instant) -> impl Fn(Instant) -> Result<u64, TrafficError> {
        move |t: Instant| {
            let upto = t.min(stop);
            Ok(upto.saturating_duration_since(began).as_millis() as u64 / 5)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_checker_fails_its_threshold_then_the_traffic_it_sent_goes_quiet() {
        let t0 = Instant::now();
        let began = t0 + 10 * SEC;
        // Every 1 s; the probes after the drain began fail (10.3, 11.3, 12.3 s).
        let lb = probes(key(5), SEC, t0 + Duration::from_millis(300), t0 + 30 * SEC, began);
        // The load balancer takes the pod out at its 2nd failure (11.3 s), so
        // traffic stops then; the rule's threshold is 3 (12.3 s).
        let stop = t0 + Duration::from_millis(11_300);
        let mut rule = Rule::new(settings(3, SEC), began);
        let (out, steps) = run(&mut rule, lb, began, t0 + 30 * SEC, traffic_until(began, stop));
        let out = out.expect("out of rotation");
        assert_eq!(
            out,
            t0 + Duration::from_millis(12_300),
            "at the 3rd failure, the traffic quiet by then"
        );
        assert_eq!(
            steps,
            [
                Step::Failed {
                    checker: "10.0.0.5 (every 1s)".into(),
                    failures: 3
                },
                Step::Out
            ]
        );
        assert_eq!(
            rule.conclusion().to_string(),
            "1 checker failed its threshold of probes in a row, and no new request came for 1s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn traffic_that_goes_on_after_the_checkers_are_done_holds_the_wait() {
        let t0 = Instant::now();
        let began = t0 + 10 * SEC;
        let lb = probes(key(5), SEC, t0, t0 + 30 * SEC, began);
        // A slow-propagating balancer: requests go on 4 s past the 3rd failure.
        let stop = t0 + 16 * SEC;
        let mut rule = Rule::new(settings(3, SEC), began);
        let (out, steps) = run(&mut rule, lb, began, t0 + 30 * SEC, traffic_until(began, stop));
        assert_eq!(out, Some(stop + SEC));
        assert_eq!(steps[1..], [Step::CheckersDone { count: 1 }, Step::Out], "{steps:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn two_checkers_wait_for_the_slower() {
        let t0 = Instant::now();
        let began = t0 + 10 * SEC;
        let mut lbs = probes(key(5), SEC, t0, t0 + 40 * SEC, began);
        lbs.extend(probes(
            key(6),
            2 * SEC,
            t0 + Duration::from_millis(500),
            t0 + 40 * SEC,
            began,
        ));
        let mut rule = Rule::new(settings(3, SEC), began);
        let (out, steps) = run(&mut rule, lbs, began, t0 + 40 * SEC, |_| Ok(7));
        // The fast one fails at 10, 11, 12 s; the slow one at 10.5, 12.5, 14.5 s.
        assert_eq!(out, Some(t0 + Duration::from_millis(14_500)));
        assert_eq!(
            steps[0],
            Step::Failed {
                checker: "10.0.0.5 (every 1s)".into(),
                failures: 3
            }
        );
        assert_eq!(
            steps[1],
            Step::Failed {
                checker: "10.0.0.6 (every 2s)".into(),
                failures: 3
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_checker_that_stops_probing_is_done_after_twice_its_interval_and_a_second() {
        let t0 = Instant::now();
        let began = t0 + 10 * SEC;
        // Probes every 2 s and stops at 12 s (it deregistered the pod).
        let lb = probes(key(5), 2 * SEC, t0, t0 + 12 * SEC, began);
        let mut rule = Rule::new(settings(3, SEC), began);
        let (out, steps) = run(&mut rule, lb, began, t0 + 30 * SEC, |_| Ok(1));
        // Silent from 12 s + 2 × 2 s + 1 s = 17 s.
        assert_eq!(out, Some(t0 + Duration::from_millis(17_100)));
        assert!(
            matches!(&steps[0], Step::Vanished { checker, .. } if checker == "10.0.0.5 (every 2s)"),
            "{steps:?}"
        );
        assert_eq!(steps[1..], [Step::Out]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_nobody_checks_is_out_after_the_quiet_period() {
        let t0 = Instant::now();
        // One probe by a person, and a checker that stopped long before.
        let mut seen = vec![(t0, key(9), true)];
        seen.extend(probes(key(5), SEC, t0, t0 + 3 * SEC, t0 + 60 * SEC));
        let began = t0 + 20 * SEC;
        let checkers = Checkers::default();
        for (t, k, ok) in &seen {
            checkers.record(*k, *t, *ok);
        }
        let mut rule = Rule::new(settings(3, SEC), began);
        let (out, _) = run(&mut rule, seen, began, t0 + 30 * SEC, |_| Ok(0));
        assert_eq!(out, Some(began + SEC));
        let eval = rule.observe(began + SEC, &checkers.snapshot(), None, arrived(0, began + SEC));
        let states: Vec<CheckerState> = eval.checkers.iter().map(|c| c.state).collect();
        assert_eq!(states, [CheckerState::SeenOnce, CheckerState::GoneBeforeDrain]);
        assert_eq!(
            rule.conclusion().to_string(),
            "no load balancer was seen checking the pod, and no new request came for 1s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_read_is_not_quiet() {
        let t0 = Instant::now();
        let mut rule = Rule::new(settings(3, SEC), t0);
        let fails_until = t0 + 5 * SEC;
        let timeout = TrafficError(ControlError::Failed("timeout".into()));
        let failed = timeout.clone();
        let total = move |t: Instant| {
            if t < fails_until {
                Err(failed.clone())
            } else {
                Ok(3)
            }
        };
        let (out, steps) = run(&mut rule, Vec::new(), t0, t0 + 10 * SEC, total);
        // Quiet counts again from the first read that answered.
        assert_eq!(out, Some(fails_until + SEC));
        assert_eq!(steps[0], Step::ReadFailed(timeout));
    }

    #[tokio::test(start_paused = true)]
    async fn a_checker_seen_first_during_the_drain_is_waited_for_and_the_words_say_so() {
        let t0 = Instant::now();
        let checkers = Checkers::default();
        let mut rule = Rule::new(settings(2, SEC), t0);
        checkers.record(key(5), t0 + SEC, false);
        checkers.record(key(5), t0 + 2 * SEC, true);
        let eval = rule.observe(t0 + 2 * SEC, &checkers.snapshot(), None, arrived(0, t0 + 2 * SEC));
        assert!(!eval.out);
        assert_eq!(
            eval.waiting_on.map(|w| w.to_string()).as_deref(),
            Some("1 checker: 10.0.0.5 (0 of 2 failures in a row, every 1s)")
        );
        checkers.record(key(5), t0 + 3 * SEC, false);
        checkers.record(key(5), t0 + 4 * SEC, false);
        let eval = rule.observe(t0 + 4 * SEC, &checkers.snapshot(), None, arrived(0, t0 + 4 * SEC));
        assert!(eval.out, "{eval:?}");
        assert_eq!(
            eval.steps[0],
            Step::Failed {
                checker: "10.0.0.5 (every 1s)".into(),
                failures: 2
            }
        );
    }

    fn agent_key(last: u8, agent: &'static str) -> CheckerKey {
        let mut h = HeaderMap::new();
        h.insert(http::header::USER_AGENT, http::header::HeaderValue::from_static(agent));
        checker_key(Some(([10, 0, 0, last], 4000).into()), &h, true).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn envoys_checker_is_done_at_its_first_failure() {
        let t0 = Instant::now();
        let began = t0 + 10 * SEC;
        // Envoy as the front proxy, checking every 1 s: the probe at 10.3 s
        // fails, and Envoy ejects the pod then; the threshold of 3 is for others.
        let envoy = probes(
            agent_key(5, "Envoy/HC"),
            SEC,
            t0 + Duration::from_millis(300),
            t0 + 30 * SEC,
            began,
        );
        let mut rule = Rule::new(settings(3, SEC), began);
        let (out, steps) = run(&mut rule, envoy, began, t0 + 30 * SEC, |_| Ok(7));
        assert_eq!(
            out,
            Some(t0 + Duration::from_millis(11_000)),
            "quiet from the drain's start, done at 10.3 s"
        );
        assert_eq!(
            steps[0],
            Step::Failed {
                checker: "10.0.0.5 (Envoy/HC) (every 1s)".into(),
                failures: 1
            }
        );
    }

    /// A peer that probes once a minute makes a checker with a 60 s
    /// interval: it fails a probe a minute, and would hold the wait for
    /// minutes; the checker timeout lets it go.
    #[tokio::test(start_paused = true)]
    async fn no_checker_holds_the_wait_past_the_checker_timeout() {
        let t0 = Instant::now();
        let began = t0 + 130 * SEC;
        let slow = probes(key(66), 60 * SEC, t0, t0 + 400 * SEC, began);
        let mut rule = Rule::new(settings(3, SEC), began);
        let (out, steps) = run(&mut rule, slow, began, t0 + 400 * SEC, |_| Ok(1));
        assert_eq!(out, Some(began + 20 * SEC));
        assert_eq!(
            steps[0],
            Step::TimedOut {
                checker: "10.0.0.66 (every 1m0s)".into(),
                failures: 0,
                threshold: 3
            }
        );
        assert_eq!(
            rule.conclusion().to_string(),
            "1 checker held the wait for the checker timeout, and no new request came for 1s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_of_other_listeners_is_not_quiet() {
        let t0 = Instant::now();
        let mut rule = Rule::new(settings(3, SEC), t0);
        let mut at = |t: Instant, total, generation| {
            let read = Arrivals {
                seq: Arrivals::next_seq(),
                total,
                generation,
                read: t,
                took: Duration::ZERO,
            };
            rule.observe(t, &[], None, Ok(read)).out
        };
        assert!(!at(t0, 5, 1));
        assert!(!at(t0 + Duration::from_millis(900), 5, 1));
        // The listeners changed: the same total of other listeners moved.
        assert!(!at(t0 + Duration::from_millis(950), 5, 2));
        assert!(!at(t0 + Duration::from_millis(1500), 5, 2));
        assert!(at(t0 + Duration::from_millis(1950), 5, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn the_conclusion_says_how_each_checker_ended() {
        let t0 = Instant::now();
        let began = t0 + 10 * SEC;
        let mut events = probes(key(5), SEC, t0, t0 + 30 * SEC, began);
        events.extend(probes(key(6), 2 * SEC, t0, t0 + 12 * SEC, began));
        events.extend(probes(key(7), 2 * SEC, t0, t0 + 14 * SEC, began));
        let mut rule = Rule::new(settings(3, SEC), began);
        let (out, _) = run(&mut rule, events, began, t0 + 30 * SEC, |_| Ok(1));
        assert!(out.is_some());
        assert_eq!(
            rule.conclusion().to_string(),
            "2 checkers failed their threshold of probes in a row, 1 checker stopped probing, and no new request came for 1s"
        );
    }

    /// A read is shared and kept while fresh: the same read looked at
    /// again says nothing of the time since it was made. With reads every
    /// 2 s (a slow Envoy), looked at every 100 ms, and traffic flowing, the
    /// wait never ends on the copies; once the traffic stops, it ends at
    /// the first read that began a quiet period after the last move.
    #[tokio::test(start_paused = true)]
    async fn a_read_looked_at_again_is_no_evidence_of_quiet() {
        let t0 = Instant::now();
        let mut rule = Rule::new(settings(3, SEC), t0);
        let stop = t0 + Duration::from_secs(10);
        let mut t = t0;
        let mut out_at = None;
        while t < t0 + Duration::from_secs(20) {
            // The read in force: made every 2 s, taking 200 ms.
            let made = t0 + Duration::from_secs(2) * ((t - t0).as_secs() as u32 / 2);
            let total = (made.min(stop) - t0).as_millis() as u64 / 5;
            // The same read, looked at again, keeps its number.
            let read = Arrivals {
                seq: (made - t0).as_secs(),
                total,
                generation: 1,
                read: made,
                took: Duration::from_millis(200),
            };
            if rule.observe(t, &[], None, Ok(read)).out {
                out_at = Some(t);
                break;
            }
            t += Duration::from_millis(100);
        }
        // The last move was seen in the read made at 10 s (ended 10.2 s);
        // the read made at 12 s is the first to show a second of quiet.
        assert_eq!(out_at, Some(t0 + Duration::from_secs(12)));
    }

    /// The attack: 64 agents from the real checker's own address
    /// keep it from being counted; the wait once answered "no load
    /// balancer was seen" 0.6 s into the drain. Its probes, followed
    /// apart, hold the wait until its own 3rd failure.
    #[tokio::test(start_paused = true)]
    async fn a_checker_whose_probes_were_not_counted_holds_the_wait_never_ends_it() {
        let t0 = Instant::now();
        let began = t0 + 20 * SEC;
        let real = agent_key(5, "HAProxy");
        // Every 3 s from 0.5 s; failing from the drain's start: 21.5,
        // 24.5, 27.5 s.
        let mut events = probes(real, 3 * SEC, t0 + Duration::from_millis(500), t0 + 40 * SEC, began);
        // 64 agents at the same address, 100 probes a second in all.
        let mut t = t0;
        let mut i = 0;
        while t < t0 + 40 * SEC {
            events.push((
                t,
                agent_key(5, Box::leak(format!("flood-{}", i % 64).into_boxed_str())),
                t < began,
            ));
            t += Duration::from_millis(10);
            i += 1;
        }
        let mut rule = Rule::new(settings(3, SEC), began);
        let (out, steps) = run(&mut rule, events, began, t0 + 40 * SEC, |_| Ok(9));
        assert_eq!(
            out,
            Some(t0 + Duration::from_millis(27_500)),
            "at the real checker's 3rd failure: {steps:?}"
        );
        let conclusion = rule.conclusion().to_string();
        assert!(
            conclusion.contains("whose probes were not counted (no room) failed, stopped or timed out"),
            "{conclusion}"
        );
        assert!(!conclusion.contains("no load balancer was seen"), "{conclusion}");
    }

    /// Probes from more probers than any table follows: the wait holds
    /// until the checker timeout, counted from the drain's start (or from
    /// the last such probe, when it came before).
    #[tokio::test(start_paused = true)]
    async fn probers_too_many_to_follow_hold_the_wait_until_the_checker_timeout() {
        let t0 = Instant::now();
        let mut rule = Rule::new(settings(3, SEC), t0);
        let mut out_at = None;
        let mut t = t0;
        while t < t0 + 30 * SEC {
            let eval = rule.observe(t, &[], Some(t0 + SEC), arrived(1, t));
            if eval.out {
                out_at = Some(t);
                assert_eq!(eval.steps, [Step::UnfollowedTimedOut, Step::Out]);
                break;
            }
            assert!(eval.waiting_on.unwrap().to_string().contains("too many to follow"));
            t += Duration::from_millis(100);
        }
        assert_eq!(out_at, Some(t0 + 20 * SEC));
        // One long before the drain (more than the checker timeout) holds nothing.
        let mut rule = Rule::new(settings(3, SEC), t0 + 60 * SEC);
        let first = rule.observe(t0 + 60 * SEC, &[], Some(t0 + SEC), arrived(1, t0 + 60 * SEC));
        assert_eq!(
            first.waiting_on.map(|w| w.to_string()).as_deref(),
            Some("no new request for 1s (none for 0s so far)")
        );
        let eval = rule.observe(t0 + 61 * SEC, &[], Some(t0 + SEC), arrived(1, t0 + 61 * SEC));
        assert!(eval.out, "{eval:?}");
    }
}
