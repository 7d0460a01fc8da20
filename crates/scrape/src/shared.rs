//! What every scrape shares: Envoy's admin client, the reads under way by
//! query string, the app's targets and their memory slots, and lifeguard's
//! own part, rendered per scrape.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::counters::{AppFailures, EnvoyCounters};
use crate::linger::Linger;
use crate::read::Read;
use lifeguard_drain::DrainHandle;
use lifeguard_drain_wait::DrainWait;
use lifeguard_envoy::admin::AdminClient;
use lifeguard_envoy::poller::Heartbeat;
use lifeguard_envoy::readiness::Readiness;
use lifeguard_istio::annotations::MetricsTarget;
use lifeguard_metrics::Metrics;

/// The merged scrape's state, shared by every scrape ([`crate::Scraper`]
/// holds it).
pub(crate) struct Shared {
    /// Envoy's admin (None: merging is off, lifeguard's part alone).
    pub(crate) admin: Option<AdminClient>,
    pub(crate) metrics: Metrics,
    /// Envoy's part, counted.
    pub(crate) envoy_counters: EnvoyCounters,
    pub(crate) readiness: Readiness,
    pub(crate) drain: Option<DrainHandle>,
    pub(crate) drain_wait: Option<DrainWait>,
    /// Told of each scrape, for the last one after Envoy stopped.
    pub(crate) linger: Option<Linger>,
    pub(crate) heartbeat: Heartbeat,
    pub(crate) shutdown: CancellationToken,
    /// The newest read per query string.
    pub(crate) reads: Mutex<HashMap<String, Weak<Read>>>,
    pub(crate) live: Arc<AtomicUsize>,
    /// The app's metrics targets (none: no app part).
    pub(crate) apps: Vec<AppSource>,
    /// Memory slots for app reads, shared by all scrapes.
    pub(crate) app_slots: Arc<Semaphore>,
    /// App families left out, logged once each (`target family`).
    pub(crate) logged_drops: Mutex<HashSet<String>>,
}

/// One app metrics target and its failure counters (by [`Incomplete`](crate::Incomplete)).
pub(crate) struct AppSource {
    pub(crate) target: MetricsTarget,
    pub(crate) label: String,
    pub(crate) failures: AppFailures,
}

impl Shared {
    /// Lifeguard's part, rendered now.
    pub(crate) fn ours(&self) -> Bytes {
        let inner = self;
        let status = inner.drain.as_ref().map(DrainHandle::status);
        let wait = inner.drain_wait.as_ref().map(DrainWait::published);
        Bytes::from(inner.metrics.render(&inner.readiness, status.as_ref(), wait.as_ref()))
    }
}
