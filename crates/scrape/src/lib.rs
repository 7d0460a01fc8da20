//! The merged scrape (`GET /stats/prometheus` on the status port): Envoy's
//! own `/stats/prometheus`, streamed through, then lifeguard's families,
//! then the app's metrics, in one answer; and the linger that keeps the
//! port up after Envoy stops for a last scrape of it.
//!
//! lifeguard's families themselves (their handles, names and text) are
//! `lifeguard_metrics`'; this crate reads Envoy (through the admin client)
//! and the app, and serves what [`Metrics::render`] writes between them.
//! If Envoy or an app target cannot be read, lifeguard's part is still
//! served and the failure is counted (by
//! [`Incomplete`]). Its pieces: the
//! scrape ([`Scraper`], made by its [`ScraperBuilder`], below), the app's
//! metrics ([`app`]), the [`linger`], and the `[metrics]` section of the
//! settings ([`Settings`], and the [`Plan`] they make: the app's metrics,
//! Envoy's merged or not, the linger).
//!
//! Envoy's body grows with its config (134 KB at 10 clusters, 63 MB at
//! 5,000, about 250 MB at 20,000) and its admin thread is busy for the
//! whole read (1.7 s at 5,000). So:
//!
//! - **Streamed through a bounded window, with back-pressure.** Each
//!   chunk hyper reads from Envoy is pushed, as it is, onto a shared list
//!   (a `read::Read`, a `window` list); clients walk it at their own pace and
//!   send the same `Bytes` (a reference count, never a copy). At most
//!   `read::PLAIN_WINDOW` (4 MiB) of the body is held: Envoy is read only as
//!   fast as the slowest client takes it, and a client that holds the
//!   window full for 2 s while another waits is let go (its Envoy part ends
//!   at a line, counted as `slow`; lifeguard's part follows), so a stalled
//!   client stalls no one and grows nothing. Only the partial line at the
//!   end of a chunk is copied (so every entry ends at a newline and a
//!   scrape cut short is still valid text). The size cap
//!   (`envoy::ENVOY_BODY_CAP`, 1 GiB) is far above what a 20,000-cluster Envoy
//!   sends; hitting it is logged and counted, never silent.
//! - **One Envoy read for concurrent scrapes.** A scrape joins the newest
//!   read for the same query string while the read still holds its start
//!   (it runs and is within its first window, or it is whole), or, once a
//!   whole read completed, for `read::REUSE_MIN` or as long as it took
//!   (whichever is longer; the read is kept that long even with no client
//!   on it). A body larger than the window is not kept after its read.
//!   Under a scrape flood or a tight scrape loop on a small Envoy, Envoy's
//!   admin thread is therefore busy with scrapes at most about half the
//!   time, however many clients there are.
//! - **The client's query string is passed to Envoy** (`?usedonly`,
//!   `?filter=...`), but for `prom_protobuf`, which makes Envoy 1.38 and
//!   later answer protobuf (see `request::envoy_query`): reads are shared
//!   only between equal query strings.
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
//!   a sync flush, itself windowed (`read::GZIP_WINDOW`, 1 MiB). A client sends
//!   the gzip header, the shared blocks, then its own part compressed as
//!   the final block, and a trailer whose CRC continues the shared
//!   stream's: one gzip member, compressed once per read.
//!
//! - **The app's metrics** (`ISTIO_PROMETHEUS_ANNOTATIONS`, see
//!   [`app`]) come last, one part per target in the given order:
//!   each target is read from the scrape's start, beside Envoy, within the
//!   same budget, and fitted into the answer's format line by line; a
//!   family already in the answer is left out of the app's part.
//!
//! Memory bound: a read holds at most its window of Envoy's body and of
//! its compressed copy (5 MiB), whatever Envoy's size; at most
//! `registry::MAX_LIVE_READS` reads are alive at once: past that, a read kept only
//! to be shared (no client on it) is let go to make room; if none is, a
//! scrape joins the newest read for its query if its start is still held,
//! or gets lifeguard's part alone, counted as `busy`. A client holds a
//! place in a list, its own part (a few KB) and, while it compresses that
//! part, a deflate state; an app target's part is held up to its 10 MiB
//! cap until it is sent (at most 4 at once).
//!
//! Files, one concern each:
//!
//! - `request`: what a scrape asks for (query, budget, gzip, format).
//! - `read`: one shared read of Envoy's body, its window and its deadline.
//! - `registry`: which read a scrape joins or starts, and its place in it.
//! - `envoy`: the producer that reads Envoy into a shared read.
//! - `gzip`: the shared compressor and each client's gzip tail.
//! - `client`: one client's walk through its answer.
//! - `shared`: what every scrape shares, and lifeguard's own part.
//! - `window`: the bounded list a read's readers share.
//! - [`mod@format`]: the answer's exposition format, by the client's `Accept`.
//! - [`app`]: the app's targets read and fitted into the answer.
//! - [`linger`]: waiting for a last scrape after Envoy stops.
//! - `settings`: the `[metrics]` settings and their [`Plan`].

pub mod app;
mod client;
mod counters;
mod envoy;
pub mod format;
mod gzip;
pub mod linger;
mod read;
mod registry;
pub(crate) mod request;
mod settings;
mod shared;
pub(crate) mod window;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::stream::{self, Stream, StreamExt};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::app::fetch::MAX_APP_READS;
use crate::linger::Linger;
use client::{Client, Step};
use counters::{AppFailures, EnvoyCounters};
pub use counters::{Incomplete, ScrapeRead};
use lifeguard_drain::DrainHandle;
use lifeguard_drain_wait::DrainWait;
use lifeguard_envoy::admin::AdminClient;
use lifeguard_envoy::poller::Heartbeat;
use lifeguard_envoy::readiness::Readiness;
use lifeguard_istio::annotations::AppMetrics;
use lifeguard_metrics::Metrics;
pub use request::ScrapeRequest;
pub use settings::{Plan, PlanError, Settings};
use shared::{AppSource, Shared};

/// The merged scrape, built and running: what every scrape shares.
/// Cloning shares it. Made by [`Scraper::builder`]; once built, nothing of
/// it is configured again.
#[derive(Clone)]
pub struct Scraper {
    inner: Arc<Shared>,
}

/// The merged scrape being configured: what it reads (Envoy, the app's
/// targets) and whom it tells (the linger, the poller's heartbeat). What
/// is not given is not read or told; [`ScraperBuilder::build`] makes the
/// [`Scraper`] the routes serve.
pub struct ScraperBuilder {
    metrics: Metrics,
    readiness: Readiness,
    admin: Option<AdminClient>,
    drain: Option<DrainHandle>,
    drain_wait: Option<DrainWait>,
    linger: Option<Linger>,
    heartbeat: Heartbeat,
    shutdown: CancellationToken,
    apps: Vec<AppSource>,
}

impl Scraper {
    /// A scrape of lifeguard's families (rendered from `metrics`, with
    /// `readiness`'s verdict) and nothing else, until the builder adds more.
    pub fn builder(metrics: Metrics, readiness: Readiness) -> ScraperBuilder {
        ScraperBuilder {
            metrics,
            readiness,
            admin: None,
            drain: None,
            drain_wait: None,
            linger: None,
            heartbeat: Heartbeat::default(),
            shutdown: CancellationToken::new(),
            apps: Vec::new(),
        }
    }

    /// The linger told of each scrape, if there is one.
    pub fn linger(&self) -> Option<&Linger> {
        self.inner.linger.as_ref()
    }

    /// The body of one scrape: Envoy's part, then lifeguard's, gzipped when
    /// `req.gzip`. Nothing is read from Envoy until the body is polled.
    pub fn body(&self, req: ScrapeRequest) -> impl Stream<Item = Bytes> + Send + 'static {
        let deadline = Instant::now() + req.budget;
        let client = Client {
            shared: self.inner.clone(),
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
}

impl ScraperBuilder {
    /// Serves Envoy's own metrics first, read through `admin` (None:
    /// merging is off, lifeguard's part alone).
    pub fn envoy(mut self, admin: Option<AdminClient>) -> Self {
        self.admin = admin;
        self
    }

    /// Takes the drain gauges from `drain`'s status.
    pub fn drain(mut self, drain: DrainHandle) -> Self {
        self.drain = Some(drain);
        self
    }

    /// Takes the drain wait's gauges from `wait`'s status.
    pub fn drain_wait(mut self, wait: DrainWait) -> Self {
        self.drain_wait = Some(wait);
        self
    }

    /// Tells `linger` of each scrape (the last one, after Envoy stopped,
    /// lets lifeguard exit).
    pub fn linger(mut self, linger: Linger) -> Self {
        self.linger = Some(linger);
        self
    }

    /// Tells `heartbeat` each time Envoy sends a chunk (the poller's proof
    /// that a busy admin thread is alive).
    pub fn heartbeat(mut self, heartbeat: Heartbeat) -> Self {
        self.heartbeat = heartbeat;
        self
    }

    /// Serves the app's metrics from `targets` after lifeguard's part.
    pub fn app_metrics(mut self, targets: &AppMetrics) -> Self {
        let metrics = &self.metrics;
        self.apps = targets
            .0
            .iter()
            .map(|target| AppSource {
                target: target.clone(),
                label: target.label(),
                failures: AppFailures::new(metrics, &target.label()),
            })
            .collect();
        self
    }

    /// Stops Envoy reads under way when `shutdown` is cancelled.
    pub fn shutdown(mut self, shutdown: CancellationToken) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// The scrape, ready to serve.
    pub fn build(self) -> Scraper {
        Scraper {
            inner: Arc::new(Shared {
                admin: self.admin,
                envoy_counters: EnvoyCounters::new(&self.metrics),
                metrics: self.metrics,
                readiness: self.readiness,
                drain: self.drain,
                drain_wait: self.drain_wait,
                linger: self.linger,
                heartbeat: self.heartbeat,
                shutdown: self.shutdown,
                reads: Mutex::new(HashMap::new()),
                live: Arc::new(AtomicUsize::new(0)),
                apps: self.apps,
                app_slots: Arc::new(Semaphore::new(MAX_APP_READS)),
                logged_drops: Mutex::new(HashSet::new()),
            }),
        }
    }
}
