//! The handle the status server and the signal task use to reach the
//! drain: events in, the published status out.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use super::status::{Phase, PhaseCell, Status};
use super::trigger::{Asker, Signal};

/// What the drain machine is told.
#[derive(Debug)]
pub(crate) enum Event {
    /// SIGTERM, SIGINT or SIGQUIT.
    Signal(Signal),
    /// `POST /drain`: drain, answer when drained, keep Envoy running.
    Drain(Asker, oneshot::Sender<Status>),
    /// `POST /quitquitquit`: stop Envoy now, answer, exit.
    Quit(oneshot::Sender<()>),
}

/// The handle the status server and the signal task use.
#[derive(Clone)]
pub struct DrainHandle {
    pub(super) events: mpsc::Sender<Event>,
    pub(super) status: watch::Receiver<Status>,
    pub(super) phase: PhaseCell,
}

impl DrainHandle {
    /// Reports a signal. It waits its turn behind the events queued before
    /// it (the queue is bounded: a flood of `POST /drain` waits, it is not
    /// dropped), and is never dropped itself: only a drain machine that has
    /// ended, with nothing left to stop, does not take it.
    pub async fn signal(&self, signal: Signal) {
        let _ = self.events.send(Event::Signal(signal)).await;
    }

    /// Starts a drain asked for by `asker` (or joins the one under way)
    /// and waits until it is drained. None when the drain machine has ended.
    pub async fn drain(&self, asker: Asker) -> Option<Status> {
        let (tx, rx) = oneshot::channel();
        self.events.send(Event::Drain(asker, tx)).await.ok()?;
        let mut status = rx.await.ok()?;
        self.phase.fill_kubelet(&mut status);
        Some(status)
    }

    /// Starts a drain asked for by `asker` (or joins the one under way)
    /// without waiting for it: resolves once the phase has left `serving`
    /// (readiness is 503), with the status then. None when the drain
    /// machine has ended.
    pub async fn begin(&self, asker: Asker) -> Option<Status> {
        let (tx, _unanswered) = oneshot::channel();
        self.events.send(Event::Drain(asker, tx)).await.ok()?;
        let mut status = self.status.clone();
        let begun = status.wait_for(|s| s.phase != Phase::Serving);
        let mut status = tokio::time::timeout(Duration::from_secs(1), begun)
            .await
            .ok()?
            .ok()?
            .clone();
        self.phase.fill_kubelet(&mut status);
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

    /// The drain's latest published status, with what the probe answered
    /// the kubelet so far.
    pub fn status(&self) -> Status {
        let mut status = self.status.borrow().clone();
        self.phase.fill_kubelet(&mut status);
        status
    }

    /// The published status, to follow the drain by.
    pub fn watch(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }

    /// The published phase alone: what readiness derives from, read
    /// without a lock the machine's writes take.
    pub fn phase(&self) -> PhaseCell {
        self.phase.clone()
    }
}
