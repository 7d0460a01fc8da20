//! Process signals, caught from start-up on: a SIGTERM during start-up must
//! drain too, not kill lifeguard with the default action.
//!
//! - SIGTERM, SIGINT and SIGQUIT are handed to the drain, which starts on
//!   the first and logs the rest.
//! - SIGHUP, SIGUSR1 and SIGUSR2 are logged and ignored: their default
//!   action would kill lifeguard at once, without a drain, and Envoy with it.
//! - As PID 1 (a container's entrypoint), lifeguard is the parent of every
//!   orphaned process in the container and must reap them, or they stay
//!   zombies. On each SIGCHLD it reaps its zombie children, except the ones
//!   it launched itself (Envoy), which their own waiter reaps: a blind
//!   `waitpid(-1)` would steal Envoy's exit status ([`crate::pod::reaper`]).

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;

use crate::drain::DrainHandle;

/// A signal handler could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("cannot install signal handlers")]
pub(crate) struct SignalsError(#[from] std::io::Error);

/// The signals lifeguard handles.
pub(crate) struct Signals {
    term: Signal,
    int: Signal,
    quit: Signal,
    hup: Signal,
    usr1: Signal,
    usr2: Signal,
    /// SIGCHLD, when lifeguard is PID 1 and so reaps orphans.
    child: Option<Signal>,
}

impl Signals {
    /// Installs the handlers. Call before anything that may take time.
    pub(crate) fn install() -> Result<Signals, SignalsError> {
        let pid1 = std::process::id() == 1;
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            quit: signal(SignalKind::quit())?,
            hup: signal(SignalKind::hangup())?,
            usr1: signal(SignalKind::user_defined1())?,
            usr2: signal(SignalKind::user_defined2())?,
            child: if pid1 { Some(signal(SignalKind::child())?) } else { None },
        })
    }

    /// Turns signals into drain events, and reaps orphans on SIGCHLD (as
    /// PID 1, leaving `own_children` to their waiters), until shutdown.
    pub(crate) async fn forward(mut self, drain: DrainHandle, own_children: Vec<i32>, shutdown: CancellationToken) {
        if self.child.is_some() {
            tracing::info!("running as PID 1: orphaned processes are reaped");
            crate::pod::reaper::reap_orphans(&own_children);
        }
        loop {
            let received = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.term.recv() => Received::Drain(lifeguard_drain::Signal::Term),
                _ = self.int.recv() => Received::Drain(lifeguard_drain::Signal::Int),
                _ = self.quit.recv() => Received::Drain(lifeguard_drain::Signal::Quit),
                _ = self.hup.recv() => Received::Ignored("SIGHUP"),
                _ = self.usr1.recv() => Received::Ignored("SIGUSR1"),
                _ = self.usr2.recv() => Received::Ignored("SIGUSR2"),
                Some(()) = recv(&mut self.child) => {
                    crate::pod::reaper::reap_orphans(&own_children);
                    continue;
                }
            };
            match received {
                Received::Drain(signal) => tokio::select! {
                    // A full queue waits its turn; shutdown does not wait for it.
                    () = drain.signal(signal) => {}
                    () = shutdown.cancelled() => return,
                },
                Received::Ignored(name) => tracing::info!(signal = name, "signal received; ignored"),
            }
        }
    }
}

/// A signal received: one the drain takes, or one logged and ignored
/// (named for the log).
enum Received {
    Drain(lifeguard_drain::Signal),
    Ignored(&'static str),
}

/// The next signal of an optional stream; never resolves without one.
async fn recv(signal: &mut Option<Signal>) -> Option<()> {
    match signal {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}
