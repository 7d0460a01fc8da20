//! The drain wait's task: samples the pod's traffic before the drain (and
//! says once when the grace period cannot fit the slowest checker), fails
//! the load balancers' checks when readiness turns 503, applies the
//! [rule](super::rule) from then until the pod is out of rotation (or
//! Envoy stops, or the wait's bound comes), and publishes what it sees for
//! the [`DrainWait`](super::DrainWait) handle.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use super::budget::{self, Needs};
use super::checkers::{CheckerKey, Checkers};
use super::handle::{DrainWaitStatus, WaitState};
use super::quiet::{quiet_period, History, Rate, SAMPLE_EVERY, WINDOW};
use super::rule::{ms, Rule, Settings, Step};
use super::waiting::{HealthChecks, WaitingOn};
use super::{DrainWaitPlan, Traffic, READ_EVERY};
use lifeguard_base::duration::GoDuration;
#[cfg(test)]
use lifeguard_base::grace::Grace;
use lifeguard_base::throttle::Throttle;
use lifeguard_drain::{DrainUntil, Phase, Status};

/// The task: samples the traffic until the drain, then applies the rule
/// until the pod is out of rotation, Envoy stops, the wait's bound comes,
/// or `shutdown`.
pub async fn run<T: Traffic>(
    mut traffic: T,
    checkers: Checkers,
    mut drain: watch::Receiver<Status>,
    plan: DrainWaitPlan,
    publish: watch::Sender<DrainWaitStatus>,
    shutdown: CancellationToken,
) {
    let mut history = History::default();
    let mut budget = BudgetWatch::default();
    let mut sampler = Sampler {
        traffic: &mut traffic,
        checkers: &checkers,
        history: &mut history,
        budget: &mut budget,
        plan: &plan,
        publish: &publish,
    };
    let drain_begun = |s: &Status| s.phase != Phase::Serving;
    let Some(began) = sampler.sample_until(&mut drain, drain_begun, &shutdown).await else {
        return;
    };
    // The policy the drain resolved when it began: a gateway keeps no
    // time for an app.
    let bound_len = plan.bound_under(drain.borrow().policy);
    publish.send_modify(|s| {
        s.state = WaitState::Waiting;
        s.began = Some(began);
        s.bound_seconds = bound_len.as_secs_f64();
    });
    // With a readiness-fail delay, the load balancers are told only when
    // readiness turns 503: the rule starts then.
    if !drain.borrow().phase.fails_readiness() {
        publish.send_modify(|s| s.waiting_on = Some(WaitingOn::ReadinessToFail));
        let told = |s: &Status| s.phase.fails_readiness() || s.phase >= Phase::Stopping;
        if sampler.sample_until(&mut drain, told, &shutdown).await.is_none() {
            return;
        }
    }
    let bound = began + bound_len;
    let mut watch = Watch {
        traffic,
        checkers,
        drain,
        plan,
        publish,
        shutdown,
        read_warning: Throttle::new(Duration::from_secs(10)),
        checks_warning: Throttle::new(Duration::from_secs(10)),
        checks: Checks::Due(Instant::now()),
    };
    // The listeners are known from the samples, unless the drain came
    // first: then learned now, within the wait's bound.
    let listeners = tokio::select! {
        listeners = watch.traffic.learn() => listeners,
        _ = sleep_until(bound) => return watch.publish.send_modify(|s| s.state = WaitState::Bound),
        _ = watch.drain.wait_for(|s| s.phase >= Phase::Stopping) => {
            return watch.publish.send_modify(|s| s.state = WaitState::Stopped);
        }
        _ = watch.shutdown.cancelled() => return,
    };
    sync_trust(&watch.traffic, &watch.checkers);
    watch.fail_checks_when_due().await;
    watch
        .publish
        .send_modify(|s| s.inbound_listeners = Some(listeners.clone()));
    // One beginning for the rule, its checker timeout and `took_seconds`:
    // the drain's start.
    watch.apply(began, bound, history, &listeners).await;
}

/// Tells the checker table whether Envoy's status listener appends the
/// prober's address to `x-forwarded-for`, as the listeners were learned;
/// says so when it is news.
fn sync_trust(traffic: &impl Traffic, checkers: &Checkers) {
    let appends = traffic.peer_forwarded();
    if !checkers.trust_forwarded(appends) {
        return;
    }
    match appends {
        true => tracing::info!(
            "drain wait: Envoy's status listener appends each prober's own address to x-forwarded-for: \
             load balancers are told apart by address and User-Agent"
        ),
        false => tracing::warn!(
            "drain wait: Envoy's status listener does not append each prober's own address to x-forwarded-for \
             (no use_remote_address, or trusted hops: a prober could write any address there), or its config \
             cannot be read: probes through Envoy count as one address, 127.0.0.1, told apart by User-Agent alone"
        ),
    }
}

/// The samples before the drain: the traffic, and the budget.
struct Sampler<'a, T> {
    traffic: &'a mut T,
    checkers: &'a Checkers,
    history: &'a mut History,
    budget: &'a mut BudgetWatch,
    plan: &'a DrainWaitPlan,
    publish: &'a watch::Sender<DrainWaitStatus>,
}

impl<T: Traffic> Sampler<'_, T> {
    /// Samples the arrivals every [`SAMPLE_EVERY`] until the drain's status
    /// satisfies `until`; when it did (None: shutdown, or no drain can come).
    async fn sample_until(
        &mut self,
        drain: &mut watch::Receiver<Status>,
        until: impl FnMut(&Status) -> bool,
        shutdown: &CancellationToken,
    ) -> Option<Instant> {
        let mut until = until;
        let mut next = Instant::now() + Duration::from_secs(1);
        loop {
            let traffic = &mut *self.traffic;
            let sample = async {
                sleep_until(next).await;
                traffic.arrivals().await
            };
            let arrivals = tokio::select! {
                begun = drain.wait_for(&mut until) => return begun.ok().map(|_| Instant::now()),
                arrivals = sample => arrivals,
                _ = shutdown.cancelled() => return None,
            };
            let now = Instant::now();
            next = now + SAMPLE_EVERY;
            match arrivals {
                Ok(arrivals) => self.history.push(now, arrivals),
                Err(e) => tracing::debug!(error = %e, "drain wait: no sample of Envoy's inbound traffic"),
            }
            sync_trust(&*self.traffic, self.checkers);
            let policy = drain.borrow().policy;
            self.check_budget(policy, now);
        }
    }

    /// Whether the grace period fits the slowest learned checker: published
    /// each sample, said once per checker that does not fit.
    fn check_budget(&mut self, policy: DrainUntil, now: Instant) {
        let plan = self.plan;
        let needs = Needs {
            threshold: plan.unhealthy_threshold,
            quiet: quiet_period(self.history.rate(), plan.min_quiet_period, plan.quiet_ceiling(policy)),
            app_time: plan.app_time_under(policy),
            grace: plan.grace,
            checker_timeout: plan.checker_timeout,
            fails_after: plan.fails_after,
        };
        let seen = self.checkers.snapshot();
        let slowest = budget::slowest(&seen, &needs, now);
        if let Some((key, budget)) = &slowest {
            if !budget.fits && self.budget.warned != Some(*key) {
                self.budget.warned = Some(*key);
                if let Some(checker) = seen.iter().find(|c| c.counted && c.key == *key) {
                    tracing::warn!("{}", budget::warning(budget, checker, &needs));
                }
            }
        }
        // The ways a node gets its traffic that no probe shows (a load
        // balancer that checks the node; an announcer), with the quiet
        // period the traffic calls for now: a declared one that does not
        // fit is said once.
        let quiet = (needs.quiet, " of the traffic now");
        let mut ways = budget::node_checked(plan, policy, quiet);
        ways.push(budget::announced(plan, policy, quiet));
        ways.retain(|w| w.declared);
        for way in &ways {
            if !way.fits && !self.budget.declared_warned.contains(&way.way) {
                self.budget.declared_warned.push(way.way.clone());
                tracing::warn!("drain wait: {}", way.words);
            }
        }
        self.say_sparse_traffic(policy, needs.quiet);
        // The published budget is the one that needs the most.
        let budget = slowest
            .map(|(_, b)| b)
            .into_iter()
            .chain(ways.iter().map(|w| w.budget(plan.grace)))
            .max_by(|a, b| a.needed_grace_period_seconds.total_cmp(&b.needed_grace_period_seconds));
        if self.publish.borrow().budget != budget {
            self.publish.send_modify(|s| s.budget = budget);
        }
    }

    /// Sparse traffic makes a drain wait long: the quiet period that tells
    /// a stopped trickle from a pause reaches the wait's bound. Said once
    /// each time the traffic becomes so sparse, and published (`GET
    /// /drain`: `drain_wait.sparse_traffic`), with the quiet period the
    /// traffic calls for now.
    fn say_sparse_traffic(&mut self, policy: DrainUntil, quiet: Duration) {
        let plan = self.plan;
        let rate = self.history.rate();
        let bound = plan.bound_under(policy);
        let uncapped = quiet_period(rate, plan.min_quiet_period, bound);
        let sparse = match rate {
            Some(r) if r.arrived > 0 && uncapped >= bound => Some(format!(
                "{:.2} new requests a second: a drain waits its bound ({}) for the traffic to be quiet, since \
                 at this rate a shorter gap comes by chance more often than once in a thousand{}",
                r.per_second,
                GoDuration(bound),
                match quiet < bound {
                    true => format!(
                        "; --drain-wait-max-quiet-period makes it {} at the most, at the risk of ending the wait \
                         while a load balancer still sends",
                        GoDuration(ms(quiet))
                    ),
                    false => "; --drain-wait-max-quiet-period shortens it, at the risk of ending the wait while \
                              a load balancer still sends"
                        .to_owned(),
                },
            )),
            _ => None,
        };
        if sparse.is_some() && !self.budget.sparse_said {
            tracing::info!("drain wait: {}", sparse.as_deref().unwrap_or_default());
        }
        self.budget.sparse_said = sparse.is_some();
        let rate = rate.map(|r| r.per_second);
        let quiet = Some(quiet.as_secs_f64());
        let changed = {
            let s = self.publish.borrow();
            s.sparse_traffic != sparse || s.quiet_period_seconds != quiet || s.requests_per_second_before_drain != rate
        };
        if changed {
            self.publish.send_modify(|s| {
                s.sparse_traffic = sparse;
                s.quiet_period_seconds = quiet;
                s.requests_per_second_before_drain = rate;
            });
        }
    }
}

/// What the budget said last.
#[derive(Default)]
struct BudgetWatch {
    /// The checker a warning was logged for.
    warned: Option<CheckerKey>,
    /// The declared ways a warning was logged for.
    declared_warned: Vec<String>,
    /// Whether the traffic's sparseness was said (until it changes).
    sparse_said: bool,
}

/// The task's parts once the drain has begun.
struct Watch<T> {
    traffic: T,
    checkers: Checkers,
    drain: watch::Receiver<Status>,
    plan: DrainWaitPlan,
    publish: watch::Sender<DrainWaitStatus>,
    shutdown: CancellationToken,
    read_warning: Throttle,
    checks_warning: Throttle,
    /// Envoy asked to fail the load balancers' checks: when to try again,
    /// or done.
    checks: Checks,
}

/// Where failing the load balancers' checks stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checks {
    /// To ask Envoy (again) at this time.
    Due(Instant),
    /// Asked, or nothing to ask (no `health_check` filter).
    Done,
}

/// A failed `/healthcheck/fail` is asked again after this.
const CHECKS_RETRY: Duration = Duration::from_secs(1);

impl<T: Traffic> Watch<T> {
    /// Readiness is 503: Envoy's `health_check` filter fails the load
    /// balancers' checks too, wherever they are sent; asked again every
    /// second until Envoy has done it.
    async fn fail_checks_when_due(&mut self) {
        let Checks::Due(at) = self.checks else { return };
        if Instant::now() < at {
            return;
        }
        let said = match self.traffic.fail_health_checks().await {
            Ok(true) => {
                tracing::info!(
                    "drain wait: Envoy fails the load balancers' checks its health_check filter recognises \
                     (POST /healthcheck/fail), wherever they are sent"
                );
                self.checks = Checks::Done;
                HealthChecks::Failing
            }
            Ok(false) => {
                self.checks = Checks::Done;
                HealthChecks::NoFilter
            }
            Err(why) => {
                if self.checks_warning.due(Instant::now()) {
                    tracing::warn!(error = %why, "drain wait: could not make Envoy fail the load balancers' checks (POST /healthcheck/fail); trying again");
                }
                self.checks = Checks::Due(Instant::now() + CHECKS_RETRY);
                HealthChecks::NotFailedYet(why.to_string())
            }
        };
        self.publish.send_modify(|s| s.envoy_health_checks = said);
    }

    /// Applies the rule from `began` (the drain's start; readiness turned
    /// 503 then or, with a readiness-fail delay, since) until out of
    /// rotation or `bound`.
    async fn apply(&mut self, began: Instant, bound: Instant, mut history: History, listeners: &str) {
        let mut rule: Option<Rule> = None;
        loop {
            if self.drain.borrow().phase >= Phase::Stopping {
                self.publish.send_modify(|s| s.state = WaitState::Stopped);
                return;
            }
            if Instant::now() >= bound {
                self.publish.send_modify(|s| s.state = WaitState::Bound);
                return;
            }
            self.fail_checks_when_due().await;
            let read_started = Instant::now();
            // A read may wait for its pace (a slow Envoy's reads are spaced):
            // the bound and Envoy's stop end the wait meanwhile too.
            let inbound = tokio::select! {
                inbound = self.traffic.arrivals() => inbound,
                _ = sleep_until(bound) => continue,
                stopping = self.drain.wait_for(|s| s.phase >= Phase::Stopping) => match stopping {
                    Ok(_) => continue,
                    Err(_) => return,
                },
                _ = self.shutdown.cancelled() => return,
            };
            sync_trust(&self.traffic, &self.checkers);
            let now = Instant::now();
            let rule = rule.get_or_insert_with(|| {
                if let Ok(arrivals) = &inbound {
                    history.push(now, *arrivals);
                }
                self.first_rule(began, history.rate(), listeners)
            });
            let eval = rule.observe(now, &self.checkers.snapshot(), self.checkers.overflow(), inbound);
            log_steps(&eval.steps, &mut self.read_warning, rule, now.duration_since(began));
            let after = |t: Option<Instant>| t.map(|t| t.saturating_duration_since(began).as_secs_f64());
            self.publish.send_modify(|s| {
                s.checkers = eval.checkers;
                s.waiting_on = eval.waiting_on;
                s.quiet_for_seconds = Some(eval.quiet_for.as_secs_f64());
                s.traffic_stopped_after_seconds = after(rule.traffic_stopped());
                s.last_checker_done_after_seconds = after(rule.last_checker_done());
                if eval.out {
                    s.state = WaitState::Out;
                    s.conclusion = Some(rule.conclusion());
                    s.took_seconds = Some(now.duration_since(began).as_secs_f64());
                }
            });
            if eval.out {
                return;
            }
            let next = (read_started + READ_EVERY).min(bound);
            tokio::select! {
                _ = sleep_until(next) => {}
                stopping = self.drain.wait_for(|s| s.phase >= Phase::Stopping) => if stopping.is_err() {
                    return;
                },
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    /// The rule of this drain, its quiet period derived from the traffic
    /// before it; says so.
    fn first_rule(&self, began: Instant, rate: Option<Rate>, listeners: &str) -> Rule {
        let plan = &self.plan;
        let policy = self.drain.borrow().policy;
        let bound = plan.bound_under(policy);
        let quiet = quiet_period(rate, plan.min_quiet_period, plan.quiet_ceiling(policy));
        let uncapped = quiet_period(rate, plan.min_quiet_period, bound);
        let why = match rate {
            Some(r) if quiet < uncapped => format!(
                "the ceiling, --drain-wait-max-quiet-period; {:.2} new requests a second in the {} before the drain \
                 call for {}: a gap this long comes by chance more often than once in a thousand",
                r.per_second,
                GoDuration(ms(r.over.min(WINDOW))),
                GoDuration(ms(uncapped))
            ),
            Some(r) if quiet > plan.min_quiet_period => format!(
                "{:.2} new requests a second in the {} before the drain: a gap that long comes by chance once in a thousand",
                r.per_second,
                GoDuration(ms(r.over.min(WINDOW)))
            ),
            Some(r) => format!(
                "the floor, --drain-wait-min-quiet-period; {:.2} new requests a second in the {} before the drain",
                r.per_second,
                GoDuration(ms(r.over.min(WINDOW)))
            ),
            None => "the floor, --drain-wait-min-quiet-period; the traffic before the drain was not measured".to_owned(),
        };
        tracing::info!(
            unhealthy_threshold = plan.unhealthy_threshold,
            quiet_period = %GoDuration(ms(quiet)),
            checker_timeout = %GoDuration(plan.checker_timeout),
            bound = %GoDuration(bound),
            "drain wait: out of rotation once every checker has failed {} probes in a row (Envoy's checker: 1), \
             stopped probing or held the wait for {}, and no new request has reached {listeners} for {} ({why})",
            plan.unhealthy_threshold,
            GoDuration(plan.checker_timeout),
            GoDuration(ms(quiet)),
        );
        self.publish.send_modify(|s| {
            s.requests_per_second_before_drain = rate.map(|r| r.per_second);
            s.quiet_period_seconds = Some(quiet.as_secs_f64());
        });
        let settings = Settings {
            threshold: plan.unhealthy_threshold,
            checker_timeout: plan.checker_timeout,
            quiet,
        };
        Rule::new(settings, began)
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
                GoDuration(ms(*silent))
            ),
            Step::TimedOut {
                checker,
                failures,
                threshold,
            } => tracing::warn!(
                "drain wait: checker {checker} has failed {failures} of {threshold} probes in a row and still probes, \
                 {} after the drain began: no longer waited for (--drain-wait-checker-timeout)",
                GoDuration(ms(since_drain))
            ),
            Step::UnfollowedTimedOut => tracing::warn!(
                "drain wait: probes came from more probers than lifeguard could follow (not counted: no room), \
                 {} after the drain began: no longer waited for (--drain-wait-checker-timeout)",
                GoDuration(ms(since_drain))
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
                took = %GoDuration(ms(since_drain)),
                "drain wait: out of rotation: {}",
                rule.conclusion()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::CheckerKey;
    use crate::handle::WaitWhy;
    use crate::DrainWait;
    use crate::{Arrivals, TrafficError};
    use http::header::HeaderMap;
    use lifeguard_drain::DrainUntil;
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
        /// A load balancer at 10.0.0.5 probing every second from now,
        /// answered as readiness would be (503 once the drain began).
        fn checker(&self) -> tokio::task::JoinHandle<()> {
            let (checkers, drain) = (self.checkers.clone(), self.drain.subscribe());
            let key = CheckerKey::of(Some(([10, 0, 0, 5], 1).into()), &HeaderMap::new(), true).unwrap();
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
        let traffic = h.traffic.clone();
        let flow = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                traffic.0.fetch_add(1, Ordering::Relaxed);
            }
        });
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
            let traffic = h.traffic.clone();
            let flow = tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(9)).await;
                    traffic.0.fetch_add(1, Ordering::Relaxed);
                }
            });
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
                    assert!(matches!(
                        h.wait.status().waiting_on,
                        Some(crate::WaitingOn::Quiet { .. })
                    ));
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
        let traffic = h.traffic.clone();
        let flow = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                traffic.0.fetch_add(1, Ordering::Relaxed);
            }
        });
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
            lifeguard_drain::Verdict::NotOut(_)
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

    /// A checker probing every `every`, from now, as readiness answers.
    fn checker_every(h: &Harness, every: Duration, last: u8) -> tokio::task::JoinHandle<()> {
        let (checkers, drain) = (h.checkers.clone(), h.drain.subscribe());
        let key = CheckerKey::of(Some(([10, 0, 0, last], 1).into()), &HeaderMap::new(), true).unwrap();
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
        let traffic = h.traffic.clone();
        let flow = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                traffic.0.fetch_add(1, Ordering::Relaxed);
            }
        });
        let verdict = lifeguard_drain::Rotation::verdict(&h.wait).await;
        assert!(matches!(verdict, lifeguard_drain::Verdict::NotOut(_)), "{verdict:?}");
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
            CheckerKey::of(Some(([10, 0, 0, 7], 1).into()), &HeaderMap::new(), true).unwrap(),
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
}
