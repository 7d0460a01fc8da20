//! The unit tests of `rule`.

use super::*;
use lifeguard_checkers::Checkers;
use lifeguard_drain::{CheckerKey, ControlError};

const SEC: Duration = Duration::from_secs(1);

/// The default terms: threshold `threshold`, quiet for `quiet`, no
/// checker held past 20 s.
fn terms(threshold: u32, quiet: Duration) -> Terms {
    Terms {
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
    CheckerKey::new([10, 0, 0, last].into(), false, b"").unwrap()
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
    let mut rule = Rule::new(terms(3, SEC), began);
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
    let mut rule = Rule::new(terms(3, SEC), began);
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
    let mut rule = Rule::new(terms(3, SEC), began);
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
    let mut rule = Rule::new(terms(3, SEC), began);
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
    let mut rule = Rule::new(terms(3, SEC), began);
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
    let mut rule = Rule::new(terms(3, SEC), t0);
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

/// Envoy counts a health check among the requests when it arrives and
/// subtracts it when it completes: one read between the two sees a rise
/// that the next takes back. That is no new request: the quiet goes on
/// from where it was (seen in a fresh-clone run: the wait ran to its bound).
#[tokio::test(start_paused = true)]
async fn a_health_check_in_progress_seen_by_one_read_is_not_a_new_request() {
    let t0 = Instant::now();
    let torn = t0 + Duration::from_millis(1500);
    let mut rule = Rule::new(terms(3, 2 * SEC), t0);
    let total = move |t: Instant| Ok(if t == torn { 6 } else { 5 });
    let (out, _) = run(&mut rule, Vec::new(), t0, t0 + 10 * SEC, total);
    assert_eq!(out, Some(t0 + 2 * SEC), "quiet from the first read");
    assert_eq!(rule.traffic_stopped(), None, "no request came");
}

/// A rise that stays is a request, whatever follows: the quiet starts at
/// the read that saw it, and a check seen in progress after it (a rise
/// and a fall back to the request's total) does not start it again.
#[tokio::test(start_paused = true)]
async fn a_rise_that_stays_is_a_request_and_a_later_check_in_progress_is_not() {
    let t0 = Instant::now();
    let request = t0 + Duration::from_millis(1500);
    let torn = t0 + Duration::from_millis(2500);
    let mut rule = Rule::new(terms(3, 2 * SEC), t0);
    let total = move |t: Instant| {
        Ok(match t {
            t if t == torn => 7,
            t if t >= request => 6,
            _ => 5,
        })
    };
    let (out, _) = run(&mut rule, Vec::new(), t0, t0 + 10 * SEC, total);
    assert_eq!(out, Some(request + 2 * SEC), "quiet from the request's read");
    assert_eq!(rule.traffic_stopped(), Some(request));
}

/// A fall that does not reach the total before the rise: a request came
/// beside the check, and the quiet starts at the rise.
#[tokio::test(start_paused = true)]
async fn a_fall_short_of_the_total_before_the_rise_keeps_the_request() {
    let t0 = Instant::now();
    let rise = t0 + Duration::from_millis(1500);
    let mut rule = Rule::new(terms(3, 2 * SEC), t0);
    // 5, then a request and a check in progress (7), then the check done (6).
    let total = move |t: Instant| {
        Ok(match t {
            t if t == rise => 7,
            t if t > rise => 6,
            _ => 5,
        })
    };
    let (out, _) = run(&mut rule, Vec::new(), t0, t0 + 10 * SEC, total);
    assert_eq!(out, Some(rise + 2 * SEC));
}

#[tokio::test(start_paused = true)]
async fn a_checker_seen_first_during_the_drain_is_waited_for_and_the_words_say_so() {
    let t0 = Instant::now();
    let checkers = Checkers::default();
    let mut rule = Rule::new(terms(2, SEC), t0);
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
    CheckerKey::new([10, 0, 0, last].into(), false, agent.as_bytes()).unwrap()
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
    let mut rule = Rule::new(terms(3, SEC), began);
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
    let mut rule = Rule::new(terms(3, SEC), began);
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
    let mut rule = Rule::new(terms(3, SEC), t0);
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
    let mut rule = Rule::new(terms(3, SEC), began);
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
    let mut rule = Rule::new(terms(3, SEC), t0);
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
    let mut rule = Rule::new(terms(3, SEC), began);
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
    let mut rule = Rule::new(terms(3, SEC), t0);
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
    let mut rule = Rule::new(terms(3, SEC), t0 + 60 * SEC);
    let first = rule.observe(t0 + 60 * SEC, &[], Some(t0 + SEC), arrived(1, t0 + 60 * SEC));
    assert_eq!(
        first.waiting_on.map(|w| w.to_string()).as_deref(),
        Some("no new request for 1s (none for 0s so far)")
    );
    let eval = rule.observe(t0 + 61 * SEC, &[], Some(t0 + SEC), arrived(1, t0 + 61 * SEC));
    assert!(eval.out, "{eval:?}");
}
