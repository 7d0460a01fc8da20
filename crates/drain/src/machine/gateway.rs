//! The gateway's part of the drain (`out-of-rotation`): which policy a pod
//! without an app drains by, and the waits while Envoy serves: for the
//! load balancers to let the pod go (then Envoy closes its kept-alive
//! connections), and for their verdict.

use std::time::Duration;

use tokio::time::{sleep_until, Instant};

use super::inbox::{Inbox, Interrupt};
use super::reads::Refusals;
use super::Drain;
use crate::kubelet::{KubeletAnswer, NotServingBecause};
use crate::plan::{DrainScope, DrainUntil, Plan};
use crate::ports::{AppControl, ControlError, EnvoyControl};
use crate::rotation::{Rotation, RotationVerdict, WaitingOn};
use crate::status::{Awaiting, Phase};
use crate::PROGRESS_HEARTBEAT;
use lifeguard_base::duration::GoDuration;

impl<E: EnvoyControl, A: AppControl, R: Rotation> Drain<E, A, R> {
    /// The default policy in a pod whose only container is the proxy: no
    /// socket or process of an app was ever seen though the pod was looked
    /// at long enough, nor is one now (a last look). Such a pod is a
    /// gateway: it drains until out of rotation, every listener. A pod too
    /// young to tell keeps app-exit. Also decides whether the drain's reads
    /// look at the app.
    pub(super) async fn resolve_policy(&mut self) {
        let plan = &mut self.plan;
        if plan.gateway_without_app() && self.app.has_app() != Some(true) {
            let look = tokio::time::timeout(plan.admin_timeout, self.app.work()).await;
            let nothing = matches!(&look, Ok(Ok(work)) if work.is_done());
            if nothing && self.app.has_app() == Some(false) {
                tracing::info!(
                    "no socket or process of an app was ever seen in the pod: its only container is the proxy \
                     (a gateway), which drains until out of rotation"
                );
                (plan.drain_until, plan.scope) = (DrainUntil::OutOfRotation, DrainScope::All);
                self.watch_app = true;
                return;
            }
        }
        self.watch_app = plan.drain_until == DrainUntil::AppExit;
    }

    /// Readiness answers as Envoy does for `fail_delay` after `from`, then
    /// fails (the phase says which).
    pub(super) async fn fail_readiness_after(
        &mut self,
        fail_delay: Duration,
        from: Instant,
        deadline: Instant,
    ) -> Result<(), Interrupt> {
        if fail_delay.is_zero() {
            return Ok(());
        }
        self.inbox
            .race(&self.envoy, sleep_until(deadline.min(from + fail_delay)))
            .await?;
        let phase = match self.plan.drain_until {
            DrainUntil::OutOfRotation => Phase::LeavingRotation,
            _ => Phase::Draining,
        };
        self.inbox.publish(|s| s.phase = phase);
        tracing::info!("the readiness-fail delay is over: readiness is 503");
        Ok(())
    }

    /// A gateway: waits until the load balancers have let the pod go
    /// (every checker done, every declared load balancer's time passed)
    /// while Envoy serves as before, kept-alive connections and all: a
    /// client that reconnected now could come back to this same pod. At
    /// the deadline, goes on all the same (the verdict's wait then ends at
    /// once too).
    pub(super) async fn wait_for_let_go(&mut self, deadline: Instant) -> Result<(), Interrupt> {
        let (inbox, envoy, rotation) = (&mut self.inbox, &self.envoy, &self.rotation);
        let let_go = rotation.let_go();
        if leaving_rotation(inbox, envoy, rotation, &self.plan, deadline, let_go)
            .await?
            .is_some()
        {
            let took = self.started.map_or(0.0, |t| t.elapsed().as_secs_f64());
            tracing::info!(
                took = %GoDuration(Duration::from_millis((took * 1000.0) as u64)),
                "the load balancers have let the pod go: Envoy closes its kept-alive connections at a request \
                 boundary and serves until their traffic has stopped"
            );
        }
        Ok(())
    }

    /// Out of rotation: waits for the drain wait's verdict while Envoy
    /// serves (a gateway's) or drains and accepts (another policy's, while
    /// the kubelet follows Envoy), or the deadline. What still held it
    /// when it did not come (None: out of rotation).
    pub(super) async fn wait_for_rotation(&mut self, deadline: Instant) -> Result<Option<WaitingOn>, Interrupt> {
        let (inbox, envoy, rotation) = (&mut self.inbox, &self.envoy, &self.rotation);
        let policy = self.plan.drain_until;
        let verdict = rotation.verdict();
        let verdict = match leaving_rotation(inbox, envoy, rotation, &self.plan, deadline, verdict).await? {
            Some(verdict) => verdict,
            None => RotationVerdict::NotOut(WaitingOn::Deadline),
        };
        let took = self.started.map_or(0.0, |t| t.elapsed().as_secs_f64());
        let then = match policy {
            DrainUntil::OutOfRotation => {
                "Envoy closes its connections at a request boundary, and stops once no request is in flight"
            }
            _ => "Envoy is stopped as the policy says",
        };
        match verdict {
            RotationVerdict::Out(why) => {
                tracing::info!(
                    took = %GoDuration(Duration::from_millis((took * 1000.0) as u64)),
                    "out of rotation ({why}): {then}"
                );
                self.inbox.publish(|s| s.out_of_rotation_after_seconds = Some(took));
                if self.kubelet == KubeletAnswer::FollowsEnvoy {
                    self.inbox.kubelet_turned(took, NotServingBecause::OutOfRotation);
                }
                Ok(None)
            }
            RotationVerdict::NotOut(held) => {
                let words = format!(
                    "the drain wait's bound came before the load balancers' verdict, {} into the drain \
                     (it was still waiting for {held}): {then}; {}",
                    GoDuration(Duration::from_millis((took * 1000.0) as u64)),
                    held.consequence()
                );
                match held.is_checkers() {
                    true => tracing::warn!("{words}"),
                    false => tracing::info!("{words}"),
                }
                self.inbox.publish(|s| s.held_by = Some(held.clone()));
                Ok(Some(held))
            }
        }
    }
}

/// Awaits `what` (the load balancers letting go, or the verdict) while the
/// pod leaves rotation: a progress line every few seconds, an Envoy not
/// lifeguard's child looked at, a signal or Envoy's exit heard. None when
/// the deadline came first.
async fn leaving_rotation<T>(
    inbox: &mut Inbox,
    envoy: &impl EnvoyControl,
    rotation: &impl Rotation,
    plan: &Plan,
    deadline: Instant,
    what: impl std::future::Future<Output = T>,
) -> Result<Option<T>, Interrupt> {
    tokio::pin!(what);
    // An Envoy not lifeguard's child is seen gone by its admin refusing
    // connections: nothing is read of it meanwhile but this.
    let mut gone = GoneWatch::new(!envoy.is_child());
    // A progress line every few seconds while the load balancers let go
    // (the drain wait logs each of their steps once).
    let mut next_line = Instant::now() + PROGRESS_HEARTBEAT;
    loop {
        let tick = deadline.min(next_line).min(gone.next_look());
        let next = async {
            tokio::select! {
                done = &mut what => Some(done),
                _ = sleep_until(tick) => None,
            }
        };
        if let Some(done) = inbox.race(envoy, next).await? {
            return Ok(Some(done));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        if gone.due(now) {
            let look = tokio::time::timeout(plan.admin_timeout, envoy.answering());
            gone.saw(inbox.race(envoy, look).await?, Instant::now())?;
        }
        if now >= next_line {
            next_line = now + PROGRESS_HEARTBEAT;
            let awaiting = Awaiting::Rotation(rotation.waiting_on());
            let to_deadline = deadline.saturating_duration_since(now);
            let line = awaiting.line(plan.drain_until, Duration::ZERO, to_deadline);
            tracing::info!("draining: {line}");
            inbox.publish(|s| s.awaiting = Some(awaiting));
        }
    }
}

/// How often the admin of an Envoy not lifeguard's child is looked at while
/// the drain waits for the load balancers.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// Whether an Envoy that is not lifeguard's child has gone: its admin
/// refusing connections for [`EXTERNAL_GONE_AFTER`](crate::EXTERNAL_GONE_AFTER).
struct GoneWatch {
    /// Whether to look (a child's exit is seen directly).
    looks: bool,
    next: Instant,
    refusals: Refusals,
}

impl GoneWatch {
    fn new(looks: bool) -> GoneWatch {
        GoneWatch {
            looks,
            next: Instant::now() + LOOK_EVERY,
            refusals: Refusals::default(),
        }
    }

    /// When to look next (far away when it does not look).
    fn next_look(&self) -> Instant {
        match self.looks {
            true => self.next,
            false => self.next + Duration::from_secs(86_400),
        }
    }

    fn due(&self, now: Instant) -> bool {
        self.looks && now >= self.next
    }

    /// What a look found (None: no answer in time, which says nothing).
    fn saw(
        &mut self,
        look: Result<Result<(), ControlError>, tokio::time::error::Elapsed>,
        now: Instant,
    ) -> Result<(), Interrupt> {
        self.next = now + LOOK_EVERY;
        match look {
            Ok(Err(ControlError::Refused(_))) => self.refusals.refused(now),
            _ => {
                self.refusals.reset();
                Ok(())
            }
        }
    }
}
