//! Readiness told to each audience while the pod terminates.
//!
//! Two probers read the same `/healthz/ready` for different ends:
//!
//! - **the load balancers** that check the pod take it out of rotation at
//!   their own pace once it fails: they must see 503 from the drain's
//!   first moment;
//! - **the kubelet** (`User-Agent: kube-probe/…`) decides the EndpointSlice
//!   condition `serving`, which kube-proxy reads under KEP-1669: once every
//!   endpoint of a Service on a node is terminating, the node's
//!   health-check port fails (whatever readiness says) and its load
//!   balancer takes the node out at its own pace; until then kube-proxy
//!   sends the node's new connections to a terminating endpoint **only
//!   while it is serving**. A pod that fails the kubelet's probe at SIGTERM
//!   has opted out of that fallback, and the node refuses what its load
//!   balancer still sends.
//!
//! So in a drain that the pod's termination started (a signal, or the
//! proxy's preStop hook), the kubelet is answered as Envoy is: 200 while
//! Envoy is ready and accepts new connections (the drain keeps Envoy's
//! listeners open until it stops Envoy), 503 once Envoy is stopping or not
//! ready ([`KubeletAnswer::FollowsEnvoy`]). A drain asked for while the pod
//! is not terminating (an operator's `POST /drain`) takes the pod out of
//! its Service's endpoints: 503 for everyone ([`KubeletAnswer::NotServing`]).
//! [`TerminatingReadiness::Failing`] keeps the older rule (503 for every
//! prober from the drain's start).
//!
//! The probe writes back what it answered the kubelet ([`KubeletRecord`]:
//! atomics, no lock, no allocation), so `GET /drain`, the exit summary and
//! the metrics say how the kubelet was answered and when that changed
//! ([`Kubelet`]).

use std::sync::atomic::{AtomicU64, Ordering};

use clap::ValueEnum;
use serde::Serialize;

/// How readiness answers the kubelet while the pod terminates (the
/// setting `terminating_readiness`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminatingReadiness {
    /// The kubelet is answered 200 while Envoy is ready and accepts new
    /// connections, so kube-proxy's terminating-endpoint fallback
    /// (KEP-1669) has somewhere to go; every other prober 503.
    Serving,
    /// Every prober, the kubelet too, is answered 503 from the drain's
    /// start: kube-proxy stops sending the node's traffic to the pod once
    /// the kubelet has seen its failure threshold.
    Failing,
}

lifeguard_base::display_as_value!(TerminatingReadiness);

/// How the kubelet's probe is answered in this drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KubeletAnswer {
    /// As Envoy is: 200 while it is ready and accepts new connections, 503
    /// once it is stopping or not ready (a drain the pod's termination
    /// started).
    FollowsEnvoy,
    /// 503 from the drain's start, as every prober: an operator's drain
    /// (the pod leaves its Service's endpoints), or `--terminating-readiness
    /// failing`.
    NotServing,
}

/// What `GET /drain`, the exit summary and the metrics show of the
/// kubelet's answers during the drain.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Kubelet {
    /// How the kubelet's probe is answered in this drain.
    pub answer: KubeletAnswer,
    /// Seconds from the drain's start to when the drain turned the
    /// kubelet's answer to 503 (0: at once; None: not yet).
    pub not_serving_after_seconds: Option<f64>,
    /// The kubelet's probes answered 200 since the drain began.
    pub ready_probes: u64,
    /// The kubelet's probes answered 503 since the drain began.
    pub not_ready_probes: u64,
    /// Seconds from the drain's start to the last 200 the kubelet got.
    pub last_ready_after_seconds: Option<f64>,
}

impl Kubelet {
    /// At the drain's start, with `answer`.
    pub(crate) fn new(answer: KubeletAnswer) -> Kubelet {
        Kubelet {
            answer,
            not_serving_after_seconds: match answer {
                KubeletAnswer::NotServing => Some(0.0),
                KubeletAnswer::FollowsEnvoy => None,
            },
            ready_probes: 0,
            not_ready_probes: 0,
            last_ready_after_seconds: None,
        }
    }
}

/// What the probe answered the kubelet since the drain began: counts, and
/// the unix time (milliseconds) of the last 200. Written by the probe
/// (relaxed atomics: counts and a time, none ordered against another).
#[derive(Debug, Default)]
pub(crate) struct KubeletRecord {
    ready: AtomicU64,
    not_ready: AtomicU64,
    /// 0: none yet.
    last_ready_ms: AtomicU64,
}

impl KubeletRecord {
    #[inline]
    pub(crate) fn answered(&self, ready: bool) {
        if ready {
            self.ready.fetch_add(1, Ordering::Relaxed);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            self.last_ready_ms.fetch_max(now, Ordering::Relaxed);
        } else {
            self.not_ready.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Fills `kubelet` in with what was answered, the drain having begun
    /// at `started_at` (unix seconds).
    pub(crate) fn fill(&self, kubelet: &mut Kubelet, started_at: Option<f64>) {
        kubelet.ready_probes = self.ready.load(Ordering::Relaxed);
        kubelet.not_ready_probes = self.not_ready.load(Ordering::Relaxed);
        let last = self.last_ready_ms.load(Ordering::Relaxed);
        kubelet.last_ready_after_seconds = match (last, started_at) {
            (0, _) | (_, None) => None,
            (ms, Some(start)) => Some((((ms as f64 / 1000.0) - start).max(0.0) * 1000.0).round() / 1000.0),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_counts_each_answer_and_dates_the_last_200_from_the_drains_start() {
        let record = KubeletRecord::default();
        let start = lifeguard_base::duration::unix_now() - 2.0;
        let mut kubelet = Kubelet::new(KubeletAnswer::FollowsEnvoy);
        record.fill(&mut kubelet, Some(start));
        assert_eq!((kubelet.ready_probes, kubelet.last_ready_after_seconds), (0, None));
        record.answered(true);
        record.answered(true);
        record.answered(false);
        record.fill(&mut kubelet, Some(start));
        assert_eq!((kubelet.ready_probes, kubelet.not_ready_probes), (2, 1));
        let after = kubelet.last_ready_after_seconds.unwrap();
        assert!((1.9..3.0).contains(&after), "{after}");
        assert_eq!(
            Kubelet::new(KubeletAnswer::NotServing).not_serving_after_seconds,
            Some(0.0),
            "an operator's drain takes the kubelet's 200 at once"
        );
    }
}
