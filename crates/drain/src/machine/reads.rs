//! The drain's reads while it waits as the policy says: Envoy's active
//! counts and the app's work, side by side, each under a timeout, and what
//! a read found, published.

use std::pin::pin;
use std::time::Duration;

use tokio::time::{sleep_until, Instant};

use super::inbox::Interrupt;
use super::Drain;
use crate::policy::{Pacer, Progress};
use crate::ports::{ActiveRead, AppControl, ControlError, EnvoyControl, Work};
use crate::rotation::Rotation;
use crate::{APP_SCAN, APP_SCAN_MAX, EXTERNAL_GONE_AFTER, WARN_EVERY};
use lifeguard_base::duration::GoDuration;
use lifeguard_base::throttle::Throttle;

/// A read under a timeout: its answer, its failure, or no answer in time.
pub(super) enum Read<T, E = ControlError> {
    Answered(T),
    Failed(E),
    TimedOut,
}

impl<T, E> Read<T, E> {
    /// What `tokio::time::timeout` made of a read.
    pub(super) fn of(read: Result<Result<T, E>, tokio::time::error::Elapsed>) -> Read<T, E> {
        match read {
            Ok(Ok(answer)) => Read::Answered(answer),
            Ok(Err(e)) => Read::Failed(e),
            Err(_) => Read::TimedOut,
        }
    }

    pub(super) fn answered(&self) -> bool {
        matches!(self, Read::Answered(_))
    }
}

/// The drain's looks at the app: when the last one began, and their pace:
/// the next begins [`APP_SCAN`] after it, or [`PACE`](crate::PACE) times
/// the recent looks' time if longer, up to [`APP_SCAN_MAX`].
#[derive(Default)]
pub(super) struct Looks {
    pacer: Pacer,
    last: Option<Instant>,
}

impl Looks {
    /// The time from the start of one look to the next.
    pub(super) fn gap(&self) -> Duration {
        self.pacer.gap(APP_SCAN).min(APP_SCAN_MAX)
    }

    /// When the next look is due (now, before the first).
    fn next(&self) -> Instant {
        self.last.map_or_else(Instant::now, |last| last + self.gap())
    }

    /// One look at the app under `timeout`; its start and (when it
    /// answered) its time are kept.
    async fn take<A: AppControl>(&mut self, app: &A, timeout: Duration) -> Read<Work, A::Error> {
        let started = Instant::now();
        self.last = Some(started);
        let look = Read::of(tokio::time::timeout(timeout, app.work()).await);
        if look.answered() {
            self.pacer.answered(started.elapsed());
        }
        look
    }
}

/// Since when an Envoy that is not lifeguard's child has refused
/// connections: gone once it has for [`EXTERNAL_GONE_AFTER`] (a child's
/// exit is seen directly).
#[derive(Debug, Default)]
pub(super) struct Refusals {
    since: Option<Instant>,
}

impl Refusals {
    /// Envoy refused a connection at `now`: gone, once it has refused
    /// them long enough.
    pub(super) fn refused(&mut self, now: Instant) -> Result<(), Interrupt> {
        let since = *self.since.get_or_insert(now);
        match now.duration_since(since) >= EXTERNAL_GONE_AFTER {
            true => Err(Interrupt::EnvoyGone),
            false => Ok(()),
        }
    }

    /// Envoy was heard from (or the look says nothing of it).
    pub(super) fn reset(&mut self) {
        self.since = None;
    }
}

/// How long one round of the drain's reads waits: Envoy's count read (as
/// the port's record of reads says, within the deadline) and a look at the
/// app (the admin timeout at most: a look's time is the kernel's, not
/// Envoy's, and a slow Envoy must not let a look stall past the deadline).
#[derive(Debug, Clone, Copy)]
pub(super) struct ReadTimeouts {
    pub(super) envoy: Duration,
    pub(super) look: Duration,
}

/// What the reads of one wait remember between them.
pub(super) struct Seen {
    /// The count the policy counts at the last successful read.
    pub(super) left: Option<u64>,
    /// An external Envoy's refusals.
    refusals: Refusals,
    pub(super) progress: Progress,
    read_warning: Throttle,
    skipped_warning: Throttle,
    app_warning: Throttle,
}

impl Default for Seen {
    fn default() -> Self {
        Self {
            left: None,
            refusals: Refusals::default(),
            progress: Progress::default(),
            read_warning: Throttle::new(WARN_EVERY),
            skipped_warning: Throttle::new(WARN_EVERY),
            app_warning: Throttle::new(WARN_EVERY),
        }
    }
}

impl<E: EnvoyControl, A: AppControl, R: Rotation> Drain<E, A, R> {
    /// One read of Envoy's active counts and, with `app-exit`, of the app's
    /// work, side by side, each under its own of `timeouts`: Envoy's answer and the
    /// app's (None: not watched), taken by `looks`.
    pub(super) async fn read_once(
        &mut self,
        timeouts: ReadTimeouts,
        looks: &mut Looks,
    ) -> Result<(Read<ActiveRead>, Option<Read<Work, A::Error>>), Interrupt> {
        let watch_app = self.watch_app;
        let (envoy, app) = (&self.envoy, &self.app);
        let ReadTimeouts { envoy: timeout, look } = timeouts;
        let envoy_read = async { Read::of(tokio::time::timeout(timeout, envoy.active(timeout)).await) };
        let app_read = async {
            match watch_app {
                true => Some(looks.take(app, look).await),
                false => None,
            }
        };
        self.inbox
            .race(envoy, async { tokio::join!(envoy_read, app_read) })
            .await
    }

    /// Until `next` (the next read of Envoy), looks at the app alone when
    /// `looks` says a look is due, and at once when it says one of its
    /// processes exited; returns early once a look finds it holds nothing:
    /// the next read of both then begins at once. A look that fails or
    /// times out changes nothing (the next read of both says it). The
    /// processes' exits are watched once per set of processes a look found
    /// (a pidfd each, opened once), and not again for the same set once
    /// they fired.
    pub(super) async fn watch_app_until(
        &mut self,
        next: Instant,
        work: Work,
        timeout: Duration,
        looks: &mut Looks,
    ) -> Result<(), Interrupt> {
        let (envoy, app) = (&self.envoy, &self.app);
        let mut watched = work.processes;
        let mut exits = pin!(app.changed(watched.clone()));
        let mut armed = true;
        loop {
            let look_at = next.min(looks.next());
            let woken = async {
                tokio::select! {
                    () = sleep_until(look_at) => {}
                    () = exits.as_mut(), if armed => armed = false,
                }
            };
            self.inbox.race(envoy, woken).await?;
            if Instant::now() >= next {
                return Ok(());
            }
            if let Read::Answered(now) = self.inbox.race(envoy, looks.take(app, timeout)).await? {
                if now.is_done() {
                    return Ok(());
                }
                if now.processes != watched {
                    watched = now.processes;
                    exits.set(app.changed(watched.clone()));
                    armed = true;
                }
            }
        }
    }

    /// Publishes what a read of Envoy found; the count the policy counts
    /// in Envoy, when the read answered. An external Envoy that refuses
    /// connections for [`EXTERNAL_GONE_AFTER`] is gone.
    pub(super) fn take_envoy_read(
        &mut self,
        read: Read<ActiveRead>,
        timeout: Duration,
        now: Instant,
        seen: &mut Seen,
    ) -> Result<Option<u64>, Interrupt> {
        let error = match read {
            Read::Answered(ActiveRead { active, .. }) => {
                seen.refusals.reset();
                if !active.skipped.is_empty() && seen.skipped_warning.due(now) {
                    for skipped in &active.skipped {
                        tracing::warn!("not counted: {skipped}");
                    }
                }
                self.inbox.publish(|s| {
                    s.active_connections = Some(active.connections);
                    s.active_requests = Some(active.requests);
                    s.active_tcp = Some(active.tcp);
                    s.last_read_error = None;
                });
                return Ok(Some(self.plan.count(&active)));
            }
            Read::Failed(e) => {
                if matches!(e, ControlError::Refused(_)) && !self.envoy.is_child() {
                    seen.refusals.refused(now)?;
                }
                e.to_string()
            }
            Read::TimedOut => format!("the read did not finish within {}", GoDuration(timeout)),
        };
        if seen.read_warning.due(now) {
            tracing::warn!(error = %error, "cannot read active counts; the drain goes on");
        }
        self.inbox.publish(|s| s.last_read_error = Some(error));
        Ok(None)
    }

    /// Publishes what a look at the app found; the app's work, when known
    /// (none, when the policy does not watch the app).
    pub(super) fn take_app_read(
        &mut self,
        read: Option<Read<Work, A::Error>>,
        now: Instant,
        seen: &mut Seen,
    ) -> Option<Work> {
        let Some(read) = read else {
            return Some(Work::default());
        };
        let work = match read {
            Read::Answered(work) => work,
            Read::Failed(e) => {
                if seen.app_warning.due(now) {
                    tracing::warn!(error = %e, "cannot see the app's sockets; the drain goes on");
                }
                return None;
            }
            Read::TimedOut => return None,
        };
        let (sockets, processes) = (work.sockets.len() as u64, work.processes.len() as u64);
        self.inbox.publish(|s| {
            s.app_sockets = Some(sockets);
            s.app_processes = Some(processes);
        });
        Some(work)
    }
}
