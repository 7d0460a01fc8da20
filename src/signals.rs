//! Process signals, caught from start-up on: a SIGTERM during start-up must
//! drain too, not kill lifeguard with the default action. Every signal is
//! handed to the drain, which starts on the first and logs the rest.

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;

use crate::drain::DrainHandle;

/// SIGTERM and SIGINT.
pub struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    /// Installs the handlers. Call before anything that may take time.
    pub fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Turns every signal into a drain event until shutdown.
    pub async fn forward(mut self, drain: DrainHandle, shutdown: CancellationToken) {
        loop {
            let name = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.term.recv() => "SIGTERM",
                _ = self.int.recv() => "SIGINT",
            };
            drain.signal(name);
        }
    }
}
