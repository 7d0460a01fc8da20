//! The rule that says the pod is out of rotation, in one place, free of
//! I/O so it runs in virtual time in the tests.
//!
//! From the start of the drain (readiness 503), at each read:
//!
//! 1. **Every checker is done.** A checker counts once it has probed twice
//!    (so it has an interval) and was still probing when the drain began.
//!    It is done when it has had `threshold` failed probes in a row (a load
//!    balancer that needs that many has taken the pod out), or when it has
//!    not probed for twice its interval and a second (it stopped checking:
//!    deregistered the pod, or went away). Done stays done for the drain.
//! 2. **No new request has reached Envoy's inbound listeners for the quiet
//!    period**, counted from the last read that saw one (a failed read
//!    counts as one: not knowing is not quiet), and at the earliest from
//!    the start of the drain. This covers what the checkers cannot show:
//!    a load balancer that takes a while to act on its own verdict, a mesh
//!    or kube-proxy learning of the pod's removal from the control plane,
//!    and a load balancer that never health-checks.
//!
//! Out of rotation is both, at the same read. The rule never ends the wait
//! before the last checker is done; with traffic flowing, it ends a quiet
//! period after the traffic stopped.

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::checkers::{Checker, CheckerKey};
use super::TrafficError;
use crate::duration::Display as D;

/// A checker that has not probed for this long past twice its interval has
/// stopped checking.
pub(crate) const VANISH_SLACK: Duration = Duration::from_secs(1);

/// What a checker is, as the rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckerState {
    /// Probing, not yet failed enough times in a row: the wait waits for it.
    Checking,
    /// Failed `threshold` probes in a row: it has taken the pod out.
    Failed,
    /// Stopped probing during the drain: counted as done.
    Vanished,
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
    pub state: CheckerState,
    pub probes: u64,
    /// The longest recent gap between its probes.
    pub interval_seconds: Option<f64>,
    pub failures_in_row: u32,
    pub last_probe_seconds_ago: f64,
}

/// A step worth one log line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    /// A checker failed `failures` probes in a row.
    Failed { checker: String, failures: u32 },
    /// A checker stopped probing.
    Vanished { checker: String, silent: Duration },
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
    /// What the wait still waits for, in words (None when out).
    pub(crate) waiting_for: Option<String>,
    /// Since when no new inbound request was seen.
    pub(crate) quiet_since: Instant,
    pub(crate) steps: Vec<Step>,
}

/// The rule's memory across reads, for one drain.
pub(crate) struct Rule {
    threshold: u32,
    quiet: Duration,
    began: Instant,
    /// Checkers done, and how (sticky for the drain).
    done: Vec<(CheckerKey, CheckerState)>,
    last_total: Option<u64>,
    quiet_since: Instant,
    all_done: bool,
    out: bool,
}

impl Rule {
    /// The rule for a drain that began at `began`.
    pub(crate) fn new(threshold: u32, quiet: Duration, began: Instant) -> Rule {
        Rule {
            threshold: threshold.max(1),
            quiet,
            began,
            done: Vec::new(),
            last_total: None,
            quiet_since: began,
            all_done: false,
            out: false,
        }
    }

    /// One read at `now`: the checkers as recorded, and Envoy's inbound
    /// request total (Err: the read failed, with why).
    pub(crate) fn observe(
        &mut self,
        now: Instant,
        checkers: &[Checker],
        inbound: Result<u64, TrafficError>,
    ) -> Evaluation {
        let mut steps = Vec::new();
        match inbound {
            Ok(total) => {
                if self.last_total.is_some_and(|last| last != total) {
                    self.quiet_since = now;
                }
                self.last_total = Some(total);
            }
            Err(why) => {
                self.quiet_since = now;
                steps.push(Step::ReadFailed(why));
            }
        }
        let mut reports = Vec::with_capacity(checkers.len());
        let mut pending = Vec::new();
        for c in checkers {
            let state = self.state_of(c, now, &mut steps);
            if state == CheckerState::Checking {
                pending.push(c);
            }
            reports.push(report(c, state, now));
        }
        let counted = reports
            .iter()
            .filter(|r| matches!(r.state, CheckerState::Failed | CheckerState::Vanished))
            .count();
        let newly_done = pending.is_empty() && !self.all_done;
        self.all_done = pending.is_empty();
        let quiet_until = self.quiet_since + self.quiet;
        let out = self.out || (self.all_done && now >= quiet_until);
        match (out && !self.out, newly_done) {
            (true, _) => steps.push(Step::Out),
            (false, true) => steps.push(Step::CheckersDone { count: counted }),
            (false, false) => {}
        }
        self.out = out;
        let waiting_for = (!out).then(|| match pending.is_empty() {
            false => self.words(&pending),
            true => format!(
                "no new request for {} (the last {} ago)",
                D(self.quiet),
                D(ms(now.saturating_duration_since(self.quiet_since)))
            ),
        });
        Evaluation {
            out,
            checkers: reports,
            waiting_for,
            quiet_since: self.quiet_since,
            steps,
        }
    }

    /// Out of rotation, in words, once it is.
    pub(crate) fn conclusion(&self) -> String {
        let done = self.done.len();
        let checkers = match done {
            0 => "no load balancer was seen checking the pod".to_owned(),
            1 => format!(
                "the one checker failed {} probes in a row or stopped probing",
                self.threshold
            ),
            n => format!(
                "all {n} checkers failed {} probes in a row or stopped probing",
                self.threshold
            ),
        };
        format!("{checkers}, and no new request came for {}", D(self.quiet))
    }

    fn state_of(&mut self, c: &Checker, now: Instant, steps: &mut Vec<Step>) -> CheckerState {
        if let Some((_, state)) = self.done.iter().find(|(k, _)| *k == c.key) {
            return *state;
        }
        let Some(interval) = c.interval else {
            return CheckerState::SeenOnce;
        };
        let silent_after = interval.saturating_mul(2) + VANISH_SLACK;
        if c.last_seen + silent_after < self.began {
            return CheckerState::GoneBeforeDrain;
        }
        let state = if c.failures_in_row >= self.threshold {
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
        } else {
            return CheckerState::Checking;
        };
        self.done.push((c.key, state));
        state
    }

    /// `checker 10.0.0.5 (1 of 3 failures, every 1s)` for each pending one.
    fn words(&self, pending: &[&Checker]) -> String {
        let each: Vec<String> = pending
            .iter()
            .map(|c| {
                format!(
                    "{} ({} of {} failures in a row, every {})",
                    c.key,
                    c.failures_in_row,
                    self.threshold,
                    D(ms(c.interval.unwrap_or_default()))
                )
            })
            .collect();
        let noun = if pending.len() == 1 { "checker" } else { "checkers" };
        format!("{} {noun}: {}", pending.len(), each.join(", "))
    }
}

/// A checker for the log: `10.0.0.5 (every 1s)`.
fn describe(c: &Checker) -> String {
    format!("{} (every {})", c.key, D(ms(c.interval.unwrap_or_default())))
}

/// A duration to the millisecond: words are for people.
pub(crate) fn ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

fn report(c: &Checker, state: CheckerState, now: Instant) -> CheckerReport {
    CheckerReport {
        peer: c.key.ip.to_string(),
        user_agent: c.key.agent(),
        forwarded: c.key.forwarded,
        state,
        probes: c.probes,
        interval_seconds: c.interval.map(|d| d.as_secs_f64()),
        failures_in_row: c.failures_in_row,
        last_probe_seconds_ago: now.saturating_duration_since(c.last_seen).as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::ControlError;
    use crate::rotation::checkers::Checkers;
    use hyper::header::HeaderMap;

    const SEC: Duration = Duration::from_secs(1);

    fn key(last: u8) -> CheckerKey {
        CheckerKey::of(Some(([10, 0, 0, last], 4000).into()), &HeaderMap::new()).unwrap()
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
            let eval = rule.observe(t, &checkers.snapshot(), total(t));
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
        let mut rule = Rule::new(3, SEC, began);
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
            rule.conclusion(),
            "the one checker failed 3 probes in a row or stopped probing, and no new request came for 1s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn traffic_that_goes_on_after_the_checkers_are_done_holds_the_wait() {
        let t0 = Instant::now();
        let began = t0 + 10 * SEC;
        let lb = probes(key(5), SEC, t0, t0 + 30 * SEC, began);
        // A slow-propagating balancer: requests go on 4 s past the 3rd failure.
        let stop = t0 + 16 * SEC;
        let mut rule = Rule::new(3, SEC, began);
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
        let mut rule = Rule::new(3, SEC, began);
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
        let mut rule = Rule::new(3, SEC, began);
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
        let mut rule = Rule::new(3, SEC, began);
        let (out, _) = run(&mut rule, seen, began, t0 + 30 * SEC, |_| Ok(0));
        assert_eq!(out, Some(began + SEC));
        let eval = rule.observe(began + SEC, &checkers.snapshot(), Ok(0));
        let states: Vec<CheckerState> = eval.checkers.iter().map(|c| c.state).collect();
        assert_eq!(states, [CheckerState::SeenOnce, CheckerState::GoneBeforeDrain]);
        assert_eq!(
            rule.conclusion(),
            "no load balancer was seen checking the pod, and no new request came for 1s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_read_is_not_quiet() {
        let t0 = Instant::now();
        let mut rule = Rule::new(3, SEC, t0);
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
        assert_eq!(out, Some(fails_until - Duration::from_millis(100) + SEC));
        assert_eq!(steps[0], Step::ReadFailed(timeout));
    }

    #[tokio::test(start_paused = true)]
    async fn a_checker_seen_first_during_the_drain_is_waited_for_and_the_words_say_so() {
        let t0 = Instant::now();
        let checkers = Checkers::default();
        let mut rule = Rule::new(2, SEC, t0);
        checkers.record(key(5), t0 + SEC, false);
        checkers.record(key(5), t0 + 2 * SEC, true);
        let eval = rule.observe(t0 + 2 * SEC, &checkers.snapshot(), Ok(0));
        assert!(!eval.out);
        assert_eq!(
            eval.waiting_for.as_deref(),
            Some("1 checker: 10.0.0.5 (0 of 2 failures in a row, every 1s)")
        );
        checkers.record(key(5), t0 + 3 * SEC, false);
        checkers.record(key(5), t0 + 4 * SEC, false);
        let eval = rule.observe(t0 + 4 * SEC, &checkers.snapshot(), Ok(0));
        assert!(eval.out, "{eval:?}");
        assert_eq!(
            eval.steps[0],
            Step::Failed {
                checker: "10.0.0.5 (every 1s)".into(),
                failures: 2
            }
        );
    }
}
