//! The merged scrape (`GET /stats/prometheus` on the status port): Envoy's
//! own `/stats/prometheus`, streamed through, then lifeguard's families.
//!
//! Envoy's body grows with its config (134 KB at 10 clusters, 63 MB at
//! 5,000, about 250 MB at 20,000) and its admin thread is busy for the
//! whole read (1.7 s at 5,000). So:
//!
//! - **Streamed through a bounded window, with back-pressure.** Each
//!   chunk hyper reads from Envoy is pushed, as it is, onto a shared list
//!   ([`Read`], a [`crate::metrics::window`] list); clients walk it at their own pace and
//!   send the same `Bytes` (a reference count, never a copy). At most
//!   [`PLAIN_WINDOW`] (4 MiB) of the body is held: Envoy is read only as
//!   fast as the slowest client takes it, and a client that holds the
//!   window full for 2 s while another waits is let go (its Envoy part ends
//!   at a line, counted as `slow`; lifeguard's part follows), so a stalled
//!   client stalls no one and grows nothing. Only the partial line at the
//!   end of a chunk is copied (so every entry ends at a newline and a
//!   scrape cut short is still valid text). The size cap
//!   ([`ENVOY_BODY_CAP`], 1 GiB) is far above what a 20,000-cluster Envoy
//!   sends; hitting it is logged and counted, never silent.
//! - **One Envoy read for concurrent scrapes.** A scrape joins the newest
//!   read for the same query string while the read still holds its start
//!   (it runs and is within its first window, or it is whole), or, once a
//!   whole read completed, for [`REUSE_MIN`] or as long as it took
//!   (whichever is longer; the read is kept that long even with no client
//!   on it). A body larger than the window is not kept after its read.
//!   Under a scrape flood or a tight scrape loop on a small Envoy, Envoy's
//!   admin thread is therefore busy with scrapes at most about half the
//!   time, however many clients there are.
//! - **The client's query string is passed to Envoy** (`?usedonly`,
//!   `?filter=...`), but for `prom_protobuf`, which makes Envoy 1.38 and
//!   later answer protobuf (see [`envoy_query`]): reads are shared only
//!   between equal query strings.
//! - **`X-Prometheus-Scrape-Timeout-Seconds` bounds the Envoy part**: each
//!   client stops taking Envoy's chunks at its budget (the timeout less a
//!   tenth, at least 200 ms less) and then gets lifeguard's part, whatever
//!   Envoy does. A read runs until the latest budget of its clients; one
//!   cut by the timeout is shared like a complete one (scrapes meanwhile
//!   get what it got), so an Envoy too slow for the timeout is not asked
//!   again at once.
//! - **gzip** when the client accepts it: one compressor per shared read
//!   (started by the first client that wants gzip, and walking the same
//!   list) produces a second shared list of deflate blocks, each ending on
//!   a sync flush, itself windowed ([`GZIP_WINDOW`], 1 MiB). A client sends
//!   the gzip header, the shared blocks, then its own part compressed as
//!   the final block, and a trailer whose CRC continues the shared
//!   stream's: one gzip member, compressed once per read.
//!
//! - **The app's metrics** (`ISTIO_PROMETHEUS_ANNOTATIONS`, see
//!   [`super::app`]) come last, one part per target in the given order:
//!   each target is read from the scrape's start, beside Envoy, within the
//!   same budget, and fitted into the answer's format line by line; a
//!   family already in the answer is left out of the app's part.
//!
//! Memory bound: a read holds at most its window of Envoy's body and of
//! its compressed copy (5 MiB), whatever Envoy's size; at most
//! [`MAX_LIVE_READS`] reads are alive at once: past that, a read kept only
//! to be shared (no client on it) is let go to make room; if none is, a
//! scrape joins the newest read for its query if its start is still held,
//! or gets lifeguard's part alone, counted as `busy`. A client holds a
//! place in a list, its own part (a few KB) and, while it compresses that
//! part, a deflate state; an app target's part is held up to its 10 MiB
//! cap until it is sent (at most 4 at once).

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use flate2::write::DeflateEncoder;
use flate2::Compression;
use futures_util::stream::{self, Stream, StreamExt};
use hyper::header::{HeaderMap, ACCEPT_ENCODING};
use hyper::StatusCode;
use metrics::Counter;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::drain::DrainHandle;
use crate::envoy::admin::{AdminClient, CallOutcome, Endpoint};
use crate::envoy::poller::Heartbeat;
use crate::envoy::readiness::Readiness;
use crate::metrics::app::fetch::{self, Piece, MAX_APP_READS};
use crate::metrics::app::lines::{note_families, Format, LineFilter};
use crate::metrics::app::{AppMetrics, Target};
use crate::metrics::window::{Cursor, End, List, Next, Weight};
use crate::metrics::{Incomplete, Metrics};

/// Largest Envoy body taken into a scrape: far above a 20,000-cluster
/// Envoy's (about 250 MB). Past it the rest is left out, logged and counted.
pub(crate) const ENVOY_BODY_CAP: usize = 1 << 30;
/// Longest line of Envoy's body (a line is the unit a cut scrape keeps).
pub(crate) const LINE_CAP: usize = 1 << 20;
/// The Envoy part's budget when the client sends no scrape timeout
/// (Prometheus' default scrape timeout).
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest scrape timeout honoured.
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(120);
/// A completed read is shared for at least this long.
pub(crate) const REUSE_MIN: Duration = Duration::from_secs(1);
/// How many Envoy reads may be held in memory at once.
pub(crate) const MAX_LIVE_READS: usize = 2;
/// The header Prometheus sends with its scrape timeout.
pub(crate) const SCRAPE_TIMEOUT_HEADER: &str = "x-prometheus-scrape-timeout-seconds";

/// The gzip member header: deflate, no name, no time, unknown OS.
const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// What a scrape request asks for, taken from its query and headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScrapeRequest {
    /// The query string passed to Envoy (without the `?`): the client's,
    /// less what would make Envoy answer protobuf ([`envoy_query`]).
    pub(crate) query: String,
    /// How long Envoy's part may take.
    pub(crate) budget: Duration,
    /// Whether the client accepts gzip.
    pub(crate) gzip: bool,
    /// The answer's format, by the client's `Accept`.
    pub(crate) format: Format,
}

impl ScrapeRequest {
    pub(crate) fn new(query: Option<&str>, headers: &HeaderMap) -> Self {
        let timeout = headers
            .get(SCRAPE_TIMEOUT_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(DEFAULT_TIMEOUT, |s| {
                Duration::from_secs_f64(s.min(MAX_TIMEOUT.as_secs_f64()))
            });
        Self {
            query: envoy_query(query.unwrap_or("")),
            budget: envoy_budget(timeout),
            gzip: accepts_gzip(headers),
            format: Format::for_accept(headers),
        }
    }
}

/// The client's query string as passed to Envoy: every parameter but
/// `prom_protobuf` (its name compared once percent-decoded, as Envoy reads
/// it), which Envoy 1.38 and later answer with protobuf whatever its value,
/// and which a text answer cannot be joined to; earlier Envoys ignore it,
/// so it goes on no version. The other parameters pass as they came.
pub(crate) fn envoy_query(query: &str) -> String {
    let protobuf = |param: &&str| {
        let name = param.split('=').next().unwrap_or("");
        percent_decoded(name) == b"prom_protobuf"
    };
    query
        .split('&')
        .filter(|param| !param.is_empty() && !protobuf(param))
        .collect::<Vec<_>>()
        .join("&")
}

/// `text` with its `%XX` escapes decoded; a `%` not followed by two hex
/// digits is kept as it is.
fn percent_decoded(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// The Envoy part's share of a scrape timeout: a tenth (at least 200 ms)
/// is kept for lifeguard's part and the transfer; at least 50 ms.
pub(crate) fn envoy_budget(timeout: Duration) -> Duration {
    let margin = (timeout / 10).max(Duration::from_millis(200));
    timeout.saturating_sub(margin).max(Duration::from_millis(50))
}

/// Whether `Accept-Encoding` lists gzip (or `*`) with a non-zero weight.
pub(crate) fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
        })
}

/// A run of deflate blocks ending on a sync flush, with the CRC-32 and
/// length of all the plain text compressed up to its end.
#[derive(Clone)]
struct GzChunk {
    data: Bytes,
    crc: u32,
    len: u64,
}

impl Weight for GzChunk {
    fn weight(&self) -> usize {
        self.data.len()
    }
}

/// The most of Envoy's body held for a read at once (see [`crate::metrics::window`]).
pub(crate) const PLAIN_WINDOW: usize = 4 << 20;
/// The most of its compressed copy held at once.
pub(crate) const GZIP_WINDOW: usize = 1 << 20;

/// One read of Envoy's `/stats/prometheus`, shared by the scrapes that
/// join it, freed with the last of them.
struct Read {
    plain: Arc<List<Bytes>>,
    gzip: OnceLock<Arc<List<GzChunk>>>,
    /// The latest budget end among its clients: the read stops there.
    deadline: Mutex<Instant>,
    started: Instant,
    /// When the read ended (with `plain`'s end).
    finished: Mutex<Option<Instant>>,
    /// Cancelled to free a read kept only to be shared, when room is needed.
    release: CancellationToken,
    /// The families of Envoy's body so far (`# TYPE` lines), when app
    /// metrics follow it: the app's copies of them are left out.
    families: Option<Mutex<HashSet<String>>>,
    _live: Live,
}

impl Read {
    fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn extend(&self, deadline: Instant) {
        let mut d = self.deadline.lock().unwrap_or_else(|e| e.into_inner());
        *d = (*d).max(deadline);
    }

    /// Whether a new scrape may share it: its start still held, and
    /// running, or complete and fresh.
    fn shareable(&self, now: Instant) -> bool {
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
struct Live(Arc<AtomicUsize>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The merged scrape's shared state. Cloning shares it.
#[derive(Clone)]
pub struct Scraper {
    inner: Arc<Inner>,
}

struct Inner {
    /// Envoy's admin (None: merging is off, lifeguard's part alone).
    admin: Option<AdminClient>,
    metrics: Metrics,
    readiness: Readiness,
    drain: Option<DrainHandle>,
    heartbeat: Heartbeat,
    shutdown: CancellationToken,
    /// The newest read per query string.
    reads: Mutex<HashMap<String, Weak<Read>>>,
    live: Arc<AtomicUsize>,
    /// The app's metrics targets (none: no app part).
    apps: Vec<AppSource>,
    /// Memory slots for app reads, shared by all scrapes.
    app_slots: Arc<Semaphore>,
    /// App families left out, logged once each (`target family`).
    logged_drops: Mutex<HashSet<String>>,
}

/// One app metrics target and its failure counters (by [`Incomplete`]).
struct AppSource {
    target: Target,
    label: String,
    failures: [Counter; 4],
}

impl Scraper {
    pub fn new(metrics: Metrics, readiness: Readiness, admin: Option<AdminClient>) -> Self {
        Self {
            inner: Arc::new(Inner {
                admin,
                metrics,
                readiness,
                drain: None,
                heartbeat: Heartbeat::default(),
                shutdown: CancellationToken::new(),
                reads: Mutex::new(HashMap::new()),
                live: Arc::new(AtomicUsize::new(0)),
                apps: Vec::new(),
                app_slots: Arc::new(Semaphore::new(MAX_APP_READS)),
                logged_drops: Mutex::new(HashSet::new()),
            }),
        }
    }

    fn inner_mut(&mut self) -> &mut Inner {
        Arc::get_mut(&mut self.inner).expect("configured before it is shared")
    }

    /// Takes the drain gauges from `drain`'s status.
    pub(crate) fn with_drain(mut self, drain: DrainHandle) -> Self {
        self.inner_mut().drain = Some(drain);
        self
    }

    /// Tells `heartbeat` each time Envoy sends a chunk (the poller's proof
    /// that a busy admin thread is alive).
    pub(crate) fn with_heartbeat(mut self, heartbeat: Heartbeat) -> Self {
        self.inner_mut().heartbeat = heartbeat;
        self
    }

    /// Serves the app's metrics from `targets` after lifeguard's part.
    pub(crate) fn with_app_metrics(mut self, targets: &AppMetrics) -> Self {
        let inner = self.inner_mut();
        inner.apps = targets
            .0
            .iter()
            .map(|target| AppSource {
                target: target.clone(),
                label: target.label(),
                failures: inner.metrics.app_scrape(&target.label()),
            })
            .collect();
        self
    }

    /// Stops Envoy reads under way when `shutdown` is cancelled.
    pub(crate) fn with_shutdown(mut self, shutdown: CancellationToken) -> Self {
        self.inner_mut().shutdown = shutdown;
        self
    }

    /// Lifeguard's part, rendered now.
    fn ours(&self) -> Bytes {
        let inner = &*self.inner;
        let status = inner.drain.as_ref().map(DrainHandle::status);
        Bytes::from(inner.metrics.render(&inner.readiness, status.as_ref()))
    }

    /// The body of one scrape: Envoy's part, then lifeguard's, gzipped when
    /// `req.gzip`. Nothing is read from Envoy until the body is polled.
    pub(crate) fn body(&self, req: ScrapeRequest) -> impl Stream<Item = Bytes> + Send + 'static {
        let deadline = Instant::now() + req.budget;
        let client = Client {
            scraper: self.clone(),
            req,
            deadline,
            read: None,
            place: None,
            step: Step::Start,
            crc: 0,
            len: 0,
            apps: Vec::new(),
            taken: HashSet::new(),
            gz: None,
        };
        stream::unfold(client, |mut client| async move {
            let frame = client.next().await?;
            Some((frame, client))
        })
        .filter(|b| std::future::ready(!b.is_empty()))
    }

    /// The read this scrape takes Envoy's part from, and its place in it:
    /// joined, started, or none (merging off, or too many reads held).
    fn join(&self, query: &str, deadline: Instant, gzip: bool) -> Option<(Arc<Read>, Place)> {
        let inner = &*self.inner;
        let admin = inner.admin.as_ref()?;
        let now = Instant::now();
        let mut reads = inner.reads.lock().unwrap_or_else(|e| e.into_inner());
        reads.retain(|_, r| r.strong_count() > 0);
        let newest = reads.get(query).and_then(Weak::upgrade);
        let shared = newest.as_ref().filter(|r| r.shareable(now));
        if let Some(joined) = shared.and_then(|r| Some((r.clone(), r.place(gzip, &inner.shutdown)?))) {
            joined.0.extend(deadline);
            inner.metrics.scrape_read(true);
            return Some(joined);
        }
        if inner.live.load(Ordering::Relaxed) >= MAX_LIVE_READS && !release_idle(&reads) {
            // At the limit: an older read of the same query whose start is
            // still held, or lifeguard's part alone.
            if let Some(joined) = newest.and_then(|r| Some((r.clone(), r.place(gzip, &inner.shutdown)?))) {
                joined.0.extend(deadline);
                inner.metrics.scrape_read(true);
                return Some(joined);
            }
            drop(reads);
            inner.metrics.scrape_incomplete(Incomplete::Busy);
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
        inner.metrics.scrape_read(false);
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

/// A client's place in a read: in Envoy's body, or in its compressed copy.
enum Place {
    Plain(Cursor<Bytes>),
    Gzip(Cursor<GzChunk>),
}

impl Read {
    /// A new reader's place from the start (of the compressed copy when
    /// `gzip`, started now if need be); None once the start is gone.
    fn place(self: &Arc<Self>, gzip: bool, shutdown: &CancellationToken) -> Option<Place> {
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

/// Reads Envoy's body into `read.plain` until it ends, the read's deadline
/// passes, the cap is hit, or lifeguard shuts down.
async fn produce(read: Arc<Read>, admin: AdminClient, path: String, heartbeat: Heartbeat, shutdown: CancellationToken) {
    let started = Instant::now();
    let mut bytes = 0usize;
    let mut tail = BytesMut::new();
    let end = tokio::select! {
        end = fill(&read, &admin, &path, &heartbeat, &mut bytes, &mut tail) => end,
        _ = shutdown.cancelled() => End::Cut(Incomplete::Error),
    };
    *read.finished.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    read.plain.end(end);
    let took = started.elapsed();
    let outcome = match end {
        End::Complete => CallOutcome::Ok,
        End::Cut(Incomplete::Timeout) => CallOutcome::Timeout,
        End::Cut(_) => CallOutcome::Error,
    };
    admin.observe(Endpoint::Prometheus, outcome, took);
    // Kept to be shared only when it can be: whole (a body larger than the
    // window was not kept, so no later scrape could start from it).
    let retain = match end {
        _ if !read.plain.holds_start() => Duration::ZERO,
        End::Complete | End::Cut(Incomplete::Timeout) => REUSE_MIN.max(took),
        End::Cut(_) => Duration::ZERO,
    };
    match end {
        End::Complete => tracing::debug!(path, bytes, took_ms = took.as_millis() as u64, "Envoy's metrics read"),
        End::Cut(Incomplete::Cap) => tracing::warn!(
            path,
            bytes,
            "Envoy's metrics passed the {} MiB cap: the rest is left out of the scrape",
            ENVOY_BODY_CAP >> 20
        ),
        End::Cut(Incomplete::Timeout) => tracing::warn!(
            path,
            bytes,
            took_ms = took.as_millis() as u64,
            "Envoy's metrics cut at the scrape timeout"
        ),
        End::Cut(_) => {}
    }
    // A complete (or timed-out) read stays shareable for a while, also
    // when no client is left on it: scrapes in a tight loop then cost
    // Envoy's admin thread at most about half its time.
    tokio::select! {
        _ = tokio::time::sleep(retain) => {}
        _ = read.release.cancelled() => {}
        _ = shutdown.cancelled() => {}
    }
    drop(read);
}

async fn fill(
    read: &Read,
    admin: &AdminClient,
    path: &str,
    heartbeat: &Heartbeat,
    bytes: &mut usize,
    tail: &mut BytesMut,
) -> End {
    // Envoy's silence is put down to this read for the first client's
    // budget at most (never past MAX_BEATING), however late others join.
    let beat_until = read.deadline().min(read.started + MAX_BEATING);
    let (status, mut body) = match bounded(read, beating(heartbeat, beat_until, admin.open(path))).await {
        None => return End::Cut(Incomplete::Timeout),
        Some(Err(e)) => {
            tracing::debug!(error = %e, "Envoy's metrics left out of the scrape");
            return End::Cut(Incomplete::Error);
        }
        Some(Ok(answer)) => answer,
    };
    if status != StatusCode::OK {
        let mut text = Vec::new();
        while let Some(Ok(Some(chunk))) = bounded(read, body.chunk()).await {
            text.extend_from_slice(&chunk[..chunk.len().min(4096 - text.len().min(4096))]);
            if text.len() >= 4096 {
                break;
            }
        }
        let error = crate::envoy::admin::check_status(status, Bytes::from(text), path).err();
        tracing::debug!(error = %error.map(|e| e.to_string()).unwrap_or_default(), "Envoy's metrics left out of the scrape");
        return End::Cut(Incomplete::Error);
    }
    loop {
        let chunk = match bounded(read, beating(heartbeat, beat_until, body.chunk())).await {
            None => return End::Cut(Incomplete::Timeout),
            Some(Err(e)) => {
                tracing::debug!(error = %e, "Envoy's metrics broke off");
                return End::Cut(Incomplete::Error);
            }
            Some(Ok(None)) => {
                if !tail.is_empty() {
                    tail.extend_from_slice(b"\n");
                    read.plain.push(tail.split().freeze());
                }
                return End::Complete;
            }
            Some(Ok(Some(chunk))) => chunk,
        };
        heartbeat.beat();
        *bytes += chunk.len();
        if *bytes > ENVOY_BODY_CAP {
            return End::Cut(Incomplete::Cap);
        }
        let before = read.plain.len();
        if !push_lines(&read.plain, tail, chunk) {
            tracing::warn!(path, "a line of Envoy's metrics is longer than {} KiB", LINE_CAP >> 10);
            return End::Cut(Incomplete::Error);
        }
        if let Some(families) = &read.families {
            let mut families = families.lock().unwrap_or_else(|e| e.into_inner());
            read.plain.each_from(before, |item| note_families(item, &mut families));
        }
        // Back-pressure: no more than the window ahead of the slowest reader.
        match bounded(read, read.plain.room(read.deadline())).await {
            Some(Ok(())) => {}
            Some(Err(end)) => return end,
            None => return End::Cut(Incomplete::Timeout),
        }
    }
}

/// Pushes the complete lines of `chunk` (after the partial line in
/// `tail`) onto `list`; keeps the new partial line in `tail`. Whole lines
/// are slices of `chunk`; only a line split across chunks is copied.
/// False when a line is longer than [`LINE_CAP`].
fn push_lines(list: &List<Bytes>, tail: &mut BytesMut, mut chunk: Bytes) -> bool {
    if !tail.is_empty() {
        match chunk.iter().position(|&b| b == b'\n') {
            None => {
                tail.extend_from_slice(&chunk);
                return tail.len() <= LINE_CAP;
            }
            Some(nl) => {
                tail.extend_from_slice(&chunk.split_to(nl + 1));
                list.push(tail.split().freeze());
            }
        }
    }
    match chunk.iter().rposition(|&b| b == b'\n') {
        Some(last) => {
            let lines = chunk.split_to(last + 1);
            list.push(lines);
            tail.extend_from_slice(&chunk);
        }
        None => tail.extend_from_slice(&chunk),
    }
    tail.len() <= LINE_CAP
}

/// How often a read waiting on Envoy says so to the poller.
const BEAT_EVERY: Duration = Duration::from_millis(250);
/// The longest a read waiting on Envoy vouches for it.
const MAX_BEATING: Duration = Duration::from_secs(30);

/// Runs `fut` (a wait on Envoy's answer to our own metrics read) and, while
/// it waits, tells the poller that Envoy's admin thread is busy with that
/// read: Envoy serves admin requests one at a time, so a `/ready` that
/// times out meanwhile is queued behind our read, not unanswered by a hung
/// Envoy. Only until `until` (the first client's budget, at most
/// [`MAX_BEATING`]): a hung Envoy is then seen within that bound plus the
/// staleness bound.
async fn beating<F: std::future::Future>(heartbeat: &Heartbeat, until: Instant, fut: F) -> F::Output {
    tokio::pin!(fut);
    let mut beat = tokio::time::interval(BEAT_EVERY);
    loop {
        tokio::select! {
            out = &mut fut => return out,
            _ = beat.tick(), if Instant::now() < until => heartbeat.beat(),
            _ = tokio::time::sleep_until(until), if Instant::now() < until => {}
        }
        if Instant::now() >= until {
            return fut.await;
        }
    }
}

/// Runs `fut` until the read's deadline, which may move later meanwhile.
async fn bounded<F: std::future::Future>(read: &Read, fut: F) -> Option<F::Output> {
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

/// Compresses `read.plain` into `out` as it grows, once for every client
/// of the read that wants gzip.
async fn compress(read: Arc<Read>, mut source: Cursor<Bytes>, out: Arc<List<GzChunk>>, shutdown: CancellationToken) {
    let mut encoder = DeflateEncoder::new(Vec::new(), Compression::fast());
    let mut crc = crc32fast::Hasher::new();
    let mut len = 0u64;
    let mut i = 0u64;
    loop {
        let next = tokio::select! {
            next = source.next(None) => next,
            _ = shutdown.cancelled() => Next::End(End::Cut(Incomplete::Error)),
        };
        let chunk = match next {
            Next::Item(chunk) => chunk,
            Next::End(end) => return out.end(end),
            Next::Timeout => return out.end(End::Cut(Incomplete::Error)),
        };
        i += 1;
        crc.update(&chunk);
        len += chunk.len() as u64;
        // Writing to a Vec cannot fail; flush() is a sync flush.
        let _ = encoder.write_all(&chunk);
        let _ = encoder.flush();
        let data = Bytes::from(std::mem::take(encoder.get_mut()));
        out.push(GzChunk {
            data,
            crc: crc.clone().finalize(),
            len,
        });
        // The compressed copy waits for its slowest reader too.
        match bounded(&read, out.room(read.deadline())).await {
            Some(Ok(())) => {}
            Some(Err(end)) => return out.end(end),
            None => return out.end(End::Cut(Incomplete::Timeout)),
        }
        if i % 16 == 0 {
            tokio::task::yield_now().await;
        }
    }
}

/// Where one client's body is.
enum Step {
    Start,
    Envoy,
    Ours,
    /// The app target of this index (past the last: the end).
    App(usize),
    Done,
}

/// One app target's read, as a client takes it.
struct AppRead {
    rx: mpsc::UnboundedReceiver<Piece>,
    filter: Option<LineFilter>,
    /// The read's memory slot, held until its part is sent.
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// One client's walk through a scrape.
struct Client {
    scraper: Scraper,
    req: ScrapeRequest,
    deadline: Instant,
    read: Option<Arc<Read>>,
    step: Step,
    /// This client's place in the read.
    place: Option<Place>,
    /// CRC-32 and length of the plain text sent compressed so far.
    crc: u32,
    len: u64,
    /// The app targets' reads, in order.
    apps: Vec<AppRead>,
    /// The families already in this answer.
    taken: HashSet<String>,
    /// This client's own compressor, after Envoy's shared blocks.
    gz: Option<GzTail>,
}

impl Client {
    /// The next piece of the body (possibly empty), or None at its end.
    async fn next(&mut self) -> Option<Bytes> {
        match self.step {
            Step::Start => {
                self.start_apps();
                let joined = self.scraper.join(&self.req.query, self.deadline, self.req.gzip);
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
                let ours = self.scraper.ours();
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
        let inner = &*self.scraper.inner;
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
            Next::End(End::Cut(why)) => self.scraper.inner.metrics.scrape_incomplete(why),
            Next::Timeout => {
                self.scraper.inner.metrics.scrape_incomplete(Incomplete::Timeout);
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
        let inner = &*self.scraper.inner;
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
            source.failures[why as usize].increment(1);
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

/// A client's own deflate blocks after the shared ones, and the gzip
/// trailer whose CRC continues the shared stream's.
struct GzTail {
    encoder: DeflateEncoder<Vec<u8>>,
    crc: crc32fast::Hasher,
    len: u64,
}

impl GzTail {
    /// After shared blocks of plain text of CRC `crc` and length `len`.
    fn new(crc: u32, len: u64) -> Self {
        Self {
            encoder: DeflateEncoder::new(Vec::new(), Compression::default()),
            crc: crc32fast::Hasher::new_with_initial_len(crc, len),
            len,
        }
    }

    /// `plain`, compressed up to a sync flush.
    fn write(&mut self, plain: &[u8]) -> Bytes {
        // Writing to a Vec cannot fail; flush() is a sync flush.
        let _ = self.encoder.write_all(plain);
        let _ = self.encoder.flush();
        self.crc.update(plain);
        self.len += plain.len() as u64;
        Bytes::from(std::mem::take(self.encoder.get_mut()))
    }

    /// `plain` as the final block, and the trailer.
    fn finish(mut self, plain: &[u8]) -> Bytes {
        let _ = self.encoder.write_all(plain);
        self.crc.update(plain);
        let total = self.len + plain.len() as u64;
        let mut out = self.encoder.finish().unwrap_or_default();
        out.extend_from_slice(&self.crc.finalize().to_le_bytes());
        out.extend_from_slice(&(total as u32).to_le_bytes());
        Bytes::from(out)
    }
}

/// `ours` as the final deflate block of a gzip member whose earlier blocks
/// (plain text of CRC `crc` and length `len`) were sent, and the trailer.
#[cfg(test)]
fn finish_gzip(ours: &[u8], crc: u32, len: u64) -> Bytes {
    GzTail::new(crc, len).finish(ours)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;
    use std::io::Read as _;

    #[test]
    fn envoy_is_never_asked_for_protobuf_by_the_query() {
        let h = HeaderMap::new();
        let query = |q: &str| ScrapeRequest::new(Some(q), &h).query;
        assert_eq!(query("usedonly&filter=^cluster"), "usedonly&filter=^cluster");
        assert_eq!(query("prom_protobuf=1"), "");
        assert_eq!(query("prom_protobuf"), "");
        assert_eq!(query("usedonly&prom_protobuf=0&filter=x"), "usedonly&filter=x");
        assert_eq!(query("prom%5Fprotobuf=1&usedonly"), "usedonly");
        assert_eq!(query("prom%5fprotobuf&&usedonly&"), "usedonly");
        // Only that name: a value or a longer name is the client's.
        assert_eq!(query("filter=prom_protobuf"), "filter=prom_protobuf");
        assert_eq!(query("prom_protobuf_x=1"), "prom_protobuf_x=1");
        assert_eq!(query("%zz=1&%5"), "%zz=1&%5");
        assert_eq!(ScrapeRequest::new(None, &h).query, "");
    }

    #[test]
    fn scrape_timeout_header_sets_the_budget() {
        let mut h = HeaderMap::new();
        assert_eq!(ScrapeRequest::new(None, &h).budget, Duration::from_secs(9));
        h.insert(SCRAPE_TIMEOUT_HEADER, HeaderValue::from_static("1"));
        assert_eq!(ScrapeRequest::new(None, &h).budget, Duration::from_millis(800));
        h.insert(SCRAPE_TIMEOUT_HEADER, HeaderValue::from_static("2.5"));
        assert_eq!(ScrapeRequest::new(None, &h).budget, Duration::from_millis(2250));
        h.insert(SCRAPE_TIMEOUT_HEADER, HeaderValue::from_static("0.1"));
        assert_eq!(ScrapeRequest::new(None, &h).budget, Duration::from_millis(50));
        for bad in ["-1", "0", "nan", "soon"] {
            h.insert(SCRAPE_TIMEOUT_HEADER, HeaderValue::from_static(bad));
            assert_eq!(ScrapeRequest::new(None, &h).budget, Duration::from_secs(9), "{bad}");
        }
        h.insert(SCRAPE_TIMEOUT_HEADER, HeaderValue::from_static("3600"));
        assert_eq!(ScrapeRequest::new(None, &h).budget, Duration::from_secs(108));
    }

    #[test]
    fn gzip_is_accepted_unless_refused() {
        for (value, want) in [
            ("gzip", true),
            ("deflate, gzip;q=1.0, *;q=0.5", true),
            ("GZIP", true),
            ("*", true),
            ("gzip;q=0", false),
            ("identity", false),
            ("br, deflate", false),
            ("", false),
        ] {
            let mut h = HeaderMap::new();
            h.insert(ACCEPT_ENCODING, HeaderValue::from_static(value));
            assert_eq!(accepts_gzip(&h), want, "{value:?}");
        }
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[test]
    fn lines_are_pushed_whole_and_split_lines_joined() {
        let list = List::new(PLAIN_WINDOW);
        let mut tail = BytesMut::new();
        for chunk in ["a 1\nb ", "2\nc", " 3", "\nd 4\ne 5\n", "f"] {
            assert!(push_lines(&list, &mut tail, Bytes::from_static(chunk.as_bytes())));
        }
        let mut items: Vec<Bytes> = Vec::new();
        list.each_from(0, |item| items.push(item.clone()));
        assert_eq!(items, ["a 1\n", "b 2\n", "c 3\n", "d 4\ne 5\n"]);
        assert!(items.iter().all(|b| b.ends_with(b"\n")));
        assert_eq!(&tail[..], b"f");
        let mut long = BytesMut::new();
        assert!(!push_lines(&list, &mut long, Bytes::from(vec![b'x'; LINE_CAP + 1])));
    }

    #[test]
    fn a_gzip_member_built_from_shared_blocks_and_a_final_part_decodes() {
        // Shared blocks, each ending on a sync flush, as compress() makes.
        let parts: [&[u8]; 3] = [b"envoy_a 1\n", b"envoy_b 2\nenvoy_c 3\n", b"envoy_d 4\n"];
        let mut encoder = DeflateEncoder::new(Vec::new(), Compression::fast());
        let mut crc = crc32fast::Hasher::new();
        let mut body = GZIP_HEADER.to_vec();
        let mut len = 0;
        for p in parts {
            encoder.write_all(p).unwrap();
            encoder.flush().unwrap();
            body.extend_from_slice(&std::mem::take(encoder.get_mut()));
            crc.update(p);
            len += p.len() as u64;
        }
        body.extend_from_slice(&finish_gzip(b"lifeguard_ready 1\n", crc.finalize(), len));
        let mut text = String::new();
        flate2::read::GzDecoder::new(&body[..])
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "envoy_a 1\nenvoy_b 2\nenvoy_c 3\nenvoy_d 4\nlifeguard_ready 1\n");
        // With no Envoy part at all.
        let mut body = GZIP_HEADER.to_vec();
        body.extend_from_slice(&finish_gzip(b"x 1\n", 0, 0));
        let mut text = String::new();
        flate2::read::GzDecoder::new(&body[..])
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "x 1\n");
    }
}
