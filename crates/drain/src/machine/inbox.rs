//! The drain machine's inbox: the events that reach it while it waits,
//! and what they leave behind for it to act on.

use std::future::Future;
use std::pin::{pin, Pin};
use std::process::ExitStatus;

use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{sleep_until, Instant};

use crate::handle::Event;
use crate::kubelet::NotServingBecause;
use crate::ports::EnvoyControl;
use crate::status::{PhaseCell, Status};
use lifeguard_base::duration::GoDuration;

/// Why a wait inside the drain ended early.
pub(super) enum Interrupt {
    EnvoyExited(ExitStatus),
    EnvoyGone,
    Quit,
}

/// The events, and what they leave behind for the machine to act on.
pub(super) struct Inbox {
    pub(super) events: mpsc::Receiver<Event>,
    pub(super) open: bool,
    pub(super) status: watch::Sender<Status>,
    /// The phase alone, for the probe's path.
    pub(super) phase: PhaseCell,
    /// When the first stop signal came (the kubelet's SIGTERM): Envoy
    /// stops once drained, and the kubelet gives a container at least 2 s
    /// after it (`Plan::stop_bound`).
    pub(super) signalled_at: Option<Instant>,
    pub(super) waiters: Vec<oneshot::Sender<Status>>,
    pub(super) drained: bool,
    pub(super) quit_reply: Option<oneshot::Sender<()>>,
    /// While the kubelet is answered as Envoy is: when its window ends,
    /// and how long it lasts from the drain's start (the probe reads the
    /// end from the cell; the machine says it, whatever it waits on).
    pub(super) kubelet_window: Option<(Instant, Duration)>,
}

impl Inbox {
    /// Whether a stop signal came: Envoy stops once drained.
    pub(super) fn stop_requested(&self) -> bool {
        self.signalled_at.is_some()
    }

    /// Runs `fut` while handling events; ends early if Envoy exits or a
    /// quit is asked for.
    pub(super) async fn race<T>(
        &mut self,
        envoy: &impl EnvoyControl,
        fut: impl Future<Output = T>,
    ) -> Result<T, Interrupt> {
        tokio::pin!(fut);
        loop {
            if let Some(out) = self.step(envoy, fut.as_mut()).await? {
                return Ok(out);
            }
        }
    }

    /// One step of a wait: `fut`'s end (Some), or an event handled or the
    /// kubelet's window closed (None); Envoy's exit and a quit interrupt.
    async fn step<T>(
        &mut self,
        envoy: &impl EnvoyControl,
        fut: Pin<&mut impl Future<Output = T>>,
    ) -> Result<Option<T>, Interrupt> {
        let window = self.kubelet_window;
        let window_ends = window.map_or_else(far, |(at, _)| at);
        let event = tokio::select! {
            biased;
            status = envoy.exited() => return Err(Interrupt::EnvoyExited(status)),
            event = self.events.recv(), if self.open => event,
            () = sleep_until(window_ends), if window.is_some() => {
                self.kubelet_window_over();
                return Ok(None);
            }
            out = fut => return Ok(Some(out)),
        };
        self.handle(event)?;
        Ok(None)
    }

    /// The node's load balancers have had their time: the kubelet is
    /// answered 503 from now (the probe saw the window's end in the cell).
    fn kubelet_window_over(&mut self) {
        let Some((_, serving_window)) = self.kubelet_window.take() else {
            return;
        };
        tracing::info!(
            "the kubelet is answered 503 from now, {} into the drain: {}",
            GoDuration(serving_window),
            NotServingBecause::NodeLoadBalancersTime.words()
        );
        self.kubelet_turned(serving_window.as_secs_f64(), NotServingBecause::NodeLoadBalancersTime);
    }

    /// The drain turned the kubelet's answer to 503 `after` its start,
    /// `because` (the first turn is kept): its window closes now.
    pub(super) fn kubelet_turned(&mut self, after: f64, because: NotServingBecause) {
        self.kubelet_window = None;
        self.phase.kubelet_window_ends(Instant::now(), because);
        self.publish(|s| {
            if let Some(kubelet) = &mut s.kubelet {
                kubelet.turned(after, because);
            }
        });
    }

    /// Waits (handling events) until a signal asks for Envoy's stop.
    pub(super) async fn wait_for_signal(&mut self, envoy: &impl EnvoyControl) -> Result<(), Interrupt> {
        let mut never = pin!(std::future::pending::<()>());
        while !self.stop_requested() {
            self.step(envoy, never.as_mut()).await?;
        }
        Ok(())
    }

    /// One event during a drain.
    fn handle(&mut self, event: Option<Event>) -> Result<(), Interrupt> {
        match event {
            None => self.open = false,
            Some(Event::Signal(signal)) => {
                if self.stop_requested() {
                    tracing::info!(%signal, "signal received again; the drain goes on unchanged");
                } else {
                    tracing::info!(%signal, "signal received; Envoy stops once drained");
                    self.signalled_at = Some(Instant::now());
                    self.publish(|s| {
                        s.stop_requested = true;
                        s.stop_signal = Some(signal);
                    });
                }
            }
            Some(Event::Drain(_, reply)) => {
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

    pub(super) fn publish(&self, f: impl FnOnce(&mut Status)) {
        self.status.send_modify(|s| {
            f(s);
            self.phase.set(s.phase, s.kubelet.as_ref().map(|k| k.answer));
        });
    }
}

/// A time no wait reaches (a timer that is never armed still needs one).
fn far() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365)
}
