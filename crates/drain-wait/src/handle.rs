//! The drain wait as the status port sees it: [`DrainWait`], the handle
//! whose `wait` answers the app's preStop hook (and whose verdict a
//! gateway's drain waits for: the drain's `Rotation` port), and what the
//! [task](super::task) publishes ([`DrainWaitStatus`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

use super::budget::Budget;
use super::rule::CheckerReport;
use super::{ms, DrainWaitPlan};
use lifeguard_base::duration::GoDuration;
use lifeguard_base::peer::PeerKey;
use lifeguard_checkers::{Checkers, NotCountedReport};
use lifeguard_drain::{Conclusion, Rotation, RotationVerdict, WaitingOn};

/// Where the wait stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitState {
    /// No drain yet: nothing is waited for.
    NotStarted,
    /// The drain began; the pod is still in rotation.
    Waiting,
    /// Every checker is done and no new request came for the quiet period.
    Out,
    /// The wait's bound came before the pod was out.
    Bound,
    /// Envoy is stopping (or lifeguard is) before the pod was out.
    Stopped,
}

/// What `GET /drain` shows of the wait (its `drain_wait` field).
#[derive(Debug, Clone, Serialize)]
pub struct DrainWaitStatus {
    pub state: WaitState,
    pub unhealthy_threshold: u32,
    /// The shortest quiet period (`--drain-wait-min-quiet-period`).
    pub min_quiet_period_seconds: f64,
    /// No checker holds the wait longer than this after the drain began.
    pub checker_timeout_seconds: f64,
    /// The wait never lasts longer: the drain's deadline less the app's time.
    pub bound_seconds: f64,
    /// New requests a second on the inbound listeners before the drain
    /// (before it, the rate so far).
    pub requests_per_second_before_drain: Option<f64>,
    /// The quiet period this drain waits for, derived from that rate
    /// (before it, the one a drain would wait for now).
    pub quiet_period_seconds: Option<f64>,
    /// When the traffic is so sparse that a drain waits its bound for it
    /// to be quiet: the rate, and which setting shortens it at what risk.
    pub sparse_traffic: Option<String>,
    /// The listeners whose new requests count, in words.
    pub inbound_listeners: Option<String>,
    /// Whether Envoy fails the checks its `health_check` filter recognises
    /// (`failing` from the moment readiness turns 503), or why it could not.
    pub envoy_health_checks: HealthChecks,
    /// Every checker heard from, as of the last read.
    pub checkers: Vec<CheckerReport>,
    /// Readiness probes not counted as a load balancer's, by reason.
    pub probes_not_counted: NotCountedReport,
    /// What the wait still waits for (in JSON, its words).
    pub waiting_on: Option<WaitingOn>,
    /// Seconds from the last new inbound request (or the drain's start) to
    /// the last read.
    pub quiet_for_seconds: Option<f64>,
    /// Why the pod is out of rotation, once it is.
    pub conclusion: Option<Conclusion>,
    /// Seconds from the drain's start to out of rotation.
    pub took_seconds: Option<f64>,
    /// Seconds from the drain's start to the read that last saw a new
    /// request (None: none came after the drain began).
    pub traffic_stopped_after_seconds: Option<f64>,
    /// Seconds from the drain's start to when the last checker was done.
    pub last_checker_done_after_seconds: Option<f64>,
    /// The slowest learned checker against the grace period (None: no
    /// checker learned yet).
    pub budget: Option<Budget>,
    /// When the drain began (the rule's clock).
    #[serde(skip)]
    pub began: Option<Instant>,
}

impl DrainWaitStatus {
    fn initial(plan: &DrainWaitPlan) -> DrainWaitStatus {
        DrainWaitStatus {
            state: WaitState::NotStarted,
            unhealthy_threshold: plan.unhealthy_threshold,
            min_quiet_period_seconds: plan.min_quiet_period.as_secs_f64(),
            checker_timeout_seconds: plan.checker_timeout.as_secs_f64(),
            bound_seconds: plan.bound().as_secs_f64(),
            requests_per_second_before_drain: None,
            quiet_period_seconds: None,
            sparse_traffic: None,
            inbound_listeners: None,
            envoy_health_checks: HealthChecks::Passing,
            checkers: Vec::new(),
            probes_not_counted: NotCountedReport::default(),
            waiting_on: Some(WaitingOn::DrainToBegin),
            quiet_for_seconds: None,
            conclusion: None,
            took_seconds: None,
            traffic_stopped_after_seconds: None,
            last_checker_done_after_seconds: None,
            budget: None,
            began: None,
        }
    }
}

/// Told of every answered wait: why it ended and how long it took. The
/// agent wires it to the metrics.
pub(crate) type WaitObserver = Arc<dyn Fn(WaitWhy, Duration) + Send + Sync>;

/// The handle the status port uses: the published status, and the wait.
#[derive(Clone)]
pub struct DrainWait {
    status: watch::Receiver<DrainWaitStatus>,
    /// The wait's bound: the drain's deadline less the app's time.
    bound: Duration,
    /// How long after the drain's start the declared load balancers have
    /// let the pod go ([`DrainWaitPlan::declared_let_go`]).
    declared_let_go: Duration,
    checkers: Checkers,
    observer: Option<WaitObserver>,
    /// Waits held open by callers from outside the pod.
    remote: Arc<std::sync::Mutex<RemoteWaits>>,
}

/// Waits from callers outside the pod, by address: the app's own hook
/// comes from loopback and is never refused; anyone else who can reach
/// the port may hold only a few waits open.
#[derive(Debug, Default)]
struct RemoteWaits {
    by_address: std::collections::HashMap<PeerKey, usize>,
}

/// Waits one address outside the pod may hold open at once: a wait is
/// not an idle connection (no idle timeout closes it), and the connection
/// cap is shared with the kubelet's probes. No cap of all addresses: the
/// kubelet's own hook comes from the node's address, and a peer must not
/// be able to crowd it out.
pub(crate) const MAX_REMOTE_WAITS_PER_ADDRESS: usize = 8;

/// A wait from outside the pod, counted while it is held.
#[derive(Debug)]
pub struct RemoteWait {
    address: PeerKey,
    waits: Arc<std::sync::Mutex<RemoteWaits>>,
}

impl Drop for RemoteWait {
    fn drop(&mut self) {
        let mut waits = self.waits.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = waits.by_address.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                waits.by_address.remove(&self.address);
            }
        }
    }
}

/// Why a wait ended, and its one-line answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitEnd {
    pub why: WaitWhy,
    /// The answer's body (one line).
    pub line: String,
}

/// Why a wait ended: the `reason` label of `lifeguard_drain_wait_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum WaitWhy {
    /// Out of rotation.
    #[strum(serialize = "out_of_rotation")]
    Out,
    /// The caller's `?timeout=` came first.
    Timeout,
    /// The wait's bound (the drain's deadline less the app's time) came first.
    Deadline,
    /// Envoy is stopping, or lifeguard is.
    Stopped,
}

impl DrainWait {
    /// The handle and the task's sender, before the task runs; `checkers`
    /// is the table the probes record into.
    pub fn new(plan: &DrainWaitPlan, checkers: Checkers) -> (DrainWait, watch::Sender<DrainWaitStatus>) {
        let (tx, rx) = watch::channel(DrainWaitStatus::initial(plan));
        let handle = DrainWait {
            status: rx,
            bound: plan.bound(),
            declared_let_go: plan.declared_let_go(),
            checkers,
            observer: None,
            remote: Arc::default(),
        };
        (handle, tx)
    }

    /// The same handle, telling `observer` of every answered wait.
    pub fn observed(self, observer: WaitObserver) -> DrainWait {
        DrainWait {
            observer: Some(observer),
            ..self
        }
    }

    /// Counts a wait from `address`, outside the pod; None when that
    /// address holds `MAX_REMOTE_WAITS_PER_ADDRESS` already: a peer
    /// cannot fill the connection cap with waits that last the drain.
    pub fn admit_remote(&self, address: std::net::IpAddr) -> Option<RemoteWait> {
        let address = PeerKey::of(address);
        let mut waits = self.remote.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let held = waits.by_address.get(&address).copied().unwrap_or(0);
        if held >= MAX_REMOTE_WAITS_PER_ADDRESS {
            return None;
        }
        *waits.by_address.entry(address).or_default() += 1;
        Some(RemoteWait {
            address,
            waits: self.remote.clone(),
        })
    }

    /// The table the probes record into.
    pub fn checkers(&self) -> &Checkers {
        &self.checkers
    }

    /// The latest published status, as the task published it (the
    /// checkers as of the last read).
    pub fn published(&self) -> DrainWaitStatus {
        self.status.borrow().clone()
    }

    /// The latest published status, with the probes not counted as of now
    /// (and before the drain, the checkers as of now).
    pub fn status(&self) -> DrainWaitStatus {
        let mut status = self.status.borrow().clone();
        status.probes_not_counted = self.checkers.not_counted();
        if status.state == WaitState::NotStarted {
            let threshold = status.unhealthy_threshold;
            status.checkers = super::rule::before_drain(&self.checkers.snapshot(), threshold, Instant::now());
        }
        status
    }

    /// Waits until the pod is out of rotation, or a bound: `timeout` from
    /// now, the wait's bound from the drain's start or from now, whichever
    /// is first, or Envoy stopping. Never fails: the answer says which.
    pub async fn wait(&self, timeout: Option<Duration>) -> WaitEnd {
        let arrived = Instant::now();
        let end = self.wait_from(arrived, timeout).await;
        let took = arrived.elapsed();
        let shown = GoDuration(ms(took));
        match end.why {
            WaitWhy::Out | WaitWhy::Stopped => tracing::info!(took = %shown, "drain wait answered: {}", end.line),
            _ => tracing::warn!(took = %shown, "drain wait answered: {}", end.line),
        }
        if let Some(observer) = &self.observer {
            observer(end.why, took);
        }
        end
    }

    async fn wait_from(&self, arrived: Instant, timeout: Option<Duration>) -> WaitEnd {
        let mut rx = self.status.clone();
        loop {
            let status = rx.borrow_and_update().clone();
            let from_drain = status.began.map_or(arrived, |b| b.min(arrived));
            let (mut bound, mut why) = (from_drain + self.bound, WaitWhy::Deadline);
            if let Some(t) = timeout.filter(|t| arrived + *t < bound) {
                (bound, why) = (arrived + t, WaitWhy::Timeout);
            }
            let at_bound = Instant::now() >= bound;
            match status.state {
                WaitState::Out => {
                    let line = format!(
                        "out of rotation: {} ({} after the drain began)",
                        status.conclusion.unwrap_or_default(),
                        GoDuration(ms(Duration::from_secs_f64(status.took_seconds.unwrap_or(0.0))))
                    );
                    return WaitEnd {
                        why: WaitWhy::Out,
                        line,
                    };
                }
                WaitState::Stopped if !at_bound => {
                    let line = format!(
                        "Envoy is stopping; the pod was not yet out of rotation (was waiting for {})",
                        words(status.waiting_on.as_ref())
                    );
                    return WaitEnd {
                        why: WaitWhy::Stopped,
                        line,
                    };
                }
                _ => {}
            }
            if at_bound || status.state == WaitState::Bound {
                let by = match why {
                    WaitWhy::Timeout => format!("the {} timeout", GoDuration(timeout.unwrap_or_default())),
                    _ => format!(
                        "its bound ({}: the drain's deadline less the app's time)",
                        GoDuration(self.bound)
                    ),
                };
                let line = format!(
                    "NOT out of rotation, stopped waiting at {by}: was waiting for {}; new requests may still arrive",
                    words(status.waiting_on.as_ref())
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

/// A gateway's drain waits for the wait's verdict: out of rotation, or
/// what it still waited for when its bound came (or Envoy stopped).
impl Rotation for DrainWait {
    async fn verdict(&self) -> RotationVerdict {
        let mut rx = self.status.clone();
        loop {
            {
                let status = rx.borrow_and_update();
                match status.state {
                    WaitState::Out => return RotationVerdict::Out(status.conclusion.clone().unwrap_or_default()),
                    WaitState::Bound | WaitState::Stopped => {
                        return RotationVerdict::NotOut(status.waiting_on.clone().unwrap_or(WaitingOn::Ended))
                    }
                    WaitState::NotStarted | WaitState::Waiting => {}
                }
            }
            if rx.changed().await.is_err() {
                return RotationVerdict::NotOut(WaitingOn::Ended);
            }
        }
    }

    /// Every checker done (the rule waits for the quiet period alone, or
    /// is out), then the declared load balancers' time since the drain's
    /// start; at once when the wait ended without a verdict.
    async fn let_go(&self) {
        let mut rx = self.status.clone();
        loop {
            let until = {
                let status = rx.borrow_and_update();
                match status.state {
                    WaitState::Bound | WaitState::Stopped => return,
                    WaitState::Out => status.began,
                    WaitState::Waiting if matches!(status.waiting_on, Some(WaitingOn::Quiet { .. })) => status.began,
                    WaitState::NotStarted | WaitState::Waiting => None,
                }
            };
            if let Some(began) = until {
                return sleep_until(began + self.declared_let_go).await;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    fn waiting_on(&self) -> WaitingOn {
        let status = self.status.borrow();
        if let (Some(WaitingOn::Quiet { .. }), Some(began)) = (&status.waiting_on, status.began) {
            let left = (began + self.declared_let_go).saturating_duration_since(Instant::now());
            if !left.is_zero() {
                return WaitingOn::DeclaredLetGo { left };
            }
        }
        status.waiting_on.clone().unwrap_or(WaitingOn::FirstRead)
    }
}

/// What the wait waited for, in words (empty: nothing).
fn words(waiting: Option<&WaitingOn>) -> String {
    waiting.map(ToString::to_string).unwrap_or_default()
}

/// How Envoy's own answers to the load balancers' checks stand (its
/// `health_check` filter, failed with `POST /healthcheck/fail` once
/// readiness turns 503).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthChecks {
    /// Before the drain's 503: Envoy passes them.
    Passing,
    /// Envoy fails them, wherever they are sent.
    Failing,
    /// No inbound listener has the filter: nothing to fail.
    NoFilter,
    /// Asking Envoy failed (asked again every second), and why.
    NotFailedYet(String),
}

/// In JSON, its words: `passing`, `failing`, ...
impl fmt::Display for HealthChecks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HealthChecks::Passing => f.write_str("passing"),
            HealthChecks::Failing => f.write_str("failing"),
            HealthChecks::NoFilter => f.write_str("passing: no inbound listener has Envoy's health_check filter"),
            HealthChecks::NotFailedYet(why) => write!(f, "could not fail them yet: {why}"),
        }
    }
}

lifeguard_base::serialize_as_display!(HealthChecks);

#[cfg(test)]
mod tests {
    use super::*;

    /// The load balancers let the pod go once every checker is done (the
    /// rule waits for the quiet period alone) and the declared ones have
    /// had their time since the drain began: a node checked every 10 s,
    /// out after 2, 21 s after it (with the second the change takes to
    /// reach kube-proxy). A wait that ended without a verdict lets go at
    /// once.
    #[tokio::test(start_paused = true)]
    async fn the_load_balancers_let_go_once_every_checker_is_done_and_the_declared_ones_had_their_time() {
        let mut plan = DrainWaitPlan::for_tests();
        plan.node_checks =
            lifeguard_drain::NodeChecks::new(vec!["10sx2".parse::<crate::LoadBalancerChecks>().unwrap().get()]);
        let (wait, publish) = DrainWait::new(&plan, Checkers::default());
        let began = Instant::now();
        let let_go = {
            let wait = wait.clone();
            tokio::spawn(async move {
                wait.let_go().await;
                Instant::now()
            })
        };
        publish.send_modify(|s| {
            s.state = WaitState::Waiting;
            s.began = Some(began);
            s.waiting_on = Some(WaitingOn::Checkers {
                pending: Vec::new(),
                unfollowed: true,
            });
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!let_go.is_finished(), "a checker still checks");
        publish.send_modify(|s| {
            s.waiting_on = Some(WaitingOn::Quiet {
                quiet: Duration::from_millis(500),
                so_far: Duration::ZERO,
            });
        });
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!let_go.is_finished(), "the declared load balancer still sends");
        assert_eq!(
            wait.waiting_on().to_string(),
            "the load balancers of --load-balancer-checks to let the pod go (6s left)"
        );
        let at = let_go.await.unwrap();
        assert_eq!(at - began, Duration::from_secs(21));

        let (wait, publish) = DrainWait::new(&plan, Checkers::default());
        publish.send_modify(|s| {
            s.state = WaitState::Bound;
            s.began = Some(Instant::now());
        });
        let start = Instant::now();
        wait.let_go().await;
        assert_eq!(start.elapsed(), Duration::ZERO, "no verdict: let go at once");
    }

    #[test]
    fn a_peer_outside_the_pod_holds_a_few_waits_and_no_more() {
        let plan = DrainWaitPlan::for_tests();
        let (wait, _publish) = DrainWait::new(&plan, Checkers::default());
        let peer = |i: u8| std::net::IpAddr::from([10, 0, 0, i]);
        let held: Vec<RemoteWait> = (0..MAX_REMOTE_WAITS_PER_ADDRESS)
            .map(|_| wait.admit_remote(peer(1)).expect("under the address's cap"))
            .collect();
        assert!(wait.admit_remote(peer(1)).is_none(), "one address past its cap");
        // One peer key: the same address mapped into IPv6, and
        // any address of one IPv6 /64, are the same peer.
        let mapped: std::net::IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert!(
            wait.admit_remote(mapped).is_none(),
            "an IPv4-mapped address is its IPv4 one"
        );
        let v6 = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let in_64: Vec<RemoteWait> = (0..MAX_REMOTE_WAITS_PER_ADDRESS)
            .map(|i| wait.admit_remote(v6(&format!("2001:db8::{i:x}"))).unwrap())
            .collect();
        assert!(
            wait.admit_remote(v6("2001:db8::ffff:1")).is_none(),
            "one /64 is one peer"
        );
        drop(in_64);
        // Others still get theirs (the kubelet's hook among them).
        let others: Vec<RemoteWait> = (2..=255).filter_map(|i| wait.admit_remote(peer(i))).collect();
        assert_eq!(others.len(), 254);
        drop(held);
        assert!(wait.admit_remote(peer(1)).is_some(), "a wait ended frees its place");
    }
}
