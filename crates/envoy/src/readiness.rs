//! The readiness snapshot: one small type that the poller writes and the
//! probe reads, without locks and without ever waiting on Envoy.
//!
//! The poller stores a [`Verdict`] (ready or not, and the response body,
//! formatted once) after every admin read. The probe handler loads the
//! latest verdict — an atomic pointer load — and checks two things the
//! verdict cannot know by itself:
//!
//! - **draining**: read from the phase the drain publishes (its
//!   [`PhaseCell`], one atomic load, no lock the drain's writes take): from
//!   the moment the phase leaves `serving`, the load balancers are answered
//!   503 `draining`, whatever Envoy says. The kubelet ([`Audience`]) is
//!   too, unless the pod's termination started the drain: then it is
//!   answered as Envoy is until its window closes (the node's load
//!   balancers' time, or the drain wait's verdict: one more load from the
//!   cell and a clock read) or Envoy stops accepting new connections
//!   (`lifeguard_drain`'s `kubelet` module says why), and its answers are
//!   recorded in the cell.
//! - **staleness**: a verdict older than the stale bound is not trusted. If
//!   the poller stopped producing answers, a probe that reaches the agent
//!   directly must not be told "ready" about an Envoy that may be gone.
//!   When the poller kept a ready answer through reads that timed out, the
//!   verdict carries the stale body to send then, naming the last error.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use tokio::time::Instant;

use lifeguard_base::duration::GoDuration;
use lifeguard_drain::{NotServingBecause, Phase, PhaseCell};

pub use lifeguard_drain::Audience;

/// The answers of a drain, each said once.
static DRAINING: Bytes = Bytes::from_static(b"not ready: draining\n");
static DRAINING_TERMINATING: Bytes = Bytes::from_static(
    b"not ready: draining (the pod terminates: load balancers are answered 503; \
the kubelet 200 while Envoy accepts new connections)\n",
);
static TERMINATING_SERVING: Bytes = Bytes::from_static(
    b"ready: the pod terminates and Envoy accepts new connections (the kubelet's answer, \
for kube-proxy's fallback to a terminating endpoint; load balancers are answered 503)\n",
);
static STOPPING: Bytes = Bytes::from_static(b"not ready: Envoy is stopping (the pod terminates)\n");
static NODE_LET_GO: Bytes = Bytes::from_static(
    b"not ready: the pod terminates and the node's load balancers have had their time to let the node go \
(the kubelet's answer, so that announcers withdraw the node; Envoy still serves)\n",
);
static OUT_OF_ROTATION: Bytes = Bytes::from_static(
    b"not ready: the pod terminates and is out of rotation (the kubelet's answer; Envoy still serves)\n",
);

/// What the probe answers: ready or not, and the body to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub ready: bool,
    pub body: Bytes,
}

/// One admin read turned into a readiness decision.
#[derive(Debug)]
pub struct Verdict {
    ready: bool,
    /// One line of plain text, newline-terminated: `ready` or the reason.
    body: Bytes,
    /// When the read that produced this verdict completed.
    at: Instant,
    /// The body once a ready verdict is too old, when it says more than the
    /// generic one (the error of the reads that timed out since).
    stale_body: Option<Bytes>,
}

impl Verdict {
    pub fn ready(at: Instant) -> Self {
        Self {
            ready: true,
            body: Bytes::from_static(b"ready\n"),
            at,
            stale_body: None,
        }
    }

    pub fn not_ready(reason: &str, at: Instant) -> Self {
        Self {
            ready: false,
            body: Bytes::from(format!("not ready: {reason}\n")),
            at,
            stale_body: None,
        }
    }

    /// `previous` kept through a read that failed with `error` (a timeout:
    /// no answer, so nothing new is known), trusted until `at` is older than
    /// `stale_after`, then answered as stale with `error` named. `at` is the
    /// last evidence that Envoy's admin is alive: `previous.at()`, or later
    /// when Envoy was seen streaming a scrape since.
    pub(crate) fn kept(previous: &Verdict, error: &str, stale_after: Duration, at: Instant) -> Self {
        Self {
            ready: previous.ready,
            body: previous.body.clone(),
            at,
            stale_body: Some(Bytes::from(format!(
                "not ready: no successful Envoy admin read in the last {}: {error}\n",
                GoDuration(stale_after)
            ))),
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// When the read that produced this verdict completed.
    pub(crate) fn at(&self) -> Instant {
        self.at
    }

    /// The reason it is not ready (or `ready`), without the trailing newline.
    pub fn text(&self) -> &str {
        let text = std::str::from_utf8(&self.body).unwrap_or("").trim_end();
        text.strip_prefix("not ready: ").unwrap_or(text)
    }
}

/// The shared readiness state. Cloning gives another handle to the same state.
#[derive(Clone)]
pub struct Readiness {
    inner: Arc<Inner>,
}

struct Inner {
    verdict: ArcSwap<Verdict>,
    /// The drain's published phase: the only source of "draining".
    phase: PhaseCell,
    stale_after: Duration,
    stale_body: Bytes,
}

impl Readiness {
    /// A new snapshot that says "not ready: no admin read yet" until the
    /// poller stores its first verdict. `phase` is the drain's published
    /// phase ([`lifeguard_drain::DrainHandle::phase`]).
    pub fn new(stale_after: Duration, phase: PhaseCell) -> Self {
        Self {
            inner: Arc::new(Inner {
                verdict: ArcSwap::from_pointee(Verdict::not_ready("no answer from Envoy admin yet", Instant::now())),
                phase,
                stale_after,
                stale_body: Bytes::from(format!(
                    "not ready: no successful Envoy admin read in the last {}\n",
                    GoDuration(stale_after)
                )),
            }),
        }
    }

    /// Readiness with no drain behind it (benchmarks, tests): the phase is
    /// `serving` for good.
    pub fn standalone(stale_after: Duration) -> Self {
        Self::new(stale_after, PhaseCell::serving())
    }

    /// The probe's answer to `audience`. Never blocks on Envoy, never
    /// allocates, records nothing ([`Readiness::answered`] does).
    #[inline]
    pub fn answer(&self, audience: Audience) -> Answer {
        let inner = &*self.inner;
        let published = inner.phase.load();
        let phase = published.phase;
        if phase == Phase::Serving {
            return self.envoys_answer();
        }
        match (audience, published.kubelet_follows_envoy) {
            (Audience::Kubelet, true) if phase.envoy_accepts() => match inner.phase.kubelet_window() {
                // The readiness-fail delay: Envoy's answer, as everyone's.
                Ok(()) if !phase.fails_readiness() => self.envoys_answer(),
                Ok(()) => {
                    let answer = self.envoys_answer();
                    match answer.ready {
                        true => Answer {
                            ready: true,
                            body: TERMINATING_SERVING.clone(),
                        },
                        false => answer,
                    }
                }
                Err(NotServingBecause::OutOfRotation) => Answer {
                    ready: false,
                    body: OUT_OF_ROTATION.clone(),
                },
                Err(_) => Answer {
                    ready: false,
                    body: NODE_LET_GO.clone(),
                },
            },
            (Audience::Kubelet, true) => Answer {
                ready: false,
                body: STOPPING.clone(),
            },
            (_, follows) if phase.fails_readiness() => Answer {
                ready: false,
                body: match follows {
                    true => DRAINING_TERMINATING.clone(),
                    false => DRAINING.clone(),
                },
            },
            // The readiness-fail delay: Envoy's answer, for everyone.
            _ => self.envoys_answer(),
        }
    }

    /// The probe answered `audience` so: a kubelet's answer during a drain
    /// is recorded in the drain's cell (`GET /drain`'s `kubelet`). The
    /// probe's route calls it once per probe; nothing else answers the
    /// kubelet.
    #[inline]
    pub fn answered(&self, audience: Audience, answer: &Answer) {
        let inner = &*self.inner;
        if audience == Audience::Kubelet && inner.phase.get() != Phase::Serving {
            inner.phase.kubelet_answered(answer.ready);
        }
    }

    /// Envoy's own answer: the poller's verdict, unless it is too old.
    #[inline]
    fn envoys_answer(&self) -> Answer {
        let inner = &*self.inner;
        let verdict = inner.verdict.load();
        if verdict.ready && verdict.at.elapsed() > inner.stale_after {
            return Answer {
                ready: false,
                body: verdict.stale_body.as_ref().unwrap_or(&inner.stale_body).clone(),
            };
        }
        Answer {
            ready: verdict.ready,
            body: verdict.body.clone(),
        }
    }

    /// Stores the poller's latest verdict; returns the previous one.
    pub fn store(&self, verdict: Verdict) -> Arc<Verdict> {
        self.inner.verdict.swap(Arc::new(verdict))
    }

    /// The latest verdict stored by the poller (the drain not applied).
    pub(crate) fn verdict(&self) -> Arc<Verdict> {
        self.inner.verdict.load_full()
    }

    /// How old a verdict may be before it is not trusted.
    pub(crate) fn stale_after(&self) -> Duration {
        self.inner.stale_after
    }

    /// Whether readiness answers the load balancers 503 `draining`.
    pub fn is_draining(&self) -> bool {
        self.inner.phase.get().fails_readiness()
    }

    /// Whether a drain has begun (Envoy's `/ready` may then say DRAINING:
    /// the drain wait made it fail its health checks).
    pub(crate) fn drain_begun(&self) -> bool {
        self.inner.phase.get() != Phase::Serving
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lifeguard_drain::KubeletAnswer;

    fn readiness(stale_after: Duration) -> (PhaseCell, Readiness) {
        let phase = PhaseCell::serving();
        (phase.clone(), Readiness::new(stale_after, phase))
    }

    /// A readiness stale after 4 s whose Envoy is ready, the drain in
    /// `phase` with the kubelet answered as `kubelet` says.
    fn ready_envoy_in(phase: Phase, kubelet: KubeletAnswer) -> (PhaseCell, Readiness) {
        let (cell, r) = readiness(Duration::from_secs(4));
        r.store(Verdict::ready(Instant::now()));
        cell.set(phase, Some(kubelet));
        (cell, r)
    }

    /// The answer `ready` with `body`.
    fn answer(ready: bool, body: &'static [u8]) -> Answer {
        Answer {
            ready,
            body: Bytes::from_static(body),
        }
    }

    #[test]
    fn starts_not_ready_with_a_reason() {
        let (_tx, r) = readiness(Duration::from_secs(4));
        let a = r.answer(Audience::LoadBalancer);
        assert!(!a.ready);
        assert_eq!(a.body, "not ready: no answer from Envoy admin yet\n");
    }

    #[test]
    fn serves_the_stored_verdict() {
        let (_tx, r) = readiness(Duration::from_secs(4));
        r.store(Verdict::ready(Instant::now()));
        assert_eq!(r.answer(Audience::LoadBalancer), answer(true, b"ready\n"));
        r.store(Verdict::not_ready("server.state is INITIALIZING", Instant::now()));
        let a = r.answer(Audience::LoadBalancer);
        assert!(!a.ready);
        assert_eq!(a.body, "not ready: server.state is INITIALIZING\n");
    }

    #[test]
    fn the_published_drain_phase_wins_over_ready() {
        let (tx, r) = readiness(Duration::from_secs(4));
        r.store(Verdict::ready(Instant::now()));
        assert!(r.answer(Audience::LoadBalancer).ready);
        for phase in [
            Phase::Delaying,
            Phase::Draining,
            Phase::Drained,
            Phase::Stopping,
            Phase::Stopped,
        ] {
            tx.set(phase, None);
            r.store(Verdict::ready(Instant::now()));
            assert_eq!(
                r.answer(Audience::LoadBalancer).body,
                "not ready: draining\n",
                "{phase:?}"
            );
            assert!(!r.answer(Audience::LoadBalancer).ready);
            assert!(r.is_draining());
        }
    }

    #[test]
    fn during_the_readiness_fail_delay_envoys_verdict_is_answered() {
        let (tx, r) = readiness(Duration::from_secs(4));
        tx.set(Phase::DrainingReady, None);
        r.store(Verdict::ready(Instant::now()));
        assert_eq!(r.answer(Audience::LoadBalancer), answer(true, b"ready\n"));
        assert!(!r.is_draining());
        r.store(Verdict::not_ready(
            "server.state is 1 (DRAINING), not 0 (LIVE)",
            Instant::now(),
        ));
        assert!(
            !r.answer(Audience::LoadBalancer).ready,
            "an Envoy that is not ready is still not ready"
        );
        tx.set(Phase::Draining, None);
        r.store(Verdict::ready(Instant::now()));
        assert_eq!(r.answer(Audience::LoadBalancer).body, "not ready: draining\n");
    }

    #[tokio::test(start_paused = true)]
    async fn a_ready_verdict_older_than_the_bound_is_not_trusted() {
        let (_tx, r) = readiness(Duration::from_millis(50));
        r.store(Verdict::ready(Instant::now()));
        tokio::time::advance(Duration::from_millis(50)).await;
        assert!(
            r.answer(Audience::LoadBalancer).ready,
            "exactly at the bound it is still trusted"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        let a = r.answer(Audience::LoadBalancer);
        assert!(!a.ready);
        assert_eq!(a.body, "not ready: no successful Envoy admin read in the last 50ms\n");
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_verdict_names_the_error_once_stale() {
        let (_tx, r) = readiness(Duration::from_millis(50));
        r.store(Verdict::ready(Instant::now()));
        let kept = Verdict::kept(&r.verdict(), "timed out", r.stale_after(), r.verdict().at());
        r.store(kept);
        assert!(r.answer(Audience::LoadBalancer).ready);
        tokio::time::advance(Duration::from_millis(51)).await;
        assert_eq!(
            r.answer(Audience::LoadBalancer).body,
            "not ready: no successful Envoy admin read in the last 50ms: timed out\n"
        );
    }

    /// A drain the pod's termination started: the load balancers get 503
    /// from its first moment (Envoy's answer, for everyone, in the
    /// readiness-fail delay), the kubelet 200 for as long as Envoy is
    /// ready and accepts new connections and its window is open, then 503;
    /// and the kubelet's answers, as the probe says it gave them, are
    /// recorded (answering alone records nothing).
    #[test]
    fn while_the_pod_terminates_the_kubelet_follows_envoy_and_load_balancers_get_503() {
        let (cell, r) = ready_envoy_in(Phase::DrainingReady, KubeletAnswer::FollowsEnvoy);
        for audience in [Audience::Kubelet, Audience::LoadBalancer] {
            assert_eq!(
                r.answer(audience).body,
                "ready\n",
                "{audience:?}: the readiness-fail delay"
            );
        }
        // What the probe route does: answer, then record what it answered.
        let probe = |audience: Audience| {
            let answer = r.answer(audience);
            r.answered(audience, &answer);
            answer
        };
        let kubelet = Audience::of_agent(Some(b"kube-probe/1.34"));
        assert_eq!(kubelet, Audience::Kubelet);
        assert_eq!(
            Audience::of_agent(Some(b"ELB-HealthChecker/2.0")),
            Audience::LoadBalancer
        );
        assert_eq!(Audience::of_agent(None), Audience::LoadBalancer);
        for phase in [Phase::Delaying, Phase::LeavingRotation, Phase::Draining, Phase::Drained] {
            cell.set(phase, Some(KubeletAnswer::FollowsEnvoy));
            let k = probe(kubelet);
            assert!(k.ready, "{phase:?}");
            assert!(
                k.body.starts_with(b"ready: the pod terminates"),
                "{phase:?}: {:?}",
                k.body
            );
            let lb = r.answer(Audience::LoadBalancer);
            assert!(!lb.ready, "{phase:?}");
            assert!(
                lb.body.starts_with(b"not ready: draining (the pod terminates"),
                "{:?}",
                lb.body
            );
        }
        // Envoy not ready: the kubelet is told why.
        r.store(Verdict::not_ready("cannot connect to Envoy admin", Instant::now()));
        assert_eq!(probe(kubelet).body, "not ready: cannot connect to Envoy admin\n");
        r.store(Verdict::ready(Instant::now()));
        // The node's load balancers have had their time: 503 for the
        // kubelet too (announcers withdraw the node), Envoy still serving.
        cell.set(Phase::Draining, Some(KubeletAnswer::FollowsEnvoy));
        cell.kubelet_window_ends(Instant::now(), NotServingBecause::NodeLoadBalancersTime);
        let k = probe(kubelet);
        assert!(!k.ready);
        assert!(k
            .body
            .starts_with(b"not ready: the pod terminates and the node's load balancers have had"));
        assert!(!r.answer(Audience::LoadBalancer).ready);
        for phase in [Phase::Stopping, Phase::Stopped] {
            cell.set(phase, Some(KubeletAnswer::FollowsEnvoy));
            let k = probe(kubelet);
            assert!(!k.ready);
            assert_eq!(k.body, "not ready: Envoy is stopping (the pod terminates)\n");
        }
        let mut status = lifeguard_drain::Status::initial(lifeguard_drain::DrainUntil::Time, String::new());
        status.kubelet = Some(lifeguard_drain::Kubelet {
            answer: KubeletAnswer::FollowsEnvoy,
            serving_window_seconds: Some(31.0),
            not_serving_after_seconds: None,
            not_serving_because: None,
            ready_probes: 0,
            not_ready_probes: 0,
            last_ready_after_seconds: None,
        });
        status.started_at = Some(lifeguard_base::duration::unix_now());
        cell.fill_kubelet(&mut status);
        let seen = status.kubelet.clone().unwrap();
        assert_eq!((seen.ready_probes, seen.not_ready_probes), (4, 4));
        let _ = r.answer(kubelet);
        let mut again = status.clone();
        cell.fill_kubelet(&mut again);
        assert_eq!(
            again.kubelet.unwrap().not_ready_probes,
            4,
            "an answer alone is not a probe"
        );
    }

    /// An operator's drain (the pod not terminating): 503 for everyone,
    /// the kubelet too, so that the pod leaves its Service's endpoints.
    #[test]
    fn an_operators_drain_gives_the_kubelet_503_too() {
        let (_cell, r) = ready_envoy_in(Phase::Draining, KubeletAnswer::NotServing);
        for audience in [Audience::Kubelet, Audience::LoadBalancer] {
            assert_eq!(r.answer(audience), answer(false, b"not ready: draining\n"));
        }
    }
}
