//! What the drain is told to do: the policy ([`DrainUntil`]), which
//! listeners drain ([`DrainScope`]) and the times ([`Plan`]), made from the
//! drain's settings ([`crate::Settings::plan`]).

use std::time::Duration;

use tokio::time::Instant;

use clap::ValueEnum;

use super::kubelet::{KubeletAnswer, NodeChecks, NotServingBecause, TerminatingReadiness};
use super::ports::Active;
pub use super::ports::DrainScope;
use super::trigger::Trigger;
use lifeguard_base::duration::GoDuration;
use lifeguard_base::grace::Grace;

/// What the kubelet gives a container between its SIGTERM and its SIGKILL
/// at least, whatever is left of the grace period (its
/// `minimumGracePeriodInSeconds`).
pub(crate) const KUBELET_MIN_STOP: Duration = Duration::from_secs(2);

/// What the drain does, and when.
#[derive(Debug, Clone)]
pub struct Plan {
    pub(crate) drain_until: DrainUntil,
    /// Whether the policy was asked for (not the default).
    pub(crate) asked: bool,
    /// Which listeners Envoy drains.
    pub(crate) scope: DrainScope,
    /// Pause between readiness turning 503 and Envoy's drain.
    pub(crate) drain_delay: Duration,
    /// Time readiness keeps answering as Envoy does once Envoy's drain has
    /// begun (the opposite order of `delay`).
    pub(crate) readiness_fail_delay: Duration,
    /// The fixed policy's drain time.
    pub(crate) termination_drain_duration: Duration,
    /// The exit-on-zero policies' shortest drain.
    pub(crate) minimum_drain_duration: Duration,
    /// The pod's grace period, counted from the drain's start, and the
    /// margin kept back: the drain's deadline, how long Envoy gets to exit
    /// after SIGTERM before SIGKILL.
    pub(crate) grace: Grace,
    /// Timeout of one admin call.
    pub(crate) admin_timeout: Duration,
    /// How often the fixed policy reads the counts, for reporting.
    pub(crate) poll_interval: Duration,
    /// How the kubelet is answered while the pod terminates.
    pub(crate) terminating_readiness: TerminatingReadiness,
    /// The load balancers that check the node: how long the kubelet is
    /// told a terminating pod serves.
    pub(crate) node_checks: NodeChecks,
    /// Settings given that the policy leaves aside.
    pub(crate) set_aside: Vec<SetAside>,
}

/// A setting given that the drain's policy leaves aside (`key`, as the
/// settings name it, and its value): said, not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAside {
    pub key: &'static str,
    pub value: String,
}

impl Plan {
    /// The policy: asked for, or the default the settings made.
    pub fn drain_until(&self) -> DrainUntil {
        self.drain_until
    }

    /// Settings given that the policy leaves aside: said at start-up and
    /// by `lifeguard check`, not errors.
    pub fn set_aside(&self) -> &[SetAside] {
        &self.set_aside
    }

    /// Whether the policy was asked for (not the default).
    pub fn asked(&self) -> bool {
        self.asked
    }

    /// The same plan under the policy in force, where the pod cannot give
    /// the one planned (`app-exit` where the app's sockets cannot be
    /// attributed).
    pub fn in_force(self, drain_until: DrainUntil) -> Plan {
        Plan { drain_until, ..self }
    }

    /// `app-exit` by default (not asked for): a pod in which no socket or
    /// process of an app was ever seen when the drain begins is a pod whose
    /// only container is the proxy (a gateway), and drains `out-of-rotation`.
    pub fn gateway_without_app(&self) -> bool {
        self.drain_until == DrainUntil::AppExit && !self.asked
    }

    /// How long the fixed policy drains (given, or its default).
    pub fn termination_drain_duration(&self) -> Duration {
        self.termination_drain_duration
    }

    /// Which listeners Envoy drains.
    pub fn scope(&self) -> DrainScope {
        self.scope
    }

    /// The pod's grace period and the margin kept back from it (the
    /// drain's deadline: Envoy is stopped by then).
    pub fn grace(&self) -> Grace {
        self.grace
    }

    /// How long readiness keeps answering as Envoy does after the drain
    /// began: the load balancers see the 503 only then.
    pub fn readiness_fail_delay(&self) -> Duration {
        self.readiness_fail_delay
    }

    /// How the kubelet is answered while the pod terminates.
    pub fn terminating_readiness(&self) -> TerminatingReadiness {
        self.terminating_readiness
    }

    /// The load balancers that check the node, declared or assumed.
    pub fn node_checks(&self) -> &NodeChecks {
        &self.node_checks
    }

    /// How the kubelet is answered while the pod terminates, in words.
    pub fn kubelet_rule(&self) -> String {
        match self.terminating_readiness {
            TerminatingReadiness::Failing => "503 from the drain's start (--terminating-readiness failing)".to_owned(),
            TerminatingReadiness::Serving => {
                let serving_window = self.node_checks.serving_window();
                let past = match serving_window >= self.grace.deadline() {
                    true => format!(
                        " (no sooner than the drain's deadline, {}: until Envoy stops)",
                        GoDuration(self.grace.deadline())
                    ),
                    false => String::new(),
                };
                format!(
                    "as Envoy is (200 while it accepts new connections) for {} at most{past} ({} + {} for \
                     kube-proxy), then 503 so that announcers withdraw the node",
                    GoDuration(serving_window),
                    self.node_checks.slowest_words(),
                    GoDuration(super::KUBE_PROXY_LAG)
                )
            }
        }
    }

    /// How the kubelet's probe is answered in a drain started by
    /// `trigger`: as Envoy is, for the node's load balancers' time, when
    /// the pod's termination started it (and the setting says so); else
    /// 503, and why.
    pub(crate) fn kubelet(&self, trigger: Trigger) -> Result<std::time::Duration, NotServingBecause> {
        match (self.terminating_readiness, trigger.is_termination()) {
            (_, false) => Err(NotServingBecause::OperatorDrain),
            (TerminatingReadiness::Failing, true) => Err(NotServingBecause::TerminatingReadinessFailing),
            (TerminatingReadiness::Serving, true) => Ok(self.node_checks.serving_window()),
        }
    }

    /// Whether Envoy's stop waits for the load balancers' verdict (the
    /// drain wait's) before the policy's own rule, when the kubelet
    /// follows Envoy: kube-proxy keeps sending a node's new connections
    /// to the pod until the node's load balancer lets the node go, so a
    /// policy that ends by the clock or by an idle moment must not stop
    /// Envoy before. Not `app-exit`: the app's own hook (`GET
    /// /drain/wait`) holds the app, and Envoy, until then; not
    /// `out-of-rotation`, which waits for the verdict first anyway.
    pub(crate) fn stop_waits_for_verdict(&self, kubelet: KubeletAnswer) -> bool {
        kubelet == KubeletAnswer::FollowsEnvoy
            && matches!(
                self.drain_until,
                DrainUntil::Time | DrainUntil::Connections | DrainUntil::Requests
            )
    }

    /// The durations that do not fit inside the drain's deadline, as
    /// warnings.
    pub fn warnings(&self) -> Vec<String> {
        let budget = self.grace.deadline();
        let (what, wait) = match self.drain_until {
            DrainUntil::Time => ("termination_drain_duration", self.termination_drain_duration),
            // The load balancers' time is the drain wait's budget, said
            // once they are learned.
            DrainUntil::OutOfRotation => ("no minimum", Duration::ZERO),
            _ => ("minimum_drain_duration", self.minimum_drain_duration),
        };
        let mut out = Vec::new();
        if self.readiness_fail_delay > budget {
            out.push(format!(
                "readiness_fail_delay ({}) does not fit the {} left by termination_grace_period - shutdown_margin: readiness fails only at the deadline",
                GoDuration(self.readiness_fail_delay),
                GoDuration(budget)
            ));
        }
        if self.drain_delay + wait > budget {
            out.push(format!(
                "drain_delay ({}) + {what} ({}) = {} does not fit the {} left by termination_grace_period ({}) - shutdown_margin ({}): the drain will be cut at the deadline",
                GoDuration(self.drain_delay),
                GoDuration(wait),
                GoDuration(self.drain_delay + wait),
                GoDuration(budget),
                GoDuration(self.grace.period()),
                GoDuration(self.grace.margin()),
            ));
        }
        out
    }

    /// The shortest timeout of a drain read, the one at (or past) the
    /// deadline that says what Envoy is stopped with among them: a quarter
    /// of the shutdown margin, at most one admin call's timeout. Envoy's
    /// stop gets what is left of the grace period after it
    /// ([`Plan::stop_bound`]).
    pub(crate) fn last_read_timeout(&self) -> Duration {
        (self.grace.margin() / 4).min(self.admin_timeout)
    }

    /// How long Envoy gets to exit when stopped at `now` by a drain that
    /// began at `began` (None: no drain, a bare `/quitquitquit`: the
    /// shutdown margin), the kubelet's SIGTERM having come at `signalled`.
    /// Lifeguard's child, between SIGTERM and SIGKILL (`child`): the rest
    /// of the grace period, less a quarter of the margin for lifeguard to
    /// write its summary and exit before the kubelet's own SIGKILL, and the
    /// margin at least while the grace period has that much left. Envoy
    /// handles SIGTERM on its main thread, the one that serves its admin
    /// API: busy with a long admin call (a scrape of a large config) or
    /// starved of CPU, it takes seconds to begin its shutdown, and a flat
    /// margin killed it for that. An Envoy beside lifeguard, which
    /// lifeguard cannot kill, is waited for after `/quitquitquit` for the
    /// margin. Not past the grace period, but for the kubelet's own floor:
    /// it gives a container [`KUBELET_MIN_STOP`] after its SIGTERM,
    /// whatever is left (kuberuntime_container.go's `killContainer`,
    /// `minimumGracePeriodInSeconds`), as it does a native sidecar sent
    /// SIGTERM once the grace period has run out: the rest of that, less a
    /// quarter of the margin (a busy run stopped such an Envoy with
    /// SIGKILL at once).
    pub(crate) fn stop_bound(
        &self,
        began: Option<Instant>,
        signalled: Option<Instant>,
        now: Instant,
        child: bool,
    ) -> Duration {
        let margin = self.grace.margin();
        let floor = signalled
            .and_then(|at| at.checked_add(KUBELET_MIN_STOP))
            .map_or(Duration::ZERO, |kill| {
                kill.saturating_duration_since(now).saturating_sub(margin / 4)
            });
        let Some(grace_end) = began.and_then(|began| began.checked_add(self.grace.period())) else {
            return margin.max(floor);
        };
        let left = grace_end.saturating_duration_since(now);
        let bound = match child {
            true => left.min(margin).max(left.saturating_sub(margin / 4)),
            false => left.min(margin),
        };
        bound.max(floor)
    }

    /// When the drain is done under its policy, in words.
    pub(crate) fn drained_when(&self) -> String {
        match self.drain_until {
            DrainUntil::Time => format!("{} of drain time", GoDuration(self.termination_drain_duration)),
            DrainUntil::AppExit => format!(
                "no request in Envoy and no socket or process of the app, after at least {}",
                GoDuration(self.minimum_drain_duration)
            ),
            DrainUntil::OutOfRotation => {
                "the load balancers to take the pod out (the drain wait's verdict), then no request in Envoy".to_owned()
            }
            until => format!(
                "zero active {until}, after at least {}",
                GoDuration(self.minimum_drain_duration)
            ),
        }
    }

    /// What the count counts under this policy. The fixed policy counts the
    /// work it would cut: requests and TCP-proxy connections.
    pub(crate) fn counted(&self) -> &'static str {
        match self.drain_until {
            DrainUntil::Connections => "connections",
            DrainUntil::Requests => "requests",
            DrainUntil::Time | DrainUntil::AppExit | DrainUntil::OutOfRotation => "requests in flight",
        }
    }

    /// What the count that ends the drain counts: with `app-exit`, the
    /// app's sockets and processes too.
    pub(crate) fn counted_in_all(&self) -> &'static str {
        match self.drain_until {
            DrainUntil::AppExit => "requests in flight, app sockets and app processes",
            _ => self.counted(),
        }
    }

    pub(crate) fn count(&self, active: &Active) -> u64 {
        match self.drain_until {
            DrainUntil::Connections => active.connections,
            DrainUntil::Requests => active.requests,
            DrainUntil::Time | DrainUntil::AppExit | DrainUntil::OutOfRotation => active.work(),
        }
    }
}

/// What the drain waits for before Envoy is stopped: one word each, as
/// the flag takes it (`app-exit`, ...), which `Display`, the JSON and the
/// `policy` label also write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum DrainUntil {
    /// A fixed time: `termination_drain_duration`.
    Time,
    /// Zero active downstream connections (after the minimum duration).
    Connections,
    /// Zero active downstream HTTP requests (after the minimum duration):
    /// idle keep-alive connections do not hold the pod.
    Requests,
    /// After the minimum duration, no request (HTTP or TCP proxy, inbound
    /// or outbound) active in Envoy and nothing left of the app in the pod:
    /// no socket, and with a shared process namespace no process.
    AppExit,
    /// For a pod whose only container is the proxy (an ingress gateway):
    /// Envoy serves as before until every load balancer has taken the pod
    /// out and no new request came for the quiet period (the drain wait's
    /// verdict), then closes its connections at a request boundary and
    /// stops once no request is in flight.
    OutOfRotation,
}

lifeguard_base::display_as_value!(DrainUntil);
lifeguard_base::serialize_as_display!(DrainUntil);

#[cfg(test)]
mod tests {
    use super::*;
    use lifeguard_base::reason::Label;

    /// Every policy is one word: the flag's (clap's), `Display`'s, the
    /// JSON's (`GET /drain`, the exit summary) and the metric label's
    /// (strum's).
    #[test]
    fn each_policy_has_one_word() {
        let all: Vec<DrainUntil> = DrainUntil::all().collect();
        assert_eq!(
            all,
            DrainUntil::value_variants(),
            "the same variants, in the same order"
        );
        for policy in all {
            let flag = policy.to_possible_value().expect("no variant is skipped");
            let word = flag.get_name();
            assert_eq!(policy.to_string(), word);
            assert_eq!(serde_json::to_value(policy).unwrap(), word);
            assert_eq!(policy.label(), word);
            assert_eq!(DrainUntil::from_str(word, false), Ok(policy));
        }
        assert_eq!(DrainUntil::AppExit.label(), "app-exit");
        assert_eq!(DrainUntil::OutOfRotation.label(), "out-of-rotation");
    }
}
