//! One client's walk through a scrape: the gzip header, Envoy's part from
//! the shared read (cut at the client's budget), lifeguard's part, each
//! app target's part fitted into the answer's format, and the end (`# EOF`
//! in OpenMetrics, the gzip trailer).

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::app::fetch::{self, Piece};
use crate::app::lines::{note_families, LineFilter};
use crate::counters::Incomplete;
use crate::format::Format;
use crate::gzip::{GzTail, GZIP_HEADER};
use crate::read::{Place, Read};
use crate::request::ScrapeRequest;
use crate::shared::Shared;
use crate::window::{End, Next};
use lifeguard_base::reason::Label;

/// Where one client's body is.
pub(crate) enum Step {
    Start,
    Envoy,
    Ours,
    /// The app target of this index (past the last: the end).
    App(usize),
    Done,
}

/// One app target's read, as a client takes it.
pub(crate) struct AppRead {
    rx: mpsc::UnboundedReceiver<Piece>,
    filter: Option<LineFilter>,
    /// The read's memory slot, held until its part is sent.
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// One client's walk through a scrape.
pub(crate) struct Client {
    pub(crate) shared: Arc<Shared>,
    pub(crate) req: ScrapeRequest,
    pub(crate) deadline: Instant,
    pub(crate) read: Option<Arc<Read>>,
    pub(crate) step: Step,
    /// This client's place in the read.
    pub(crate) place: Option<Place>,
    /// CRC-32 and length of the plain text sent compressed so far.
    pub(crate) crc: u32,
    pub(crate) len: u64,
    /// The app targets' reads, in order.
    pub(crate) apps: Vec<AppRead>,
    /// The families already in this answer.
    pub(crate) taken: HashSet<String>,
    /// This client's own compressor, after Envoy's shared blocks.
    pub(crate) gz: Option<GzTail>,
}

impl Client {
    /// The next piece of the body (possibly empty), or None at its end.
    pub(crate) async fn next(&mut self) -> Option<Bytes> {
        match self.step {
            Step::Start => {
                self.start_apps();
                let joined = self.shared.join(&self.req.query, self.deadline, self.req.gzip);
                (self.read, self.place) = joined.map_or((None, None), |(read, place)| (Some(read), Some(place)));
                self.step = if self.read.is_some() { Step::Envoy } else { Step::Ours };
                Some(if self.req.gzip {
                    Bytes::from_static(&GZIP_HEADER)
                } else {
                    Bytes::new()
                })
            }
            Step::Envoy => self.envoy().await,
            Step::Ours => {
                self.step = Step::App(0);
                let ours = self.shared.ours();
                note_families(&ours, &mut self.taken);
                if !self.req.format.is_open_metrics() {
                    return Some(self.emit(ours));
                }
                // Our text as OpenMetrics: no blank lines, no `untyped`.
                let mut out = Vec::with_capacity(ours.len());
                LineFilter::new(Format::Text, self.req.format).push(&ours, &HashSet::new(), &mut out);
                Some(self.emit(Bytes::from(out)))
            }
            Step::App(i) if i < self.apps.len() => Some(self.app(i).await),
            Step::App(_) => {
                self.step = Step::Done;
                let eof: &[u8] = if self.req.format.is_open_metrics() {
                    b"# EOF\n"
                } else {
                    b""
                };
                if !self.req.gzip {
                    return Some(Bytes::from_static(eof));
                }
                let tail = self.gz.take().unwrap_or_else(|| GzTail::new(self.crc, self.len));
                Some(tail.finish(eof))
            }
            Step::Done => None,
        }
    }

    /// Starts reading every app target, within this scrape's budget.
    fn start_apps(&mut self) {
        let inner = &*self.shared;
        self.apps = inner
            .apps
            .iter()
            .map(|app| AppRead {
                rx: fetch::start(&app.target, self.req.format, self.deadline, inner.app_slots.clone()),
                filter: None,
                _slot: None,
            })
            .collect();
    }

    /// The next piece of Envoy's part; past its end, on to ours.
    async fn envoy(&mut self) -> Option<Bytes> {
        let read = self.read.clone()?;
        let next = match self.place.as_mut()? {
            Place::Gzip(cursor) => match cursor.next(Some(self.deadline)).await {
                Next::Item(chunk) => {
                    self.crc = chunk.crc;
                    self.len = chunk.len;
                    Next::Item(chunk.data)
                }
                Next::End(end) => Next::End(end),
                Next::Timeout => Next::Timeout,
            },
            Place::Plain(cursor) => cursor.next(Some(self.deadline)).await,
        };
        match next {
            Next::Item(chunk) => return Some(chunk),
            Next::End(End::Complete) => {}
            Next::End(End::Cut(why)) => self.shared.envoy_counters.incomplete(why),
            Next::Timeout => {
                self.shared.envoy_counters.incomplete(Incomplete::Timeout);
                tracing::debug!(
                    budget_ms = self.req.budget.as_millis() as u64,
                    "a scrape took what Envoy had sent by its timeout"
                );
            }
        }
        if let Some(families) = &read.families {
            let families = families.lock().unwrap_or_else(|e| e.into_inner());
            self.taken.extend(families.iter().cloned());
        }
        // Done with Envoy: leave the read (it is freed with its last client).
        (self.read, self.place) = (None, None);
        self.step = Step::Ours;
        Some(Bytes::new())
    }

    /// The next piece of app target `i`'s part; past its end, the next.
    async fn app(&mut self, i: usize) -> Bytes {
        let app = &mut self.apps[i];
        match app.rx.recv().await {
            Some(Piece::Start(from, slot)) => {
                app.filter = Some(LineFilter::new(from, self.req.format));
                app._slot = Some(slot);
                Bytes::new()
            }
            Some(Piece::Lines(lines)) => {
                let mut out = Vec::with_capacity(lines.len());
                if let Some(filter) = &mut app.filter {
                    filter.push(&lines, &self.taken, &mut out);
                }
                self.emit(Bytes::from(out))
            }
            Some(Piece::End(why, error)) => {
                self.app_done(i, why, &error);
                Bytes::new()
            }
            None => {
                self.app_done(i, Some(Incomplete::Error), "the read stopped");
                Bytes::new()
            }
        }
    }

    /// App target `i`'s part is over: its families join the answer's, and
    /// what went wrong is counted and logged.
    fn app_done(&mut self, i: usize, why: Option<Incomplete>, error: &str) {
        self.step = Step::App(i + 1);
        let inner = &*self.shared;
        let source = &inner.apps[i];
        let read = &mut self.apps[i];
        read._slot = None;
        if let Some(filter) = read.filter.take() {
            let dropped = filter.finish(&mut self.taken);
            let mut logged = inner.logged_drops.lock().unwrap_or_else(|e| e.into_inner());
            for family in dropped {
                if logged.len() < 1000 && logged.insert(format!("{} {family}", source.label)) {
                    tracing::warn!(
                        target = %source.label, family,
                        "the app's metrics declare a family already in the scrape (Envoy's, lifeguard's or an earlier target's): the app's is left out"
                    );
                }
            }
        }
        if let Some(why) = why {
            source.failures.count(why);
            tracing::warn!(target = %source.label, reason = why.label(), error, "the app's metrics are missing from a scrape or cut short");
        }
    }

    /// `plain` as sent: as it is, or compressed by this client's own
    /// compressor (after Envoy's shared blocks).
    fn emit(&mut self, plain: Bytes) -> Bytes {
        if !self.req.gzip || plain.is_empty() {
            return plain;
        }
        let (crc, len) = (self.crc, self.len);
        self.gz.get_or_insert_with(|| GzTail::new(crc, len)).write(&plain)
    }
}
