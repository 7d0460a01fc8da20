//! The drain: one state machine that owns the phase, the deadline and the
//! policy, and is the only place that decides when Envoy stops.
//!
//! It runs as one task ([`Drain::run`]) fed by [`Event`]s — signals,
//! `POST /drain`, `POST /quitquitquit` — through a [`DrainHandle`], and talks
//! to Envoy only through [`EnvoyControl`] (drain the listeners, read the
//! active counts, stop, notice an exit). Time is tokio's clock, so the whole
//! machine runs in virtual time in the unit tests below, against a scripted
//! Envoy.
//!
//! The sequence on the first SIGTERM or SIGINT:
//!
//! 1. the phase leaves `serving`, and readiness, which reads the published
//!    phase, answers 503 `draining` before any network call is made;
//! 2. optional pre-drain delay: Envoy keeps serving while endpoint removal
//!    propagates;
//! 3. Envoy's inbound listeners drain gracefully (retried; a failure is
//!    logged and the sequence goes on);
//! 4. the policy: a fixed time, or nothing left (connections, requests, or
//!    the app's work) after a minimum time, read every 50 ms on a small
//!    Envoy and less often on a slow one; only a count read *now* can end it;
//! 5. Envoy is stopped gracefully. One deadline (grace period less the
//!    shutdown margin, counted from the start of the drain) bounds steps 2–4.
//!
//! `POST /drain` runs steps 1–4 with `skip_exit` and answers when the policy
//! is satisfied; Envoy keeps running until a signal, which then stops it at
//! once. Every wait ends early when Envoy exits on its own.
//!
//! The phase is published once, in a `watch` channel ([`Status`]); readiness,
//! `GET /drain` and the metrics all derive from it.

use std::future::Future;
use std::process::ExitStatus;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{sleep_until, Instant};

use crate::admin::AdminError;
use crate::app::{self, Work};
use crate::duration::Display as D;
use crate::envoy::Exit;
use crate::stats::Active;
use std::fmt;

use clap::ValueEnum;
use serde::Deserialize;

/// How often active connections or requests are read while waiting for zero,
/// so Envoy stops within about this long after the last one ends.
pub const ZERO_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// With `app-exit`, how long every read must have found nothing left (no
/// request in Envoy, no socket or process of the app) before Envoy stops:
/// an app between two steps of its shutdown may hold no socket for a
/// moment (with a shared process namespace its processes still show).
pub const APP_QUIET: Duration = Duration::from_millis(100);
/// A drain read starts this many times the recent reads' duration after the
/// one before: Envoy's admin thread spends at most 1/PACE (about 9 %) of its
/// time on the drain's reads, whatever the size of its config.
const PACE: u32 = 11;
/// How long an external Envoy's admin API may refuse connections during a
/// drain before lifeguard concludes Envoy is gone.
const EXTERNAL_GONE_AFTER: Duration = Duration::from_secs(1);
/// Tries of the `drain_listeners` call.
const DRAIN_CALL_TRIES: u32 = 3;
/// Time between two progress lines, and between two repeats of one warning.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Process exit codes.
pub mod exit_code {
    /// Envoy was drained and stopped (or `/quitquitquit` was asked for).
    pub const CLEAN: u8 = 0;
    /// Bad configuration or a start-up error: nothing was started.
    pub const CONFIG: u8 = 2;
    /// Envoy was stopped with work in flight: the deadline cut the drain,
    /// or the fixed policy's time ran out with requests still active.
    pub const CUT_BY_DEADLINE: u8 = 3;
    /// Envoy exited on its own (crash, OOM kill, bad config) or vanished.
    pub const ENVOY_EXITED: u8 = 4;
}

/// What the drain needs from Envoy. [`crate::envoy::Envoy`] is the real one;
/// the unit tests script their own.
pub trait EnvoyControl {
    /// Starts the graceful drain of the inbound listeners. With `skip_exit`,
    /// Envoy's drain timer does not close them afterwards.
    fn drain_listeners(&self, skip_exit: bool) -> impl Future<Output = Result<(), AdminError>> + Send;
    /// Reads the active downstream connections and requests.
    fn active(&self) -> impl Future<Output = Result<Active, AdminError>> + Send;
    /// Stops Envoy gracefully within `bound`.
    fn stop(&self, bound: Duration) -> impl Future<Output = Exit> + Send;
    /// Resolves when Envoy exits on its own (never, if that cannot be seen).
    fn exited(&self) -> impl Future<Output = ExitStatus> + Send;
    /// Whether Envoy is lifeguard's child (its exit is seen directly).
    fn is_child(&self) -> bool;
}

/// What the app still holds, for the `app-exit` policy. [`app::Watcher`]
/// is the real one.
pub trait AppControl {
    fn work(&self) -> impl Future<Output = Result<Work, String>> + Send;
}

impl AppControl for app::Watcher {
    fn work(&self) -> impl Future<Output = Result<Work, String>> + Send {
        self.scan()
    }
}

/// For drains whose policy never looks at the app.
impl AppControl for () {
    async fn work(&self) -> Result<Work, String> {
        Ok(Work::default())
    }
}

/// What the drain machine is told.
#[derive(Debug)]
pub enum Event {
    /// SIGTERM or SIGINT.
    Signal(&'static str),
    /// `POST /drain`: drain, answer when drained, keep Envoy running.
    Drain(oneshot::Sender<Status>),
    /// `POST /quitquitquit`: stop Envoy now, answer, exit.
    Quit(oneshot::Sender<()>),
}

/// The drain's phases, in order (`lifeguard_drain_phase{phase}` names them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Not draining.
    Serving = 0,
    /// Readiness is 503; waiting out the pre-drain delay.
    Delaying = 1,
    /// Envoy's listeners are draining; waiting as the policy says.
    Draining = 2,
    /// The policy is satisfied (after `POST /drain`); waiting for a signal.
    Drained = 3,
    /// Envoy is being stopped.
    Stopping = 4,
    /// Envoy has stopped; lifeguard is exiting.
    Stopped = 5,
}

/// What `GET /drain` shows: the drain as the machine last published it.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub phase: Phase,
    /// What started the drain: `SIGTERM`, `SIGINT` or `POST /drain`.
    pub trigger: Option<&'static str>,
    /// Unix time (seconds) the drain began.
    pub started_at: Option<f64>,
    /// Unix time (seconds) by which Envoy is stopped.
    pub deadline: Option<f64>,
    pub policy: DrainUntil,
    /// What the drain waits for, in words.
    pub waiting_for: String,
    pub active_connections: Option<u64>,
    pub active_requests: Option<u64>,
    /// TCP-proxy (non-HTTP) connections active in Envoy.
    pub active_tcp: Option<u64>,
    /// Sockets and processes the app still holds (`app-exit`).
    pub app_sockets: Option<u64>,
    pub app_processes: Option<u64>,
    /// What the drain waits on right now, e.g. `3 requests` or
    /// `2 app sockets (127.0.0.1:8080 listening; ...)`.
    pub waiting_on: Option<String>,
    /// What the drain waited on last, kept once the count reached zero (the
    /// exit summary's "waited for last").
    pub waited_on_last: Option<String>,
    /// Why the last read of the active counts failed, if it did.
    pub last_read_error: Option<String>,
    /// Whether a signal asked for Envoy to be stopped once drained.
    pub stop_requested: bool,
    /// Whether the deadline cut the drain.
    pub cut_by_deadline: bool,
    /// What the policy counts (connections, requests, or work in flight and
    /// app sockets and processes) still active when Envoy was stopped.
    pub left_at_stop: Option<u64>,
    /// Seconds from the start of the drain to drained, while Envoy keeps
    /// running after `POST /drain`; to Envoy's stop once it has stopped.
    pub duration_seconds: Option<f64>,
}

impl Status {
    /// Before any drain.
    pub fn initial(policy: DrainUntil, waiting_for: String) -> Status {
        Status {
            phase: Phase::Serving,
            trigger: None,
            started_at: None,
            deadline: None,
            policy,
            waiting_for,
            active_connections: None,
            active_requests: None,
            active_tcp: None,
            app_sockets: None,
            app_processes: None,
            waiting_on: None,
            waited_on_last: None,
            last_read_error: None,
            stop_requested: false,
            cut_by_deadline: false,
            left_at_stop: None,
            duration_seconds: None,
        }
    }
}

/// How the agent ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Drained by the policy, then Envoy stopped.
    Drained(Exit),
    /// The deadline cut the drain with `left` still active (None: unknown).
    Cut { left: Option<u64>, exit: Exit },
    /// The fixed policy's time ran out with `left` requests in flight.
    Unfinished { left: u64, exit: Exit },
    /// `POST /quitquitquit`.
    Quit(Exit),
    /// Envoy exited on its own.
    EnvoyExited(ExitStatus),
    /// An external Envoy stopped answering during the drain.
    EnvoyGone,
}

impl Outcome {
    pub fn exit_code(&self) -> u8 {
        match self {
            Outcome::Drained(_) | Outcome::Quit(_) => exit_code::CLEAN,
            Outcome::Cut { left: Some(0), .. } => exit_code::CLEAN,
            Outcome::Cut { .. } | Outcome::Unfinished { .. } => exit_code::CUT_BY_DEADLINE,
            Outcome::EnvoyExited(_) | Outcome::EnvoyGone => exit_code::ENVOY_EXITED,
        }
    }
}

/// The drain's settings (`Settings::drain_plan` in [`crate::config`]).
#[derive(Debug, Clone)]
pub struct Plan {
    pub policy: DrainUntil,
    /// Pause between readiness turning 503 and Envoy's drain.
    pub delay: Duration,
    /// The fixed policy's drain time.
    pub drain_time: Duration,
    /// The exit-on-zero policies' shortest drain.
    pub minimum: Duration,
    /// From the start of the drain to Envoy's stop, at the latest.
    pub deadline: Duration,
    /// Timeout of one admin call.
    pub read_timeout: Duration,
    /// How long Envoy gets to exit after SIGTERM before SIGKILL.
    pub stop_bound: Duration,
    /// How often the fixed policy reads the counts, for reporting.
    pub report_every: Duration,
}

impl Plan {
    /// What the drain waits for, in words.
    pub fn waiting_for(&self) -> String {
        match self.policy {
            DrainUntil::Time => format!("{} of drain time", D(self.drain_time)),
            DrainUntil::AppExit => format!(
                "no request in Envoy and no socket or process of the app, after at least {}",
                D(self.minimum)
            ),
            until => format!("zero active {until}, after at least {}", D(self.minimum)),
        }
    }

    /// What the count counts under this policy. The fixed policy counts the
    /// work it would cut: requests and TCP-proxy connections.
    fn counted(&self) -> &'static str {
        match self.policy {
            DrainUntil::Connections => "connections",
            DrainUntil::Requests => "requests",
            DrainUntil::Time | DrainUntil::AppExit => "requests in flight",
        }
    }

    /// What the count that ends the drain counts: with `app-exit`, the
    /// app's sockets and processes too.
    fn counted_in_all(&self) -> &'static str {
        match self.policy {
            DrainUntil::AppExit => "requests in flight, app sockets and app processes",
            _ => self.counted(),
        }
    }

    fn count(&self, active: &Active) -> u64 {
        match self.policy {
            DrainUntil::Connections => active.connections,
            DrainUntil::Requests => active.requests,
            DrainUntil::Time | DrainUntil::AppExit => active.work(),
        }
    }
}

/// The handle the status server and the signal task use.
#[derive(Clone)]
pub struct DrainHandle {
    events: mpsc::Sender<Event>,
    status: watch::Receiver<Status>,
}

impl DrainHandle {
    /// Reports a signal.
    pub fn signal(&self, name: &'static str) {
        let _ = self.events.try_send(Event::Signal(name));
    }

    /// Starts a drain (or joins the one under way) and waits until it is
    /// drained. None when the drain machine has ended.
    pub async fn drain(&self) -> Option<Status> {
        let (tx, rx) = oneshot::channel();
        self.events.send(Event::Drain(tx)).await.ok()?;
        rx.await.ok()
    }

    /// Starts a drain (or joins the one under way) without waiting for it:
    /// resolves once the phase has left `serving` (readiness is 503), with
    /// the status then. None when the drain machine has ended.
    pub async fn begin(&self) -> Option<Status> {
        let (tx, _unanswered) = oneshot::channel();
        self.events.send(Event::Drain(tx)).await.ok()?;
        let mut status = self.status.clone();
        let begun = status.wait_for(|s| s.phase != Phase::Serving);
        let status = tokio::time::timeout(Duration::from_secs(1), begun)
            .await
            .ok()?
            .ok()?
            .clone();
        Some(status)
    }

    /// Stops Envoy now; resolves once it has stopped.
    pub async fn quit(&self) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.events.send(Event::Quit(tx)).await.is_err() {
            return false;
        }
        rx.await.is_ok()
    }

    /// The drain's latest published status.
    pub fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    /// The published status, to derive readiness from.
    pub fn watch(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }
}

/// Why a wait inside the drain ended early.
enum Interrupt {
    EnvoyExited(ExitStatus),
    EnvoyGone,
    Quit,
}

/// The drain state machine. Build it with [`Drain::new`], run it with
/// [`Drain::run`].
pub struct Drain<E, A = ()> {
    plan: Plan,
    envoy: E,
    app: A,
    inbox: Inbox,
    started: Option<Instant>,
}

/// The events, and what they leave behind for the machine to act on.
struct Inbox {
    events: mpsc::Receiver<Event>,
    open: bool,
    status: watch::Sender<Status>,
    stop_requested: bool,
    waiters: Vec<oneshot::Sender<Status>>,
    drained: bool,
    quit_reply: Option<oneshot::Sender<()>>,
}

impl<E: EnvoyControl, A: AppControl> Drain<E, A> {
    /// The machine and its handle. `app` is what the `app-exit` policy
    /// watches (`()` for the other policies).
    pub fn new(plan: Plan, envoy: E, app: A) -> (Drain<E, A>, DrainHandle) {
        let (events_tx, events) = mpsc::channel(64);
        let (status, status_rx) = watch::channel(Status::initial(plan.policy, plan.waiting_for()));
        let handle = DrainHandle {
            events: events_tx,
            status: status_rx,
        };
        let inbox = Inbox {
            events,
            open: true,
            status,
            stop_requested: false,
            waiters: Vec::new(),
            drained: false,
            quit_reply: None,
        };
        let drain = Drain {
            plan,
            envoy,
            app,
            inbox,
            started: None,
        };
        (drain, handle)
    }

    /// Runs until Envoy has stopped (or exited on its own).
    pub async fn run(mut self) -> Outcome {
        let trigger = loop {
            let event = tokio::select! {
                status = self.envoy.exited() => return self.envoy_exited(status),
                event = self.inbox.events.recv(), if self.inbox.open => event,
            };
            match event {
                None => self.inbox.open = false,
                Some(Event::Signal(name)) => {
                    self.inbox.stop_requested = true;
                    break name;
                }
                Some(Event::Drain(reply)) => {
                    self.inbox.waiters.push(reply);
                    break "POST /drain";
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

    async fn drain(&mut self, trigger: &'static str) -> Result<Outcome, Interrupt> {
        let started = Instant::now();
        self.started = Some(started);
        let deadline = started
            .checked_add(self.plan.deadline)
            .unwrap_or_else(|| started + Duration::from_secs(86400 * 365));
        // 1. Readiness derives from the phase: publishing it is the 503.
        let now_unix = unix_now();
        let stop_requested = self.inbox.stop_requested;
        let first = if self.plan.delay.is_zero() {
            Phase::Draining
        } else {
            Phase::Delaying
        };
        self.inbox.publish(|s| {
            s.phase = first;
            s.trigger = Some(trigger);
            s.started_at = Some(now_unix);
            s.deadline = Some(now_unix + self.plan.deadline.as_secs_f64());
            s.stop_requested = stop_requested;
        });
        tracing::info!(
            trigger,
            policy = %self.plan.policy,
            waiting_for = %self.plan.waiting_for(),
            deadline_in = %D(self.plan.deadline),
            "drain started: readiness is 503"
        );

        // 2. Pre-drain delay.
        if !self.plan.delay.is_zero() {
            let until = deadline.min(started + self.plan.delay);
            self.inbox.race(&self.envoy, sleep_until(until)).await?;
            self.inbox.publish(|s| s.phase = Phase::Draining);
        }

        // 3. Envoy drains its inbound listeners.
        self.drain_listeners(deadline).await?;
        let drain_began = Instant::now();

        // 4. The policy.
        let (left, satisfied) = self.wait_for_policy(drain_began, deadline).await?;
        let cut = !satisfied;
        self.inbox.drained = true;
        let keep_running = !self.inbox.stop_requested;
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

        // After `POST /drain`, Envoy keeps running until a signal.
        if keep_running {
            tracing::info!("drained; Envoy keeps running until SIGTERM");
            self.inbox.wait_for_signal(&self.envoy).await?;
        }

        // 5. Stop Envoy. What it is stopped with is published with the
        // `stopping` phase, so `GET /drain` shows it while Envoy exits.
        let exit = self.stop_envoy(left).await;
        let unfinished = match (self.plan.policy, left) {
            (DrainUntil::Time, Some(n)) if !cut && n > 0 => Some(n),
            _ => None,
        };
        if let Some(n) = unfinished {
            tracing::warn!(
                left_at_stop = n,
                "the drain time ran out with requests in flight: Envoy stopped with them"
            );
            return Ok(Outcome::Unfinished { left: n, exit });
        }
        if cut {
            match left {
                Some(n) => tracing::warn!(
                    left = n,
                    counting = self.plan.counted_in_all(),
                    "the deadline cut the drain: Envoy stopped with {n} still active"
                ),
                None => tracing::warn!("the deadline cut the drain; the active count was unknown"),
            }
            Ok(Outcome::Cut { left, exit })
        } else {
            tracing::info!(took = %D(started.elapsed()), "drain complete, Envoy stopped ({exit})");
            Ok(Outcome::Drained(exit))
        }
    }

    /// Starts Envoy's graceful drain, retried within the deadline. A failure
    /// is logged; the drain goes on.
    async fn drain_listeners(&mut self, deadline: Instant) -> Result<(), Interrupt> {
        let skip_exit = !self.inbox.stop_requested;
        for attempt in 1..=DRAIN_CALL_TRIES {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!("the deadline came before Envoy's drain could start");
                return Ok(());
            }
            let call = tokio::time::timeout(left.min(self.plan.read_timeout), self.envoy.drain_listeners(skip_exit));
            match self.inbox.race(&self.envoy, call).await? {
                Ok(Ok(())) => {
                    tracing::info!(skip_exit, "Envoy is draining its inbound listeners");
                    return Ok(());
                }
                Ok(Err(e)) => tracing::warn!(attempt, error = %e, "drain_listeners failed"),
                Err(_) if left <= self.plan.read_timeout => break,
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
    /// was satisfied (false: the deadline came first).
    ///
    /// Envoy answers admin calls on its main thread, the one that applies
    /// xDS: reads are spaced so they take at most about 9 % of its time (a
    /// read starts [`PACE`] times the median of the last three reads' time
    /// after the one before), and never closer than [`ZERO_POLL_INTERVAL`].
    async fn wait_for_policy(
        &mut self,
        drain_began: Instant,
        deadline: Instant,
    ) -> Result<(Option<u64>, bool), Interrupt> {
        let plan = self.plan.clone();
        let (period, min_end) = match plan.policy {
            DrainUntil::Time => (plan.report_every, drain_began + plan.drain_time),
            _ => (ZERO_POLL_INTERVAL, drain_began + plan.minimum),
        };
        let watch_app = plan.policy == DrainUntil::AppExit;
        let mut left: Option<u64> = None;
        let mut refused_since: Option<Instant> = None;
        let mut progress = Progress::default();
        let mut read_warning = Throttle::new(WARN_EVERY);
        let mut skipped_warning = Throttle::new(WARN_EVERY);
        let mut app_warning = Throttle::new(WARN_EVERY);
        // The last three answered reads' durations: the pause follows their
        // median (the shortest, until there are three), so one read slowed
        // by a busy CPU here does not stall the drain, while a config that
        // makes every read slow is paced by it. A read that timed out says
        // nothing of what a read costs Envoy (it may have waited behind
        // something else) and is left out.
        let mut recent: Vec<Duration> = Vec::with_capacity(3);
        let mut zero_since: Option<Instant> = None;
        loop {
            let read_timeout = plan
                .read_timeout
                .min(deadline.saturating_duration_since(Instant::now()))
                .max(Duration::from_millis(10));
            let read_started = Instant::now();
            let envoy_read = async {
                let started = Instant::now();
                let read = tokio::time::timeout(read_timeout, self.envoy.active()).await;
                (read, started.elapsed())
            };
            let app_read = async {
                match watch_app {
                    true => Some(tokio::time::timeout(read_timeout, self.app.work()).await),
                    false => None,
                }
            };
            let ((read, took), app_read) = self
                .inbox
                .race(&self.envoy, async { tokio::join!(envoy_read, app_read) })
                .await?;
            if read.is_ok() {
                if recent.len() == 3 {
                    recent.remove(0);
                }
                recent.push(took);
            }
            let now = Instant::now();
            // Only counts read now may end the drain: an older zero may be
            // stale (a graceful drain still accepts connections).
            let mut envoy_now = None;
            match read {
                Ok(Ok(active)) => {
                    refused_since = None;
                    if !active.skipped.is_empty() && skipped_warning.due(now) {
                        for skipped in &active.skipped {
                            tracing::warn!("not counted: {skipped}");
                        }
                    }
                    envoy_now = Some(plan.count(&active));
                    self.inbox.publish(|s| {
                        s.active_connections = Some(active.connections);
                        s.active_requests = Some(active.requests);
                        s.active_tcp = Some(active.tcp);
                        s.last_read_error = None;
                    });
                }
                Ok(Err(e)) => {
                    if matches!(e, AdminError::Connect { .. }) && !self.envoy.is_child() {
                        let since = *refused_since.get_or_insert(now);
                        if now.duration_since(since) >= EXTERNAL_GONE_AFTER {
                            return Err(Interrupt::EnvoyGone);
                        }
                    }
                    if read_warning.due(now) {
                        tracing::warn!(error = %e, "cannot read active counts; the drain goes on");
                    }
                    self.inbox.publish(|s| s.last_read_error = Some(e.to_string()));
                }
                Err(_) => {
                    let e = format!("the read did not finish within {}", D(read_timeout));
                    if read_warning.due(now) {
                        tracing::warn!(error = %e, "cannot read active counts; the drain goes on");
                    }
                    self.inbox.publish(|s| s.last_read_error = Some(e));
                }
            }
            let app_now: Option<Work> = match app_read {
                None => Some(Work::default()),
                Some(Ok(Ok(work))) => Some(work),
                Some(Ok(Err(e))) => {
                    if app_warning.due(now) {
                        tracing::warn!(error = %e, "cannot see the app's sockets; the drain goes on");
                    }
                    None
                }
                Some(Err(_)) => None,
            };
            if watch_app {
                if let Some(work) = &app_now {
                    let sockets = work.sockets.len() as u64;
                    let processes = work.processes.len() as u64;
                    self.inbox.publish(|s| {
                        s.app_sockets = Some(sockets);
                        s.app_processes = Some(processes);
                    });
                }
            }
            // The count the policy counts, read now (None: unknown now).
            let count_now = match (envoy_now, &app_now) {
                (Some(n), Some(work)) => Some(n.saturating_add(work.count())),
                _ => None,
            };
            if let Some(count) = count_now {
                let on = waiting_on(&plan, envoy_now.unwrap_or(0), app_now.as_ref());
                if Some(count) != left || self.inbox.status.borrow().waiting_on.as_deref() != on.as_deref() {
                    self.inbox.publish(|s| {
                        if on.is_some() {
                            s.waited_on_last.clone_from(&on);
                        }
                        s.waiting_on = on;
                    });
                }
                progress.observe(now, count, plan.counted_in_all());
                left = Some(count);
            }
            // Since when every read said nothing is left (None: the last
            // read found work, or failed).
            zero_since = match count_now {
                Some(0) => zero_since.or(Some(now)),
                _ => None,
            };
            let done = match plan.policy {
                DrainUntil::Time => now >= min_end,
                // The app may hold nothing for a moment between two steps
                // of its shutdown (its last answer, its first call out):
                // it is done when nothing was seen for APP_QUIET.
                DrainUntil::AppExit => now >= min_end && zero_since.is_some_and(|t| now.duration_since(t) >= APP_QUIET),
                _ => now >= min_end && count_now == Some(0),
            };
            if done {
                match plan.policy {
                    DrainUntil::Time => tracing::info!(in_flight = left, "drain time ({}) is over", D(plan.drain_time)),
                    DrainUntil::AppExit => tracing::info!(
                        took = %D(now.duration_since(drain_began)),
                        "the app is done and Envoy is idle"
                    ),
                    until => tracing::info!(took = %D(now.duration_since(drain_began)), "zero active {until}"),
                }
                return Ok((left, true));
            }
            if now >= deadline {
                return Ok((left, false));
            }
            let mut sorted = recent.clone();
            sorted.sort_unstable();
            let cost = match sorted.len() {
                3 => sorted[1],
                _ => sorted.first().copied().unwrap_or(Duration::ZERO),
            };
            let gap = period.max(cost.saturating_mul(PACE));
            let mut next = deadline.min(read_started + gap).max(now);
            if plan.policy == DrainUntil::Time {
                next = next.min(min_end);
            }
            self.inbox.race(&self.envoy, sleep_until(next)).await?;
        }
    }

    /// Stops Envoy; `left` is what the policy counted still active, which
    /// is published with the `stopped` phase (one consistent final status).
    async fn stop_envoy(&mut self, left: Option<u64>) -> Exit {
        self.inbox.publish(|s| {
            s.phase = Phase::Stopping;
            s.left_at_stop = left;
        });
        let exit = self.envoy.stop(self.plan.stop_bound).await;
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

impl Inbox {
    /// Runs `fut` while handling events; ends early if Envoy exits or a
    /// quit is asked for.
    async fn race<T>(&mut self, envoy: &impl EnvoyControl, fut: impl Future<Output = T>) -> Result<T, Interrupt> {
        tokio::pin!(fut);
        loop {
            let event = tokio::select! {
                biased;
                status = envoy.exited() => return Err(Interrupt::EnvoyExited(status)),
                event = self.events.recv(), if self.open => event,
                out = &mut fut => return Ok(out),
            };
            self.handle(event)?;
        }
    }

    /// Waits (handling events) until a signal asks for Envoy's stop.
    async fn wait_for_signal(&mut self, envoy: &impl EnvoyControl) -> Result<(), Interrupt> {
        while !self.stop_requested {
            let event = tokio::select! {
                biased;
                status = envoy.exited() => return Err(Interrupt::EnvoyExited(status)),
                event = self.events.recv(), if self.open => event,
            };
            self.handle(event)?;
        }
        Ok(())
    }

    /// One event during a drain.
    fn handle(&mut self, event: Option<Event>) -> Result<(), Interrupt> {
        match event {
            None => self.open = false,
            Some(Event::Signal(name)) => {
                if self.stop_requested {
                    tracing::info!(signal = name, "signal received again; the drain goes on unchanged");
                } else {
                    tracing::info!(signal = name, "signal received; Envoy stops once drained");
                    self.stop_requested = true;
                    self.publish(|s| s.stop_requested = true);
                }
            }
            Some(Event::Drain(reply)) => {
                if self.drained {
                    let _ = reply.send(self.status.borrow().clone());
                } else {
                    self.waiters.push(reply);
                }
            }
            Some(Event::Quit(reply)) => {
                self.quit_reply = Some(reply);
                return Err(Interrupt::Quit);
            }
        }
        Ok(())
    }

    fn publish(&self, f: impl FnOnce(&mut Status)) {
        self.status.send_modify(f);
    }
}

/// The drain's progress log: one line per change of the count, at most one
/// a second; a change that comes too soon is logged once a line is due, so
/// the last change is not lost.
#[derive(Default)]
struct Progress {
    logged: Option<u64>,
    last_line: Option<Instant>,
}

impl Progress {
    fn observe(&mut self, now: Instant, count: u64, counting: &'static str) {
        let due = self.last_line.is_none_or(|t| now.duration_since(t) >= PROGRESS_EVERY);
        if self.logged != Some(count) && due {
            tracing::info!(active = count, counting, "draining");
            self.logged = Some(count);
            self.last_line = Some(now);
        }
    }
}

/// Lets a repeated message through at most once per period.
struct Throttle {
    every: Duration,
    last: Option<Instant>,
}

impl Throttle {
    fn new(every: Duration) -> Self {
        Self { every, last: None }
    }

    fn due(&mut self, now: Instant) -> bool {
        let due = self.last.is_none_or(|t| now.duration_since(t) >= self.every);
        if due {
            self.last = Some(now);
        }
        due
    }
}

/// What the drain waits on now, in words; None when nothing.
fn waiting_on(plan: &Plan, envoy: u64, app: Option<&Work>) -> Option<String> {
    let mut parts = Vec::new();
    if envoy > 0 {
        parts.push(format!("{envoy} {}", plan.counted()));
    }
    if let Some(work) = app.filter(|w| !w.is_done()) {
        parts.push(work.to_string());
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What the drain waits for before Envoy is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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
    #[serde(rename = "app-exit")]
    AppExit,
}

impl fmt::Display for DrainUntil {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.to_possible_value().expect("no variant is skipped").get_name())
    }
}

/// Which listeners Envoy drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DrainScope {
    /// `drain_listeners?inboundonly`: listeners with traffic_direction INBOUND.
    Inbound,
    /// Every listener (gateways).
    All,
}

impl fmt::Display for DrainScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.to_possible_value().expect("no variant is skipped").get_name())
    }
}

#[cfg(test)]
mod tests {
    //! The drain in virtual time (`start_paused`): tokio advances the clock
    //! whenever every task waits, so a 28 s drain takes microseconds, and
    //! every instant below is exact. Envoy is scripted: its counts are a
    //! function of the time since the test began.

    use std::os::unix::process::ExitStatusExt;
    use std::sync::{Arc, Mutex};

    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    /// What a scripted read returns: after `delay`, counts or an error.
    type Read = (Duration, Result<Active, AdminError>);

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Call {
        DrainListeners { skip_exit: bool, phase: Phase },
        Stop,
    }

    struct Script {
        t0: Instant,
        child: bool,
        reads: Mutex<Box<dyn FnMut(Duration) -> Read + Send>>,
        calls: Mutex<Vec<(Duration, Call)>>,
        exit: watch::Sender<Option<ExitStatus>>,
        phase: Mutex<Option<watch::Receiver<Status>>>,
    }

    #[derive(Clone)]
    struct FakeEnvoy(Arc<Script>);

    fn conns(n: u64) -> Read {
        (
            Duration::ZERO,
            Ok(Active {
                connections: n,
                requests: n,
                tcp: 0,
                skipped: Vec::new(),
            }),
        )
    }

    fn refused() -> Read {
        let source = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let url = "http://127.0.0.1:15000".to_owned();
        (Duration::ZERO, Err(AdminError::Connect { url, source }))
    }

    impl FakeEnvoy {
        fn new(child: bool, reads: impl FnMut(Duration) -> Read + Send + 'static) -> Self {
            FakeEnvoy(Arc::new(Script {
                t0: Instant::now(),
                child,
                reads: Mutex::new(Box::new(reads)),
                calls: Mutex::new(Vec::new()),
                exit: watch::channel(None).0,
                phase: Mutex::new(None),
            }))
        }

        fn since(&self) -> Duration {
            self.0.t0.elapsed()
        }

        fn record(&self, call: Call) {
            self.0.calls.lock().unwrap().push((self.since(), call));
        }

        fn calls(&self) -> Vec<(Duration, Call)> {
            self.0.calls.lock().unwrap().clone()
        }

        fn stops(&self) -> Vec<Duration> {
            self.calls()
                .into_iter()
                .filter(|(_, c)| *c == Call::Stop)
                .map(|(t, _)| t)
                .collect()
        }

        fn drain_calls(&self) -> Vec<(Duration, Call)> {
            self.calls().into_iter().filter(|(_, c)| *c != Call::Stop).collect()
        }

        /// The child exits on its own.
        fn exit(&self, code: i32) {
            self.0.exit.send_replace(Some(ExitStatus::from_raw(code << 8)));
        }
    }

    impl EnvoyControl for FakeEnvoy {
        async fn drain_listeners(&self, skip_exit: bool) -> Result<(), AdminError> {
            let phase = self.0.phase.lock().unwrap().as_ref().map(|w| w.borrow().phase);
            self.record(Call::DrainListeners {
                skip_exit,
                phase: phase.unwrap_or(Phase::Serving),
            });
            Ok(())
        }

        async fn active(&self) -> Result<Active, AdminError> {
            let (delay, result) = (self.0.reads.lock().unwrap())(self.since());
            tokio::time::sleep(delay).await;
            result
        }

        async fn stop(&self, _bound: Duration) -> Exit {
            self.record(Call::Stop);
            Exit::Status(ExitStatus::from_raw(0))
        }

        async fn exited(&self) -> ExitStatus {
            if !self.0.child {
                return std::future::pending().await;
            }
            let mut rx = self.0.exit.subscribe();
            let status = *rx
                .wait_for(Option::is_some)
                .await
                .expect("sender kept")
                .as_ref()
                .unwrap();
            status
        }

        fn is_child(&self) -> bool {
            self.0.child
        }
    }

    fn plan(policy: DrainUntil) -> Plan {
        Plan {
            policy,
            delay: Duration::ZERO,
            drain_time: secs(5.0),
            minimum: secs(5.0),
            deadline: secs(28.0),
            read_timeout: secs(1.0),
            stop_bound: secs(2.0),
            report_every: secs(1.0),
        }
    }

    /// Starts the drain machine on `envoy`; the fake sees the published phase.
    fn start(plan: Plan, envoy: &FakeEnvoy) -> (tokio::task::JoinHandle<Outcome>, DrainHandle) {
        let (drain, handle) = Drain::new(plan, envoy.clone(), ());
        *envoy.0.phase.lock().unwrap() = Some(handle.watch());
        (tokio::spawn(drain.run()), handle)
    }

    /// Sleeps until `at` after the script's start.
    async fn at(envoy: &FakeEnvoy, at: f64) {
        tokio::time::sleep_until(envoy.0.t0 + secs(at)).await;
    }

    fn assert_between(t: Duration, low: f64, high: f64) {
        assert!(t >= secs(low) && t <= secs(high), "{t:?} not in [{low}s, {high}s]");
    }

    #[tokio::test(start_paused = true)]
    async fn fixed_policy_drains_for_the_drain_time_then_stops_envoy() {
        let envoy = FakeEnvoy::new(true, |_| conns(0));
        let (task, handle) = start(plan(DrainUntil::Time), &envoy);
        assert_eq!(handle.status().phase, Phase::Serving);
        handle.signal("SIGTERM");
        let outcome = task.await.unwrap();
        assert!(matches!(outcome, Outcome::Drained(_)), "{outcome:?}");
        assert_eq!(outcome.exit_code(), exit_code::CLEAN);
        // Readiness turned 503 (the phase left serving) before Envoy was
        // asked to drain; the signal asks Envoy to exit after its drain.
        assert_eq!(
            envoy.drain_calls(),
            [(
                Duration::ZERO,
                Call::DrainListeners {
                    skip_exit: false,
                    phase: Phase::Draining
                }
            )]
        );
        assert_eq!(envoy.stops(), [secs(5.0)]);
        let status = handle.status();
        assert_eq!(status.phase, Phase::Stopped);
        assert_eq!(status.trigger, Some("SIGTERM"));
        assert!(!status.cut_by_deadline);
        assert_eq!(status.duration_seconds, Some(5.0));
    }

    #[tokio::test(start_paused = true)]
    async fn exit_on_zero_waits_out_the_minimum_then_stops_at_the_first_zero() {
        // Two connections until 7 s, then none.
        let envoy = FakeEnvoy::new(true, |t| conns(if t < secs(7.0) { 2 } else { 0 }));
        let (task, handle) = start(plan(DrainUntil::Connections), &envoy);
        handle.signal("SIGTERM");
        let outcome = task.await.unwrap();
        assert!(matches!(outcome, Outcome::Drained(_)), "{outcome:?}");
        assert_between(envoy.stops()[0], 7.0, 7.05);
        assert_eq!(handle.status().left_at_stop, Some(0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_before_the_minimum_does_not_end_the_drain() {
        let envoy = FakeEnvoy::new(true, |_| conns(0));
        let (task, handle) = start(plan(DrainUntil::Requests), &envoy);
        handle.signal("SIGTERM");
        assert_eq!(task.await.unwrap().exit_code(), exit_code::CLEAN);
        assert_between(envoy.stops()[0], 5.0, 5.05);
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_older_than_the_last_non_zero_read_does_not_end_the_drain() {
        // Zero at first, one connection from 3 s to 8 s, zero after.
        let envoy = FakeEnvoy::new(true, |t| conns(u64::from(t >= secs(3.0) && t < secs(8.0))));
        let (task, handle) = start(plan(DrainUntil::Connections), &envoy);
        handle.signal("SIGTERM");
        assert_eq!(task.await.unwrap().exit_code(), exit_code::CLEAN);
        assert_between(envoy.stops()[0], 8.0, 8.05);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_read_at_the_minimum_does_not_reuse_the_zero_read_before_it() {
        // Zero, but every read between 4.9 s and 6 s fails.
        let envoy = FakeEnvoy::new(true, |t| {
            if t >= secs(4.9) && t < secs(6.0) {
                refused()
            } else {
                conns(0)
            }
        });
        let (task, handle) = start(plan(DrainUntil::Connections), &envoy);
        handle.signal("SIGTERM");
        assert_eq!(task.await.unwrap().exit_code(), exit_code::CLEAN);
        assert_between(envoy.stops()[0], 6.0, 6.05);
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_cuts_a_drain_with_connections_left() {
        let envoy = FakeEnvoy::new(true, |_| conns(3));
        let mut p = plan(DrainUntil::Connections);
        p.deadline = secs(10.0);
        let (task, handle) = start(p, &envoy);
        handle.signal("SIGTERM");
        let outcome = task.await.unwrap();
        assert!(matches!(outcome, Outcome::Cut { left: Some(3), .. }), "{outcome:?}");
        assert_eq!(outcome.exit_code(), exit_code::CUT_BY_DEADLINE);
        assert_between(envoy.stops()[0], 10.0, 10.0);
        let status = handle.status();
        assert!(status.cut_by_deadline);
        assert_eq!(status.left_at_stop, Some(3));
        assert_eq!(status.active_connections, Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_inside_the_pre_drain_delay_stops_envoy_at_the_deadline() {
        let envoy = FakeEnvoy::new(true, |_| conns(2));
        let mut p = plan(DrainUntil::Connections);
        p.delay = secs(20.0);
        p.deadline = secs(10.0);
        let (task, handle) = start(p, &envoy);
        handle.signal("SIGTERM");
        at(&envoy, 9.0).await;
        assert_eq!(handle.status().phase, Phase::Delaying);
        let outcome = task.await.unwrap();
        assert_eq!(outcome.exit_code(), exit_code::CUT_BY_DEADLINE, "{outcome:?}");
        // Envoy was never asked to drain: the deadline came first.
        assert_eq!(envoy.drain_calls(), []);
        assert_between(envoy.stops()[0], 10.0, 10.02);
    }

    #[tokio::test(start_paused = true)]
    async fn the_pre_drain_delay_keeps_envoy_serving_then_drains() {
        let envoy = FakeEnvoy::new(true, |_| conns(0));
        let mut p = plan(DrainUntil::Connections);
        p.delay = secs(3.0);
        p.minimum = secs(1.0);
        let (task, handle) = start(p, &envoy);
        handle.signal("SIGTERM");
        at(&envoy, 2.0).await;
        assert_eq!(handle.status().phase, Phase::Delaying);
        assert_eq!(task.await.unwrap().exit_code(), exit_code::CLEAN);
        let drains = envoy.drain_calls();
        assert_eq!(drains.len(), 1);
        assert_eq!(drains[0].0, secs(3.0));
        assert_between(envoy.stops()[0], 4.0, 4.05);
    }

    #[tokio::test(start_paused = true)]
    async fn envoy_exiting_mid_drain_ends_it_with_code_4_and_no_stop() {
        let envoy = FakeEnvoy::new(true, |_| conns(1));
        let (task, handle) = start(plan(DrainUntil::Connections), &envoy);
        handle.signal("SIGTERM");
        at(&envoy, 3.0).await;
        envoy.exit(1);
        let outcome = task.await.unwrap();
        assert!(
            matches!(outcome, Outcome::EnvoyExited(s) if s.code() == Some(1)),
            "{outcome:?}"
        );
        assert_eq!(outcome.exit_code(), exit_code::ENVOY_EXITED);
        assert_eq!(envoy.stops(), []);
        assert_eq!(handle.status().phase, Phase::Stopped);
    }

    #[tokio::test(start_paused = true)]
    async fn envoy_exiting_before_any_drain_ends_the_machine() {
        let envoy = FakeEnvoy::new(true, |_| conns(0));
        let (task, handle) = start(plan(DrainUntil::Time), &envoy);
        at(&envoy, 1.0).await;
        envoy.exit(0);
        assert_eq!(task.await.unwrap().exit_code(), exit_code::ENVOY_EXITED);
        assert_eq!(handle.status().phase, Phase::Stopped);
        assert_eq!(envoy.calls(), []);
    }

    #[tokio::test(start_paused = true)]
    async fn an_external_envoy_that_stops_answering_is_gone_after_a_second() {
        let envoy = FakeEnvoy::new(false, |t| if t < secs(2.0) { conns(1) } else { refused() });
        let (task, handle) = start(plan(DrainUntil::Connections), &envoy);
        handle.signal("SIGTERM");
        let outcome = task.await.unwrap();
        assert_eq!(outcome, Outcome::EnvoyGone);
        assert_eq!(outcome.exit_code(), exit_code::ENVOY_EXITED);
        assert_eq!(envoy.stops(), []);
        let status = handle.status();
        assert_eq!(status.phase, Phase::Stopped);
        assert!(status.last_read_error.unwrap().contains("cannot connect"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusing_child_envoy_is_not_declared_gone() {
        // A child's exit is seen directly: refusals alone are read failures.
        let envoy = FakeEnvoy::new(true, |t| if t < secs(2.0) { conns(1) } else { refused() });
        let mut p = plan(DrainUntil::Connections);
        p.deadline = secs(6.0);
        let (task, handle) = start(p, &envoy);
        handle.signal("SIGTERM");
        let outcome = task.await.unwrap();
        assert!(matches!(outcome, Outcome::Cut { left: Some(1), .. }), "{outcome:?}");
        assert_eq!(envoy.stops(), [secs(6.0)]);
    }

    #[tokio::test(start_paused = true)]
    async fn repeated_and_mixed_signals_make_one_drain() {
        let envoy = FakeEnvoy::new(true, |_| conns(0));
        let (task, handle) = start(plan(DrainUntil::Time), &envoy);
        handle.signal("SIGTERM");
        at(&envoy, 1.0).await;
        handle.signal("SIGINT");
        at(&envoy, 2.0).await;
        handle.signal("SIGTERM");
        assert_eq!(handle.status().trigger, Some("SIGTERM"));
        assert!(matches!(task.await.unwrap(), Outcome::Drained(_)));
        assert_eq!(envoy.drain_calls().len(), 1);
        assert_eq!(envoy.stops(), [secs(5.0)]);
    }

    #[tokio::test(start_paused = true)]
    async fn post_drain_answers_when_drained_and_envoy_runs_until_sigterm() {
        let envoy = FakeEnvoy::new(true, |t| conns(u64::from(t < secs(7.0))));
        let (task, handle) = start(plan(DrainUntil::Connections), &envoy);
        let h = handle.clone();
        let waiter = tokio::spawn(async move {
            let status = h.drain().await;
            (Instant::now(), status)
        });
        let (answered, status) = waiter.await.unwrap();
        let status = status.expect("drained");
        assert_eq!(status.phase, Phase::Drained);
        assert_eq!(status.trigger, Some("POST /drain"));
        assert!(!status.stop_requested);
        assert_between(answered - envoy.0.t0, 7.0, 7.05);
        // Envoy keeps its listeners after its drain time (skip_exit) and is
        // not stopped until the signal.
        assert!(matches!(
            envoy.drain_calls()[0].1,
            Call::DrainListeners { skip_exit: true, .. }
        ));
        // A second POST /drain answers at once.
        assert_eq!(handle.drain().await.unwrap().phase, Phase::Drained);
        at(&envoy, 20.0).await;
        assert_eq!(envoy.stops(), []);
        handle.signal("SIGTERM");
        let outcome = task.await.unwrap();
        assert!(matches!(outcome, Outcome::Drained(_)), "{outcome:?}");
        assert_eq!(envoy.stops(), [secs(20.0)]);
        assert_eq!(handle.status().phase, Phase::Stopped);
    }

    #[tokio::test(start_paused = true)]
    async fn sigterm_during_post_drain_stops_envoy_once_drained() {
        let envoy = FakeEnvoy::new(true, |t| conns(u64::from(t < secs(7.0))));
        let (task, handle) = start(plan(DrainUntil::Connections), &envoy);
        let h = handle.clone();
        let waiter = tokio::spawn(async move { h.drain().await });
        at(&envoy, 2.0).await;
        handle.signal("SIGTERM");
        let mut status = handle.watch();
        status.wait_for(|s| s.stop_requested).await.unwrap();
        assert_eq!(status.borrow().phase, Phase::Draining);
        assert!(matches!(task.await.unwrap(), Outcome::Drained(_)));
        assert!(waiter.await.unwrap().is_some());
        assert_between(envoy.stops()[0], 7.0, 7.05);
    }

    #[tokio::test(start_paused = true)]
    async fn quitquitquit_during_a_drain_stops_envoy_at_once() {
        let envoy = FakeEnvoy::new(true, |_| conns(4));
        let (task, handle) = start(plan(DrainUntil::Connections), &envoy);
        handle.signal("SIGTERM");
        at(&envoy, 2.0).await;
        assert!(handle.quit().await);
        let outcome = task.await.unwrap();
        assert!(matches!(outcome, Outcome::Quit(_)), "{outcome:?}");
        assert_eq!(outcome.exit_code(), exit_code::CLEAN);
        assert_eq!(envoy.stops(), [secs(2.0)]);
    }

    #[tokio::test(start_paused = true)]
    async fn quitquitquit_before_a_drain_stops_envoy_without_draining() {
        let envoy = FakeEnvoy::new(true, |_| conns(4));
        let (task, handle) = start(plan(DrainUntil::Connections), &envoy);
        assert!(handle.quit().await);
        assert!(matches!(task.await.unwrap(), Outcome::Quit(_)));
        assert_eq!(envoy.drain_calls(), []);
        assert_eq!(envoy.stops(), [Duration::ZERO]);
    }

    #[tokio::test(start_paused = true)]
    async fn slow_and_failed_reads_never_count_as_zero() {
        // Reads take 3 s (past the 1 s read timeout) until 4 s, fail until
        // 6 s, then say zero.
        let envoy = FakeEnvoy::new(true, |t| {
            if t < secs(4.0) {
                (secs(3.0), conns(0).1)
            } else if t < secs(6.0) {
                refused()
            } else {
                conns(0)
            }
        });
        let mut p = plan(DrainUntil::Connections);
        p.minimum = secs(1.0);
        let (task, handle) = start(p, &envoy);
        handle.signal("SIGTERM");
        at(&envoy, 2.5).await;
        let status = handle.status();
        assert!(
            status
                .last_read_error
                .as_deref()
                .unwrap_or("")
                .contains("did not finish within 1s"),
            "{status:?}"
        );
        assert_eq!(status.active_connections, None);
        assert_eq!(task.await.unwrap().exit_code(), exit_code::CLEAN);
        // Not before the first zero that was really read (after 6 s), and
        // at once then: reads that timed out do not pace the next ones.
        assert_between(envoy.stops()[0], 6.0, 6.05);
    }

    #[tokio::test(start_paused = true)]
    async fn the_fixed_policy_reports_connections_while_it_waits() {
        let envoy = FakeEnvoy::new(true, |t| conns(if t < secs(2.0) { 5 } else { 1 }));
        let (task, handle) = start(plan(DrainUntil::Time), &envoy);
        handle.signal("SIGTERM");
        at(&envoy, 1.0 + 0.5).await;
        assert_eq!(handle.status().active_connections, Some(5));
        task.await.unwrap();
        assert_eq!(handle.status().active_connections, Some(1));
    }

    /// The app, scripted like Envoy: its sockets as a function of time.
    #[derive(Clone)]
    struct FakeApp {
        t0: Instant,
        sockets: Arc<dyn Fn(Duration) -> usize + Send + Sync>,
    }

    impl AppControl for FakeApp {
        async fn work(&self) -> Result<Work, String> {
            let n = (self.sockets)(self.t0.elapsed());
            let socket = app::AppSocket {
                local: "127.0.0.1:41234".parse().unwrap(),
                remote: Some("127.0.0.1:15001".parse().unwrap()),
                pid: Some(7),
            };
            Ok(Work {
                sockets: vec![socket; n],
                processes: Vec::new(),
            })
        }
    }

    fn start_with_app(
        plan: Plan,
        envoy: &FakeEnvoy,
        sockets: impl Fn(Duration) -> usize + Send + Sync + 'static,
    ) -> (tokio::task::JoinHandle<Outcome>, DrainHandle) {
        let app = FakeApp {
            t0: envoy.0.t0,
            sockets: Arc::new(sockets),
        };
        let (drain, handle) = Drain::new(plan, envoy.clone(), app);
        (tokio::spawn(drain.run()), handle)
    }

    #[tokio::test(start_paused = true)]
    async fn app_exit_waits_for_the_apps_outbound_calls_after_envoy_is_idle() {
        // Inbound requests end at 1 s; the app calls out through Envoy until
        // 4 s (one request in Envoy, one socket of the app's), then exits.
        let envoy = FakeEnvoy::new(true, |t| {
            conns(u64::from(t < secs(1.0) || (t >= secs(2.0) && t < secs(4.0))))
        });
        let mut p = plan(DrainUntil::AppExit);
        p.minimum = secs(1.0);
        let (task, handle) = start_with_app(p, &envoy, |t| usize::from(t < secs(4.2)));
        handle.signal("SIGTERM");
        at(&envoy, 3.0).await;
        let status = handle.status();
        assert_eq!(
            status.waiting_on.as_deref(),
            Some("1 requests in flight; 1 app socket (127.0.0.1:41234 -> 127.0.0.1:15001)")
        );
        assert_eq!(status.app_sockets, Some(1));
        let outcome = task.await.unwrap();
        assert!(matches!(outcome, Outcome::Drained(_)), "{outcome:?}");
        // Stopped once nothing was seen for APP_QUIET, within one read
        // period more.
        assert_between(envoy.stops()[0], 4.3, 4.35);
        let status = handle.status();
        assert_eq!(status.left_at_stop, Some(0));
        assert_eq!(status.waiting_on, None);
    }

    #[tokio::test(start_paused = true)]
    async fn app_exit_is_cut_by_the_deadline_with_what_the_app_still_holds() {
        let envoy = FakeEnvoy::new(true, |_| conns(0));
        let mut p = plan(DrainUntil::AppExit);
        p.deadline = secs(8.0);
        let (task, handle) = start_with_app(p, &envoy, |_| 2);
        handle.signal("SIGTERM");
        let outcome = task.await.unwrap();
        assert!(matches!(outcome, Outcome::Cut { left: Some(2), .. }), "{outcome:?}");
        assert_eq!(outcome.exit_code(), exit_code::CUT_BY_DEADLINE);
        assert_eq!(envoy.stops(), [secs(8.0)]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_fixed_policy_stopping_envoy_with_requests_in_flight_exits_3() {
        let envoy = FakeEnvoy::new(true, |_| conns(1));
        let (task, handle) = start(plan(DrainUntil::Time), &envoy);
        handle.signal("SIGTERM");
        let outcome = task.await.unwrap();
        assert!(matches!(outcome, Outcome::Unfinished { left: 1, .. }), "{outcome:?}");
        assert_eq!(outcome.exit_code(), exit_code::CUT_BY_DEADLINE);
        let status = handle.status();
        assert_eq!(status.left_at_stop, Some(1));
        assert!(!status.cut_by_deadline);
        assert_eq!(envoy.stops(), [secs(5.0)]);
    }

    #[tokio::test(start_paused = true)]
    async fn slow_reads_space_themselves_to_a_tenth_of_envoys_time() {
        // Every read takes 200 ms: reads start 2 s apart, not every 50 ms.
        let starts = Arc::new(Mutex::new(Vec::new()));
        let seen = starts.clone();
        let t0 = Instant::now();
        let envoy = FakeEnvoy::new(true, move |t| {
            seen.lock().unwrap().push(t);
            (Duration::from_millis(200), conns(u64::from(t < secs(9.0))).1)
        });
        assert_eq!(envoy.0.t0, t0);
        let mut p = plan(DrainUntil::Connections);
        p.minimum = secs(1.0);
        let (task, handle) = start(p, &envoy);
        handle.signal("SIGTERM");
        task.await.unwrap();
        let starts = starts.lock().unwrap().clone();
        for pair in starts.windows(2) {
            assert!(pair[1] - pair[0] >= secs(2.0), "{starts:?}");
        }
        // Each read and the pause after it: Envoy busy a tenth of the time.
        let busy = Duration::from_millis(200) * (starts.len() as u32 - 1);
        let span = *starts.last().unwrap() - starts[0];
        assert!(
            busy.as_secs_f64() / span.as_secs_f64() <= 0.1001,
            "{busy:?} of {span:?}"
        );
        // The drain still ends at the first zero read after 9 s.
        assert_between(envoy.stops()[0], 9.0, 11.3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hook_starts_the_pods_clock_before_sigterm() {
        // wait-app-exit tells the agent at 0 s; SIGTERM comes at 5 s (when
        // the hook returns). The deadline counts from the hook.
        let envoy = FakeEnvoy::new(true, |_| conns(1));
        let mut p = plan(DrainUntil::Connections);
        p.deadline = secs(10.0);
        let (task, handle) = start(p, &envoy);
        let status = handle.begin().await.expect("the drain began");
        assert_eq!(status.phase, Phase::Draining, "readiness is 503 when begin() answers");
        assert_eq!(status.trigger, Some("POST /drain"));
        at(&envoy, 5.0).await;
        handle.signal("SIGTERM");
        let outcome = task.await.unwrap();
        assert!(matches!(outcome, Outcome::Cut { left: Some(1), .. }), "{outcome:?}");
        assert_eq!(envoy.stops(), [secs(10.0)]);
    }

    #[tokio::test(start_paused = true)]
    async fn one_slow_read_does_not_stall_the_drain() {
        // Reads take 2 ms, but one (at 1 s) takes 900 ms: the pause after it
        // follows the shortest recent read, not the outlier.
        let envoy = FakeEnvoy::new(true, |t| {
            let delay = if t >= secs(1.0) && t < secs(1.05) { 900 } else { 2 };
            (Duration::from_millis(delay), conns(u64::from(t < secs(2.0))).1)
        });
        let mut p = plan(DrainUntil::Connections);
        p.minimum = secs(1.0);
        let (task, handle) = start(p, &envoy);
        handle.signal("SIGTERM");
        task.await.unwrap();
        assert_between(envoy.stops()[0], 2.0, 2.1);
    }

    #[tokio::test(start_paused = true)]
    async fn app_exit_is_not_fooled_by_a_moment_without_app_sockets() {
        // The app answers its last request at 1 s, holds nothing for 60 ms,
        // then calls out (one socket) until 3 s.
        let envoy = FakeEnvoy::new(true, |_| conns(0));
        let mut p = plan(DrainUntil::AppExit);
        p.minimum = secs(0.5);
        let gap = |t: Duration| t >= secs(1.0) && t < secs(1.06);
        let (task, handle) = start_with_app(p, &envoy, move |t| usize::from(t < secs(3.0) && !gap(t)));
        handle.signal("SIGTERM");
        task.await.unwrap();
        assert_between(envoy.stops()[0], 3.1, 3.15);
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_read_stuck_behind_a_long_scrape_does_not_stall_the_drain() {
        // Envoy's admin is busy for the first second (the first read times
        // out), then answers in 2 ms; the count reaches zero at 2 s.
        let envoy = FakeEnvoy::new(true, |t| {
            let delay = if t < secs(1.0) { 2000 } else { 2 };
            (Duration::from_millis(delay), conns(u64::from(t < secs(2.0))).1)
        });
        let mut p = plan(DrainUntil::Connections);
        p.minimum = secs(1.0);
        let (task, handle) = start(p, &envoy);
        handle.signal("SIGTERM");
        task.await.unwrap();
        assert_between(envoy.stops()[0], 2.0, 2.1);
    }
}
