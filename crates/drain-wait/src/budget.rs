//! Whether the pod's grace period leaves its load balancers the time they
//! take to let it go, said before it is needed: once a checker is learned,
//! long before any drain.
//!
//! A checker that probes every `i` and takes the pod out after `n` failed
//! probes in a row needs `i × n` from the moment readiness turns 503; the
//! traffic it sent must then stop for the quiet period; and lifeguard
//! keeps the shutdown margin to stop Envoy (and, for a sidecar's drain
//! wait, the app's time to finish before Envoy stops). When the slowest
//! learned checker's sum does not fit the grace period, the wait ends at
//! its bound with the pod still in rotation, and requests are lost: that
//! is worth a warning at the first probe that shows it, not at the pod's
//! deletion.

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::ms;
use super::quiet::{quiet_period, Rate};
use super::settings::Checks;
use super::DrainWaitPlan;
use lifeguard_base::duration::GoDuration;
use lifeguard_base::grace::Grace;
use lifeguard_checkers::Checker;
use lifeguard_drain::CheckerKey;
use lifeguard_drain::DrainUntil;
use lifeguard_drain::KUBE_PROXY_LAG;

/// The slowest learned checker against the grace period (`GET /drain`'s
/// `drain_wait.budget`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Budget {
    /// Whether the slowest checker's time, the quiet period, the shutdown
    /// margin and (for a sidecar) the app's time fit the grace period, and
    /// the checker timeout waits for that checker.
    pub fits: bool,
    /// The slowest learned checker, e.g. `10.0.0.5 (ELB-HealthChecker/2.0)`.
    pub checker: String,
    /// Its interval × its threshold: how long it takes to let the pod go.
    pub checker_takes_seconds: f64,
    /// The grace period it needs.
    pub needed_grace_period_seconds: f64,
    pub grace_period_seconds: f64,
    /// The checker timeout it needs, when the one set is shorter.
    pub needed_checker_timeout_seconds: Option<f64>,
}

/// What a drain needs besides the checkers' time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Needs {
    /// The configured threshold (a checker's software may fix its own).
    pub(crate) threshold: u32,
    /// The quiet period the traffic before the drain calls for now.
    pub(crate) quiet: Duration,
    /// The app's time after the wait (a sidecar's), or zero (a gateway).
    pub(crate) app_time: Duration,
    pub(crate) grace: Grace,
    pub(crate) checker_timeout: Duration,
    /// The drain's readiness-fail delay: the checkers start failing only
    /// after it.
    pub(crate) fails_after: Duration,
}

/// The slowest learned checker still probing at `now`, against the grace
/// period (None: none learned).
pub(crate) fn slowest(checkers: &[Checker], needs: &Needs, now: Instant) -> Option<(CheckerKey, Budget)> {
    let takes = |c: &Checker| {
        let threshold = c.key.fixed_threshold().unwrap_or(needs.threshold.max(1));
        c.interval.map(|i| i.saturating_mul(threshold))
    };
    let probing = |c: &Checker| {
        c.silent_after()
            .is_some_and(|after| now.saturating_duration_since(c.last_seen) <= after)
    };
    let slowest = checkers
        .iter()
        .filter(|c| c.counted && probing(c))
        .filter_map(|c| Some((c, takes(c)?)))
        .max_by_key(|(_, t)| *t)?;
    let (checker, takes) = slowest;
    let takes = tenths(takes);
    let needed = needs.fails_after + takes + needs.quiet + needs.grace.margin() + needs.app_time;
    // The checker timeout counts from the drain's start; the checker fails
    // from the 503, the readiness-fail delay later.
    let from_start = needs.fails_after + takes;
    let timeout_short = from_start > needs.checker_timeout;
    let budget = Budget {
        fits: needed <= needs.grace.period() && !timeout_short,
        checker: checker.key.to_string(),
        checker_takes_seconds: takes.as_secs_f64(),
        needed_grace_period_seconds: round_up(needed).as_secs_f64(),
        grace_period_seconds: needs.grace.period().as_secs_f64(),
        needed_checker_timeout_seconds: timeout_short.then(|| round_up(from_start).as_secs_f64()),
    };
    Some((checker.key, budget))
}

/// A measured interval to the tenth of a second: intervals are measured
/// between arrivals, a few milliseconds off the load balancer's setting.
fn tenths(d: Duration) -> Duration {
    Duration::from_millis((d.as_millis() as u64 + 50) / 100 * 100)
}

/// A duration up to the next whole second: a grace period is set in
/// seconds.
fn round_up(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0))
}

/// The warning for a budget that does not fit, in words.
pub(crate) fn warning(budget: &Budget, checker: &Checker, needs: &Needs) -> String {
    let every = GoDuration(tenths(checker.interval.unwrap_or_default()));
    let threshold = checker.key.fixed_threshold().unwrap_or(needs.threshold.max(1));
    let takes = GoDuration(ms(Duration::from_secs_f64(budget.checker_takes_seconds)));
    let app = match needs.app_time.is_zero() {
        true => String::new(),
        false => format!(" + the app's {}", GoDuration(needs.app_time)),
    };
    let delay = match needs.fails_after.is_zero() {
        true => String::new(),
        false => format!("the {} readiness-fail delay + ", GoDuration(needs.fails_after)),
    };
    let mut words = format!(
        "drain wait: checker {} probes every {every} and takes the pod out after {threshold} failures in a row: \
         it needs a grace period of {}s ({delay}{takes} + the {} quiet period + the {} shutdown margin{app}), \
         and the pod's is {}",
        budget.checker,
        budget.needed_grace_period_seconds,
        GoDuration(ms(needs.quiet)),
        GoDuration(needs.grace.margin()),
        GoDuration(needs.grace.period()),
    );
    if let Some(timeout) = budget.needed_checker_timeout_seconds {
        words.push_str(&format!(
            "; and --drain-wait-checker-timeout ({}) lets it go before it has: set it to at least {timeout}s",
            GoDuration(needs.checker_timeout)
        ));
    }
    words.push_str(
        ": set terminationGracePeriodSeconds (and TERMINATION_GRACE_PERIOD) to at least that; until then the wait \
         ends at its bound with the pod still in this load balancer's rotation",
    );
    words
}

/// The quiet period a declared load balancer's budget assumes before any
/// traffic is known (`lifeguard check`, start-up): one request a second's.
pub(crate) fn assumed_quiet(plan: &DrainWaitPlan, policy: DrainUntil) -> Duration {
    let one_a_second = Rate {
        per_second: 1.0,
        arrived: 60,
        over: Duration::from_secs(60),
    };
    quiet_period(Some(one_a_second), plan.min_quiet_period, plan.quiet_ceiling(policy))
}

/// A way a node gets its traffic that the drain wait cannot see (no probe
/// of it reaches the pod), weighed against the grace period before any
/// drain: at start-up, by `lifeguard check`, and at each sample.
#[derive(Debug, Clone, PartialEq)]
pub struct WayBudget {
    /// The way, e.g. `a load balancer checking the node every 10s, out
    /// after 3 (--load-balancer-checks)`.
    pub way: String,
    /// The grace period it needs, up to a whole second.
    pub needed: Duration,
    pub fits: bool,
    /// Whether the settings it is made of were set (not assumed): then it
    /// holds the pod to it (`lifeguard check` exits 1, start-up warns
    /// when it does not fit).
    pub declared: bool,
    /// Its own time, before the quiet period: how long until its traffic
    /// stops.
    pub takes: Duration,
    /// What it needs, of what, against the grace period.
    pub words: String,
}

/// The kubelet's readiness probe assumed when `--kubelet-probe` is not
/// set: Kubernetes' defaults (periodSeconds 10, failureThreshold 3).
pub const KUBELET_PROBE_DEFAULT: Checks = Checks {
    interval: Duration::from_secs(10),
    threshold: 3,
};

/// The end of a way's words: the quiet period, the margin, the app's
/// time, against the grace period, and what comes when it does not fit.
fn tail(plan: &DrainWaitPlan, policy: DrainUntil, (quiet, of): (Duration, &str), needed: Duration) -> String {
    let app = plan.app_time_under(policy);
    let app = match app.is_zero() {
        true => String::new(),
        false => format!(" + the app's {}", GoDuration(app)),
    };
    format!(
        " + the {} quiet period{of} + the {} shutdown margin{app}), and the pod's is {}{}",
        GoDuration(ms(quiet)),
        GoDuration(plan.grace.margin()),
        GoDuration(plan.grace.period()),
        match needed <= plan.grace.period() {
            true => ": it fits",
            false => ": set terminationGracePeriodSeconds to at least that, or requests it still sends are lost",
        }
    )
}

/// Each load balancer that checks the node (declared, or the one assumed
/// when none is), under the drain's `policy`, with the quiet period
/// `quiet` (`of` what).
pub(crate) fn node_checked(plan: &DrainWaitPlan, policy: DrainUntil, quiet: (Duration, &str)) -> Vec<WayBudget> {
    let declared = !plan.node_checks.declared().is_empty();
    let all = match declared {
        true => plan.node_checks.declared().to_vec(),
        false => vec![lifeguard_drain::NodeChecks::ASSUMED],
    };
    all.iter()
        .map(|checks| {
            let way = format!(
                "a load balancer checking the node every {}, out after {} ({})",
                GoDuration(checks.interval),
                checks.threshold,
                match declared {
                    true => "--load-balancer-checks",
                    false => "assumed: --load-balancer-checks not set",
                }
            );
            let needed = round_up(
                plan.fails_after
                    + checks.takes()
                    + KUBE_PROXY_LAG
                    + quiet.0
                    + plan.grace.margin()
                    + plan.app_time_under(policy),
            );
            if !plan.kubelet_served {
                return WayBudget {
                    words: format!(
                        "{way}: the kubelet is answered 503 from the drain's start (--terminating-readiness failing), \
                         so the node drops what the load balancer still sends once the kubelet has seen its \
                         failures, before the load balancer lets the node go: set --terminating-readiness serving"
                    ),
                    way,
                    needed,
                    fits: false,
                    declared,
                    takes: checks.takes(),
                };
            }
            let delay = match plan.fails_after.is_zero() {
                true => String::new(),
                false => format!("the {} readiness-fail delay + ", GoDuration(plan.fails_after)),
            };
            let words = format!(
                "{way} needs a grace period of {}s ({delay}{} + {} for the change to reach it{}",
                needed.as_secs(),
                GoDuration(checks.takes()),
                GoDuration(KUBE_PROXY_LAG),
                tail(plan, policy, quiet, needed)
            );
            WayBudget {
                fits: needed <= plan.grace.period(),
                way,
                needed,
                declared,
                takes: checks.takes(),
                words,
            }
        })
        .collect()
}

/// An announcer that follows the EndpointSlice (MetalLB): it withdraws
/// the node once the kubelet's answer has turned 503 (after the node's
/// load balancers' time, or at once with `--terminating-readiness
/// failing`) and the kubelet has seen its failure threshold.
pub(crate) fn announced(plan: &DrainWaitPlan, policy: DrainUntil, quiet: (Duration, &str)) -> WayBudget {
    let probe = plan.kubelet_probe.unwrap_or(KUBELET_PROBE_DEFAULT);
    let serving_window = match plan.kubelet_served {
        true => plan.node_checks.serving_window(),
        false => Duration::ZERO,
    };
    let needed = round_up(
        serving_window + probe.takes() + KUBE_PROXY_LAG + quiet.0 + plan.grace.margin() + plan.app_time_under(policy),
    );
    let told = match plan.kubelet_served {
        true => format!(
            "the kubelet told the pod serves for {} (the node's load balancers' time)",
            GoDuration(serving_window)
        ),
        false => "the kubelet told 503 at once (--terminating-readiness failing)".to_owned(),
    };
    let source = match plan.kubelet_probe {
        Some(_) => "--kubelet-probe",
        None => "assumed: Kubernetes' defaults, --kubelet-probe not set",
    };
    let words = format!(
        "an announcer that follows the EndpointSlice (MetalLB) needs a grace period of {}s ({told} + {} failed \
         probes of the kubelet every {} ({source}) + {} for the change to reach it{}",
        needed.as_secs(),
        probe.threshold,
        GoDuration(probe.interval),
        GoDuration(KUBE_PROXY_LAG),
        tail(plan, policy, quiet, needed)
    );
    WayBudget {
        way: "an announcer that follows the EndpointSlice (MetalLB)".to_owned(),
        needed,
        fits: needed <= plan.grace.period(),
        declared: plan.kubelet_probe.is_some(),
        takes: serving_window + probe.takes(),
        words,
    }
}

impl WayBudget {
    /// The budget `GET /drain` shows for a declared way.
    pub(crate) fn budget(&self, grace: Grace) -> Budget {
        Budget {
            fits: self.fits,
            checker: self.way.clone(),
            checker_takes_seconds: self.takes.as_secs_f64(),
            needed_grace_period_seconds: self.needed.as_secs_f64(),
            grace_period_seconds: grace.period().as_secs_f64(),
            needed_checker_timeout_seconds: None,
        }
    }
}

impl DrainWaitPlan {
    /// What `lifeguard check` and start-up say of each way a node gets its
    /// traffic that the drain wait cannot see (a load balancer that checks
    /// the node; an announcer), under the drain's `policy`, the quiet
    /// period assumed (one request a second's).
    pub fn way_budgets(&self, policy: DrainUntil) -> Vec<WayBudget> {
        let quiet = (assumed_quiet(self, policy), " of a request a second");
        let mut ways = node_checked(self, policy, quiet);
        ways.push(announced(self, policy, quiet));
        ways
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lifeguard_checkers::Checkers;
    use lifeguard_drain::{CheckerKey, NodeChecks};

    fn needs(grace: u64) -> Needs {
        Needs {
            threshold: 2,
            quiet: Duration::from_millis(500),
            app_time: Duration::ZERO,
            grace: Grace::new(Duration::from_secs(grace), Duration::from_secs(2)).unwrap(),
            checker_timeout: Duration::from_secs(70),
            fails_after: Duration::ZERO,
        }
    }

    /// A checker at 10.0.0.5 probing every `every` seconds, twice.
    fn learned(every: u64, agent: &'static str) -> (Checkers, Instant) {
        let checkers = Checkers::default();
        let key = CheckerKey::new([10, 0, 0, 5].into(), false, agent.as_bytes()).unwrap();
        let t0 = Instant::now();
        checkers.record(key, t0, true);
        checkers.record(key, t0 + Duration::from_secs(every), true);
        (checkers, t0 + Duration::from_secs(every))
    }

    /// The case: an ALB's target group checking every 30 s, out
    /// after 2 failures, and the default 30 s grace period.
    #[tokio::test(start_paused = true)]
    async fn a_checker_that_cannot_fit_the_grace_period_is_named_with_what_it_needs() {
        let (checkers, now) = learned(30, "ELB-HealthChecker/2.0");
        let (_, budget) = slowest(&checkers.snapshot(), &needs(30), now).unwrap();
        assert!(!budget.fits);
        assert_eq!(budget.checker, "10.0.0.5 (ELB-HealthChecker/2.0)");
        assert_eq!(budget.checker_takes_seconds, 60.0);
        assert_eq!(budget.needed_grace_period_seconds, 63.0, "60 + 0.5 + 2, up to a second");
        let c = &checkers.snapshot()[0];
        let line = warning(&budget, c, &needs(30));
        assert!(
            line.contains("checker 10.0.0.5 (ELB-HealthChecker/2.0) probes every 30s")
                && line.contains("a grace period of 63s")
                && line.contains("the pod's is 30s"),
            "{line}"
        );
        // The same checker fits a 63 s grace period.
        let (_, fits) = slowest(&checkers.snapshot(), &needs(63), now).unwrap();
        assert!(fits.fits, "{fits:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_checker_timeout_shorter_than_the_checker_does_not_fit() {
        let (checkers, now) = learned(30, "ELB-HealthChecker/2.0");
        let short = Needs {
            checker_timeout: Duration::from_secs(20),
            ..needs(90)
        };
        let (_, budget) = slowest(&checkers.snapshot(), &short, now).unwrap();
        assert!(!budget.fits);
        assert_eq!(budget.needed_checker_timeout_seconds, Some(60.0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_readiness_fail_delay_counts_in_the_grace_period_needed() {
        let (checkers, now) = learned(10, "ELB-HealthChecker/2.0");
        let (_, fits) = slowest(&checkers.snapshot(), &needs(30), now).unwrap();
        assert!(fits.fits, "{fits:?}");
        let delayed = Needs {
            fails_after: Duration::from_secs(10),
            ..needs(30)
        };
        let (_, budget) = slowest(&checkers.snapshot(), &delayed, now).unwrap();
        assert!(!budget.fits);
        assert_eq!(budget.needed_grace_period_seconds, 33.0);
        // The checker timeout (from the drain's start) must cover the
        // delay and the checker: 20 s does not.
        let short = Needs {
            checker_timeout: Duration::from_secs(20),
            ..delayed
        };
        let (_, budget) = slowest(&checkers.snapshot(), &short, now).unwrap();
        assert_eq!(budget.needed_checker_timeout_seconds, Some(30.0));
        let checker = &checkers.snapshot()[0];
        let words = warning(&budget, checker, &delayed);
        assert!(words.contains("(the 10s readiness-fail delay + 20s + the "), "{words}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_apps_time_counts_for_a_sidecar_and_envoys_checker_needs_one_failure() {
        let (checkers, now) = learned(5, "Envoy/HC");
        let sidecar = Needs {
            app_time: Duration::from_secs(5),
            ..needs(30)
        };
        let (_, budget) = slowest(&checkers.snapshot(), &sidecar, now).unwrap();
        assert_eq!(budget.checker_takes_seconds, 5.0, "Envoy's checker: 1 failure");
        assert_eq!(budget.needed_grace_period_seconds, 13.0, "5 + 0.5 + 2 + 5");
        assert!(budget.fits);
        // None learned: nothing to say.
        assert!(slowest(&Checkers::default().snapshot(), &sidecar, now).is_none());
    }

    /// A declared load balancer (one that checks the node, which no probe
    /// shows) is weighed as a learned one is: its interval x threshold, a
    /// second for the change to reach it, the quiet period and the margin.
    #[test]
    fn a_declared_load_balancers_checks_are_weighed_against_the_grace_period() {
        use crate::LoadBalancerChecks;
        let checks = |s: &str| s.parse::<LoadBalancerChecks>().map(LoadBalancerChecks::get);
        for same in ["10s x 3", "10s*3", "10s×3"] {
            assert_eq!(checks(same).unwrap(), checks("10sx3").unwrap(), "{same}");
        }
        for bad in ["10s", "x3", "10sx0", "0sx3", "tenx3"] {
            assert!(checks(bad).is_err(), "{bad}");
        }
        let mut plan = DrainWaitPlan::for_tests();
        plan.grace = Grace::new(Duration::from_secs(60), Duration::from_secs(2)).unwrap();
        plan.node_checks = NodeChecks::new(vec![checks("10sx3").unwrap(), checks("20sx3").unwrap()]);
        let quiet = (Duration::from_secs(5), "");
        let budgets = node_checked(&plan, DrainUntil::OutOfRotation, quiet);
        // 30 + 1 + 5 + 2 = 38 s fits 60 s; 60 + 1 + 5 + 2 = 68 s does not.
        assert_eq!(budgets[0].needed, Duration::from_secs(38));
        assert!(budgets[0].fits && budgets[0].declared);
        assert_eq!(budgets[1].needed, Duration::from_secs(68));
        assert!(!budgets[1].fits);
        // A sidecar's keeps the app's time too.
        assert_eq!(
            node_checked(&plan, DrainUntil::AppExit, quiet)[0].needed,
            Duration::from_secs(43)
        );
        let said = plan.way_budgets(DrainUntil::OutOfRotation);
        assert!(
            said[1].words.contains("needs a grace period of 70s") && !said[1].fits,
            "{said:?}"
        );
        // With the older rule the node drops what its load balancer still
        // sends: a declared one does not fit, whatever the grace period.
        plan.kubelet_served = false;
        let failing = node_checked(&plan, DrainUntil::OutOfRotation, quiet);
        assert!(!failing[0].fits && failing[0].words.contains("--terminating-readiness serving"));
    }

    /// Issue #51: an announcer withdraws the node once the kubelet's
    /// window is over and the kubelet has seen its failure threshold; the
    /// assumed numbers are said, not held to.
    #[test]
    fn an_announcer_needs_the_kubelets_window_and_its_failures() {
        let mut plan = DrainWaitPlan::for_tests();
        plan.grace = Grace::new(Duration::from_secs(90), Duration::from_secs(2)).unwrap();
        let quiet = (Duration::from_millis(500), "");
        // 31 s (10sx3 assumed, and 1 s) + 30 s (10sx3, the kubelet's
        // defaults) + 1 s + 0.5 s + 2 s = 64.5 s, up to 65 s.
        let way = announced(&plan, DrainUntil::OutOfRotation, quiet);
        assert_eq!(way.needed, Duration::from_secs(65));
        assert!(way.fits && !way.declared, "{way:?}");
        assert!(
            way.words.contains("for 31s") && way.words.contains("assumed"),
            "{}",
            way.words
        );
        plan.kubelet_probe = Some("5sx3".parse().unwrap());
        plan.grace = Grace::new(Duration::from_secs(45), Duration::from_secs(2)).unwrap();
        let way = announced(&plan, DrainUntil::OutOfRotation, quiet);
        assert_eq!(way.needed, Duration::from_secs(50), "31 + 15 + 1 + 0.5 + 2");
        assert!(!way.fits && way.declared);
        // The older rule: the kubelet told 503 at once, the node withdrawn
        // after its failures alone.
        plan.kubelet_served = false;
        let way = announced(&plan, DrainUntil::OutOfRotation, quiet);
        assert_eq!(way.needed, Duration::from_secs(19), "15 + 1 + 0.5 + 2");
        assert!(way.fits);
    }
}
