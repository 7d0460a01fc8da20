//! Readiness told to each audience while the pod terminates.
//!
//! Two probers read the same `/healthz/ready` for different ends:
//!
//! - **the load balancers** that check the pod take it out of rotation at
//!   their own pace once it fails: they must see 503 from the drain's
//!   first moment;
//! - **the kubelet** (`User-Agent: kube-probe/…`) decides the EndpointSlice
//!   condition `serving`, which has two readers that want opposite things
//!   of a terminating pod:
//!   - kube-proxy, under KEP-1669: once every endpoint of a Service on a
//!     node is terminating, the node's health-check port fails (whatever
//!     readiness says) and a load balancer that checks the node takes it
//!     out at its own pace; until then kube-proxy sends the node's new
//!     connections to a terminating endpoint **only while it is
//!     serving**. It wants the pod serving until that load balancer has let
//!     the node go;
//!   - announcers (MetalLB's speaker, in L2 and BGP mode) announce a
//!     Service's address from a node while an endpoint on it is ready **or
//!     serving**, and probe nothing. They want the pod not serving, so that
//!     the node is withdrawn and its traffic stops.
//!
//! So in a drain the pod's termination started (a signal, or the proxy's
//! preStop hook), the kubelet is answered as Envoy is (200 while Envoy is
//! ready and accepts new connections) for the **node's load balancers'
//! time** at most ([`NodeChecks::serving_window`]: the slowest of their checks
//! as declared, `--load-balancer-checks`, or the common clouds' when none
//! is, and a second for kube-proxy to see the deletion), then 503: a load
//! balancer that checks the node has let it go by then, and an announcer
//! withdraws the node once the kubelet has seen its failure threshold.
//! The answer turns 503 sooner when the drain wait's verdict says the
//! traffic has stopped, or when Envoy stops accepting
//! ([`KubeletAnswer::FollowsEnvoy`], [`NotServingBecause`]). A drain asked
//! for while the pod is not terminating (an operator's `POST /drain`)
//! takes the pod out of its Service's endpoints: 503 for everyone
//! ([`KubeletAnswer::NotServing`]). [`TerminatingReadiness::Failing`] keeps
//! the older rule (503 for every prober from the drain's start).
//!
//! The probe writes back what it answered the kubelet ([`KubeletRecord`]:
//! atomics, no lock, no allocation) and reads when the kubelet's window
//! ends from the same record, so `GET /drain`, the exit summary and the
//! metrics say how the kubelet was answered, when that changed and why
//! ([`Kubelet`]).

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::ValueEnum;
use serde::Serialize;
use tokio::time::Instant;

use lifeguard_base::duration::GoDuration;

/// Who asks: the two audiences readiness tells apart while the pod
/// terminates. The one place a probe is told to be the kubelet's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Audience {
    /// The kubelet (`User-Agent: kube-probe/…`): its answer is the
    /// EndpointSlice's `serving`, which kube-proxy's fallback to a
    /// terminating endpoint and announcers read.
    Kubelet,
    /// Anyone else: the load balancers that check the pod.
    LoadBalancer,
}

impl Audience {
    /// The audience of a probe that sent this `User-Agent`.
    #[inline]
    pub fn of_agent(agent: Option<&[u8]>) -> Audience {
        match agent {
            Some(agent) if agent.starts_with(b"kube-probe/") => Audience::Kubelet,
            _ => Audience::LoadBalancer,
        }
    }
}

/// How readiness answers the kubelet while the pod terminates (the
/// setting `terminating_readiness`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TerminatingReadiness {
    /// The kubelet is answered 200 while Envoy is ready and accepts new
    /// connections, for the node's load balancers' time at most, so
    /// kube-proxy's terminating-endpoint fallback (KEP-1669) has somewhere
    /// to go until they let the node go; every other prober 503.
    Serving,
    /// Every prober, the kubelet too, is answered 503 from the drain's
    /// start: kube-proxy stops sending the node's traffic to the pod once
    /// the kubelet has seen its failure threshold.
    Failing,
}

lifeguard_base::display_as_value!(TerminatingReadiness);
lifeguard_base::serialize_as_display!(TerminatingReadiness);

/// How a load balancer's checks are configured: every `interval`, out
/// after `threshold` failures in a row. Written `10sx3` (also `10s x 3`,
/// `10s*3`, `10s×3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checks {
    pub interval: Duration,
    pub threshold: u32,
}

/// Why a load balancer's checks were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected a load balancer's checks as INTERVALxTHRESHOLD, for example 10sx3 (every 10 s, out after 3 failures in a row; the threshold 1 to 100)")]
pub struct ChecksError;

impl Checks {
    /// How long it takes to let the pod (or the node) go once its checks
    /// fail.
    pub fn takes(&self) -> Duration {
        self.interval.saturating_mul(self.threshold)
    }
}

impl FromStr for Checks {
    type Err = ChecksError;

    fn from_str(s: &str) -> Result<Checks, ChecksError> {
        let s = s.trim();
        let (interval, threshold) = ['×', '*', 'x']
            .into_iter()
            .find_map(|sep| s.rsplit_once(sep))
            .ok_or(ChecksError)?;
        let interval = lifeguard_base::duration::positive(interval.trim()).map_err(|_| ChecksError)?;
        let threshold: u32 = threshold.trim().parse().map_err(|_| ChecksError)?;
        match threshold {
            1..=100 => Ok(Checks { interval, threshold }),
            _ => Err(ChecksError),
        }
    }
}

impl std::fmt::Display for Checks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", GoDuration(self.interval), self.threshold)
    }
}

/// How late kube-proxy (and an announcer) learns of an endpoint's change:
/// allowed on top of a node-checking load balancer's own time.
pub const KUBE_PROXY_LAG: Duration = Duration::from_secs(1);

/// The load balancers that check the node, as declared
/// (`--load-balancer-checks`), or the common clouds' when none is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeChecks {
    declared: Vec<Checks>,
}

impl NodeChecks {
    /// What is assumed when no load balancer's checks are declared: every
    /// 10 s, out after 3, which covers the common clouds' node checks with
    /// `externalTrafficPolicy: Local` (the AWS Load Balancer Controller's
    /// NLB with instance targets: every 10 s, out after 2; GKE's L4 load
    /// balancer: every 3 s, out after 2, or 8 s and 3 for a Service whose
    /// policy is Cluster).
    pub const ASSUMED: Checks = Checks {
        interval: Duration::from_secs(10),
        threshold: 3,
    };

    pub fn new(declared: Vec<Checks>) -> NodeChecks {
        NodeChecks { declared }
    }

    /// The checks as declared (empty: none; [`NodeChecks::ASSUMED`] holds).
    pub fn declared(&self) -> &[Checks] {
        &self.declared
    }

    /// The slowest of the checks: declared, or assumed.
    pub fn slowest(&self) -> Checks {
        self.declared
            .iter()
            .copied()
            .max_by_key(Checks::takes)
            .unwrap_or(Self::ASSUMED)
    }

    /// How long, from the drain's start, the kubelet is told a terminating
    /// pod serves: the slowest load balancer's interval × threshold, and
    /// kube-proxy's lag.
    pub fn serving_window(&self) -> Duration {
        self.slowest().takes() + KUBE_PROXY_LAG
    }

    /// The slowest checks in words, saying whether they were declared.
    pub fn slowest_words(&self) -> String {
        let slowest = self.slowest();
        let how = match self.declared.is_empty() {
            true => "assumed: --load-balancer-checks not set",
            false => "--load-balancer-checks",
        };
        format!(
            "a load balancer checking the node every {}, out after {} ({how})",
            GoDuration(slowest.interval),
            slowest.threshold
        )
    }
}

/// How the kubelet's probe is answered in this drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr, serde::Serialize)]
#[strum(serialize_all = "snake_case")]
#[serde(into = "&'static str")]
pub enum KubeletAnswer {
    /// As Envoy is: 200 while it is ready and accepts new connections,
    /// until the node's load balancers' time is over (a drain the pod's
    /// termination started).
    FollowsEnvoy,
    /// 503 from the drain's start, as every prober: an operator's drain
    /// (the pod leaves its Service's endpoints), or `--terminating-readiness
    /// failing`.
    NotServing,
}

/// An answer of the readiness probe: ready (200) or not (503). The
/// `code` and `answer` labels of the probe's metrics, and what Envoy's
/// readiness changed to (`to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ReadyOrNot {
    /// 200.
    Ready,
    /// 503.
    NotReady,
}

impl ReadyOrNot {
    /// The answer for `ready`.
    #[inline]
    pub fn of(ready: bool) -> ReadyOrNot {
        match ready {
            true => ReadyOrNot::Ready,
            false => ReadyOrNot::NotReady,
        }
    }

    /// The probe's HTTP status code for it.
    pub fn status_code(self) -> &'static str {
        match self {
            ReadyOrNot::Ready => "200",
            ReadyOrNot::NotReady => "503",
        }
    }
}

/// Why the drain turned the kubelet's answer to 503 (in JSON and as a
/// metric's label: its snake-case name).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr, strum::FromRepr, serde::Serialize,
)]
#[strum(serialize_all = "snake_case")]
#[serde(into = "&'static str")]
pub enum NotServingBecause {
    /// An operator's drain (`POST /drain` while the pod is not
    /// terminating): the pod leaves its Service's endpoints.
    OperatorDrain,
    /// `--terminating-readiness failing`.
    TerminatingReadinessFailing,
    /// The node's load balancers have had their time to let the node go:
    /// announcers withdraw it once the kubelet has seen its failures.
    NodeLoadBalancersTime,
    /// The drain wait's verdict: every load balancer let the pod go and
    /// the traffic stopped.
    OutOfRotation,
    /// Envoy stops accepting: the drain stops it.
    EnvoyStopping,
}

impl NotServingBecause {
    /// In words, for the log.
    pub fn words(self) -> &'static str {
        match self {
            NotServingBecause::OperatorDrain => "an operator's drain: the pod leaves its Service's endpoints",
            NotServingBecause::TerminatingReadinessFailing => "--terminating-readiness failing",
            NotServingBecause::NodeLoadBalancersTime => {
                "the node's load balancers have had their time to let the node go; announcers that follow \
                 the EndpointSlice (MetalLB) withdraw it once the kubelet has seen its failures"
            }
            NotServingBecause::OutOfRotation => "out of rotation: the load balancers let go and the traffic stopped",
            NotServingBecause::EnvoyStopping => "Envoy is stopping",
        }
    }
}

impl std::fmt::Display for NotServingBecause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str((*self).into())
    }
}

/// What `GET /drain`, the exit summary and the metrics show of the
/// kubelet's answers during the drain.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Kubelet {
    /// How the kubelet's probe is answered in this drain.
    pub answer: KubeletAnswer,
    /// `follows_envoy`: how long from the drain's start it is answered as
    /// Envoy is at most (the node's load balancers' time); None:
    /// `not_serving`.
    pub serving_window_seconds: Option<f64>,
    /// Seconds from the drain's start to when the drain turned the
    /// kubelet's answer to 503 (0: at once; None: not yet).
    pub not_serving_after_seconds: Option<f64>,
    /// Why it turned (None: not yet).
    pub not_serving_because: Option<NotServingBecause>,
    /// The kubelet's probes answered 200 since the drain began.
    pub ready_probes: u64,
    /// The kubelet's probes answered 503 since the drain began.
    pub not_ready_probes: u64,
    /// Seconds from the drain's start to the last 200 the kubelet got.
    pub last_ready_after_seconds: Option<f64>,
}

impl Kubelet {
    /// At the drain's start: answered as Envoy is for `serving_window`, or
    /// 503 `because`.
    pub(crate) fn new(answer: Result<Duration, NotServingBecause>) -> Kubelet {
        Kubelet {
            answer: match answer {
                Ok(_) => KubeletAnswer::FollowsEnvoy,
                Err(_) => KubeletAnswer::NotServing,
            },
            serving_window_seconds: answer.ok().map(|d| d.as_secs_f64()),
            not_serving_after_seconds: answer.err().map(|_| 0.0),
            not_serving_because: answer.err(),
            ready_probes: 0,
            not_ready_probes: 0,
            last_ready_after_seconds: None,
        }
    }

    /// The kubelet's probes answered `answer` since the drain began.
    pub fn probes(&self, answer: ReadyOrNot) -> u64 {
        match answer {
            ReadyOrNot::Ready => self.ready_probes,
            ReadyOrNot::NotReady => self.not_ready_probes,
        }
    }

    /// The drain turned the answer to 503 `after` its start, `because`:
    /// the first turn is the one kept.
    pub(crate) fn turned(&mut self, after: f64, because: NotServingBecause) {
        if self.not_serving_after_seconds.is_none() {
            self.not_serving_after_seconds = Some((after * 1000.0).round() / 1000.0);
            self.not_serving_because = Some(because);
        }
    }
}

/// What the probe answered the kubelet since the drain began (counts, and
/// the unix time in milliseconds of the last 200), and until when it
/// answers as Envoy is: written by the probe and by the drain (relaxed
/// atomics: counts and times, none ordered against another but the
/// window's end, which the drain publishes with its status).
#[derive(Debug)]
pub(crate) struct KubeletRecord {
    ready: AtomicU64,
    not_ready: AtomicU64,
    /// 0: none yet.
    last_ready_ms: AtomicU64,
    /// The clock the window's end is counted on.
    base: Instant,
    /// The end of the kubelet's window: nanoseconds from `base` in the low
    /// [`NANOS`] bits, why it ends in the bits above ([`OPEN`]: none set).
    window_ends: AtomicU64,
}

/// A window that never ends.
const OPEN: u64 = u64::MAX;
/// The bits of a window's end that count nanoseconds (36 years' worth).
const NANOS: u32 = 60;

impl Default for KubeletRecord {
    fn default() -> KubeletRecord {
        KubeletRecord {
            ready: AtomicU64::new(0),
            not_ready: AtomicU64::new(0),
            last_ready_ms: AtomicU64::new(0),
            base: Instant::now(),
            window_ends: AtomicU64::new(OPEN),
        }
    }
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

    /// The kubelet's window ends at `at` `because`, unless it already
    /// ends sooner.
    pub(crate) fn window_ends(&self, at: Instant, because: NotServingBecause) {
        let mask = (1u64 << NANOS) - 1;
        let nanos = at.saturating_duration_since(self.base).as_nanos();
        let nanos = u64::try_from(nanos).unwrap_or(mask).min(mask);
        let code = because as u64;
        let packed = (code << NANOS) | nanos;
        let _ = self
            .window_ends
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                (now == OPEN || now & mask > nanos).then_some(packed)
            });
    }

    /// Whether the kubelet's window is still open now (Ok), or why it
    /// closed: one load and a clock read.
    #[inline]
    pub(crate) fn window(&self) -> Result<(), NotServingBecause> {
        let ends = self.window_ends.load(Ordering::Relaxed);
        if ends == OPEN || (self.base.elapsed().as_nanos() as u64) < ends & ((1u64 << NANOS) - 1) {
            return Ok(());
        }
        let code = (ends >> NANOS) as usize;
        Err(NotServingBecause::from_repr(code).unwrap_or(NotServingBecause::NodeLoadBalancersTime))
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
        let mut kubelet = Kubelet::new(Ok(Duration::from_secs(31)));
        record.fill(&mut kubelet, Some(start));
        assert_eq!((kubelet.ready_probes, kubelet.last_ready_after_seconds), (0, None));
        record.answered(true);
        record.answered(true);
        record.answered(false);
        record.fill(&mut kubelet, Some(start));
        assert_eq!((kubelet.ready_probes, kubelet.not_ready_probes), (2, 1));
        let by_answer = (kubelet.probes(ReadyOrNot::Ready), kubelet.probes(ReadyOrNot::NotReady));
        assert_eq!(by_answer, (2, 1));
        let after = kubelet.last_ready_after_seconds.unwrap();
        assert!((1.9..3.0).contains(&after), "{after}");
        let operator = Kubelet::new(Err(NotServingBecause::OperatorDrain));
        assert_eq!(
            (operator.not_serving_after_seconds, operator.not_serving_because),
            (Some(0.0), Some(NotServingBecause::OperatorDrain)),
            "an operator's drain takes the kubelet's 200 at once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_closes_at_its_end_or_sooner_never_later() {
        use NotServingBecause::{NodeLoadBalancersTime, OutOfRotation};
        let record = KubeletRecord::default();
        assert_eq!(record.window(), Ok(()), "no window set: open");
        let start = Instant::now();
        record.window_ends(start + Duration::from_secs(31), NodeLoadBalancersTime);
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(record.window(), Ok(()));
        record.window_ends(start + Duration::from_secs(40), OutOfRotation);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            record.window(),
            Err(NodeLoadBalancersTime),
            "a later end does not reopen it"
        );
        let record = KubeletRecord::default();
        record.window_ends(Instant::now() + Duration::from_secs(31), NodeLoadBalancersTime);
        record.window_ends(Instant::now(), OutOfRotation);
        assert_eq!(record.window(), Err(OutOfRotation), "closed at once by the verdict");
    }

    #[test]
    fn checks_are_read_as_users_write_them_and_the_slowest_sets_the_window() {
        let c: Checks = "10s x 3".parse().unwrap();
        assert_eq!(
            (c.interval, c.threshold, c.to_string()),
            (Duration::from_secs(10), 3, "10sx3".into())
        );
        assert_eq!("500ms*2".parse::<Checks>().unwrap().takes(), Duration::from_secs(1));
        for bad in ["", "10s", "x3", "10sx0", "10sx101", "0sx3", "tenx3"] {
            assert_eq!(bad.parse::<Checks>(), Err(ChecksError), "{bad:?}");
        }
        assert_eq!(
            NodeChecks::default().serving_window(),
            Duration::from_secs(31),
            "assumed 10sx3, and 1 s"
        );
        let declared = NodeChecks::new(vec!["5sx2".parse().unwrap(), "8sx3".parse().unwrap()]);
        assert_eq!(declared.serving_window(), Duration::from_secs(25));
    }
}
