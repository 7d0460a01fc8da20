//! What every scrape shares: Envoy's admin client, the reads under way by
//! query string, the app's targets and their memory slots, and lifeguard's
//! own part, rendered per scrape.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::read::Read;
use crate::linger::Linger;
use crate::{AppScrapeFailures, Metrics};
use lifeguard_drain::DrainHandle;
use lifeguard_drain_wait::DrainWait;
use lifeguard_envoy::admin::AdminClient;
use lifeguard_envoy::poller::Heartbeat;
use lifeguard_envoy::readiness::Readiness;
use lifeguard_istio::annotations::Target;

/// The merged scrape's state, shared by every scrape ([`super::Scraper`]
/// holds it).
pub(super) struct Shared {
    /// Envoy's admin (None: merging is off, lifeguard's part alone).
    pub(super) admin: Option<AdminClient>,
    pub(super) metrics: Metrics,
    pub(super) readiness: Readiness,
    pub(super) drain: Option<DrainHandle>,
    pub(super) drain_wait: Option<DrainWait>,
    /// Told of each scrape, for the last one after Envoy stopped.
    pub(super) linger: Option<Linger>,
    pub(super) heartbeat: Heartbeat,
    pub(super) shutdown: CancellationToken,
    /// The newest read per query string.
    pub(super) reads: Mutex<HashMap<String, Weak<Read>>>,
    pub(super) live: Arc<AtomicUsize>,
    /// The app's metrics targets (none: no app part).
    pub(super) apps: Vec<AppSource>,
    /// Memory slots for app reads, shared by all scrapes.
    pub(super) app_slots: Arc<Semaphore>,
    /// App families left out, logged once each (`target family`).
    pub(super) logged_drops: Mutex<HashSet<String>>,
}

/// One app metrics target and its failure counters (by [`crate::Incomplete`]).
pub(super) struct AppSource {
    pub(super) target: Target,
    pub(super) label: String,
    pub(super) failures: AppScrapeFailures,
}

impl Shared {
    /// Lifeguard's part, rendered now.
    pub(super) fn ours(&self) -> Bytes {
        let inner = self;
        let status = inner.drain.as_ref().map(DrainHandle::status);
        let wait = inner.drain_wait.as_ref().map(DrainWait::published);
        Bytes::from(inner.metrics.render(&inner.readiness, status.as_ref(), wait.as_ref()))
    }
}
