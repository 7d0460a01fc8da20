//! The drain machine's inbox: the events that reach it while it waits,
//! and what they leave behind for it to act on.

use std::future::Future;
use std::process::ExitStatus;

use tokio::sync::{mpsc, oneshot, watch};

use crate::handle::Event;
use crate::ports::EnvoyControl;
use crate::status::{PhaseCell, Status};

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
    pub(super) stop_requested: bool,
    pub(super) waiters: Vec<oneshot::Sender<Status>>,
    pub(super) drained: bool,
    pub(super) quit_reply: Option<oneshot::Sender<()>>,
}

impl Inbox {
    /// Runs `fut` while handling events; ends early if Envoy exits or a
    /// quit is asked for.
    pub(super) async fn race<T>(
        &mut self,
        envoy: &impl EnvoyControl,
        fut: impl Future<Output = T>,
    ) -> Result<T, Interrupt> {
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
    pub(super) async fn wait_for_signal(&mut self, envoy: &impl EnvoyControl) -> Result<(), Interrupt> {
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
            Some(Event::Signal(signal)) => {
                if self.stop_requested {
                    tracing::info!(%signal, "signal received again; the drain goes on unchanged");
                } else {
                    tracing::info!(%signal, "signal received; Envoy stops once drained");
                    self.stop_requested = true;
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
