//! The task that applies the [rule](super::rule) from the start of the
//! drain until the pod is out of rotation (or Envoy stops), publishing
//! what it sees; and [`Rotation`], the handle whose `wait` answers the
//! app's preStop hook.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use super::checkers::Checkers;
use super::rule::{CheckerReport, Rule, Step};
use super::{RotationPlan, Traffic, READ_EVERY};
use crate::drain::{Phase, Status};
use crate::duration::Display as D;
use crate::logging::Throttle;

/// Where the wait stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RotationState {
    /// No drain yet: nothing is waited for.
    NotStarted,
    /// The drain began; the pod is still in rotation.
    Waiting,
    /// Every checker is done and no new request came for the quiet period.
    Out,
    /// Envoy is stopping (or the deadline came) before the pod was out.
    Ended,
}

/// What `GET /drain` shows of the wait (its `rotation` field).
#[derive(Debug, Clone, Serialize)]
pub struct RotationStatus {
    pub state: RotationState,
    pub lb_unhealthy_threshold: u32,
    pub lb_quiet_period_seconds: f64,
    /// The listeners whose new requests count, in words.
    pub inbound_listeners: Option<String>,
    /// Every checker heard from, as of the last read.
    pub checkers: Vec<CheckerReport>,
    /// What the wait still waits for, in words.
    pub waiting_for: Option<String>,
    /// Seconds from the last new inbound request (or the drain's start) to
    /// the last read.
    pub quiet_for_seconds: Option<f64>,
    /// Why the pod is out of rotation, once it is.
    pub conclusion: Option<String>,
    /// Seconds from the drain's start to out of rotation.
    pub took_seconds: Option<f64>,
    /// When the drain began (the rule's clock).
    #[serde(skip)]
    pub(crate) began: Option<Instant>,
}

impl RotationStatus {
    fn initial(plan: &RotationPlan) -> RotationStatus {
        RotationStatus {
            state: RotationState::NotStarted,
            lb_unhealthy_threshold: plan.lb_unhealthy_threshold,
            lb_quiet_period_seconds: plan.lb_quiet_period.as_secs_f64(),
            inbound_listeners: None,
            checkers: Vec::new(),
            waiting_for: Some("the drain to begin (the proxy's SIGTERM or POST /drain)".into()),
            quiet_for_seconds: None,
            conclusion: None,
            took_seconds: None,
            began: None,
        }
    }
}

/// Told of every answered wait: why it ended (a [`WaitEnd::label`]) and
/// how long it took. The agent wires it to the metrics.
pub(crate) type WaitObserver = Arc<dyn Fn(&'static str, Duration) + Send + Sync>;

/// The handle the status port uses: the published status, and the wait.
#[derive(Clone)]
pub struct Rotation {
    status: watch::Receiver<RotationStatus>,
    deadline: Duration,
    observer: Option<WaitObserver>,
}

/// Why a wait ended, and its one-line answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitEnd {
    pub why: WaitWhy,
    /// The answer's body (one line).
    pub line: String,
}

/// Why a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitWhy {
    /// Out of rotation.
    Out,
    /// The caller's `?timeout=` came first.
    Timeout,
    /// The drain's deadline came first.
    Deadline,
    /// Envoy is stopping, or lifeguard is.
    Stopped,
}

impl WaitEnd {
    /// The `reason` label of `lifeguard_drain_wait_seconds`.
    pub fn label(&self) -> &'static str {
        match self.why {
            WaitWhy::Out => "out_of_rotation",
            WaitWhy::Timeout => "timeout",
            WaitWhy::Deadline => "deadline",
            WaitWhy::Stopped => "stopped",
        }
    }
}

impl Rotation {
    /// The handle and the task's sender, before the task runs.
    pub(crate) fn new(plan: &RotationPlan) -> (Rotation, watch::Sender<RotationStatus>) {
        let (tx, rx) = watch::channel(RotationStatus::initial(plan));
        let handle = Rotation {
            status: rx,
            deadline: plan.drain_deadline,
            observer: None,
        };
        (handle, tx)
    }

    /// The same handle, telling `observer` of every answered wait.
    pub(crate) fn observed(self, observer: WaitObserver) -> Rotation {
        Rotation {
            observer: Some(observer),
            ..self
        }
    }

    /// The latest published status.
    pub fn status(&self) -> RotationStatus {
        self.status.borrow().clone()
    }

    /// Waits until the pod is out of rotation, or a bound: `timeout` from
    /// now, the drain's deadline from its start or from now, whichever is
    /// first, or Envoy stopping. Never fails: the answer says which.
    pub async fn wait(&self, timeout: Option<Duration>) -> WaitEnd {
        let arrived = Instant::now();
        let end = self.wait_from(arrived, timeout).await;
        let took = arrived.elapsed();
        let shown = D(super::rule::ms(took));
        match end.why {
            WaitWhy::Out | WaitWhy::Stopped => tracing::info!(took = %shown, "drain wait answered: {}", end.line),
            _ => tracing::warn!(took = %shown, "drain wait answered: {}", end.line),
        }
        if let Some(observer) = &self.observer {
            observer(end.label(), took);
        }
        end
    }

    async fn wait_from(&self, arrived: Instant, timeout: Option<Duration>) -> WaitEnd {
        let mut rx = self.status.clone();
        loop {
            let status = rx.borrow_and_update().clone();
            match status.state {
                RotationState::Out => {
                    let line = format!(
                        "out of rotation: {} ({} after the drain began)",
                        status.conclusion.unwrap_or_default(),
                        D(super::rule::ms(Duration::from_secs_f64(
                            status.took_seconds.unwrap_or(0.0)
                        )))
                    );
                    return WaitEnd {
                        why: WaitWhy::Out,
                        line,
                    };
                }
                RotationState::Ended => {
                    let line = format!(
                        "Envoy is stopping; the pod was not yet out of rotation (was waiting for {})",
                        status.waiting_for.unwrap_or_default()
                    );
                    return WaitEnd {
                        why: WaitWhy::Stopped,
                        line,
                    };
                }
                RotationState::NotStarted | RotationState::Waiting => {}
            }
            let from_drain = status.began.map_or(arrived, |b| b.min(arrived));
            let (mut bound, mut why) = (from_drain + self.deadline, WaitWhy::Deadline);
            if let Some(t) = timeout.filter(|t| arrived + *t < bound) {
                (bound, why) = (arrived + t, WaitWhy::Timeout);
            }
            if Instant::now() >= bound {
                let by = match why {
                    WaitWhy::Timeout => format!("the {} timeout", D(timeout.unwrap_or_default())),
                    _ => format!("the drain's deadline ({})", D(self.deadline)),
                };
                let line = format!(
                    "NOT out of rotation, stopped waiting at {by}: was waiting for {}; new requests may still arrive",
                    status.waiting_for.unwrap_or_default()
                );
                return WaitEnd { why, line };
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() {
                    let line = "lifeguard is stopping; the pod was not yet out of rotation".to_owned();
                    return WaitEnd { why: WaitWhy::Stopped, line };
                },
                _ = sleep_until(bound) => {}
            }
        }
    }
}

/// Applies the rule from the start of the drain until the pod is out of
/// rotation, Envoy stops, the deadline comes, or `shutdown`.
pub(crate) async fn run<T: Traffic>(
    mut traffic: T,
    checkers: Checkers,
    mut drain: watch::Receiver<Status>,
    plan: RotationPlan,
    publish: watch::Sender<RotationStatus>,
    shutdown: CancellationToken,
) {
    let began = tokio::select! {
        begun = drain.wait_for(|s| s.phase != Phase::Serving) => match begun {
            Ok(_) => Instant::now(),
            Err(_) => return,
        },
        _ = shutdown.cancelled() => return,
    };
    publish.send_modify(|s| {
        s.state = RotationState::Waiting;
        s.began = Some(began);
    });
    let listeners = tokio::select! {
        listeners = traffic.learn() => listeners,
        _ = shutdown.cancelled() => return,
    };
    tracing::info!(
        lb_unhealthy_threshold = plan.lb_unhealthy_threshold,
        lb_quiet_period = %D(plan.lb_quiet_period),
        "drain wait: out of rotation once every checker has failed {} probes in a row (or stopped probing) \
         and no new request has reached {listeners} for {}",
        plan.lb_unhealthy_threshold,
        D(plan.lb_quiet_period)
    );
    publish.send_modify(|s| s.inbound_listeners = Some(listeners));
    let mut rule = Rule::new(plan.lb_unhealthy_threshold, plan.lb_quiet_period, began);
    let mut read_warning = Throttle::new(Duration::from_secs(10));
    let deadline = began + plan.drain_deadline;
    loop {
        if drain.borrow().phase >= Phase::Stopping || Instant::now() >= deadline {
            publish.send_modify(|s| s.state = RotationState::Ended);
            return;
        }
        let read_started = Instant::now();
        // A read may wait for its pace (a slow Envoy's reads are spaced):
        // the deadline and Envoy's stop end the wait meanwhile too.
        let inbound = tokio::select! {
            inbound = traffic.inbound_total() => inbound,
            _ = sleep_until(deadline) => continue,
            stopping = drain.wait_for(|s| s.phase >= Phase::Stopping) => match stopping {
                Ok(_) => continue,
                Err(_) => return,
            },
            _ = shutdown.cancelled() => return,
        };
        let now = Instant::now();
        let eval = rule.observe(now, &checkers.snapshot(), inbound);
        log_steps(&eval.steps, &mut read_warning, &rule, now.duration_since(began));
        publish.send_modify(|s| {
            s.checkers = eval.checkers;
            s.waiting_for = eval.waiting_for;
            s.quiet_for_seconds = Some(now.saturating_duration_since(eval.quiet_since).as_secs_f64());
            if eval.out {
                s.state = RotationState::Out;
                s.conclusion = Some(rule.conclusion());
                s.took_seconds = Some(now.duration_since(began).as_secs_f64());
            }
        });
        if eval.out {
            return;
        }
        let next = (read_started + READ_EVERY).min(deadline);
        tokio::select! {
            _ = sleep_until(next) => {}
            _ = drain.wait_for(|s| s.phase >= Phase::Stopping) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// One log line per step; failed reads at most every ten seconds.
fn log_steps(steps: &[Step], read_warning: &mut Throttle, rule: &Rule, since_drain: Duration) {
    for step in steps {
        match step {
            Step::Failed { checker, failures } => {
                tracing::info!(
                    "drain wait: checker {checker} failed {failures} probes in a row: it has taken the pod out"
                )
            }
            Step::Vanished { checker, silent } => tracing::info!(
                "drain wait: checker {checker} has not probed for {}: it stopped checking, counted as done",
                D(super::rule::ms(*silent))
            ),
            Step::CheckersDone { count } => {
                tracing::info!(
                    checkers = count,
                    "drain wait: every checker is done; waiting for the traffic to stop"
                )
            }
            Step::ReadFailed(why) => {
                if read_warning.due(Instant::now()) {
                    tracing::warn!(error = %why, "drain wait: cannot read Envoy's inbound traffic; not counted as quiet");
                }
            }
            Step::Out => tracing::info!(
                took = %D(super::rule::ms(since_drain)),
                "drain wait: out of rotation: {}",
                rule.conclusion()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::DrainUntil;
    use crate::rotation::checkers::CheckerKey;
    use crate::rotation::TrafficError;
    use hyper::header::HeaderMap;
    use std::sync::atomic::{AtomicU64, Ordering};

    const SEC: Duration = Duration::from_secs(1);

    /// Envoy's inbound total, as the test sets it.
    #[derive(Clone, Default)]
    struct Scripted(Arc<AtomicU64>);

    impl Traffic for Scripted {
        async fn learn(&mut self) -> String {
            "listeners 0.0.0.0_15006".into()
        }
        async fn inbound_total(&mut self) -> Result<u64, TrafficError> {
            Ok(self.0.load(Ordering::Relaxed))
        }
    }

    struct Harness {
        drain: watch::Sender<Status>,
        rotation: Rotation,
        checkers: Checkers,
        traffic: Scripted,
        shutdown: CancellationToken,
    }

    fn start(deadline: Duration) -> Harness {
        let plan = RotationPlan {
            lb_unhealthy_threshold: 2,
            lb_quiet_period: SEC,
            drain_deadline: deadline,
        };
        let (drain, drain_rx) = watch::channel(Status::initial(DrainUntil::Time, String::new()));
        let (rotation, publish) = Rotation::new(&plan);
        let (checkers, traffic, shutdown) = (Checkers::default(), Scripted::default(), CancellationToken::new());
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
            rotation,
            checkers,
            traffic,
            shutdown,
        }
    }

    impl Harness {
        fn phase(&self, phase: Phase) {
            self.drain.send_modify(|s| s.phase = phase);
        }
        /// A load balancer at 10.0.0.5 probing every second from now,
        /// answered as readiness would be (503 once the drain began).
        fn checker(&self) -> tokio::task::JoinHandle<()> {
            let (checkers, drain) = (self.checkers.clone(), self.drain.subscribe());
            let key = CheckerKey::of(Some(([10, 0, 0, 5], 1).into()), &HeaderMap::new()).unwrap();
            tokio::spawn(async move {
                loop {
                    let ok = drain.borrow().phase == Phase::Serving;
                    checkers.record(key, Instant::now(), ok);
                    tokio::time::sleep(SEC).await;
                }
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hook_before_the_drain_waits_for_it_then_for_the_checker_and_the_quiet() {
        let h = start(Duration::from_secs(28));
        let lb = h.checker();
        tokio::time::sleep(Duration::from_millis(3500)).await;
        let t0 = Instant::now();
        let waiting = {
            let rotation = h.rotation.clone();
            tokio::spawn(async move { (rotation.wait(None).await, Instant::now()) })
        };
        // The proxy's SIGTERM comes 2 s after the hook.
        tokio::time::sleep(2 * SEC).await;
        assert_eq!(h.rotation.status().state, RotationState::NotStarted);
        h.phase(Phase::Draining);
        // Traffic goes on until the balancer's 2nd failure (about 2 s).
        for _ in 0..20 {
            h.traffic.0.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (end, at) = waiting.await.unwrap();
        assert_eq!(end.why, WaitWhy::Out, "{end:?}");
        assert!(
            end.line.starts_with("out of rotation: the one checker failed 2 probes"),
            "{}",
            end.line
        );
        // Probes every second from 0: failures at 6 and 7 s, done at 7 s;
        // traffic until 7.4 s, then quiet for 1 s: 8.4 s, 4.9 s after the hook.
        let waited = at - t0;
        assert!(
            waited >= Duration::from_millis(4850) && waited <= Duration::from_millis(5050),
            "{waited:?}"
        );
        let status = h.rotation.status();
        assert_eq!(status.state, RotationState::Out);
        assert_eq!(status.checkers.len(), 1);
        // A later hook answers at once.
        assert_eq!(h.rotation.wait(Some(SEC)).await.why, WaitWhy::Out);
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
        let end = h.rotation.wait(Some(3 * SEC)).await;
        assert_eq!((end.why, end.label()), (WaitWhy::Timeout, "timeout"));
        assert_eq!(Instant::now() - t0, 3 * SEC);
        assert!(
            end.line.starts_with(
                "NOT out of rotation, stopped waiting at the 3s timeout: was waiting for no new request for 1s"
            ),
            "{}",
            end.line
        );
        // Without a timeout: the drain's deadline, counted from its start.
        let end = h.rotation.wait(None).await;
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
        assert_eq!(h.rotation.wait(None).await.why, WaitWhy::Deadline);
        assert_eq!(Instant::now() - t0, 5 * SEC);
        let waiting = {
            let rotation = h.rotation.clone();
            tokio::spawn(async move { rotation.wait(None).await })
        };
        h.phase(Phase::Draining);
        h.traffic.0.store(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(50)).await;
        // A checker that never fails keeps the pod in rotation...
        let lb = h.checker();
        tokio::time::sleep(Duration::from_millis(300)).await;
        h.phase(Phase::Stopping);
        let end = waiting.await.unwrap();
        assert_eq!(end.why, WaitWhy::Stopped, "{end:?}");
        assert_eq!(h.rotation.status().state, RotationState::Ended);
        lb.abort();
        h.shutdown.cancel();
    }
}
