//! Which read a scrape takes Envoy's part from: the newest read of the same
//! query string while it still holds its start (running, or whole and
//! fresh), else a new one, at most [`MAX_LIVE_READS`] alive at once (an
//! idle kept one let go to make room); and a client's place in it, from
//! its start (in its compressed copy when the client wants gzip, the
//! compressor started by the first such client).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::counters::{Incomplete, ScrapeRead};
use crate::envoy::produce;
use crate::gzip::compress;
use crate::read::{Live, Place, Read, GZIP_WINDOW, PLAIN_WINDOW};
use crate::shared::Shared;
use crate::window::List;

/// How many Envoy reads may be held in memory at once.
pub(crate) const MAX_LIVE_READS: usize = 2;

impl Shared {
    /// The read this scrape takes Envoy's part from, and its place in it:
    /// joined, started, or none (merging off, or too many reads held).
    pub(crate) fn join(&self, query: &str, deadline: Instant, gzip: bool) -> Option<(Arc<Read>, Place)> {
        let inner = self;
        let admin = inner.admin.as_ref()?;
        let now = Instant::now();
        let mut reads = inner.reads.lock().unwrap_or_else(|e| e.into_inner());
        reads.retain(|_, r| r.strong_count() > 0);
        let newest = reads.get(query).and_then(Weak::upgrade);
        let shared = newest.as_ref().filter(|r| r.shareable(now));
        if let Some(joined) = shared.and_then(|r| Some((r.clone(), r.place(gzip, &inner.shutdown)?))) {
            joined.0.extend(deadline);
            inner.envoy_counters.read(ScrapeRead::Joined);
            return Some(joined);
        }
        if inner.live.load(Ordering::Relaxed) >= MAX_LIVE_READS && !release_idle(&reads) {
            // At the limit: an older read of the same query whose start is
            // still held, or lifeguard's part alone.
            if let Some(joined) = newest.and_then(|r| Some((r.clone(), r.place(gzip, &inner.shutdown)?))) {
                joined.0.extend(deadline);
                inner.envoy_counters.read(ScrapeRead::Joined);
                return Some(joined);
            }
            drop(reads);
            inner.envoy_counters.incomplete(Incomplete::Busy);
            tracing::debug!(
                query,
                "Envoy's metrics left out of a scrape: {MAX_LIVE_READS} reads already held for other clients"
            );
            return None;
        }
        inner.live.fetch_add(1, Ordering::Relaxed);
        let read = Arc::new(Read {
            plain: List::new(PLAIN_WINDOW),
            gzip: OnceLock::new(),
            deadline: Mutex::new(deadline),
            started: now,
            finished: Mutex::new(None),
            release: CancellationToken::new(),
            families: (!inner.apps.is_empty()).then(|| Mutex::new(HashSet::new())),
            _live: Live(inner.live.clone()),
        });
        reads.insert(query.to_owned(), Arc::downgrade(&read));
        inner.envoy_counters.read(ScrapeRead::New);
        // Its first reader joins before anything is read: nothing is dropped
        // before it has it.
        let place = read.place(gzip, &inner.shutdown).expect("a new read holds its start");
        let path = if query.is_empty() {
            "/stats/prometheus".to_owned()
        } else {
            format!("/stats/prometheus?{query}")
        };
        tokio::spawn(produce(
            read.clone(),
            admin.clone(),
            path,
            inner.heartbeat.clone(),
            inner.shutdown.clone(),
        ));
        Some((read, place))
    }
}

impl Read {
    /// A new reader's place from the start (of the compressed copy when
    /// `gzip`, started now if need be); None once the start is gone.
    pub(crate) fn place(self: &Arc<Self>, gzip: bool, shutdown: &CancellationToken) -> Option<Place> {
        if !gzip {
            return self.plain.join().map(Place::Plain);
        }
        let list = match self.gzip.get() {
            Some(list) => list.clone(),
            None => {
                let source = self.plain.join()?;
                let list = List::new(GZIP_WINDOW);
                let _ = self.gzip.set(list.clone());
                tokio::spawn(compress(self.clone(), source, list.clone(), shutdown.clone()));
                list
            }
        };
        list.join().map(Place::Gzip)
    }
}

/// Lets go of one read kept only to be shared (ended, no client on it),
/// making room for a new one; false when there is none.
fn release_idle(reads: &HashMap<String, Weak<Read>>) -> bool {
    for read in reads.values().filter_map(Weak::upgrade) {
        // Held here and by its producer, which only waits to let it go.
        if read.plain.ended().is_some() && Arc::strong_count(&read) == 2 && !read.release.is_cancelled() {
            read.release.cancel();
            return true;
        }
    }
    false
}
