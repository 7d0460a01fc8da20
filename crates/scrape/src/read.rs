//! One read of Envoy's `/stats/prometheus`, shared by the scrapes that
//! join it: its body as a windowed list (and, when a client wants gzip,
//! its compressed copy), the latest budget of its clients, when a new
//! scrape may still share it, and how each client's place in it is kept.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::counters::Incomplete;
use crate::window::{Cursor, End, List, Weight};

/// A completed read is shared for at least this long.
pub(crate) const REUSE_MIN: Duration = Duration::from_secs(1);

/// The most of Envoy's body held for a read at once (see [`crate::window`]).
pub(crate) const PLAIN_WINDOW: usize = 4 << 20;
/// The most of its compressed copy held at once.
pub(crate) const GZIP_WINDOW: usize = 1 << 20;

/// A run of deflate blocks ending on a sync flush, with the CRC-32 and
/// length of all the plain text compressed up to its end.
#[derive(Clone)]
pub(crate) struct GzChunk {
    pub(crate) data: Bytes,
    pub(crate) crc: u32,
    pub(crate) len: u64,
}

impl Weight for GzChunk {
    fn weight(&self) -> usize {
        self.data.len()
    }
}

/// One read of Envoy's `/stats/prometheus`, shared by the scrapes that
/// join it, freed with the last of them.
pub(crate) struct Read {
    pub(crate) plain: Arc<List<Bytes>>,
    pub(crate) gzip: OnceLock<Arc<List<GzChunk>>>,
    /// The latest budget end among its clients: the read stops there.
    pub(crate) deadline: Mutex<Instant>,
    pub(crate) started: Instant,
    /// When the read ended (with `plain`'s end).
    pub(crate) finished: Mutex<Option<Instant>>,
    /// Cancelled to free a read kept only to be shared, when room is needed.
    pub(crate) release: CancellationToken,
    /// The families of Envoy's body so far (`# TYPE` lines), when app
    /// metrics follow it: the app's copies of them are left out.
    pub(crate) families: Option<Mutex<HashSet<String>>>,
    pub(crate) _live: Live,
}

impl Read {
    pub(crate) fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn extend(&self, deadline: Instant) {
        let mut d = self.deadline.lock().unwrap_or_else(|e| e.into_inner());
        *d = (*d).max(deadline);
    }

    /// Whether a new scrape may share it: its start still held, and
    /// running, or complete and fresh.
    pub(crate) fn shareable(&self, now: Instant) -> bool {
        if !self.plain.holds_start() {
            return false;
        }
        match self.plain.ended() {
            None => true,
            // A read that timed out is shared (with what it got) as long as
            // a complete one: Envoy's admin thread, still busy with it, is
            // not handed the next one at once.
            Some(End::Complete | End::Cut(Incomplete::Timeout)) => {
                let finished = self.finished.lock().unwrap_or_else(|e| e.into_inner());
                finished.is_some_and(|f| now.duration_since(f) < REUSE_MIN.max(f.duration_since(self.started)))
            }
            Some(End::Cut(_)) => false,
        }
    }
}

/// Counts live reads: one per [`Read`] value.
pub(crate) struct Live(pub(crate) Arc<AtomicUsize>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A client's place in a read: in Envoy's body, or in its compressed copy.
pub(crate) enum Place {
    Plain(Cursor<Bytes>),
    Gzip(Cursor<GzChunk>),
}

/// Runs `fut` until the read's deadline, which may move later meanwhile.
pub(crate) async fn bounded<F: std::future::Future>(read: &Read, fut: F) -> Option<F::Output> {
    tokio::pin!(fut);
    loop {
        let deadline = read.deadline();
        tokio::select! {
            out = &mut fut => return Some(out),
            _ = tokio::time::sleep_until(deadline) => {
                if read.deadline() <= deadline {
                    return None;
                }
            }
        }
    }
}
