//! The unit tests of `task`.

use super::*;
use crate::handle::WaitWhy;
use crate::DrainWait;
use crate::{Arrivals, TrafficError};
use http::header::HeaderMap;
use lifeguard_base::reason::Label;
use lifeguard_drain::{CheckerKey, DrainUntil};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const SEC: Duration = Duration::from_secs(1);

/// Envoy's inbound total, as the test sets it, and whether Envoy was
/// told to fail the load balancers' checks.
#[derive(Clone, Default)]
struct Scripted(Arc<AtomicU64>, Arc<std::sync::atomic::AtomicBool>);

impl Traffic for Scripted {
    async fn learn(&mut self) -> String {
        "listeners 0.0.0.0_15006".into()
    }
    async fn arrivals(&mut self) -> Result<Arrivals, TrafficError> {
        Ok(Arrivals {
            seq: Arrivals::next_seq(),
            total: self.0.load(Ordering::Relaxed),
            generation: 1,
            read: Instant::now(),
            took: Duration::ZERO,
        })
    }
    fn peer_forwarded(&self) -> bool {
        true
    }
    async fn fail_health_checks(&mut self) -> Result<bool, TrafficError> {
        self.1.store(true, Ordering::Relaxed);
        Ok(true)
    }
}

struct Harness {
    drain: watch::Sender<Status>,
    wait: DrainWait,
    checkers: Checkers,
    traffic: Scripted,
    shutdown: CancellationToken,
}

fn start(deadline: Duration) -> Harness {
    start_with(deadline, Duration::ZERO)
}

/// The wait of a drain with this deadline, keeping `app_time` for the app.
fn start_with(deadline: Duration, app_time: Duration) -> Harness {
    start_plan(DrainWaitPlan {
        unhealthy_threshold: 2,
        min_quiet_period: SEC,
        grace: Grace::new(deadline + Duration::from_secs(2), Duration::from_secs(2)).unwrap(),
        app_time,
        ..DrainWaitPlan::for_tests()
    })
}

/// The wait of a drain planned so.
fn start_plan(plan: DrainWaitPlan) -> Harness {
    let (drain, drain_rx) = watch::channel(Status::initial(DrainUntil::Time, String::new()));
    let checkers = Checkers::default();
    let (wait, publish) = DrainWait::new(&plan, checkers.clone());
    let (traffic, shutdown) = (Scripted::default(), CancellationToken::new());
    tokio::spawn(run(
        traffic.clone(),
        checkers.clone(),
        drain_rx,
        plan,
        publish,
        shutdown.clone(),
    ));
    Harness {
        drain,
        wait,
        checkers,
        traffic,
        shutdown,
    }
}

impl Harness {
    fn phase(&self, phase: Phase) {
        self.drain.send_modify(|s| s.phase = phase);
    }
    /// Requests through Envoy, one every `every` (the first `every` from
    /// now), until the task is aborted.
    fn requests_every(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let traffic = self.traffic.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                traffic.0.fetch_add(1, Ordering::Relaxed);
            }
        })
    }
    /// A load balancer at 10.0.0.5 probing every second from now,
    /// answered as readiness would be (503 once the drain began).
    fn checker(&self) -> tokio::task::JoinHandle<()> {
        checker_every(self, SEC, 5)
    }
}

#[tokio::test(start_paused = true)]
async fn a_hook_before_the_drain_waits_for_it_then_for_the_checker_and_the_quiet() {
    let h = start(Duration::from_secs(28));
    let lb = h.checker();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let t0 = Instant::now();
    let waiting = {
        let wait = h.wait.clone();
        tokio::spawn(async move { (wait.wait(None).await, Instant::now()) })
    };
    // The proxy's SIGTERM comes 2 s after the hook.
    tokio::time::sleep(2 * SEC).await;
    assert_eq!(h.wait.status().state, WaitState::NotStarted);
    h.phase(Phase::Draining);
    tokio::time::sleep(Duration::from_millis(1)).await;
    // Traffic goes on until the balancer's 2nd failure (about 2 s).
    for _ in 0..20 {
        h.traffic.0.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (end, at) = waiting.await.unwrap();
    assert_eq!(end.why, WaitWhy::Out, "{end:?}");
    assert!(
        end.line
            .starts_with("out of rotation: 1 checker failed its threshold of probes in a row"),
        "{}",
        end.line
    );
    // Probes every second from 0: failures at 6 and 7 s, done at 7 s;
    // traffic until 7.4 s, then quiet for 1 s: 8.4 s, 4.9 s after the hook
    // (the pod had no traffic before the drain: the floor, 1 s).
    let waited = at - t0;
    assert!(
        waited >= Duration::from_millis(4850) && waited <= Duration::from_millis(5050),
        "{waited:?}"
    );
    let status = h.wait.status();
    assert_eq!(status.state, WaitState::Out);
    assert_eq!(status.checkers.len(), 1);
    // A later hook answers at once.
    assert_eq!(h.wait.wait(Some(SEC)).await.why, WaitWhy::Out);
    lb.abort();
    h.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn the_wait_is_bounded_by_its_timeout_and_by_the_deadline() {
    let h = start(Duration::from_secs(8));
    h.phase(Phase::Draining);
    // A balancer's traffic that never stops.
    let traffic = h.traffic.clone();
    let flow = tokio::spawn(async move {
        loop {
            traffic.0.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let t0 = Instant::now();
    let end = h.wait.wait(Some(3 * SEC)).await;
    assert_eq!((end.why, end.why.label()), (WaitWhy::Timeout, "timeout"));
    assert_eq!(Instant::now() - t0, 3 * SEC);
    assert!(
        end.line.starts_with(
            "NOT out of rotation, stopped waiting at the 3s timeout: was waiting for no new request for 1s"
        ),
        "{}",
        end.line
    );
    // Without a timeout: the drain's deadline, counted from its start.
    let end = h.wait.wait(None).await;
    assert_eq!(end.why, WaitWhy::Deadline);
    assert_eq!(Instant::now() - t0, 8 * SEC);
    flow.abort();
    h.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn envoy_stopping_ends_the_wait_and_a_hook_with_no_drain_is_bounded() {
    let h = start(Duration::from_secs(5));
    let t0 = Instant::now();
    // No drain ever: the hook's own bound (the deadline from its arrival).
    assert_eq!(h.wait.wait(None).await.why, WaitWhy::Deadline);
    assert_eq!(Instant::now() - t0, 5 * SEC);
    let waiting = {
        let wait = h.wait.clone();
        tokio::spawn(async move { wait.wait(None).await })
    };
    h.phase(Phase::Draining);
    h.traffic.0.store(1, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A checker that never fails keeps the pod in wait...
    let lb = h.checker();
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.phase(Phase::Stopping);
    let end = waiting.await.unwrap();
    assert_eq!(end.why, WaitWhy::Stopped, "{end:?}");
    assert_eq!(h.wait.status().state, WaitState::Stopped);
    lb.abort();
    h.shutdown.cancel();
}

/// 2 requests a second for a minute before the drain: a quiet second is
/// chance (13 % of seconds), so the wait asks for 3.45 s of quiet.
#[tokio::test(start_paused = true)]
async fn sparse_traffic_before_the_drain_lengthens_the_quiet_period() {
    let h = start(Duration::from_secs(28));
    let flow = h.requests_every(Duration::from_millis(500));
    tokio::time::sleep(Duration::from_secs(62)).await;
    h.phase(Phase::Draining);
    let drained = Instant::now();
    // The load balancer takes the pod out 3 s after the drain began.
    tokio::time::sleep(Duration::from_millis(3010)).await;
    flow.abort();
    let stopped = Instant::now();
    let end = h.wait.wait(None).await;
    assert_eq!(end.why, WaitWhy::Out, "{end:?}");
    let quiet = Instant::now() - stopped;
    assert!(
        quiet >= Duration::from_millis(3400) && quiet <= Duration::from_millis(3600),
        "{quiet:?} of quiet after the traffic stopped"
    );
    let status = h.wait.status();
    let rate = status.requests_per_second_before_drain.unwrap();
    assert!((rate - 2.0).abs() < 0.1, "{rate}");
    let quiet_period = status.quiet_period_seconds.unwrap();
    assert!(
        (quiet_period - 1000f64.ln() / rate).abs() < 1e-3,
        "{quiet_period} at {rate}"
    );
    assert!(end.line.contains("no new request came for 3.4"), "{}", end.line);
    assert!(Instant::now() - drained > Duration::from_secs(6));
    h.shutdown.cancel();
}

/// Issue #51: a request every 9 s (0.11 a second) calls for a quiet
/// period longer than the wait's bound: said before any drain (`GET
/// /drain`, the log), with the setting that shortens it; the wait then
/// ends at its bound, held by the traffic alone. With
/// `--drain-wait-max-quiet-period` the quiet period is that at most.
#[tokio::test(start_paused = true)]
async fn sparse_traffic_is_said_before_the_drain_and_the_max_quiet_period_caps_its_wait() {
    for max in [None, Some(Duration::from_secs(5))] {
        let h = start_plan(DrainWaitPlan {
            min_quiet_period: SEC,
            grace: Grace::new(Duration::from_secs(30), Duration::from_secs(2)).unwrap(),
            app_time: Duration::from_secs(5),
            max_quiet_period: max,
            ..DrainWaitPlan::for_tests()
        });
        let flow = h.requests_every(Duration::from_secs(9));
        tokio::time::sleep(Duration::from_secs(62)).await;
        let before = h.wait.status();
        let sparse = before.sparse_traffic.clone().expect("said before the drain");
        assert!(
            sparse.contains("a drain waits its bound (23s)") && sparse.contains("--drain-wait-max-quiet-period"),
            "{sparse}"
        );
        h.phase(Phase::Draining);
        let drained = Instant::now();
        let end = h.wait.wait(None).await;
        flow.abort();
        let took = Instant::now() - drained;
        match max {
            None => {
                assert_eq!(end.why, WaitWhy::Deadline, "{end:?}");
                assert_eq!(took, Duration::from_secs(23), "the wait's bound");
                assert!(matches!(h.wait.status().waiting_on, Some(WaitingOn::Quiet { .. })));
            }
            Some(max) => {
                assert_eq!(end.why, WaitWhy::Out, "{end:?}");
                assert!(took <= Duration::from_secs(9) + max, "{took:?}");
                assert_eq!(h.wait.status().quiet_period_seconds, Some(max.as_secs_f64()));
            }
        }
        h.shutdown.cancel();
    }
}

#[tokio::test(start_paused = true)]
async fn the_wait_ends_before_the_deadline_leaving_the_app_its_time() {
    let h = start_with(Duration::from_secs(10), Duration::from_secs(3));
    h.phase(Phase::Draining);
    let t0 = Instant::now();
    // A balancer's traffic that never stops.
    let flow = h.requests_every(Duration::from_millis(50));
    let end = h.wait.wait(None).await;
    assert_eq!(end.why, WaitWhy::Deadline, "{end:?}");
    assert_eq!(Instant::now() - t0, 7 * SEC, "the app keeps 3 s of the 10 s");
    assert!(
        end.line.starts_with(
            "NOT out of rotation, stopped waiting at its bound (7s: the drain's deadline less the app's time)"
        ),
        "{}",
        end.line
    );
    // The bound is told from Envoy's stop.
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(h.wait.status().state, WaitState::Bound);
    assert!(matches!(
        lifeguard_drain::Rotation::verdict(&h.wait).await,
        lifeguard_drain::RotationVerdict::NotOut(_)
    ));
    // Envoy stopping now changes nothing of how the wait ended.
    h.phase(Phase::Stopping);
    tokio::time::sleep(SEC).await;
    assert_eq!(h.wait.status().state, WaitState::Bound);
    flow.abort();
    h.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn envoy_fails_the_load_balancers_checks_when_readiness_turns_503() {
    let h = start(Duration::from_secs(28));
    h.phase(Phase::DrainingReady);
    tokio::time::sleep(2 * SEC).await;
    assert!(
        !h.traffic.1.load(Ordering::Relaxed),
        "readiness still answers as Envoy does"
    );
    assert_eq!(h.wait.status().envoy_health_checks, HealthChecks::Passing);
    h.phase(Phase::Draining);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(h.traffic.1.load(Ordering::Relaxed));
    assert_eq!(h.wait.status().envoy_health_checks, HealthChecks::Failing);
    h.shutdown.cancel();
}

/// A checker at 10.0.0.`last` probing every `every`, from now, as
/// readiness answers.
fn checker_every(h: &Harness, every: Duration, last: u8) -> tokio::task::JoinHandle<()> {
    let (checkers, drain) = (h.checkers.clone(), h.drain.subscribe());
    let key = CheckerKey::new([10, 0, 0, last].into(), false, b"").unwrap();
    tokio::spawn(async move {
        loop {
            let ok = drain.borrow().phase == Phase::Serving;
            checkers.record(key, Instant::now(), ok);
            tokio::time::sleep(every).await;
        }
    })
}

/// The case: a checker every 30 s, out after 2 failures, and a
/// 30 s grace period. Said once it is learned, long before any drain;
/// a checker every 5 s fits.
#[tokio::test(start_paused = true)]
async fn the_budget_names_a_checker_that_cannot_fit_the_grace_period() {
    // The harness's grace period: its deadline and a 2 s margin.
    let h = start(Duration::from_secs(28));
    let fits = checker_every(&h, 5 * SEC, 6);
    tokio::time::sleep(Duration::from_secs(12)).await;
    let budget = h.wait.status().budget.expect("a checker is learned");
    assert!(budget.fits, "{budget:?}");
    assert_eq!(budget.checker, "10.0.0.6");
    assert_eq!(
        budget.needed_grace_period_seconds, 13.0,
        "5 s x 2 + 1 s quiet + 2 s margin"
    );
    let slow = checker_every(&h, 30 * SEC, 5);
    // Its second probe at 30 s, and a sample (every 10 s) after it.
    tokio::time::sleep(Duration::from_secs(45)).await;
    let budget = h.wait.status().budget.expect("a checker is learned");
    assert!(!budget.fits, "{budget:?}");
    assert_eq!(budget.checker, "10.0.0.5");
    assert_eq!(
        budget.needed_grace_period_seconds, 63.0,
        "30 s x 2 + 1 s quiet + 2 s margin"
    );
    assert_eq!(budget.grace_period_seconds, 30.0);
    assert_eq!(
        budget.needed_checker_timeout_seconds,
        Some(60.0),
        "the 20 s timeout lets it go first"
    );
    slow.abort();
    fits.abort();
    h.shutdown.cancel();
}

/// A gateway's drain (out-of-rotation) keeps no time for an app: its
/// wait may last to the drain's deadline, and says the bound, not a
/// stop, when it comes.
#[tokio::test(start_paused = true)]
async fn a_gateways_wait_lasts_to_the_deadline_and_ends_at_its_bound() {
    let h = start_with(Duration::from_secs(10), Duration::from_secs(3));
    h.drain.send_modify(|s| {
        s.policy = DrainUntil::OutOfRotation;
        s.phase = Phase::LeavingRotation;
    });
    let t0 = Instant::now();
    let flow = h.requests_every(Duration::from_millis(50));
    let verdict = lifeguard_drain::Rotation::verdict(&h.wait).await;
    assert!(
        matches!(verdict, lifeguard_drain::RotationVerdict::NotOut(_)),
        "{verdict:?}"
    );
    assert_eq!(Instant::now() - t0, 10 * SEC);
    let status = h.wait.status();
    assert_eq!((status.state, status.bound_seconds), (WaitState::Bound, 10.0));
    flow.abort();
    h.shutdown.cancel();
}

/// With a readiness-fail delay, the checker timeout and `took_seconds`
/// count from the drain's start, not from the 503.
#[tokio::test(start_paused = true)]
async fn the_checker_timeout_and_took_seconds_count_from_the_drains_start() {
    let h = start(Duration::from_secs(28));
    // A prober that probes every second and never fails.
    let (checkers, key) = (
        h.checkers.clone(),
        CheckerKey::new([10, 0, 0, 7].into(), false, b"").unwrap(),
    );
    let prober = tokio::spawn(async move {
        loop {
            checkers.record(key, Instant::now(), true);
            tokio::time::sleep(SEC).await;
        }
    });
    tokio::time::sleep(3 * SEC).await;
    let t0 = Instant::now();
    // The drain begins; readiness fails 4 s later (--readiness-fail-delay).
    h.phase(Phase::DrainingReady);
    tokio::time::sleep(4 * SEC).await;
    h.phase(Phase::Draining);
    let end = h.wait.wait(None).await;
    assert_eq!(end.why, WaitWhy::Out, "{end:?}");
    // Let go at the 20 s checker timeout from the drain's start (no
    // traffic since: quiet all along), not 4 s later.
    let out = Instant::now() - t0;
    assert!(out >= 20 * SEC && out <= Duration::from_millis(20_200), "{out:?}");
    let took = h.wait.status().took_seconds.unwrap();
    assert!((20.0..20.2).contains(&took), "{took}");
    prober.abort();
    h.shutdown.cancel();
}

/// An Envoy whose listeners cannot be read at first (its admin not
/// listening yet): each learn fails, due again at once, until the
/// `succeeds_at`-th.
#[derive(Clone)]
struct Starting {
    learns: Arc<AtomicU64>,
    succeeds_at: u64,
    due: Option<Instant>,
}

impl Starting {
    fn try_learn(&mut self) {
        let n = self.learns.fetch_add(1, Ordering::Relaxed) + 1;
        self.due = (n < self.succeeds_at).then(Instant::now);
    }
}

impl Traffic for Starting {
    async fn learn(&mut self) -> String {
        if self.learns.load(Ordering::Relaxed) == 0 || self.due.is_some_and(|d| Instant::now() >= d) {
            self.try_learn();
        }
        "listeners 0.0.0.0_8080".into()
    }
    fn learn_due(&self) -> Option<Instant> {
        self.due
    }
    async fn arrivals(&mut self) -> Result<Arrivals, TrafficError> {
        self.learn().await;
        Ok(Arrivals {
            seq: Arrivals::next_seq(),
            total: 0,
            generation: 1,
            read: Instant::now(),
            took: Duration::ZERO,
        })
    }
    fn peer_forwarded(&self) -> bool {
        self.due.is_none() && self.learns.load(Ordering::Relaxed) >= self.succeeds_at
    }
    async fn fail_health_checks(&mut self) -> Result<bool, TrafficError> {
        Ok(false)
    }
}

/// Before the drain the samples are 10 s apart, but a learn that failed
/// is tried again when due (no sooner than a second after the last): the
/// trust in Envoy's `x-forwarded-for` is learned seconds after Envoy's
/// admin answers, not at the next sample (a busy run: 14 s).
#[tokio::test(start_paused = true)]
async fn a_failed_learn_is_tried_again_within_seconds_before_the_drain_not_at_the_next_sample() {
    let plan = DrainWaitPlan::for_tests();
    let (_drain, drain_rx) = watch::channel(Status::initial(DrainUntil::Time, String::new()));
    let checkers = Checkers::default();
    let (_wait, publish) = DrainWait::new(&plan, checkers.clone());
    let learns = Arc::new(AtomicU64::new(0));
    let traffic = Starting {
        learns: learns.clone(),
        succeeds_at: 4,
        due: None,
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(run(
        traffic,
        checkers.clone(),
        drain_rx,
        plan,
        publish,
        shutdown.clone(),
    ));
    let mut headers = HeaderMap::new();
    headers.insert("x-forwarded-for", "10.0.0.9".parse().unwrap());
    let probe = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 40000)));
    let began = Instant::now();
    while checkers.key_of(probe, &headers).map(|k| k.to_string()) != Some("10.0.0.9".into()) {
        assert!(
            began.elapsed() < 10 * SEC,
            "not learned before the next sample: {learns:?} learns"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The first learn at the first sample (1 s), then one a second.
    assert_eq!(learns.load(Ordering::Relaxed), 4);
    assert!(began.elapsed() <= 5 * SEC, "{:?}", began.elapsed());
    shutdown.cancel();
}
