//! The drain: one state machine that owns the phase, the deadline and the
//! policy, and is the only place that decides when Envoy stops.
//!
//! It runs as one task ([`Drain::run`]) fed by [`Event`]s — signals,
//! `POST /drain`, `POST /quitquitquit` — through a [`DrainHandle`]. The
//! sequence on the first SIGTERM or SIGINT:
//!
//! 1. readiness turns 503 `draining` (the sender does this before the event
//!    is even queued, so no network call comes first);
//! 2. optional pre-drain delay: Envoy keeps serving while endpoint removal
//!    propagates;
//! 3. `POST /drain_listeners?inboundonly&graceful` on the admin API
//!    (retried, each try under the admin timeout; a failure is logged and the
//!    sequence goes on);
//! 4. the policy: a fixed time, or zero active connections or requests after
//!    a minimum time, read every 50 ms;
//! 5. Envoy is stopped gracefully. One deadline (grace period less the
//!    shutdown margin, counted from the start of the drain) bounds steps 2–4.
//!
//! `POST /drain` runs steps 1–4 with `skip_exit` and answers when the policy
//! is satisfied; Envoy keeps running until a signal, which then stops it at
//! once. Every wait ends early when Envoy exits on its own.

use std::future::Future;
use std::process::ExitStatus;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::sleep_until;

use crate::admin::{AdminClient, AdminError};
use crate::config::{DrainUntil, Settings};
use crate::duration::Display as D;
use crate::envoy::{Envoy, Exit};
use crate::readiness::Readiness;
use crate::stats::{self, Active};

/// How often active connections or requests are read while waiting for zero,
/// so Envoy stops within about this long after the last one ends.
pub const ZERO_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How long an external Envoy's admin API may refuse connections during a
/// drain before lifeguard concludes Envoy is gone.
const EXTERNAL_GONE_AFTER: Duration = Duration::from_secs(1);
/// Tries of the `drain_listeners` call.
const DRAIN_CALL_TRIES: u32 = 3;

/// Process exit codes.
pub mod exit_code {
    /// Envoy was drained and stopped (or `/quitquitquit` was asked for).
    pub const CLEAN: u8 = 0;
    /// Bad configuration or a start-up error: nothing was started.
    pub const CONFIG: u8 = 2;
    /// The deadline cut the drain while connections or requests were active.
    pub const CUT_BY_DEADLINE: u8 = 3;
    /// Envoy exited on its own (crash, OOM kill, bad config) or vanished.
    pub const ENVOY_EXITED: u8 = 4;
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

/// The drain's phases, in order. The number is the `lifeguard_drain_phase`
/// gauge's value.
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
    /// Why the last read of the active counts failed, if it did.
    pub last_read_error: Option<String>,
    /// Whether a signal asked for Envoy to be stopped once drained.
    pub stop_requested: bool,
    /// Whether the deadline cut the drain.
    pub cut_by_deadline: bool,
    /// Connections (or requests, by the policy) still active when Envoy
    /// was stopped.
    pub left_at_stop: Option<u64>,
    /// Seconds from the start of the drain to Envoy's stop.
    pub duration_seconds: Option<f64>,
}

/// How the agent ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Drained by the policy, then Envoy stopped.
    Drained(Exit),
    /// The deadline cut the drain with `left` still active (None: unknown).
    Cut { left: Option<u64>, exit: Exit },
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
            Outcome::Cut { .. } => exit_code::CUT_BY_DEADLINE,
            Outcome::EnvoyExited(_) | Outcome::EnvoyGone => exit_code::ENVOY_EXITED,
        }
    }
}

/// The handle the status server and the signal task use.
#[derive(Clone)]
pub struct DrainHandle {
    events: mpsc::Sender<Event>,
    status: watch::Receiver<Status>,
    readiness: Readiness,
}

impl DrainHandle {
    /// Reports a signal. Readiness turns 503 before anything else happens.
    pub fn signal(&self, name: &'static str) {
        self.readiness.start_draining();
        let _ = self.events.try_send(Event::Signal(name));
    }

    /// Starts a drain (or joins the one under way) and waits until it is
    /// drained. Readiness turns 503 at once.
    pub async fn drain(&self) -> Option<Status> {
        self.readiness.start_draining();
        let (tx, rx) = oneshot::channel();
        self.events.send(Event::Drain(tx)).await.ok()?;
        rx.await.ok()
    }

    /// Stops Envoy now; resolves once it has stopped.
    pub async fn quit(&self) -> bool {
        self.readiness.start_draining();
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
}

/// Why a wait inside the drain ended early.
enum Interrupt {
    EnvoyExited(ExitStatus),
    EnvoyGone,
    Quit,
}

/// The drain state machine. Build it with [`Drain::new`], run it with
/// [`Drain::run`].
pub struct Drain {
    settings: Settings,
    admin: AdminClient,
    readiness: Readiness,
    envoy: Envoy,
    events: mpsc::Receiver<Event>,
    events_open: bool,
    status: watch::Sender<Status>,
    stop: watch::Sender<bool>,
    waiters: Vec<oneshot::Sender<Status>>,
    quit_reply: Option<oneshot::Sender<()>>,
    drained: bool,
    started: Option<Instant>,
}

impl Drain {
    pub fn new(settings: Settings, admin: AdminClient, readiness: Readiness, envoy: Envoy) -> (Drain, DrainHandle) {
        let (events_tx, events) = mpsc::channel(64);
        let policy = settings.drain_until;
        let (status, status_rx) = watch::channel(Status {
            phase: Phase::Serving,
            trigger: None,
            started_at: None,
            deadline: None,
            policy,
            waiting_for: waiting_for(&settings),
            active_connections: None,
            active_requests: None,
            last_read_error: None,
            stop_requested: false,
            cut_by_deadline: false,
            left_at_stop: None,
            duration_seconds: None,
        });
        let handle = DrainHandle {
            events: events_tx,
            status: status_rx,
            readiness: readiness.clone(),
        };
        let drain = Drain {
            settings,
            admin,
            readiness,
            envoy,
            events,
            events_open: true,
            status,
            stop: watch::channel(false).0,
            waiters: Vec::new(),
            quit_reply: None,
            drained: false,
            started: None,
        };
        (drain, handle)
    }

    /// Runs until Envoy has stopped (or exited on its own).
    pub async fn run(mut self) -> Outcome {
        let trigger = loop {
            let event = tokio::select! {
                status = self.envoy.exited() => return self.envoy_exited(status),
                event = self.events.recv(), if self.events_open => event,
            };
            match event {
                None => self.events_open = false,
                Some(Event::Signal(name)) => {
                    self.stop.send_replace(true);
                    break name;
                }
                Some(Event::Drain(reply)) => {
                    self.waiters.push(reply);
                    break "POST /drain";
                }
                Some(Event::Quit(reply)) => {
                    self.quit_reply = Some(reply);
                    return self.quit().await;
                }
            }
        };
        match self.drain(trigger).await {
            Ok(outcome) => outcome,
            Err(Interrupt::EnvoyExited(status)) => self.envoy_exited(status),
            Err(Interrupt::EnvoyGone) => {
                tracing::error!("Envoy's admin API stopped answering during the drain: Envoy is gone");
                self.publish(|s| s.phase = Phase::Stopped);
                Outcome::EnvoyGone
            }
            Err(Interrupt::Quit) => self.quit().await,
        }
    }

    async fn drain(&mut self, trigger: &'static str) -> Result<Outcome, Interrupt> {
        self.readiness.start_draining();
        let started = Instant::now();
        self.started = Some(started);
        let deadline = started + self.settings.drain_deadline();
        let stop_requested = *self.stop.borrow();
        tracing::info!(
            trigger,
            policy = %self.settings.drain_until,
            waiting_for = %waiting_for(&self.settings),
            deadline_in = %D(self.settings.drain_deadline()),
            "drain started: readiness is 503"
        );
        let now_unix = unix_now();
        self.publish(|s| {
            s.trigger = Some(trigger);
            s.started_at = Some(now_unix);
            s.deadline = Some(now_unix + (deadline - started).as_secs_f64());
            s.stop_requested = stop_requested;
        });

        // 2. Pre-drain delay.
        if !self.settings.drain_delay.is_zero() {
            self.publish(|s| s.phase = Phase::Delaying);
            let until = deadline.min(started + self.settings.drain_delay);
            self.race(sleep_until(until.into())).await?;
        }

        // 3. Envoy drains its inbound listeners.
        self.publish(|s| s.phase = Phase::Draining);
        self.drain_listeners(deadline).await?;
        let drain_began = Instant::now();

        // 4. The policy.
        let (left, satisfied) = self.wait_for_policy(drain_began, deadline).await?;
        let cut = !satisfied;
        self.drained = true;
        let keep_running = !*self.stop.borrow();
        let took = started.elapsed().as_secs_f64();
        self.publish(|s| {
            s.cut_by_deadline = cut;
            s.duration_seconds = Some(took);
            if keep_running {
                s.phase = Phase::Drained;
            }
        });
        let status = self.status.borrow().clone();
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send(status.clone());
        }

        // After `POST /drain`, Envoy keeps running until a signal.
        if keep_running {
            tracing::info!("drained; Envoy keeps running until SIGTERM");
            let mut stop = self.stop.subscribe();
            self.race(async move {
                let _ = stop.wait_for(|v| *v).await;
            })
            .await?;
        }

        // 5. Stop Envoy.
        let exit = self.stop_envoy().await;
        self.publish(|s| s.left_at_stop = left);
        if cut {
            match left {
                Some(n) => tracing::warn!(
                    left = n,
                    counting = counted(self.settings.drain_until),
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

    /// `POST /drain_listeners?inboundonly&graceful`, retried within the
    /// deadline. A failure is logged; the drain goes on.
    async fn drain_listeners(&mut self, deadline: Instant) -> Result<(), Interrupt> {
        let path = if *self.stop.borrow() {
            "/drain_listeners?inboundonly&graceful"
        } else {
            "/drain_listeners?inboundonly&graceful&skip_exit"
        };
        for attempt in 1..=DRAIN_CALL_TRIES {
            let admin = self.admin.clone();
            let left = deadline.saturating_duration_since(Instant::now());
            let result = self
                .race(async move { tokio::time::timeout(left, admin.post(path)).await })
                .await?;
            match result {
                Ok(Ok(_)) => {
                    tracing::info!("Envoy is draining its inbound listeners ({path})");
                    return Ok(());
                }
                Ok(Err(e)) => tracing::warn!(attempt, error = %e, "drain_listeners failed"),
                Err(_) => break,
            }
            if attempt < DRAIN_CALL_TRIES {
                let next = deadline.min(Instant::now() + Duration::from_millis(100));
                self.race(sleep_until(next.into())).await?;
            }
        }
        tracing::error!("could not start Envoy's graceful drain; waiting as the policy says anyway");
        Ok(())
    }

    /// Waits as the policy says, or until the deadline. Returns the active
    /// count (connections or requests, by the policy; connections for the
    /// fixed policy) at the last successful read, and whether the policy was
    /// satisfied (false: the deadline came first).
    async fn wait_for_policy(
        &mut self,
        drain_began: Instant,
        deadline: Instant,
    ) -> Result<(Option<u64>, bool), Interrupt> {
        let until = self.settings.drain_until;
        let (period, min_end) = match until {
            DrainUntil::Time => (
                self.settings.poll_interval,
                drain_began + self.settings.termination_drain_duration,
            ),
            _ => (ZERO_POLL_INTERVAL, drain_began + self.settings.minimum_drain_duration),
        };
        let mut left: Option<u64> = None;
        let mut refused_since: Option<Instant> = None;
        let mut last_log: Option<Instant> = None;
        loop {
            let admin = self.admin.clone();
            let read_timeout = self
                .settings
                .admin_timeout
                .min(deadline.saturating_duration_since(Instant::now()))
                .max(Duration::from_millis(10));
            let read = self
                .race(async move {
                    tokio::time::timeout(
                        read_timeout,
                        admin.get_text(stats::ACTIVE_STATS, crate::admin::STATS_LIMIT),
                    )
                    .await
                })
                .await?;
            let now = Instant::now();
            // Only a count read now may end the drain: an older zero may
            // be stale (a graceful drain still accepts connections).
            let mut read_now = None;
            match read {
                Ok(Ok(body)) => {
                    refused_since = None;
                    let active = stats::active(&body, &self.settings.ignore_listener_ports);
                    for skipped in &active.skipped {
                        tracing::warn!("not counted: {skipped}");
                    }
                    let count = match until {
                        DrainUntil::Requests => active.requests,
                        _ => active.connections,
                    };
                    let log_due = last_log.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1));
                    if left != Some(count) && log_due {
                        tracing::info!(active = count, counting = counted(until), "draining");
                        last_log = Some(now);
                    }
                    left = Some(count);
                    read_now = Some(count);
                    self.publish_active(&active);
                }
                Ok(Err(e)) => {
                    if matches!(e, AdminError::Connect { .. }) && !self.envoy.is_child() {
                        let since = *refused_since.get_or_insert(now);
                        if now.duration_since(since) >= EXTERNAL_GONE_AFTER {
                            return Err(Interrupt::EnvoyGone);
                        }
                    }
                    tracing::warn!(error = %e, "cannot read active counts; the drain goes on");
                    self.publish(|s| s.last_read_error = Some(e.to_string()));
                }
                Err(_) => {
                    let e = "the read did not finish before the deadline".to_string();
                    self.publish(|s| s.last_read_error = Some(e));
                }
            }
            let done = match until {
                DrainUntil::Time => now >= min_end,
                _ => now >= min_end && read_now == Some(0),
            };
            if done {
                let took = now.duration_since(drain_began);
                match until {
                    DrainUntil::Time => tracing::info!(
                        connections = left,
                        "drain time ({}) is over",
                        D(self.settings.termination_drain_duration)
                    ),
                    _ => tracing::info!(took = %D(took), "zero active {until}"),
                }
                return Ok((left, true));
            }
            if now >= deadline {
                return Ok((left, false));
            }
            let next = deadline
                .min(now + period)
                .min(if until == DrainUntil::Time { min_end } else { deadline });
            self.race(sleep_until(next.into())).await?;
        }
    }

    async fn stop_envoy(&mut self) -> Exit {
        self.publish(|s| s.phase = Phase::Stopping);
        let exit = self
            .envoy
            .stop(self.settings.shutdown_margin.max(Duration::from_millis(100)))
            .await;
        let took = self.started.map(|t| t.elapsed().as_secs_f64());
        self.publish(|s| {
            s.phase = Phase::Stopped;
            s.duration_seconds = took;
        });
        exit
    }

    async fn quit(&mut self) -> Outcome {
        self.readiness.start_draining();
        tracing::info!("POST /quitquitquit: stopping Envoy now");
        let exit = self.stop_envoy().await;
        tracing::info!("Envoy stopped ({exit})");
        if let Some(reply) = self.quit_reply.take() {
            let _ = reply.send(());
        }
        Outcome::Quit(exit)
    }

    fn envoy_exited(&mut self, status: ExitStatus) -> Outcome {
        self.readiness.start_draining();
        tracing::error!(%status, "Envoy exited on its own");
        self.publish(|s| s.phase = Phase::Stopped);
        Outcome::EnvoyExited(status)
    }

    /// Runs `fut` while handling events; ends early if Envoy exits or a
    /// quit is asked for.
    async fn race<T>(&mut self, fut: impl Future<Output = T>) -> Result<T, Interrupt> {
        tokio::pin!(fut);
        loop {
            let event = tokio::select! {
                biased;
                status = self.envoy.exited() => return Err(Interrupt::EnvoyExited(status)),
                event = self.events.recv(), if self.events_open => event,
                out = &mut fut => return Ok(out),
            };
            match event {
                None => self.events_open = false,
                Some(Event::Signal(name)) => {
                    if self.stop.send_replace(true) {
                        tracing::info!(signal = name, "signal received again; the drain goes on unchanged");
                    } else {
                        tracing::info!(signal = name, "signal received; Envoy stops once drained");
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
        }
    }

    fn publish(&self, f: impl FnOnce(&mut Status)) {
        self.status.send_modify(f);
    }

    /// Publishes a successful read of the active counts.
    fn publish_active(&self, active: &Active) {
        self.status.send_modify(|s| {
            s.active_connections = Some(active.connections);
            s.active_requests = Some(active.requests);
            s.last_read_error = None;
        });
    }
}

/// What the active count counts under a policy (the fixed policy reports
/// connections).
fn counted(until: DrainUntil) -> &'static str {
    match until {
        DrainUntil::Requests => "requests",
        DrainUntil::Time | DrainUntil::Connections => "connections",
    }
}

fn waiting_for(settings: &Settings) -> String {
    match settings.drain_until {
        DrainUntil::Time => format!("{} of drain time", D(settings.termination_drain_duration)),
        until => format!(
            "zero active {until}, after at least {}",
            D(settings.minimum_drain_duration)
        ),
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
