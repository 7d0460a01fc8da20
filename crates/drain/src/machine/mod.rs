//! The drain state machine: one task that owns the phase, the deadline and
//! the policy, fed by events through a [`DrainHandle`].
//!
//! - [`gateway`]: the policy of a pod without an app, and the waits for
//!   the load balancers to let the pod go and for their verdict
//!   (`out-of-rotation`);
//! - [`inbox`]: the events that reach the machine while it waits;
//! - [`reads`]: the reads of Envoy and the app while the policy waits.

mod gateway;
mod inbox;
mod reads;

use std::process::ExitStatus;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, Instant};

use super::handle::{DrainHandle, Event};
use super::kubelet::{Kubelet, KubeletAnswer, NotServingBecause};
use super::plan::{DrainUntil, Plan};
use super::policy::{log_done, DoneRule, Pacer, GONE_BEFORE};
use super::ports::{AppControl, EnvoyControl, Exit};
use super::rotation::Rotation;
use super::status::{Awaiting, Left, Outcome, Phase, PhaseCell, Remaining, Status};
use super::trigger::Trigger;
use super::DRAIN_CALL_TRIES;
use inbox::{Inbox, Interrupt};
use lifeguard_base::duration::GoDuration;
use reads::{Looks, Read, ReadTimeouts, Seen};

/// The drain state machine. Build it with [`Drain::new`] (and, for the
/// `out-of-rotation` policy, [`Drain::with_rotation`]), run it with
/// [`Drain::run`].
pub struct Drain<E, A = (), R = ()> {
    plan: Plan,
    envoy: E,
    app: A,
    rotation: R,
    /// Whether the drain's reads look at the app (decided when it begins).
    watch_app: bool,
    /// How the kubelet is answered in this drain (decided when it begins).
    kubelet: KubeletAnswer,
    inbox: Inbox,
    started: Option<Instant>,
}

impl<E: EnvoyControl, A: AppControl> Drain<E, A> {
    /// The machine and its handle. `app` is what the `app-exit` policy
    /// watches (`()` for the other policies).
    pub fn new(plan: Plan, envoy: E, app: A) -> (Drain<E, A>, DrainHandle) {
        let (events_tx, events) = mpsc::channel(64);
        let (status, status_rx) = watch::channel(Status::initial(plan.drain_until, plan.drained_when()));
        let phase = PhaseCell::serving();
        let handle = DrainHandle {
            events: events_tx,
            status: status_rx,
            phase: phase.clone(),
        };
        let inbox = Inbox {
            events,
            open: true,
            status,
            phase,
            signalled_at: None,
            waiters: Vec::new(),
            drained: false,
            quit_reply: None,
            kubelet_window: None,
        };
        let drain = Drain {
            plan,
            envoy,
            app,
            rotation: (),
            watch_app: false,
            kubelet: KubeletAnswer::NotServing,
            inbox,
            started: None,
        };
        (drain, handle)
    }
}

impl<E, A, R> Drain<E, A, R> {
    /// The same machine, waiting on `rotation` under the `out-of-rotation`
    /// policy.
    pub fn with_rotation<R2: Rotation>(self, rotation: R2) -> Drain<E, A, R2> {
        Drain {
            plan: self.plan,
            envoy: self.envoy,
            app: self.app,
            rotation,
            watch_app: self.watch_app,
            kubelet: self.kubelet,
            inbox: self.inbox,
            started: self.started,
        }
    }
}

impl<E: EnvoyControl, A: AppControl, R: Rotation> Drain<E, A, R> {
    /// Runs until Envoy has stopped (or exited on its own).
    pub async fn run(mut self) -> Outcome {
        let trigger = loop {
            let event = tokio::select! {
                status = self.envoy.exited() => return self.envoy_exited(status),
                event = self.inbox.events.recv(), if self.inbox.open => event,
            };
            match event {
                None => self.inbox.open = false,
                Some(Event::Signal(signal)) => {
                    self.inbox.signalled_at = Some(Instant::now());
                    self.inbox.publish(|s| s.stop_signal = Some(signal));
                    break Trigger::Signal(signal);
                }
                Some(Event::Drain(asker, reply)) => {
                    self.inbox.waiters.push(reply);
                    break asker.trigger();
                }
                Some(Event::Quit(reply)) => {
                    self.inbox.quit_reply = Some(reply);
                    return self.quit().await;
                }
            }
        };
        match self.drain(trigger).await {
            Ok(outcome) => outcome,
            Err(Interrupt::EnvoyExited(status)) => self.envoy_exited(status),
            Err(Interrupt::EnvoyGone) => {
                tracing::error!("Envoy's admin API stopped answering during the drain: Envoy is gone");
                self.inbox.publish(|s| s.phase = Phase::Stopped);
                Outcome::EnvoyGone
            }
            Err(Interrupt::Quit) => self.quit().await,
        }
    }

    async fn drain(&mut self, trigger: Trigger) -> Result<Outcome, Interrupt> {
        let started = Instant::now();
        self.started = Some(started);
        let deadline = started
            .checked_add(self.plan.grace.deadline())
            .unwrap_or_else(|| started + Duration::from_secs(86400 * 365));
        self.resolve_policy().await;
        let gateway = self.plan.drain_until == DrainUntil::OutOfRotation;
        // After the delays: Envoy drains, or (out-of-rotation) serves until
        // the load balancers have let go.
        let waiting = if gateway {
            Phase::LeavingRotation
        } else {
            Phase::Draining
        };
        // 1. Readiness derives from the phase: publishing it is the 503
        // (after the readiness-fail delay, when there is one).
        let (delay, fail_delay) = (self.plan.drain_delay, self.plan.readiness_fail_delay);
        let first = match (delay.is_zero(), fail_delay.is_zero()) {
            (false, _) => Phase::Delaying,
            (true, false) => Phase::DrainingReady,
            (true, true) => waiting,
        };
        self.publish_start(trigger, first);

        // 2. Pre-drain delay.
        if !delay.is_zero() {
            self.inbox
                .race(&self.envoy, sleep_until(deadline.min(started + delay)))
                .await?;
            self.inbox.publish(|s| s.phase = waiting);
        }

        // 3. Envoy drains its listeners; readiness fails after the
        // readiness-fail delay. Out of rotation: Envoy serves as before,
        // kept-alive connections and all, until the load balancers have
        // let the pod go; then drains (each kept-alive connection closed
        // at a request boundary: its client reconnects where the load
        // balancers now send) and serves until the verdict.
        let mut held = None;
        if gateway {
            self.fail_readiness_after(fail_delay, Instant::now(), deadline).await?;
            self.wait_for_let_go(deadline).await?;
            self.drain_listeners(deadline).await?;
            held = self.wait_for_rotation(deadline).await?;
            self.inbox.publish(|s| s.phase = Phase::Draining);
        } else {
            self.drain_listeners(deadline).await?;
        }
        let drain_began = Instant::now();
        if !gateway {
            self.fail_readiness_after(fail_delay, drain_began, deadline).await?;
        }
        // The kubelet still sees the pod serving: kube-proxy may send the
        // node's new connections here until the node's load balancer let
        // the node go. Envoy, draining, accepts them until the verdict.
        if self.plan.stop_waits_for_verdict(self.kubelet) {
            held = self.wait_for_rotation(deadline).await?;
        }

        // 4. The policy.
        let (mut left, satisfied) = self.wait_for_policy(drain_began, deadline).await?;
        let mut cut = !satisfied;
        let keep_running = self.publish_drained(cut, started);

        // After `POST /drain`, Envoy keeps running until a signal. What it
        // is stopped with is read again then, by the policy's own rule: work
        // may have come or gone since.
        if keep_running {
            tracing::info!("drained; Envoy keeps running until SIGTERM");
            self.inbox.wait_for_signal(&self.envoy).await?;
            self.inbox.publish(|s| s.phase = Phase::Draining);
            let (now_left, satisfied) = self.wait_for_policy(drain_began, deadline).await?;
            (left, cut) = (now_left, !satisfied);
        }

        // 5. Stop Envoy.
        Ok(self.stop_and_conclude(left, (cut, held.is_some()), started).await)
    }

    /// Publishes the drain's start in its `first` phase, and how the
    /// kubelet is answered in it (by what started it); logs it.
    fn publish_start(&mut self, trigger: Trigger, first: Phase) {
        let now_unix = lifeguard_base::duration::unix_now();
        let stop_requested = self.inbox.stop_requested();
        let (policy, drained_when) = (self.plan.drain_until, self.plan.drained_when());
        let answer = self.plan.kubelet(trigger);
        let kubelet = Kubelet::new(answer);
        self.kubelet = kubelet.answer;
        if let (Ok(serving_window), Some(started)) = (answer, self.started) {
            let ends = started + serving_window;
            self.inbox
                .phase
                .kubelet_window_ends(ends, NotServingBecause::NodeLoadBalancersTime);
            self.inbox.kubelet_window = Some((ends, serving_window));
        }
        let deadline = now_unix + self.plan.grace.deadline().as_secs_f64();
        self.inbox.publish(|s| {
            s.phase = first;
            s.policy = policy;
            s.drained_when = drained_when;
            s.trigger = Some(trigger);
            s.kubelet = Some(kubelet);
            s.started_at = Some(now_unix);
            s.deadline = Some(deadline);
            s.stop_requested = stop_requested;
        });
        let readiness = match (first, self.kubelet) {
            (Phase::DrainingReady, _) => {
                format!("readiness fails in {}", GoDuration(self.plan.readiness_fail_delay))
            }
            (_, KubeletAnswer::FollowsEnvoy) => format!(
                "readiness is 503 for the load balancers; the kubelet's probe is answered 200 while Envoy \
                 accepts new connections, for {} at most (the pod terminates: kube-proxy's fallback may \
                 still send here until the node is let go: {} + {}), then 503, so that announcers withdraw \
                 the node",
                GoDuration(self.plan.node_checks().serving_window()),
                self.plan.node_checks().slowest_words(),
                GoDuration(crate::KUBE_PROXY_LAG)
            ),
            _ => "readiness is 503".to_owned(),
        };
        tracing::info!(
            %trigger,
            policy = %self.plan.drain_until,
            drained_when = %self.plan.drained_when(),
            deadline_in = %GoDuration(self.plan.grace.deadline()),
            "drain started: {readiness}"
        );
    }

    /// The policy is satisfied or the deadline came: publishes it and
    /// answers every `POST /drain`. Whether Envoy keeps running (no signal
    /// asked for its stop yet).
    fn publish_drained(&mut self, cut: bool, started: Instant) -> bool {
        self.inbox.drained = true;
        let keep_running = !self.inbox.stop_requested();
        let took = started.elapsed().as_secs_f64();
        self.inbox.publish(|s| {
            s.cut_by_deadline = cut;
            s.duration_seconds = Some(took);
            if keep_running {
                s.phase = Phase::Drained;
            }
        });
        let status = self.inbox.status.borrow().clone();
        for waiter in self.inbox.waiters.drain(..) {
            let _ = waiter.send(status.clone());
        }
        keep_running
    }

    /// Stops Envoy and says how the drain ended. What Envoy is stopped
    /// with is published with the `stopping` phase, so `GET /drain` shows
    /// it while Envoy exits.
    /// `cut`: the deadline cut the policy; `held`: the wait for the load
    /// balancers ended at its bound (without their verdict).
    async fn stop_and_conclude(&mut self, left: Option<u64>, (cut, held): (bool, bool), started: Instant) -> Outcome {
        // The wait's bound ended it and nothing was left: whether or not
        // the policy's last look came before the deadline, nothing was cut.
        let cut = cut && !(held && left == Some(0));
        self.inbox.publish(|s| s.cut_by_deadline = cut);
        let exit = self.stop_envoy(left).await;
        let unfinished = match (self.plan.drain_until, left) {
            (DrainUntil::Time, Some(n)) if !cut && n > 0 => Some(n),
            _ => None,
        };
        if let Some(n) = unfinished {
            tracing::warn!(
                left_at_stop = n,
                "the drain time ran out with requests in flight: Envoy stopped with them"
            );
            return Outcome::Unfinished { left: n, exit };
        }
        if cut {
            let why = "the deadline cut the drain";
            match left {
                Some(n) => tracing::warn!(
                    left = n,
                    counting = self.plan.counted_in_all(),
                    "{why}: Envoy stopped with {n} still active"
                ),
                None => tracing::warn!("{why}; the active count was unknown"),
            }
            Outcome::Cut { left, exit }
        } else if held {
            tracing::info!(
                took = %GoDuration(started.elapsed()),
                "drained with nothing left after the drain wait's bound, Envoy stopped ({exit})"
            );
            Outcome::WaitBound(exit)
        } else {
            tracing::info!(took = %GoDuration(started.elapsed()), "drain complete, Envoy stopped ({exit})");
            Outcome::Drained(exit)
        }
    }

    /// Starts Envoy's graceful drain, retried within the deadline. A failure
    /// is logged; the drain goes on.
    /// Envoy's listeners keep accepting until Envoy is stopped
    /// (`skip_exit`) while Envoy keeps running after the drain (`POST
    /// /drain`), and while the kubelet follows Envoy (its answer says Envoy
    /// accepts new connections).
    async fn drain_listeners(&mut self, deadline: Instant) -> Result<(), Interrupt> {
        let skip_exit = !self.inbox.stop_requested() || self.kubelet == KubeletAnswer::FollowsEnvoy;
        let scope = self.plan.scope;
        for attempt in 1..=DRAIN_CALL_TRIES {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!("the deadline came before Envoy's drain could start");
                return Ok(());
            }
            let call = tokio::time::timeout(
                left.min(self.plan.admin_timeout),
                self.envoy.drain_listeners(scope, skip_exit),
            );
            match self.inbox.race(&self.envoy, call).await? {
                Ok(Ok(())) => {
                    tracing::info!(skip_exit, %scope, "Envoy is draining its listeners");
                    return Ok(());
                }
                Ok(Err(e)) => tracing::warn!(attempt, error = %e, "drain_listeners failed"),
                Err(_) if left <= self.plan.admin_timeout => break,
                Err(_) => tracing::warn!(attempt, "drain_listeners did not answer in time"),
            }
            if attempt < DRAIN_CALL_TRIES {
                let next = deadline.min(Instant::now() + Duration::from_millis(100));
                self.inbox.race(&self.envoy, sleep_until(next)).await?;
            }
        }
        tracing::error!("could not start Envoy's graceful drain; waiting as the policy says anyway");
        Ok(())
    }

    /// Waits as the policy says, or until the deadline. Returns the count
    /// the policy counts at the last successful read, and whether the policy
    /// was satisfied (false: the deadline came first). Reads are paced by
    /// [`Pacer`]; the end is [`DoneRule`]'s.
    async fn wait_for_policy(
        &mut self,
        drain_began: Instant,
        deadline: Instant,
    ) -> Result<(Option<u64>, bool), Interrupt> {
        let plan = self.plan.clone();
        let mut rule = DoneRule::new(&plan, drain_began);
        let mut pacer = Pacer::default();
        // The looks at the app, paced apart: what they cost is the kernel's.
        let mut looks = Looks::default();
        let mut seen = Seen::default();
        loop {
            // A read gets what the port's record of Envoy's reads says
            // (the admin timeout, longer after reads that ran past it),
            // never past the deadline; near (or past) the deadline it
            // still gets a short while: what Envoy is stopped with must be
            // known, and the shutdown margin has room for it.
            let read_timeout = self
                .envoy
                .read_timeout()
                .min(deadline.saturating_duration_since(Instant::now()))
                .max(plan.last_read_timeout());
            let read_started = Instant::now();
            let timeouts = ReadTimeouts {
                envoy: read_timeout,
                look: read_timeout.min(plan.admin_timeout),
            };
            let (envoy_read, app_read) = self.read_once(timeouts, &mut looks).await?;
            // The pace counts from the start of the read the drain got: a
            // read shared with the drain wait began before the drain asked
            // (and cost Envoy more than the drain waited for it), and the
            // drain wait paces its own reads from that start too.
            let mut read_began = read_started;
            if let Read::Answered(read) = &envoy_read {
                pacer.answered(read.took);
                let began = Instant::now().checked_sub(read.took).unwrap_or(read_started);
                read_began = read_began.min(began);
            }
            let now = Instant::now();
            let envoy_now = self.take_envoy_read(envoy_read, read_timeout, now, &mut seen)?;
            let app_now = self.take_app_read(app_read, now, &mut seen);
            // An app gone does not come back: no quiet period is waited out for it.
            let app_gone = self.watch_app && app_now.as_ref().is_some_and(|w| w.gone());
            // The count the policy counts, read now (None: unknown now).
            let count_now = match (envoy_now, &app_now) {
                (Some(n), Some(work)) => {
                    let why = rule.first_reading(&plan, n, work).and_then(|b| b.why_the_minimum());
                    if let (Some(why), true) = (why, now < rule.min_end) {
                        tracing::info!("{why}");
                    }
                    Some(n.saturating_add(work.count()))
                }
                _ => None,
            };
            let left = match count_now {
                Some(count) => {
                    seen.left = Some(count);
                    let on = Remaining::of(envoy_now.unwrap_or(0), plan.counted(), app_now.as_ref());
                    self.publish_waiting_on(on.as_ref());
                    on.map_or(Left::Nothing, Left::On)
                }
                None => Left::Unknown,
            };
            let awaiting = self.awaiting(left, &rule, drain_began, now);
            let own_left = rule.min_end.saturating_duration_since(now);
            let to_deadline = deadline.saturating_duration_since(now);
            seen.progress.observe(now, &awaiting, || {
                awaiting.line(plan.drain_until, own_left, to_deadline)
            });
            self.publish_awaiting(awaiting);
            if rule.done(read_started, now, count_now, app_gone) {
                let waived = rule.floor_waived(now);
                if waived {
                    self.publish_awaiting(Awaiting::Said(GONE_BEFORE));
                }
                log_done(&plan, seen.left, now.duration_since(drain_began), waived);
                return Ok((seen.left, true));
            }
            if now >= deadline {
                return Ok((seen.left, false));
            }
            // Envoy's reads are paced by their cost to Envoy, and (each
            // with a look at the app) by the looks' cost.
            let gap = match self.watch_app {
                true => pacer.gap(rule.period()).max(looks.gap()),
                false => pacer.gap(rule.period()),
            };
            let next = rule.cap(deadline.min(read_began + gap).max(now));
            match app_now.filter(|work| self.watch_app && !work.is_done()) {
                // The app's end is looked for in between.
                Some(work) => self.watch_app_until(next, work, timeouts.look, &mut looks).await?,
                None => self.inbox.race(&self.envoy, sleep_until(next)).await?,
            }
        }
    }

    /// What the policy awaits (`left`), and the end of its own time while
    /// it runs (unix seconds, from the drain's published start).
    fn awaiting(&self, left: Left, rule: &DoneRule, drain_began: Instant, now: Instant) -> Awaiting {
        let started_at = self.inbox.status.borrow().started_at;
        let own_time_ends = started_at
            .filter(|_| rule.min_end > now)
            .map(|start| start + (rule.min_end - drain_began).as_secs_f64());
        Awaiting::Policy { left, own_time_ends }
    }

    /// Publishes what the drain awaits, when it changed.
    fn publish_awaiting(&mut self, awaiting: Awaiting) {
        if self.inbox.status.borrow().awaiting.as_ref() != Some(&awaiting) {
            self.inbox.publish(|s| s.awaiting = Some(awaiting));
        }
    }

    /// Publishes what the drain waits on, when it changed.
    fn publish_waiting_on(&mut self, on: Option<&Remaining>) {
        if self.inbox.status.borrow().waiting_on.as_ref() == on {
            return;
        }
        self.inbox.publish(|s| {
            if let Some(on) = on {
                s.waited_on_last = Some(on.clone());
            }
            s.waiting_on = on.cloned();
        });
    }

    /// Stops Envoy; `left` is what the policy counted still active, which
    /// is published with the `stopped` phase (one consistent final status).
    async fn stop_envoy(&mut self, left: Option<u64>) -> Exit {
        let took = self.started.map(|t| t.elapsed().as_secs_f64());
        // Envoy stops accepting: the kubelet's answer turns 503.
        if self.kubelet == KubeletAnswer::FollowsEnvoy {
            self.inbox
                .kubelet_turned(took.unwrap_or(0.0), NotServingBecause::EnvoyStopping);
        }
        self.inbox.publish(|s| {
            s.phase = Phase::Stopping;
            s.left_at_stop = left;
        });
        let bound = self.plan.stop_bound(
            self.started,
            self.inbox.signalled_at,
            Instant::now(),
            self.envoy.is_child(),
        );
        let exit = self.envoy.stop(bound).await;
        let took = self.started.map(|t| t.elapsed().as_secs_f64());
        self.inbox.publish(|s| {
            s.phase = Phase::Stopped;
            s.duration_seconds = took;
            s.left_at_stop = left;
        });
        exit
    }

    async fn quit(&mut self) -> Outcome {
        tracing::info!("POST /quitquitquit: stopping Envoy now");
        let exit = self.stop_envoy(None).await;
        tracing::info!("Envoy stopped ({exit})");
        if let Some(reply) = self.inbox.quit_reply.take() {
            let _ = reply.send(());
        }
        Outcome::Quit(exit)
    }

    fn envoy_exited(&mut self, status: ExitStatus) -> Outcome {
        tracing::error!(%status, "Envoy exited on its own");
        self.inbox.publish(|s| s.phase = Phase::Stopped);
        Outcome::EnvoyExited(status)
    }
}
