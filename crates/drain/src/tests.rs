//! The drain in virtual time (`start_paused`): tokio advances the clock
//! whenever every task waits, so a 28 s drain takes microseconds, and
//! every instant below is exact. Envoy is scripted: its counts are a
//! function of the time since the test began.

use std::os::unix::process::ExitStatusExt;
use std::sync::{Arc, Mutex};

use std::process::ExitStatus;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::*;
use lifeguard_base::grace::Grace;

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// The fake port's admin timeout: the tests' plans' (`plan`).
const FAKE_ADMIN_TIMEOUT: Duration = Duration::from_secs(1);

/// What a scripted read returns: after `delay`, counts or an error.
type Read = (Duration, Result<Active, ControlError>);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Call {
    DrainListeners { skip_exit: bool, phase: Phase },
    Stop,
}

struct Script {
    t0: Instant,
    child: bool,
    reads: Mutex<Box<dyn FnMut(Duration) -> Read + Send>>,
    /// What each answered read says it cost Envoy, when not its delay: a
    /// read shared with the drain wait, under way before the drain asked.
    took: Mutex<Option<Duration>>,
    calls: Mutex<Vec<(Duration, Call)>>,
    /// What each stop was given between SIGTERM and SIGKILL.
    stop_bounds: Mutex<Vec<Duration>>,
    exit: watch::Sender<Option<ExitStatus>>,
    phase: Mutex<Option<watch::Receiver<Status>>>,
    /// The record of reads, kept as the real port keeps it (a 1 s admin
    /// timeout, the tests' plans').
    patience: Mutex<Patience>,
}

#[derive(Clone)]
struct FakeEnvoy(Arc<Script>);

fn conns(n: u64) -> Read {
    (
        Duration::ZERO,
        Ok(Active {
            connections: n,
            requests: n,
            tcp: 0,
            skipped: Vec::new(),
        }),
    )
}

fn refused() -> Read {
    let error =
        ControlError::Refused("cannot connect to Envoy admin at http://127.0.0.1:15000: Connection refused".into());
    (Duration::ZERO, Err(error))
}

impl FakeEnvoy {
    fn new(child: bool, reads: impl FnMut(Duration) -> Read + Send + 'static) -> Self {
        FakeEnvoy(Arc::new(Script {
            t0: Instant::now(),
            child,
            reads: Mutex::new(Box::new(reads)),
            took: Mutex::new(None),
            calls: Mutex::new(Vec::new()),
            stop_bounds: Mutex::new(Vec::new()),
            exit: watch::channel(None).0,
            phase: Mutex::new(None),
            patience: Mutex::new(Patience::default()),
        }))
    }

    fn since(&self) -> Duration {
        self.0.t0.elapsed()
    }

    fn record(&self, call: Call) {
        self.0.calls.lock().unwrap().push((self.since(), call));
    }

    fn calls(&self) -> Vec<(Duration, Call)> {
        self.0.calls.lock().unwrap().clone()
    }

    fn stops(&self) -> Vec<Duration> {
        self.calls()
            .into_iter()
            .filter(|(_, c)| *c == Call::Stop)
            .map(|(t, _)| t)
            .collect()
    }

    fn drain_calls(&self) -> Vec<(Duration, Call)> {
        self.calls().into_iter().filter(|(_, c)| *c != Call::Stop).collect()
    }

    /// The child exits on its own.
    fn exit(&self, code: i32) {
        self.0.exit.send_replace(Some(ExitStatus::from_raw(code << 8)));
    }
}

impl EnvoyControl for FakeEnvoy {
    async fn drain_listeners(&self, _scope: DrainScope, skip_exit: bool) -> Result<(), ControlError> {
        let phase = self.0.phase.lock().unwrap().as_ref().map(|w| w.borrow().phase);
        self.record(Call::DrainListeners {
            skip_exit,
            phase: phase.unwrap_or(Phase::Serving),
        });
        Ok(())
    }

    async fn active(&self, _timeout: Duration) -> Result<ActiveRead, ControlError> {
        let (delay, result) = (self.0.reads.lock().unwrap())(self.since());
        // Taken as timed out until it answers: the drain cuts it at its
        // timeout by dropping this future.
        self.0.patience.lock().unwrap().timed_out();
        tokio::time::sleep(delay).await;
        let took = self.0.took.lock().unwrap().unwrap_or(delay);
        let mut patience = self.0.patience.lock().unwrap();
        match &result {
            Ok(_) => patience.answered(took, FAKE_ADMIN_TIMEOUT),
            Err(_) => patience.reset(),
        }
        result.map(|active| ActiveRead { active, took })
    }

    fn read_timeout(&self) -> Duration {
        self.0.patience.lock().unwrap().timeout(FAKE_ADMIN_TIMEOUT)
    }

    async fn stop(&self, bound: Duration) -> Exit {
        self.record(Call::Stop);
        self.0.stop_bounds.lock().unwrap().push(bound);
        Exit::Status(ExitStatus::from_raw(0))
    }

    async fn exited(&self) -> ExitStatus {
        if !self.0.child {
            return std::future::pending().await;
        }
        let mut rx = self.0.exit.subscribe();
        let status = *rx
            .wait_for(Option::is_some)
            .await
            .expect("sender kept")
            .as_ref()
            .unwrap();
        status
    }

    fn is_child(&self) -> bool {
        self.0.child
    }

    async fn answering(&self) -> Result<(), ControlError> {
        match (self.0.reads.lock().unwrap())(self.since()).1 {
            Err(e @ ControlError::Refused(_)) => Err(e),
            _ => Ok(()),
        }
    }
}

fn plan(policy: DrainUntil) -> Plan {
    let mut plan = Plan::for_status_tests().in_force(policy);
    // The policies' own rules, as they stand when the kubelet is told
    // what the load balancers are; `serving` below.
    plan.terminating_readiness = TerminatingReadiness::Failing;
    plan
}

/// Starts the drain machine on `envoy`; the fake sees the published phase.
fn start(plan: Plan, envoy: &FakeEnvoy) -> (tokio::task::JoinHandle<Outcome>, DrainHandle) {
    assert_eq!(
        plan.admin_timeout, FAKE_ADMIN_TIMEOUT,
        "the fake port's record is kept at the plan's"
    );
    let (drain, handle) = Drain::new(plan, envoy.clone(), ());
    *envoy.0.phase.lock().unwrap() = Some(handle.watch());
    (tokio::spawn(drain.run()), handle)
}

/// `plan(policy)` whose minimum drain time is `minimum` seconds.
fn plan_with_minimum(policy: DrainUntil, minimum: f64) -> Plan {
    let mut p = plan(policy);
    p.minimum_drain_duration = secs(minimum);
    p
}

/// `plan(policy)` whose deadline comes `deadline` seconds after the drain
/// begins (the grace period's margin kept).
fn plan_with_deadline(policy: DrainUntil, deadline: f64) -> Plan {
    let mut p = plan(policy);
    p.grace = with_deadline(p.grace, secs(deadline));
    p
}

/// Starts the drain machine on `envoy` (`start`) and sends it SIGTERM.
async fn start_signalled(plan: Plan, envoy: &FakeEnvoy) -> (tokio::task::JoinHandle<Outcome>, DrainHandle) {
    let (task, handle) = start(plan, envoy);
    handle.signal(Signal::Term).await;
    (task, handle)
}

/// A drain begun by SIGTERM, run to its end: its outcome, and the handle
/// for its last status.
async fn drain_after_term(plan: Plan, envoy: &FakeEnvoy) -> (Outcome, DrainHandle) {
    let (task, handle) = start_signalled(plan, envoy).await;
    (task.await.unwrap(), handle)
}

/// Sleeps until `at` after the script's start.
async fn at(envoy: &FakeEnvoy, at: f64) {
    tokio::time::sleep_until(envoy.0.t0 + secs(at)).await;
}

/// `grace` with its margin, shortened (or lengthened) to this deadline.
fn with_deadline(grace: Grace, deadline: Duration) -> Grace {
    Grace::new(deadline + grace.margin(), grace.margin()).unwrap()
}

fn assert_between(t: Duration, low: f64, high: f64) {
    assert!(t >= secs(low) && t <= secs(high), "{t:?} not in [{low}s, {high}s]");
}

#[tokio::test(start_paused = true)]
async fn fixed_policy_drains_for_the_drain_time_then_stops_envoy() {
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let (task, handle) = start(plan(DrainUntil::Time), &envoy);
    assert_eq!(handle.status().phase, Phase::Serving);
    handle.signal(Signal::Term).await;
    let outcome = task.await.unwrap();
    assert!(matches!(outcome, Outcome::Drained(_)), "{outcome:?}");
    // Readiness turned 503 (the phase left serving) before Envoy was
    // asked to drain; the signal asks Envoy to exit after its drain.
    assert_eq!(
        envoy.drain_calls(),
        [(
            Duration::ZERO,
            Call::DrainListeners {
                skip_exit: false,
                phase: Phase::Draining
            }
        )]
    );
    assert_eq!(envoy.stops(), [secs(5.0)]);
    let status = handle.status();
    assert_eq!(status.phase, Phase::Stopped);
    assert_eq!(status.trigger, Some(Trigger::Signal(Signal::Term)));
    assert!(!status.cut_by_deadline);
    assert_eq!(status.duration_seconds, Some(5.0));
}

#[tokio::test(start_paused = true)]
async fn exit_on_zero_waits_out_the_minimum_then_stops_at_the_first_zero() {
    // Two connections until 7 s, then none.
    let envoy = FakeEnvoy::new(true, |t| conns(if t < secs(7.0) { 2 } else { 0 }));
    let (outcome, handle) = drain_after_term(plan(DrainUntil::Connections), &envoy).await;
    assert!(matches!(outcome, Outcome::Drained(_)), "{outcome:?}");
    assert_between(envoy.stops()[0], 7.0, 7.05);
    assert_eq!(handle.status().left_at_stop, Some(0));
}

#[tokio::test(start_paused = true)]
async fn a_zero_before_the_minimum_does_not_end_the_drain() {
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let (outcome, _handle) = drain_after_term(plan(DrainUntil::Requests), &envoy).await;
    assert!(matches!(outcome, Outcome::Drained(_)), "{outcome:?}");
    assert_between(envoy.stops()[0], 5.0, 5.05);
}

#[tokio::test(start_paused = true)]
async fn a_zero_older_than_the_last_non_zero_read_does_not_end_the_drain() {
    // Zero at first, one connection from 3 s to 8 s, zero after.
    let envoy = FakeEnvoy::new(true, |t| conns(u64::from(t >= secs(3.0) && t < secs(8.0))));
    let (outcome, _handle) = drain_after_term(plan(DrainUntil::Connections), &envoy).await;
    assert!(matches!(outcome, Outcome::Drained(_)), "{outcome:?}");
    assert_between(envoy.stops()[0], 8.0, 8.05);
}

#[tokio::test(start_paused = true)]
async fn a_failed_read_at_the_minimum_does_not_reuse_the_zero_read_before_it() {
    // Zero, but every read between 4.9 s and 6 s fails.
    let envoy = FakeEnvoy::new(true, |t| {
        if t >= secs(4.9) && t < secs(6.0) {
            refused()
        } else {
            conns(0)
        }
    });
    let (outcome, _handle) = drain_after_term(plan(DrainUntil::Connections), &envoy).await;
    assert!(matches!(outcome, Outcome::Drained(_)), "{outcome:?}");
    assert_between(envoy.stops()[0], 6.0, 6.05);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_cuts_a_drain_with_connections_left() {
    let envoy = FakeEnvoy::new(true, |_| conns(3));
    let (outcome, handle) = drain_after_term(plan_with_deadline(DrainUntil::Connections, 10.0), &envoy).await;
    assert!(matches!(outcome, Outcome::Cut { left: Some(3), .. }), "{outcome:?}");
    assert_between(envoy.stops()[0], 10.0, 10.0);
    let status = handle.status();
    assert!(status.cut_by_deadline);
    assert_eq!(status.left_at_stop, Some(3));
    assert_eq!(status.active_connections, Some(3));
}

#[tokio::test(start_paused = true)]
async fn a_deadline_inside_the_pre_drain_delay_stops_envoy_at_the_deadline() {
    let envoy = FakeEnvoy::new(true, |_| conns(2));
    let mut p = plan_with_deadline(DrainUntil::Connections, 10.0);
    p.drain_delay = secs(20.0);
    let (task, handle) = start_signalled(p, &envoy).await;
    at(&envoy, 9.0).await;
    assert_eq!(handle.status().phase, Phase::Delaying);
    let outcome = task.await.unwrap();
    assert!(matches!(outcome, Outcome::Cut { .. }), "{outcome:?}");
    // Envoy was never asked to drain: the deadline came first.
    assert_eq!(envoy.drain_calls(), []);
    assert_between(envoy.stops()[0], 10.0, 10.02);
}

#[tokio::test(start_paused = true)]
async fn the_pre_drain_delay_keeps_envoy_serving_then_drains() {
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let mut p = plan_with_minimum(DrainUntil::Connections, 1.0);
    p.drain_delay = secs(3.0);
    let (task, handle) = start_signalled(p, &envoy).await;
    at(&envoy, 2.0).await;
    assert_eq!(handle.status().phase, Phase::Delaying);
    let outcome = task.await.unwrap();
    assert!(matches!(outcome, Outcome::Drained(_)), "{outcome:?}");
    let drains = envoy.drain_calls();
    assert_eq!(drains.len(), 1);
    assert_eq!(drains[0].0, secs(3.0));
    assert_between(envoy.stops()[0], 4.0, 4.05);
}

#[tokio::test(start_paused = true)]
async fn envoy_exiting_mid_drain_ends_it_with_code_4_and_no_stop() {
    let envoy = FakeEnvoy::new(true, |_| conns(1));
    let (task, handle) = start_signalled(plan(DrainUntil::Connections), &envoy).await;
    at(&envoy, 3.0).await;
    envoy.exit(1);
    let outcome = task.await.unwrap();
    assert!(
        matches!(outcome, Outcome::EnvoyExited(s) if s.code() == Some(1)),
        "{outcome:?}"
    );
    assert_eq!(envoy.stops(), Vec::<Duration>::new());
    assert_eq!(handle.status().phase, Phase::Stopped);
}

#[tokio::test(start_paused = true)]
async fn envoy_exiting_before_any_drain_ends_the_machine() {
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let (task, handle) = start(plan(DrainUntil::Time), &envoy);
    at(&envoy, 1.0).await;
    envoy.exit(0);
    let outcome = task.await.unwrap();
    assert!(matches!(outcome, Outcome::EnvoyExited(_)), "{outcome:?}");
    assert_eq!(handle.status().phase, Phase::Stopped);
    assert_eq!(envoy.calls(), []);
}

#[tokio::test(start_paused = true)]
async fn an_external_envoy_that_stops_answering_is_gone_after_a_second() {
    let envoy = FakeEnvoy::new(false, |t| if t < secs(2.0) { conns(1) } else { refused() });
    let (outcome, handle) = drain_after_term(plan(DrainUntil::Connections), &envoy).await;
    assert_eq!(outcome, Outcome::EnvoyGone);
    assert_eq!(envoy.stops(), Vec::<Duration>::new());
    let status = handle.status();
    assert_eq!(status.phase, Phase::Stopped);
    assert!(status.last_read_error.unwrap().contains("cannot connect"));
}

#[tokio::test(start_paused = true)]
async fn a_refusing_child_envoy_is_not_declared_gone() {
    // A child's exit is seen directly: refusals alone are read failures.
    let envoy = FakeEnvoy::new(true, |t| if t < secs(2.0) { conns(1) } else { refused() });
    let (outcome, _handle) = drain_after_term(plan_with_deadline(DrainUntil::Connections, 6.0), &envoy).await;
    assert!(matches!(outcome, Outcome::Cut { left: Some(1), .. }), "{outcome:?}");
    assert_eq!(envoy.stops(), [secs(6.0)]);
}

#[tokio::test(start_paused = true)]
async fn repeated_and_mixed_signals_make_one_drain() {
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let (task, handle) = start_signalled(plan(DrainUntil::Time), &envoy).await;
    at(&envoy, 1.0).await;
    handle.signal(Signal::Int).await;
    at(&envoy, 2.0).await;
    handle.signal(Signal::Term).await;
    assert_eq!(handle.status().trigger, Some(Trigger::Signal(Signal::Term)));
    assert!(matches!(task.await.unwrap(), Outcome::Drained(_)));
    assert_eq!(envoy.drain_calls().len(), 1);
    assert_eq!(envoy.stops(), [secs(5.0)]);
}

#[tokio::test(start_paused = true)]
async fn post_drain_answers_when_drained_and_envoy_runs_until_sigterm() {
    let envoy = FakeEnvoy::new(true, |t| conns(u64::from(t < secs(7.0))));
    let (task, handle) = start(plan(DrainUntil::Connections), &envoy);
    let h = handle.clone();
    let waiter = tokio::spawn(async move {
        let status = h.drain(Asker::Operator).await;
        (Instant::now(), status)
    });
    let (answered, status) = waiter.await.unwrap();
    let status = status.expect("drained");
    assert_eq!(status.phase, Phase::Drained);
    assert_eq!(status.trigger, Some(Trigger::PostDrain));
    assert!(!status.stop_requested);
    assert_between(answered - envoy.0.t0, 7.0, 7.05);
    // Envoy keeps its listeners after its drain time (skip_exit) and is
    // not stopped until the signal.
    assert!(matches!(
        envoy.drain_calls()[0].1,
        Call::DrainListeners { skip_exit: true, .. }
    ));
    // A second POST /drain answers at once.
    assert_eq!(handle.drain(Asker::Operator).await.unwrap().phase, Phase::Drained);
    at(&envoy, 20.0).await;
    assert_eq!(envoy.stops(), Vec::<Duration>::new());
    handle.signal(Signal::Term).await;
    let outcome = task.await.unwrap();
    assert!(matches!(outcome, Outcome::Drained(_)), "{outcome:?}");
    assert_eq!(envoy.stops(), [secs(20.0)]);
    assert_eq!(handle.status().phase, Phase::Stopped);
}

#[tokio::test(start_paused = true)]
async fn sigterm_during_post_drain_stops_envoy_once_drained() {
    let envoy = FakeEnvoy::new(true, |t| conns(u64::from(t < secs(7.0))));
    let (task, handle) = start(plan(DrainUntil::Connections), &envoy);
    let h = handle.clone();
    let waiter = tokio::spawn(async move { h.drain(Asker::Operator).await });
    at(&envoy, 2.0).await;
    handle.signal(Signal::Term).await;
    let mut status = handle.watch();
    status.wait_for(|s| s.stop_requested).await.unwrap();
    assert_eq!(status.borrow().phase, Phase::Draining);
    assert!(matches!(task.await.unwrap(), Outcome::Drained(_)));
    assert!(waiter.await.unwrap().is_some());
    assert_between(envoy.stops()[0], 7.0, 7.05);
}

#[tokio::test(start_paused = true)]
async fn quitquitquit_during_a_drain_stops_envoy_at_once() {
    let envoy = FakeEnvoy::new(true, |_| conns(4));
    let (task, handle) = start_signalled(plan(DrainUntil::Connections), &envoy).await;
    at(&envoy, 2.0).await;
    assert!(handle.quit().await);
    let outcome = task.await.unwrap();
    assert!(matches!(outcome, Outcome::Quit(_)), "{outcome:?}");
    assert_eq!(envoy.stops(), [secs(2.0)]);
}

#[tokio::test(start_paused = true)]
async fn quitquitquit_before_a_drain_stops_envoy_without_draining() {
    let envoy = FakeEnvoy::new(true, |_| conns(4));
    let (task, handle) = start(plan(DrainUntil::Connections), &envoy);
    assert!(handle.quit().await);
    assert!(matches!(task.await.unwrap(), Outcome::Quit(_)));
    assert_eq!(envoy.drain_calls(), []);
    assert_eq!(envoy.stops(), [Duration::ZERO]);
}

/// At the smallest margin, with the read at the deadline as
/// slow as its timeout lets it be, Envoy's SIGKILL (its stop plus the bound
/// it was given) comes by the end of the grace period, and Envoy still gets
/// most of the margin to exit in.
#[tokio::test(start_paused = true)]
async fn a_read_past_the_deadline_leaves_envoy_stopped_within_the_grace_period() {
    for margin in [0.1, 0.4, 2.0] {
        // Reads answer at once until just before the deadline, then hang:
        // the read at the deadline takes all its timeout.
        let slow_from = secs(30.0 - margin - 0.03);
        let envoy = FakeEnvoy::new(true, move |t| {
            if t < slow_from {
                conns(4)
            } else {
                (secs(5.0), conns(4).1)
            }
        });
        let mut p = plan(DrainUntil::Connections);
        p.grace = Grace::new(secs(30.0), secs(margin)).unwrap();
        let (task, handle) = start(p, &envoy);
        handle.signal(Signal::Term).await;
        let outcome = task.await.unwrap();
        assert!(matches!(outcome, Outcome::Cut { .. }), "{outcome:?}");
        let stopped = envoy.stops()[0];
        let bound = envoy.0.stop_bounds.lock().unwrap()[0];
        assert!(
            stopped > secs(30.0 - margin),
            "margin {margin}: stopped at {stopped:?}, at the deadline"
        );
        assert!(
            stopped + bound <= secs(30.0),
            "margin {margin}: killed at {:?}",
            stopped + bound
        );
        assert!(
            bound >= secs(margin * 0.75),
            "margin {margin}: Envoy got {bound:?} to exit"
        );
    }
}

/// An Envoy so large, on a node so busy, that each count read takes 1.5 s
/// against the 1 s admin timeout: the read after one that timed out waits
/// 2 s and is answered, and the next keeps the 2 s it needed. Cut at 1 s
/// each time, no read would ever answer and the drain would wait to its
/// deadline.
#[tokio::test(start_paused = true)]
async fn count_reads_slower_than_the_admin_timeout_are_waited_for_as_long_as_they_need() {
    let envoy = FakeEnvoy::new(true, |t| {
        let n = if t < secs(12.0) { 2 } else { 0 };
        (secs(1.5), conns(n).1)
    });
    let p = plan_with_minimum(DrainUntil::Connections, 1.0);
    assert_eq!(p.admin_timeout, secs(1.0));
    let (task, handle) = start_signalled(p, &envoy).await;
    at(&envoy, 2.6).await;
    // The first read (0 s) was cut at 1 s; the second (1 s) waited 2 s.
    let status = handle.status();
    assert_eq!(status.active_connections, Some(2), "{status:?}");
    assert_eq!(status.last_read_error, None);
    let outcome = task.await.unwrap();
    assert!(matches!(outcome, Outcome::Drained(_)), "{outcome:?}");
    // The third read begins 11 times 1.5 s after the second (17.5 s) and,
    // given 2 s, answers zero at 19 s; given 1 s again, it would have been
    // cut, and the next would begin 16.5 s after it.
    assert_between(envoy.stops()[0], 19.0, 19.05);
}

#[test]
fn patience_doubles_after_each_timeout_up_to_eight_times_and_keeps_what_an_answer_needed() {
    let usual = secs(1.0);
    let mut patience = Patience::default();
    let mut waits = vec![patience.timeout(usual)];
    for _ in 0..4 {
        patience.timed_out();
        waits.push(patience.timeout(usual));
    }
    assert_eq!(waits, [1.0, 2.0, 4.0, 8.0, 8.0].map(secs));
    for (took, wait) in [(3.0, 4.0), (1.5, 2.0), (2.0, 2.0), (0.2, 1.0), (20.0, 8.0)] {
        patience.answered(secs(took), usual);
        assert_eq!(patience.timeout(usual), secs(wait), "an answer after {took} s");
    }
    patience.reset();
    assert_eq!(patience.timeout(usual), usual);
}

#[tokio::test(start_paused = true)]
async fn slow_and_failed_reads_never_count_as_zero() {
    // Reads take 3 s (past the 1 s read timeout) until 4 s, fail until
    // 6 s, then say zero.
    let envoy = FakeEnvoy::new(true, |t| {
        if t < secs(4.0) {
            (secs(3.0), conns(0).1)
        } else if t < secs(6.0) {
            refused()
        } else {
            conns(0)
        }
    });
    let (task, handle) = start_signalled(plan_with_minimum(DrainUntil::Connections, 1.0), &envoy).await;
    at(&envoy, 2.5).await;
    let status = handle.status();
    assert!(
        status
            .last_read_error
            .as_deref()
            .unwrap_or("")
            .contains("did not finish within 1s"),
        "{status:?}"
    );
    assert_eq!(status.active_connections, None);
    let outcome = task.await.unwrap();
    assert!(matches!(outcome, Outcome::Drained(_)), "{outcome:?}");
    // Not before the first zero that was really read (after 6 s), and
    // at once then: reads that timed out do not pace the next ones.
    assert_between(envoy.stops()[0], 6.0, 6.05);
}

#[tokio::test(start_paused = true)]
async fn the_fixed_policy_reports_connections_while_it_waits() {
    let envoy = FakeEnvoy::new(true, |t| conns(if t < secs(2.0) { 5 } else { 1 }));
    let (task, handle) = start_signalled(plan(DrainUntil::Time), &envoy).await;
    at(&envoy, 1.0 + 0.5).await;
    assert_eq!(handle.status().active_connections, Some(5));
    task.await.unwrap();
    assert_eq!(handle.status().active_connections, Some(1));
}

/// The app, scripted like Envoy: its sockets as a function of time.
#[derive(Clone)]
struct FakeApp {
    t0: Instant,
    sockets: Arc<dyn Fn(Duration) -> usize + Send + Sync>,
    /// The pod shares its process namespace (the app has none left here).
    processes_seen: bool,
}

impl AppControl for FakeApp {
    type Error = std::convert::Infallible;
    async fn work(&self) -> Result<Work, Self::Error> {
        let n = (self.sockets)(self.t0.elapsed());
        let socket = AppSocket {
            local: "127.0.0.1:41234".parse().unwrap(),
            remote: Some("127.0.0.1:15001".parse().unwrap()),
        };
        Ok(Work {
            sockets: vec![socket; n],
            processes: Vec::new(),
            processes_seen: self.processes_seen,
        })
    }
    fn has_app(&self) -> Option<bool> {
        Some(true)
    }
}

fn start_with_app(
    plan: Plan,
    envoy: &FakeEnvoy,
    sockets: impl Fn(Duration) -> usize + Send + Sync + 'static,
) -> (tokio::task::JoinHandle<Outcome>, DrainHandle) {
    start_with_fake_app(plan, envoy, false, sockets)
}

fn start_with_fake_app(
    plan: Plan,
    envoy: &FakeEnvoy,
    processes_seen: bool,
    sockets: impl Fn(Duration) -> usize + Send + Sync + 'static,
) -> (tokio::task::JoinHandle<Outcome>, DrainHandle) {
    let app = FakeApp {
        t0: envoy.0.t0,
        sockets: Arc::new(sockets),
        processes_seen,
    };
    let (drain, handle) = Drain::new(plan, envoy.clone(), app);
    (tokio::spawn(drain.run()), handle)
}

/// An app of one process, seen (the pod shares its process namespace),
/// that exits at `exits_at`: its exit wakes the drain, as a pidfd does.
#[derive(Clone)]
struct OneProcessApp {
    t0: Instant,
    exits_at: Duration,
}

impl AppControl for OneProcessApp {
    type Error = std::convert::Infallible;
    async fn work(&self) -> Result<Work, Self::Error> {
        let running = self.t0.elapsed() < self.exits_at;
        let process = AppProcess {
            pid: 42,
            name: "app".into(),
        };
        Ok(Work {
            sockets: Vec::new(),
            processes: if running { vec![process] } else { Vec::new() },
            processes_seen: true,
        })
    }
    fn has_app(&self) -> Option<bool> {
        Some(true)
    }
    async fn changed(&self, processes: Vec<AppProcess>) {
        if !processes.is_empty() {
            tokio::time::sleep_until(self.t0 + self.exits_at).await;
        }
    }
}

/// Envoy's reads slowed (40 ms each: paced 440 ms apart, to spare Envoy's
/// admin thread) do not slow the drain's sight of the app's end: the app
/// alone is looked at in between. Its last socket closes at 1 s (no
/// shared process namespace): Envoy stops after the quiet period and a
/// read, not at the next paced read.
#[tokio::test(start_paused = true)]
async fn app_exit_sees_the_apps_end_between_envoys_paced_reads() {
    let envoy = FakeEnvoy::new(true, |_| (secs(0.04), conns(0).1));
    let (task, handle) = start_with_app(plan_with_minimum(DrainUntil::AppExit, 0.5), &envoy, |t| {
        usize::from(t < secs(1.0))
    });
    handle.signal(Signal::Term).await;
    assert!(matches!(task.await.unwrap(), Outcome::Drained(_)));
    // Seen within APP_SCAN; nothing for APP_QUIET; one read (40 ms).
    assert_between(envoy.stops()[0], 1.1, 1.2);
}

/// An app whose looks are slow to take (its socket table is big): one
/// that holds a socket until `ends_at`, each look taking `cost`, the
/// looks' starts kept.
#[derive(Clone)]
struct CostlyApp {
    t0: Instant,
    ends_at: Duration,
    cost: Duration,
    looks: Arc<std::sync::Mutex<Vec<Duration>>>,
}

impl AppControl for CostlyApp {
    type Error = std::convert::Infallible;
    async fn work(&self) -> Result<Work, Self::Error> {
        self.looks.lock().unwrap().push(self.t0.elapsed());
        tokio::time::sleep(self.cost).await;
        let socket = AppSocket {
            local: "127.0.0.1:41234".parse().unwrap(),
            remote: Some("127.0.0.1:15001".parse().unwrap()),
        };
        let n = usize::from(self.t0.elapsed() < self.ends_at);
        Ok(Work {
            sockets: vec![socket; n],
            processes: Vec::new(),
            processes_seen: false,
        })
    }
    fn has_app(&self) -> Option<bool> {
        Some(true)
    }
}

/// A drain of an app whose looks take `cost` each, whose last socket
/// closes at 2 s: the looks' starts while it held it, and when Envoy was
/// stopped.
async fn drain_with_costly_looks(cost: Duration) -> (Vec<Duration>, Duration) {
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let p = plan_with_minimum(DrainUntil::AppExit, 0.5);
    let app = CostlyApp {
        t0: envoy.0.t0,
        ends_at: secs(2.0),
        cost,
        looks: Arc::default(),
    };
    let (drain, handle) = Drain::new(p, envoy.clone(), app.clone());
    let task = tokio::spawn(drain.run());
    handle.signal(Signal::Term).await;
    assert!(matches!(task.await.unwrap(), Outcome::Drained(_)));
    // While the app holds its socket (after it, the quiet period's end
    // is read when it comes).
    let looks = app
        .looks
        .lock()
        .unwrap()
        .iter()
        .copied()
        .filter(|&t| t < secs(2.0))
        .collect();
    (looks, envoy.stops()[0])
}

/// The gaps between consecutive looks: the closest and the farthest.
fn gaps(looks: &[Duration]) -> (Duration, Duration) {
    let gaps: Vec<Duration> = looks.windows(2).map(|w| w[1] - w[0]).collect();
    (*gaps.iter().min().unwrap(), *gaps.iter().max().unwrap())
}

/// Looks at the app that take 10 ms start 110 ms apart (PACE times their
/// time), not every APP_SCAN: what lifeguard spends looking stays under a
/// tenth of a core however big the socket table. The app's end is still
/// seen by the next look.
#[tokio::test(start_paused = true)]
async fn costly_looks_at_the_app_are_paced_by_their_cost() {
    let (looks, stopped) = drain_with_costly_looks(secs(0.01)).await;
    let (closest, _) = gaps(&looks);
    assert!(closest >= secs(0.11), "looks {closest:?} apart: {looks:?}");
    // The end (2 s) seen by a look within 110 ms + its time, then
    // APP_QUIET (100 ms) and the read that confirms it.
    assert_between(stopped, 2.1, 2.5);
}

/// Looks that take 200 ms (a busy node) start APP_SCAN_MAX (1 s) apart,
/// not 2.2 s: the app's end is seen within a second and a look.
#[tokio::test(start_paused = true)]
async fn slow_looks_at_the_app_are_at_most_a_second_apart() {
    let (looks, stopped) = drain_with_costly_looks(secs(0.2)).await;
    let (closest, farthest) = gaps(&looks);
    assert!(
        closest >= secs(0.99) && farthest <= secs(1.0),
        "looks {closest:?} to {farthest:?} apart: {looks:?}"
    );
    assert_between(stopped, 2.0, 3.5);
}

/// Where the app's processes are seen, its last exit wakes the drain at
/// once, and nothing waits out a quiet period: Envoy stops one read
/// after it, whatever the reads' pace.
#[tokio::test(start_paused = true)]
async fn app_exit_stops_envoy_one_read_after_the_apps_last_process_exits() {
    let envoy = FakeEnvoy::new(true, |_| (secs(0.04), conns(0).1));
    let p = plan_with_minimum(DrainUntil::AppExit, 0.5);
    let app = OneProcessApp {
        t0: envoy.0.t0,
        exits_at: secs(1.013),
    };
    let (drain, handle) = Drain::new(p, envoy.clone(), app);
    let task = tokio::spawn(drain.run());
    handle.signal(Signal::Term).await;
    assert!(matches!(task.await.unwrap(), Outcome::Drained(_)));
    assert_between(envoy.stops()[0], 1.013, 1.06);
}

#[tokio::test(start_paused = true)]
async fn app_exit_waits_for_the_apps_outbound_calls_after_envoy_is_idle() {
    // Inbound requests end at 1 s; the app calls out through Envoy until
    // 4 s (one request in Envoy, one socket of the app's), then exits.
    let envoy = FakeEnvoy::new(true, |t| {
        conns(u64::from(t < secs(1.0) || (t >= secs(2.0) && t < secs(4.0))))
    });
    let (task, handle) = start_with_app(plan_with_minimum(DrainUntil::AppExit, 1.0), &envoy, |t| {
        usize::from(t < secs(4.2))
    });
    handle.signal(Signal::Term).await;
    at(&envoy, 3.0).await;
    let status = handle.status();
    assert_eq!(
        status.waiting_on.map(|w| w.to_string()).as_deref(),
        Some("1 requests in flight; 1 app socket (127.0.0.1:41234 -> 127.0.0.1:15001)")
    );
    assert_eq!(status.app_sockets, Some(1));
    let outcome = task.await.unwrap();
    assert!(matches!(outcome, Outcome::Drained(_)), "{outcome:?}");
    // Stopped once nothing was seen for APP_QUIET, within one read
    // period more.
    assert_between(envoy.stops()[0], 4.3, 4.35);
    let status = handle.status();
    assert_eq!(status.left_at_stop, Some(0));
    assert_eq!(status.waiting_on, None);
}

#[tokio::test(start_paused = true)]
async fn app_exit_is_cut_by_the_deadline_with_what_the_app_still_holds() {
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let (task, handle) = start_with_app(plan_with_deadline(DrainUntil::AppExit, 8.0), &envoy, |_| 2);
    handle.signal(Signal::Term).await;
    let outcome = task.await.unwrap();
    assert!(matches!(outcome, Outcome::Cut { left: Some(2), .. }), "{outcome:?}");
    assert_eq!(envoy.stops(), [secs(8.0)]);
}

#[tokio::test(start_paused = true)]
async fn the_fixed_policy_stopping_envoy_with_requests_in_flight_exits_3() {
    let envoy = FakeEnvoy::new(true, |_| conns(1));
    let (outcome, handle) = drain_after_term(plan(DrainUntil::Time), &envoy).await;
    assert!(matches!(outcome, Outcome::Unfinished { left: 1, .. }), "{outcome:?}");
    let status = handle.status();
    assert_eq!(status.left_at_stop, Some(1));
    assert!(!status.cut_by_deadline);
    assert_eq!(envoy.stops(), [secs(5.0)]);
}

/// A drain of 1 s minimum whose reads answer `after` the ask (each said
/// to have cost Envoy `took`, when given) and count 1 until 9 s: when
/// each read was asked for, and the fake Envoy.
async fn paced_drain(after: Duration, took: Option<Duration>) -> (Vec<Duration>, FakeEnvoy) {
    let starts = Arc::new(Mutex::new(Vec::new()));
    let seen = starts.clone();
    let t0 = Instant::now();
    let envoy = FakeEnvoy::new(true, move |t| {
        seen.lock().unwrap().push(t);
        (after, conns(u64::from(t < secs(9.0))).1)
    });
    assert_eq!(envoy.0.t0, t0);
    *envoy.0.took.lock().unwrap() = took;
    let (task, _handle) = start_signalled(plan_with_minimum(DrainUntil::Connections, 1.0), &envoy).await;
    task.await.unwrap();
    let starts = starts.lock().unwrap().clone();
    (starts, envoy)
}

#[tokio::test(start_paused = true)]
async fn slow_reads_space_themselves_to_a_tenth_of_envoys_time() {
    // Every read takes 200 ms: reads start 2.2 s apart (PACE times 200
    // ms), not every 50 ms.
    let (starts, envoy) = paced_drain(Duration::from_millis(200), None).await;
    for pair in starts.windows(2) {
        assert!(pair[1] - pair[0] >= secs(2.0), "{starts:?}");
    }
    // Each read and the pause after it: Envoy busy a tenth of the time.
    let busy = Duration::from_millis(200) * (starts.len() as u32 - 1);
    let span = *starts.last().unwrap() - starts[0];
    assert!(
        busy.as_secs_f64() / span.as_secs_f64() <= 0.1001,
        "{busy:?} of {span:?}"
    );
    // The drain still ends at the first zero read after 9 s.
    assert_between(envoy.stops()[0], 9.0, 11.3);
}

#[tokio::test(start_paused = true)]
async fn shared_reads_are_paced_by_what_they_cost_envoy_not_by_the_wait() {
    // Each read answers 50 ms after the drain asks, but it is one the
    // drain wait began 150 ms before the ask: it cost Envoy 200 ms. The
    // next read is asked PACE times 200 ms after that read began (2.05 s
    // after the ask), not PACE times the 50 ms waited (550 ms).
    let (starts, envoy) = paced_drain(Duration::from_millis(50), Some(Duration::from_millis(200))).await;
    assert!(starts.len() >= 3, "{starts:?}");
    let paced = Duration::from_millis(200) * PACE - Duration::from_millis(150);
    for pair in starts.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap >= paced && gap < paced + Duration::from_millis(20), "{starts:?}");
    }
    // The drain still ends at the first zero read after 9 s.
    assert_between(envoy.stops()[0], 9.0, 11.3);
}

#[tokio::test(start_paused = true)]
async fn a_hook_starts_the_pods_clock_before_sigterm() {
    // wait-app-exit tells the agent at 0 s; SIGTERM comes at 5 s (when
    // the hook returns). The deadline counts from the hook.
    let envoy = FakeEnvoy::new(true, |_| conns(1));
    let (task, handle) = start(plan_with_deadline(DrainUntil::Connections, 10.0), &envoy);
    let status = handle.begin(Asker::Operator).await.expect("the drain began");
    assert_eq!(status.phase, Phase::Draining, "readiness is 503 when begin() answers");
    assert_eq!(status.trigger, Some(Trigger::PostDrain));
    at(&envoy, 5.0).await;
    handle.signal(Signal::Term).await;
    let outcome = task.await.unwrap();
    assert!(matches!(outcome, Outcome::Cut { left: Some(1), .. }), "{outcome:?}");
    assert_eq!(envoy.stops(), [secs(10.0)]);
}

#[tokio::test(start_paused = true)]
async fn one_slow_read_does_not_stall_the_drain() {
    // Reads take 2 ms, but one (at 1 s) takes 900 ms: the pause after it
    // follows the shortest recent read, not the outlier.
    let envoy = FakeEnvoy::new(true, |t| {
        let delay = if t >= secs(1.0) && t < secs(1.05) { 900 } else { 2 };
        (Duration::from_millis(delay), conns(u64::from(t < secs(2.0))).1)
    });
    let (task, _handle) = start_signalled(plan_with_minimum(DrainUntil::Connections, 1.0), &envoy).await;
    task.await.unwrap();
    assert_between(envoy.stops()[0], 2.0, 2.1);
}

#[tokio::test(start_paused = true)]
async fn app_exit_is_not_fooled_by_a_moment_without_app_sockets() {
    // The app answers its last request at 1 s, holds nothing for 60 ms,
    // then calls out (one socket) until 3 s.
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let p = plan_with_minimum(DrainUntil::AppExit, 0.5);
    let gap = |t: Duration| t >= secs(1.0) && t < secs(1.06);
    let (task, handle) = start_with_app(p, &envoy, move |t| usize::from(t < secs(3.0) && !gap(t)));
    handle.signal(Signal::Term).await;
    task.await.unwrap();
    assert_between(envoy.stops()[0], 3.1, 3.15);
}

#[tokio::test(start_paused = true)]
async fn a_first_read_stuck_behind_a_long_scrape_does_not_stall_the_drain() {
    // Envoy's admin is busy for the first second (the first read times
    // out), then answers in 2 ms; the count reaches zero at 2 s.
    let envoy = FakeEnvoy::new(true, |t| {
        let delay = if t < secs(1.0) { 2000 } else { 2 };
        (Duration::from_millis(delay), conns(u64::from(t < secs(2.0))).1)
    });
    let (task, _handle) = start_signalled(plan_with_minimum(DrainUntil::Connections, 1.0), &envoy).await;
    task.await.unwrap();
    assert_between(envoy.stops()[0], 2.0, 2.1);
}

#[tokio::test(start_paused = true)]
async fn what_envoy_is_stopped_with_is_read_at_the_stop_not_when_the_time_ran_out() {
    // The preStop hook starts the drain at 0 s; the fixed 5 s run out with
    // 9 requests in flight; the app finishes them at 7.8 s; SIGTERM comes
    // at 7.9 s. Envoy stops with nothing in flight: drained, exit 0.
    let envoy = FakeEnvoy::new(true, |t| conns(if t < secs(7.8) { 9 } else { 0 }));
    let (task, handle) = start(plan(DrainUntil::Time), &envoy);
    handle.begin(Asker::Operator).await.expect("the drain began");
    at(&envoy, 5.5).await;
    assert_eq!(handle.status().phase, Phase::Drained);
    assert_eq!(handle.status().active_requests, Some(9));
    at(&envoy, 7.9).await;
    handle.signal(Signal::Term).await;
    let outcome = task.await.unwrap();
    assert!(matches!(outcome, Outcome::Drained(_)), "{outcome:?}");
    let status = handle.status();
    assert_eq!(status.left_at_stop, Some(0));
    assert!(!status.cut_by_deadline);
    assert_eq!(envoy.stops(), [secs(7.9)]);
}

#[tokio::test(start_paused = true)]
async fn the_fixed_policy_still_in_flight_at_the_signal_is_unfinished() {
    let envoy = FakeEnvoy::new(true, |_| conns(3));
    let (task, handle) = start(plan(DrainUntil::Time), &envoy);
    handle.begin(Asker::Operator).await.expect("the drain began");
    at(&envoy, 7.0).await;
    handle.signal(Signal::Term).await;
    let outcome = task.await.unwrap();
    assert!(matches!(outcome, Outcome::Unfinished { left: 3, .. }), "{outcome:?}");
    assert_eq!(handle.status().left_at_stop, Some(3));
}

#[tokio::test(start_paused = true)]
async fn work_that_came_after_post_drain_is_waited_for_at_the_signal() {
    // Drained (zero) at 6 s; new requests from 10 s to 12.5 s (a graceful
    // drain still accepts); SIGTERM at 11 s waits for them.
    let envoy = FakeEnvoy::new(true, |t| {
        conns(u64::from(t < secs(6.0) || (t >= secs(10.0) && t < secs(12.5))))
    });
    let (task, handle) = start(plan(DrainUntil::Requests), &envoy);
    let h = handle.clone();
    let waiter = tokio::spawn(async move { h.drain(Asker::Operator).await });
    assert_eq!(waiter.await.unwrap().expect("drained").phase, Phase::Drained);
    at(&envoy, 11.0).await;
    handle.signal(Signal::Term).await;
    // Waiting for the new work is draining again, not drained.
    at(&envoy, 12.0).await;
    assert_eq!(handle.status().phase, Phase::Draining);
    assert_eq!(
        handle.status().waiting_on.map(|w| w.to_string()).as_deref(),
        Some("1 requests")
    );
    let outcome = task.await.unwrap();
    assert!(matches!(outcome, Outcome::Drained(_)), "{outcome:?}");
    assert_between(envoy.stops()[0], 12.5, 12.55);
    assert_eq!(handle.status().left_at_stop, Some(0));
}

#[tokio::test(start_paused = true)]
async fn the_readiness_fail_delay_drains_envoy_first_and_fails_readiness_after() {
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let mut p = plan_with_minimum(DrainUntil::Requests, 1.0);
    p.readiness_fail_delay = secs(3.0);
    let (task, handle) = start_signalled(p, &envoy).await;
    at(&envoy, 1.0).await;
    // Envoy drains from the start, while readiness answers as Envoy does.
    assert_eq!(
        envoy.drain_calls(),
        [(
            Duration::ZERO,
            Call::DrainListeners {
                skip_exit: false,
                phase: Phase::DrainingReady
            }
        )]
    );
    assert_eq!(handle.status().phase, Phase::DrainingReady);
    assert!(!handle.status().phase.fails_readiness());
    at(&envoy, 2.9).await;
    assert_eq!(handle.status().phase, Phase::DrainingReady);
    assert!(matches!(task.await.unwrap(), Outcome::Drained(_)));
    // The minimum counts from Envoy's drain; the policy ends once
    // readiness has failed.
    assert_between(envoy.stops()[0], 3.0, 3.05);
}

#[tokio::test(start_paused = true)]
async fn the_readiness_fail_delay_is_bounded_by_the_deadline() {
    let envoy = FakeEnvoy::new(true, |_| conns(1));
    let mut p = plan_with_deadline(DrainUntil::Requests, 8.0);
    p.readiness_fail_delay = secs(60.0);
    let (outcome, _handle) = drain_after_term(p, &envoy).await;
    assert!(matches!(outcome, Outcome::Cut { left: Some(1), .. }), "{outcome:?}");
    assert_eq!(envoy.stops(), [secs(8.0)]);
}

/// The progress line `GET /drain` shows `t` seconds into the drain.
fn progress_at(handle: &DrainHandle, t: f64) -> Option<String> {
    let status = handle.status();
    status.progress(status.started_at? + t)
}

#[tokio::test(start_paused = true)]
async fn the_progress_says_what_is_awaited_and_the_time_left() {
    let envoy = FakeEnvoy::new(true, |t| conns(if t < secs(9.0) { 2 } else { 0 }));
    let (task, handle) = start_signalled(plan(DrainUntil::Requests), &envoy).await;
    at(&envoy, 2.0).await;
    assert_eq!(
        progress_at(&handle, 2.0).as_deref(),
        Some("waiting for 2 requests; the minimum drain time ends in 3s; 26s to the deadline")
    );
    // Written when asked: the time left as of the asking.
    assert_eq!(
        progress_at(&handle, 2.35).as_deref(),
        Some("waiting for 2 requests; the minimum drain time ends in 2.6s; 25.6s to the deadline")
    );
    at(&envoy, 7.0).await;
    assert_eq!(
        progress_at(&handle, 7.0).as_deref(),
        Some("waiting for 2 requests; 21s to the deadline")
    );
    task.await.unwrap();
    assert_eq!(
        progress_at(&handle, 9.0).as_deref(),
        Some("nothing left; 19s to the deadline")
    );
}

#[tokio::test(start_paused = true)]
async fn app_exit_stops_envoy_at_once_when_the_app_was_gone_before_the_drain() {
    // The app's preStop hook could not reach the agent: the drain begins at
    // the proxy's SIGTERM, after the app has exited. Nothing is left, its
    // processes included (the pod shares its process namespace): no
    // minimum (5 s) to wait out.
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let (task, handle) = start_with_fake_app(plan(DrainUntil::AppExit), &envoy, true, |_| 0);
    handle.signal(Signal::Term).await;
    let outcome = task.await.unwrap();
    assert!(matches!(outcome, Outcome::Drained(_)), "{outcome:?}");
    // No quiet period either: an exited process does not come back.
    assert_between(envoy.stops()[0], 0.0, 0.05);
    let progress = progress_at(&handle, 0.0).unwrap();
    assert!(
        progress.starts_with("the app was already gone when the drain began"),
        "{progress}"
    );
}

#[tokio::test(start_paused = true)]
async fn app_exit_waits_out_the_minimum_once_the_app_was_seen() {
    // The app still held a socket at the first reads and exits at 0.3 s:
    // the minimum applies, as load balancers must see the 503 first.
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let (task, handle) = start_with_app(plan(DrainUntil::AppExit), &envoy, |t| usize::from(t < secs(0.3)));
    handle.signal(Signal::Term).await;
    task.await.unwrap();
    assert_between(envoy.stops()[0], 5.0, 5.05);
    assert!(!progress_at(&handle, 0.0).unwrap().contains("already gone"));
}

#[tokio::test(start_paused = true)]
async fn app_exit_waives_the_minimum_only_when_the_apps_processes_are_seen_gone() {
    // Without a shared process namespace, no socket at the first reading
    // may be an app between two steps of its shutdown (its listener closed
    // at SIGTERM, its next call not yet made): the minimum applies.
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let (task, handle) = start_with_fake_app(plan(DrainUntil::AppExit), &envoy, false, |_| 0);
    handle.signal(Signal::Term).await;
    task.await.unwrap();
    assert_between(envoy.stops()[0], 5.0, 5.05);
    assert!(!progress_at(&handle, 0.0).unwrap().contains("already gone"));
    // ... and with it, an app whose last process has exited is gone.
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let (task, handle) = start_with_fake_app(plan(DrainUntil::AppExit), &envoy, true, |_| 0);
    handle.signal(Signal::Term).await;
    task.await.unwrap();
    assert_between(envoy.stops()[0], 0.0, 0.05);
    let progress = progress_at(&handle, 0.0).unwrap();
    assert!(
        progress.starts_with(
            "the app was already gone when the drain began (no process left in the app's containers, \
             the pod sharing its process namespace; no app socket)"
        ),
        "{progress}"
    );
}

/// The app gone at the drain's start, but one request in flight
/// then (a client still sending to the gone app; Envoy answers it 503 at
/// once): Envoy waits for that request, not for the 5 s minimum.
#[tokio::test(start_paused = true)]
async fn a_gone_app_with_a_request_in_flight_at_the_drains_start_waits_for_the_request_not_the_floor() {
    let envoy = FakeEnvoy::new(true, |t| conns(u64::from(t < secs(0.3))));
    let (task, handle) = start_with_fake_app(plan(DrainUntil::AppExit), &envoy, true, |_| 0);
    handle.signal(Signal::Term).await;
    assert!(matches!(task.await.unwrap(), Outcome::Drained(_)));
    // The request ends at 0.3 s: the next read finds nothing left, and
    // the app's processes are seen gone (no quiet period to wait out).
    assert_between(envoy.stops()[0], 0.3, 0.35);
    assert!(progress_at(&handle, 0.0)
        .unwrap()
        .starts_with("the app was already gone"));
}

#[tokio::test(start_paused = true)]
async fn app_exit_decides_how_the_drain_began_from_its_first_reading_alone() {
    // Gone at the first reading, a request in Envoy then (a load
    // balancer's, to a gone app): the drain began with the app gone, and
    // Envoy stops once the request ends, not at 5 s.
    let envoy = FakeEnvoy::new(true, |t| conns(u64::from(t < secs(0.1))));
    let (task, handle) = start_with_fake_app(plan(DrainUntil::AppExit), &envoy, true, |_| 0);
    handle.signal(Signal::Term).await;
    task.await.unwrap();
    assert_between(envoy.stops()[0], 0.1, 0.15);
    assert!(progress_at(&handle, 0.0)
        .unwrap()
        .starts_with("the app was already gone"));
    // Here at the first reading, gone from the next: the minimum applies,
    // whatever the later readings say.
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let (task, handle) = start_with_fake_app(plan(DrainUntil::AppExit), &envoy, true, |t| usize::from(t < secs(0.01)));
    handle.signal(Signal::Term).await;
    task.await.unwrap();
    assert_between(envoy.stops()[0], 5.0, 5.05);
    assert!(!progress_at(&handle, 0.0).unwrap().contains("already gone"));
}

/// A SIGTERM is never dropped: with the event queue full of `POST /drain`
/// requests (a flood from the app, say) before the machine runs, the
/// signal waits its turn, and Envoy is stopped once drained, not kept
/// running as a drain asked by `POST /drain` alone would be.
#[tokio::test(start_paused = true)]
async fn a_signal_behind_a_full_queue_of_drain_requests_is_not_dropped() {
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let (drain, handle) = Drain::new(plan(DrainUntil::Time), envoy.clone(), ());
    *envoy.0.phase.lock().unwrap() = Some(handle.watch());
    let floods: Vec<_> = (0..100)
        .map(|_| {
            let handle = handle.clone();
            tokio::spawn(async move { handle.drain(Asker::Operator).await })
        })
        .collect();
    // Every flood request is queued or waiting for room before the signal.
    tokio::task::yield_now().await;
    let signal = {
        let handle = handle.clone();
        tokio::spawn(async move { handle.signal(Signal::Term).await })
    };
    tokio::task::yield_now().await;
    let outcome = tokio::time::timeout(Duration::from_secs(60), drain.run())
        .await
        .expect("the drain ends: the signal reached it");
    assert!(matches!(outcome, Outcome::Drained(_)), "{outcome:?}");
    assert_eq!(handle.status().stop_signal, Some(Signal::Term));
    signal.await.unwrap();
    for flood in floods {
        let _ = flood.await;
    }
}

#[tokio::test(start_paused = true)]
async fn the_read_at_a_stop_past_the_deadline_gets_a_quarter_of_the_shutdown_margin() {
    // `POST /drain` at 0 s; one connection stays; the 3 s deadline cuts
    // the drain and Envoy keeps running; SIGTERM comes at 4 s, when
    // Envoy's admin takes 200 ms a read (a busy machine). The read gets a
    // quarter of the 1 s margin, so what Envoy is stopped with is known.
    let envoy = FakeEnvoy::new(true, |t| {
        let delay = if t >= secs(4.0) { 200 } else { 2 };
        (Duration::from_millis(delay), conns(1).1)
    });
    let mut p = plan_with_minimum(DrainUntil::Connections, 0.5);
    p.grace = Grace::new(secs(4.0), secs(1.0)).unwrap();
    assert_eq!(p.last_read_timeout(), secs(0.25));
    let (task, handle) = start(p, &envoy);
    handle.begin(Asker::Operator).await.expect("the drain began");
    at(&envoy, 4.0).await;
    assert_eq!(handle.status().phase, Phase::Drained);
    handle.signal(Signal::Term).await;
    let outcome = task.await.unwrap();
    assert!(matches!(outcome, Outcome::Cut { left: Some(1), .. }), "{outcome:?}");
    assert_eq!(handle.status().left_at_stop, Some(1));
    assert_between(envoy.stops()[0], 4.2, 4.21);
}

/// Lifeguard's child Envoy gets the rest of the grace period to exit
/// after SIGTERM (less a quarter of the margin for lifeguard's own exit),
/// never less than the margin while that much is left, never past the
/// grace period; an Envoy beside lifeguard, the margin after
/// /quitquitquit.
#[test]
fn envoys_stop_gets_the_rest_of_the_grace_period() {
    let mut p = plan(DrainUntil::Connections);
    p.grace = Grace::new(secs(30.0), secs(2.0)).unwrap();
    let began = Instant::now();
    let child = |at: f64| p.stop_bound(Some(began), None, began + secs(at), true);
    assert_eq!(child(5.0), secs(24.5));
    assert_eq!(child(28.0), secs(2.0), "at the deadline: the margin");
    assert_eq!(child(28.4), secs(1.6), "past it: what is left");
    assert_eq!(child(31.0), Duration::ZERO);
    assert_eq!(p.stop_bound(None, None, began, true), secs(2.0), "a bare /quitquitquit");
    // An Envoy beside lifeguard: waited for the margin after /quitquitquit.
    assert_eq!(p.stop_bound(Some(began), None, began + secs(5.0), false), secs(2.0));
    assert_eq!(p.stop_bound(Some(began), None, began + secs(28.4), false), secs(1.6));
    // The kubelet's SIGTERM at the grace period's end (a native sidecar's,
    // once the app outlived it) comes with 2 s before its SIGKILL: Envoy
    // gets those, less a quarter of the margin, not a SIGKILL at once.
    let signalled = Some(began + secs(30.0));
    assert_eq!(
        p.stop_bound(Some(began), signalled, began + secs(30.3), true),
        secs(1.2)
    );
    assert_eq!(
        p.stop_bound(Some(began), signalled, began + secs(31.6), true),
        Duration::ZERO
    );
    // A SIGTERM long before: the grace period decides, as before.
    assert_eq!(
        p.stop_bound(Some(began), Some(began), began + secs(31.0), true),
        Duration::ZERO
    );
    assert_eq!(
        p.stop_bound(Some(began), Some(began), began + secs(5.0), true),
        secs(24.5)
    );
}

#[test]
fn the_last_read_gets_a_quarter_of_the_margin_and_at_most_an_admin_call() {
    let mut p = plan(DrainUntil::Connections);
    p.grace = Grace::new(secs(30.0), secs(2.0)).unwrap();
    assert_eq!(p.last_read_timeout(), secs(0.5));
    p.grace = Grace::new(secs(30.0), secs(0.1)).unwrap();
    assert_eq!(p.last_read_timeout(), Duration::from_millis(25), "the smallest margin");
    p.grace = Grace::new(secs(60.0), secs(30.0)).unwrap();
    p.admin_timeout = secs(1.0);
    assert_eq!(p.last_read_timeout(), secs(1.0), "one admin call at most");
}

/// The wait for one checker at 10.0.0.5, 1 of 3 failures in a row,
/// probing every `every` seconds.
fn checker_pending(every: u64) -> WaitingOn {
    let key = CheckerKey::new(std::net::IpAddr::from([10, 0, 0, 5]), false, b"").unwrap();
    WaitingOn::Checkers {
        pending: vec![Pending {
            key,
            counted: true,
            failures_in_row: 1,
            threshold: 3,
            interval: Duration::from_secs(every),
        }],
        unfollowed: false,
    }
}

/// No new request for `quiet`, none for `so_far`.
fn quiet_pending(quiet: f64, so_far: f64) -> WaitingOn {
    WaitingOn::Quiet {
        quiet: secs(quiet),
        so_far: secs(so_far),
    }
}

/// The verdict `Out`, no checker seen, the quiet period 500 ms.
fn out() -> RotationVerdict {
    RotationVerdict::Out(Conclusion {
        quiet: Duration::from_millis(500),
        ..Conclusion::default()
    })
}

/// The drain wait's verdict, and the load balancers letting the pod go
/// before it, as a test gives them.
#[derive(Clone)]
struct FakeRotation(watch::Sender<Option<RotationVerdict>>, watch::Sender<bool>);

impl FakeRotation {
    fn new() -> Self {
        FakeRotation(watch::channel(None).0, watch::channel(false).0)
    }
    /// The verdict (the load balancers let go with it, if not before).
    fn give(&self, verdict: RotationVerdict) {
        self.0.send_replace(Some(verdict));
    }
    /// The load balancers let the pod go; no verdict yet.
    fn let_go_now(&self) {
        self.1.send_replace(true);
    }
}

impl Rotation for FakeRotation {
    async fn verdict(&self) -> RotationVerdict {
        let mut rx = self.0.subscribe();
        let verdict = rx.wait_for(Option::is_some).await.expect("sender kept");
        verdict.clone().unwrap()
    }
    async fn let_go(&self) {
        let (mut verdict, mut let_go) = (self.0.subscribe(), self.1.subscribe());
        tokio::select! {
            _ = verdict.wait_for(Option::is_some) => {}
            _ = let_go.wait_for(|l| *l) => {}
        }
    }
    fn waiting_on(&self) -> WaitingOn {
        checker_pending(2)
    }
}

/// An app that never was: nothing of it ever seen.
#[derive(Clone)]
struct NoApp;

impl AppControl for NoApp {
    type Error = std::convert::Infallible;
    async fn work(&self) -> Result<Work, Self::Error> {
        Ok(Work {
            processes_seen: false,
            ..Work::default()
        })
    }
    fn has_app(&self) -> Option<bool> {
        Some(false)
    }
}

fn start_gateway<A: AppControl + Send + Sync + 'static>(
    plan: Plan,
    envoy: &FakeEnvoy,
    app: A,
    rotation: &FakeRotation,
) -> (tokio::task::JoinHandle<Outcome>, DrainHandle)
where
    A::Error: Send,
{
    let (drain, handle) = Drain::new(plan, envoy.clone(), app);
    *envoy.0.phase.lock().unwrap() = Some(handle.watch());
    let drain = drain.with_rotation(rotation.clone());
    (tokio::spawn(drain.run()), handle)
}

/// A gateway: Envoy serves as before (no drain of its listeners: its
/// kept-alive connections stay open) until the load balancers have let the
/// pod go, however long past the 5 s minimum that is; then drains (each
/// kept-alive connection closed at a request boundary) while the traffic
/// still comes, and stops once the verdict came and no request is in
/// flight.
#[tokio::test(start_paused = true)]
async fn out_of_rotation_serves_until_let_go_then_drains_and_stops_once_out_and_idle() {
    // Requests flow until 7.3 s (the load balancer's last), then none.
    let envoy = FakeEnvoy::new(true, |t| conns(u64::from(t < secs(7.3))));
    let rotation = FakeRotation::new();
    let (task, handle) = start_gateway(plan(DrainUntil::OutOfRotation), &envoy, (), &rotation);
    handle.signal(Signal::Term).await;
    at(&envoy, 5.9).await;
    let status = handle.status();
    assert_eq!(status.phase, Phase::LeavingRotation, "readiness 503, Envoy serving");
    assert_eq!(
        progress_at(&handle, 5.9).as_deref(),
        Some("leaving rotation, Envoy serving: waiting for 1 checker: 10.0.0.5 (1 of 3 failures in a row, every 2s); 22.1s to the deadline")
    );
    assert!(
        envoy.drain_calls().is_empty(),
        "no drain before the load balancers let go"
    );
    at(&envoy, 6.0).await;
    rotation.let_go_now();
    at(&envoy, 6.9).await;
    assert_eq!(
        envoy.drain_calls(),
        [(
            secs(6.0),
            Call::DrainListeners {
                skip_exit: false,
                phase: Phase::LeavingRotation
            }
        )],
        "kept-alive connections closed once let go, before the verdict"
    );
    assert_eq!(handle.status().phase, Phase::LeavingRotation);
    assert!(envoy.stops().is_empty(), "no stop before the verdict");
    at(&envoy, 7.0).await;
    rotation.give(out());
    let outcome = task.await.unwrap();
    assert!(matches!(outcome, Outcome::Drained(_)), "{outcome:?}");
    assert_eq!(envoy.drain_calls().len(), 1, "one drain");
    // The last request ends at 7.3 s; nothing for 100 ms: one read later.
    assert_between(envoy.stops()[0], 7.4, 7.45);
    let status = handle.status();
    assert_eq!(status.out_of_rotation_after_seconds, Some(7.0));
    assert!(!status.cut_by_deadline && status.held_by.is_none());
}

/// The verdict never comes: the wait ends at its bound (a gateway's is
/// the deadline), with what held it; Envoy, with nothing in flight, is
/// stopped and the outcome says so: the wait's bound, not a cut.
#[tokio::test(start_paused = true)]
async fn a_verdict_that_never_comes_ends_at_the_bound_reported_with_who_held_it() {
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let rotation = FakeRotation::new();
    let (task, handle) = start_gateway(p_with_deadline(20.0), &envoy, (), &rotation);
    handle.signal(Signal::Term).await;
    at(&envoy, 19.9).await;
    assert!(envoy.drain_calls().is_empty());
    rotation.give(RotationVerdict::NotOut(checker_pending(30)));
    let outcome = task.await.unwrap();
    assert!(matches!(outcome, Outcome::WaitBound(_)), "{outcome:?}");
    let status = handle.status();
    assert!(!status.cut_by_deadline, "nothing was cut");
    assert_eq!(
        status.held_by.map(|h| h.to_string()).as_deref(),
        Some("1 checker: 10.0.0.5 (1 of 3 failures in a row, every 30s)")
    );
    assert_between(envoy.stops()[0], 19.9, 20.0);
    // With no verdict at all, the deadline itself ends the wait.
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let (task, handle) = start_gateway(p_with_deadline(12.0), &envoy, (), &FakeRotation::new());
    handle.signal(Signal::Term).await;
    assert!(matches!(task.await.unwrap(), Outcome::WaitBound(_)));
    assert_eq!(envoy.stops(), [secs(12.0)]);
    assert_eq!(handle.status().held_by, Some(WaitingOn::Deadline));
    // Work in flight at the deadline: cut, whatever held the wait.
    let envoy = FakeEnvoy::new(true, |_| conns(1));
    let (task, handle) = start_gateway(p_with_deadline(12.0), &envoy, (), &FakeRotation::new());
    handle.signal(Signal::Term).await;
    assert!(matches!(task.await.unwrap(), Outcome::Cut { left: Some(1), .. }));
    assert!(handle.status().cut_by_deadline);
}

/// `plan_with_deadline` of the out-of-rotation policy.
fn p_with_deadline(deadline: f64) -> Plan {
    plan_with_deadline(DrainUntil::OutOfRotation, deadline)
}

/// The default in a pod where no app was ever seen: its only container is
/// the proxy, a gateway; it drains until out of rotation, every listener.
#[tokio::test(start_paused = true)]
async fn app_exit_by_default_in_a_pod_without_an_app_drains_out_of_rotation() {
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let rotation = FakeRotation::new();
    let mut p = plan(DrainUntil::AppExit);
    p.asked = false;
    let (task, handle) = start_gateway(p, &envoy, NoApp, &rotation);
    handle.signal(Signal::Term).await;
    at(&envoy, 3.0).await;
    let status = handle.status();
    assert_eq!(status.policy, DrainUntil::OutOfRotation);
    assert_eq!(status.phase, Phase::LeavingRotation);
    rotation.give(out());
    assert!(matches!(task.await.unwrap(), Outcome::Drained(_)));
    assert_between(envoy.stops()[0], 3.1, 3.2);
    // A pod whose app was seen keeps app-exit, and its 5 s minimum.
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let mut p = plan(DrainUntil::AppExit);
    p.asked = false;
    let (task, handle) = start_with_app(p, &envoy, |_| 0);
    handle.signal(Signal::Term).await;
    assert!(matches!(task.await.unwrap(), Outcome::Drained(_)));
    assert_eq!(handle.status().policy, DrainUntil::AppExit);
    assert_between(envoy.stops()[0], 5.0, 5.2);
}

// ---------------------------------------------------------------------------
// Readiness told to each audience while the pod terminates

/// `plan(policy)` with the kubelet answered as Envoy is while the pod
/// terminates (the default).
fn serving(policy: DrainUntil) -> Plan {
    Plan {
        terminating_readiness: TerminatingReadiness::Serving,
        ..plan(policy)
    }
}

/// Any policy's machine, its verdict given by `rotation`.
fn start_with_rotation(
    plan: Plan,
    envoy: &FakeEnvoy,
    rotation: &FakeRotation,
) -> (tokio::task::JoinHandle<Outcome>, DrainHandle) {
    start_gateway(plan, envoy, (), rotation)
}

/// The fixed policy, the pod terminating: Envoy's listeners stay open
/// (`skip_exit`), the kubelet follows Envoy, and Envoy is not stopped at
/// the 5 s drain time but once the load balancers let go (kube-proxy
/// sends the node's new connections until then); the kubelet's answer
/// turns at the stop.
#[tokio::test(start_paused = true)]
async fn while_the_kubelet_follows_envoy_the_fixed_policy_stops_envoy_only_after_the_verdict() {
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let rotation = FakeRotation::new();
    let (task, handle) = start_with_rotation(serving(DrainUntil::Time), &envoy, &rotation);
    let cell = handle.phase();
    handle.signal(Signal::Term).await;
    at(&envoy, 11.0).await;
    let status = handle.status();
    assert_eq!(status.phase, Phase::Draining);
    assert_eq!(
        status.kubelet.as_ref().map(|k| k.answer),
        Some(KubeletAnswer::FollowsEnvoy)
    );
    assert!(cell.load().kubelet_follows_envoy);
    assert!(envoy.stops().is_empty(), "Envoy serves past its 5 s until the verdict");
    assert_eq!(
        progress_at(&handle, 11.0).as_deref(),
        Some(
            "Envoy draining, accepting what kube-proxy still sends until the load balancers let go: \
             waiting for 1 checker: 10.0.0.5 (1 of 3 failures in a row, every 2s); 17s to the deadline"
        )
    );
    rotation.give(out());
    assert!(matches!(task.await.unwrap(), Outcome::Drained(_)));
    assert_eq!(
        envoy.drain_calls(),
        [(
            Duration::ZERO,
            Call::DrainListeners {
                skip_exit: true,
                phase: Phase::Draining
            }
        )]
    );
    assert_eq!(envoy.stops(), [secs(11.0)], "the drain time is over: at the verdict");
    let kubelet = handle.status().kubelet.unwrap();
    assert_eq!(kubelet.not_serving_after_seconds, Some(11.0));
    assert_eq!(kubelet.not_serving_because, Some(NotServingBecause::OutOfRotation));
    assert_eq!(cell.kubelet_window(), Err(NotServingBecause::OutOfRotation));
}

/// Issue #51: the kubelet is answered as Envoy is for the node's load
/// balancers' time (assumed: every 10 s, out after 3, and kube-proxy's
/// second: 31 s), then 503, so that an announcer withdraws the node; the
/// drain goes on waiting for the traffic to stop.
#[tokio::test(start_paused = true)]
async fn the_kubelets_window_closes_after_the_node_load_balancers_time() {
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let rotation = FakeRotation::new();
    let mut p = serving(DrainUntil::Time);
    p.grace = with_deadline(p.grace, secs(88.0));
    let (task, handle) = start_with_rotation(p, &envoy, &rotation);
    let cell = handle.phase();
    handle.signal(Signal::Term).await;
    at(&envoy, 0.001).await;
    let kubelet = handle.status().kubelet.unwrap();
    assert_eq!(kubelet.serving_window_seconds, Some(31.0));
    at(&envoy, 30.9).await;
    assert_eq!(cell.kubelet_window(), Ok(()));
    assert_eq!(handle.status().kubelet.unwrap().not_serving_after_seconds, None);
    at(&envoy, 31.0).await;
    assert_eq!(
        cell.kubelet_window(),
        Err(NotServingBecause::NodeLoadBalancersTime),
        "closed at 31 s exactly"
    );
    tokio::task::yield_now().await;
    let kubelet = handle.status().kubelet.unwrap();
    assert_eq!(kubelet.not_serving_after_seconds, Some(31.0));
    assert_eq!(
        kubelet.not_serving_because,
        Some(NotServingBecause::NodeLoadBalancersTime)
    );
    assert!(envoy.stops().is_empty(), "Envoy serves on until the traffic stops");
    at(&envoy, 47.0).await;
    rotation.give(out());
    assert!(matches!(task.await.unwrap(), Outcome::Drained(_)));
    assert_eq!(envoy.stops(), [secs(47.0)]);
    let kubelet = handle.status().kubelet.unwrap();
    assert_eq!(
        kubelet.not_serving_because,
        Some(NotServingBecause::NodeLoadBalancersTime),
        "the first turn is the one kept"
    );
    // Declared checks set the window: every 5 s, out after 2, and 1 s.
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let mut p = serving(DrainUntil::Time);
    p.node_checks = NodeChecks::new(vec!["5sx2".parse().unwrap()]);
    let (_task, handle) = start_with_rotation(p, &envoy, &FakeRotation::new());
    handle.signal(Signal::Term).await;
    at(&envoy, 0.001).await;
    assert_eq!(handle.status().kubelet.unwrap().serving_window_seconds, Some(11.0));
    at(&envoy, 11.0).await;
    assert!(handle.phase().kubelet_window().is_err());
}

/// Zero requests, the pod terminating: the verdict first (at 2 s), then the
/// policy's own rule (its 5 s minimum, then no request).
#[tokio::test(start_paused = true)]
async fn while_the_kubelet_follows_envoy_an_exit_on_zero_policy_keeps_its_own_rule_after_the_verdict() {
    let envoy = FakeEnvoy::new(true, |t| conns(u64::from(t < secs(6.0))));
    let rotation = FakeRotation::new();
    rotation.give(out());
    let (task, handle) = start_with_rotation(serving(DrainUntil::Requests), &envoy, &rotation);
    handle.signal(Signal::Term).await;
    assert!(matches!(task.await.unwrap(), Outcome::Drained(_)));
    assert_between(envoy.stops()[0], 6.0, 6.1);
    // A verdict that never comes: cut at the deadline, with who held it.
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let rotation = FakeRotation::new();
    let (task, handle) = start_with_rotation(serving(DrainUntil::Connections), &envoy, &rotation);
    handle.signal(Signal::Term).await;
    at(&envoy, 27.9).await;
    rotation.give(RotationVerdict::NotOut(quiet_pending(23.0, 4.2)));
    assert!(matches!(task.await.unwrap(), Outcome::WaitBound(_)));
    assert_eq!(handle.status().held_by, Some(quiet_pending(23.0, 4.2)));
}

/// Issue #51: a `requests` drain of a pod with sparse traffic and no load
/// balancer ever seen: the wait's bound (23 s of a 30 s grace period)
/// ends the wait for the traffic to be quiet, nothing is in flight, and
/// Envoy stops then, well before the deadline. Not a cut: the outcome
/// says the wait's bound.
#[tokio::test(start_paused = true)]
async fn a_sparse_pods_drain_ending_at_the_waits_bound_is_no_cut() {
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let rotation = FakeRotation::new();
    let (task, handle) = start_with_rotation(serving(DrainUntil::Requests), &envoy, &rotation);
    handle.signal(Signal::Term).await;
    at(&envoy, 23.0).await;
    rotation.give(RotationVerdict::NotOut(quiet_pending(23.0, 4.2)));
    let outcome = task.await.unwrap();
    assert!(matches!(outcome, Outcome::WaitBound(_)), "{outcome:?}");
    let status = handle.status();
    assert!(!status.cut_by_deadline);
    assert_eq!(status.left_at_stop, Some(0));
    assert_between(envoy.stops()[0], 23.0, 23.1);
}

/// An operator's `POST /drain` (the pod not terminating) takes the pod out
/// of its endpoints: the kubelet is answered 503 from the start, and the
/// policy needs no verdict. The preStop hook's is the pod's termination.
#[tokio::test(start_paused = true)]
async fn an_operators_drain_fails_the_kubelet_too_and_the_prestop_hooks_does_not() {
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let (task, handle) = start_with_rotation(serving(DrainUntil::Time), &envoy, &FakeRotation::new());
    let status = handle.drain(Asker::Operator).await.unwrap();
    assert_eq!(status.trigger, Some(Trigger::PostDrain));
    let kubelet = status.kubelet.unwrap();
    assert_eq!(kubelet.answer, KubeletAnswer::NotServing);
    assert_eq!(kubelet.not_serving_after_seconds, Some(0.0));
    assert_eq!(kubelet.not_serving_because, Some(NotServingBecause::OperatorDrain));
    assert!(!handle.phase().load().kubelet_follows_envoy);
    assert_eq!(status.duration_seconds, Some(5.0), "no verdict awaited");
    // A signal now: the drain stays the operator's (the kubelet's 503).
    handle.signal(Signal::Term).await;
    task.await.unwrap();
    assert!(!handle.phase().load().kubelet_follows_envoy);

    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let rotation = FakeRotation::new();
    let (_task, handle) = start_with_rotation(serving(DrainUntil::Time), &envoy, &rotation);
    let status = handle.begin(Asker::PreStop).await.unwrap();
    assert_eq!(status.trigger, Some(Trigger::PreStop));
    assert_eq!(status.trigger.unwrap().to_string(), "preStop hook");
    assert_eq!(status.kubelet.unwrap().answer, KubeletAnswer::FollowsEnvoy);
    assert!(handle.phase().load().kubelet_follows_envoy);
}

/// `app-exit`: the app's own hook holds the app (and so Envoy) until the
/// verdict; the drain does not wait for it again, and Envoy's listeners
/// stay open until the stop.
#[tokio::test(start_paused = true)]
async fn app_exit_while_the_kubelet_follows_envoy_stops_once_the_app_is_gone_without_a_verdict() {
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let (task, handle) = start_with_app(serving(DrainUntil::AppExit), &envoy, |t| usize::from(t < secs(7.0)));
    handle.signal(Signal::Term).await;
    assert!(matches!(task.await.unwrap(), Outcome::Drained(_)));
    assert_between(envoy.stops()[0], 7.0, 7.2);
    assert!(matches!(
        envoy.drain_calls()[0].1,
        Call::DrainListeners { skip_exit: true, .. }
    ));
    assert_eq!(handle.status().kubelet.unwrap().answer, KubeletAnswer::FollowsEnvoy);
}

/// The older rule, by name: every prober 503 from the drain's start.
#[tokio::test(start_paused = true)]
async fn terminating_readiness_failing_answers_the_kubelet_503_from_the_start() {
    let envoy = FakeEnvoy::new(true, |_| conns(0));
    let (task, handle) = start_signalled(plan(DrainUntil::Time), &envoy).await;
    task.await.unwrap();
    let kubelet = handle.status().kubelet.unwrap();
    assert_eq!(kubelet.answer, KubeletAnswer::NotServing);
    assert_eq!(
        kubelet.not_serving_because,
        Some(NotServingBecause::TerminatingReadinessFailing)
    );
    assert_eq!(envoy.stops(), [secs(5.0)]);
}

/// An Envoy beside lifeguard (not its child) that stops answering while
/// the drain waits for the load balancers' verdict is seen gone within
/// about a second, as when the drain reads its counts.
#[tokio::test(start_paused = true)]
async fn an_external_envoy_gone_while_the_drain_waits_for_the_verdict_ends_it() {
    let envoy = FakeEnvoy::new(false, |t| if t < secs(3.0) { conns(0) } else { refused() });
    let (task, handle) = start_with_rotation(serving(DrainUntil::Time), &envoy, &FakeRotation::new());
    handle.signal(Signal::Term).await;
    let outcome = task.await.unwrap();
    assert_eq!(outcome, Outcome::EnvoyGone);
    assert_between(envoy.since(), 4.0, 4.3);
    assert!(envoy.stops().is_empty(), "nothing to stop");
}
