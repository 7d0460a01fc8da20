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
use super::handle::HealthChecks;
use super::handle::{DrainWaitStatus, WaitState};
use super::quiet::{quiet_period, History, Rate, SAMPLE_EVERY, WINDOW};
use super::rule::{Rule, Step, Terms};
use super::{ms, DrainWaitPlan, Traffic, READ_EVERY};
use lifeguard_base::duration::GoDuration;
#[cfg(test)]
use lifeguard_base::grace::Grace;
use lifeguard_base::throttle::Throttle;
use lifeguard_checkers::Checkers;
use lifeguard_drain::CheckerKey;
use lifeguard_drain::WaitingOn;
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

/// Before the drain, a failed learn of the listeners is tried again no
/// sooner than this after the last try (a refused connection, Envoy not
/// listening yet, is due again at once).
const RELEARN_FLOOR: Duration = Duration::from_secs(1);

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
            // A failed learn of the listeners is tried again when due, not
            // at the next sample: until it succeeds, load balancers probing
            // through Envoy are told apart by `User-Agent` alone.
            let relearn = traffic
                .learn_due()
                .map(|due| due.max(Instant::now() + RELEARN_FLOOR))
                .filter(|at| *at < next);
            let step = async {
                match relearn {
                    Some(at) => {
                        sleep_until(at).await;
                        traffic.learn().await;
                        None
                    }
                    None => {
                        sleep_until(next).await;
                        Some(traffic.arrivals().await)
                    }
                }
            };
            let sampled = tokio::select! {
                begun = drain.wait_for(&mut until) => return begun.ok().map(|_| Instant::now()),
                sampled = step => sampled,
                _ = shutdown.cancelled() => return None,
            };
            let Some(arrivals) = sampled else {
                sync_trust(&*self.traffic, self.checkers);
                continue;
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
        let terms = Terms {
            threshold: plan.unhealthy_threshold,
            checker_timeout: plan.checker_timeout,
            quiet,
        };
        Rule::new(terms, began)
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
mod tests;
