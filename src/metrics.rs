//! lifeguard's own Prometheus metrics, and the merged scrape.
//!
//! Every metric handle is registered once, here, on a recorder that belongs
//! to the agent (no global recorder): the probe path increments a stored
//! counter, with no name lookup or label formatting per request. The drain
//! gauges are taken from the drain's published status at scrape time, so
//! they can never disagree with `GET /drain`.
//!
//! `GET /stats/prometheus` streams Envoy's own `/stats/prometheus`
//! (families named `envoy_*`) and ends with our families (all named
//! `lifeguard_*`, rendered here): the merge is [`crate::scrape`]'s. This
//! module knows nothing of the admin client, and the admin client knows
//! nothing of metrics (the binary wires its call observer to
//! [`Metrics::admin_call`]). If Envoy cannot be read, our part is still
//! served and the failure is counted.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics::{Counter, Gauge, Key, Label, Metadata, Recorder, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use tokio::time::Instant;

use crate::config::DrainUntil;
use crate::drain::{Phase, Status};
use crate::readiness::Readiness;

/// The metric handles, registered once. Cloning shares them.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    /// Kept for the admin-call series, registered as calls happen.
    recorder: Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
    started: Instant,
    /// `lifeguard_probe_responses_total{code="200"}`.
    probe_ok: Counter,
    /// `lifeguard_probe_responses_total{code="503"}`.
    probe_unavailable: Counter,
    ready: Gauge,
    time_to_first_ready: Gauge,
    first_ready_seen: AtomicBool,
    answer_age: Gauge,
    server_state: Gauge,
    drain_phase: Gauge,
    drain_started: Gauge,
    drain_deadline: Gauge,
    drain_duration: Gauge,
    drain_active_connections: Gauge,
    drain_active_requests: Gauge,
    drain_left_at_stop: Gauge,
    drain_cut: Gauge,
    drain_policy: [Gauge; 3],
    readiness_kept: Counter,
    /// `lifeguard_readiness_changes_total{to="ready"}`, `{to="not_ready"}`.
    readiness_changes: [Counter; 2],
    /// `lifeguard_scrape_envoy_reads_total{read="new"}`, `{read="joined"}`.
    scrape_reads: [Counter; 2],
    /// `lifeguard_scrape_envoy_incomplete_total{reason}`, by [`Incomplete`].
    scrape_incomplete: [Counter; 4],
}

/// Why a merged scrape carries less than Envoy's whole body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incomplete {
    /// The scrape's time budget ran out first.
    Timeout = 0,
    /// Envoy could not be read, answered an error, or broke off.
    Error = 1,
    /// Envoy's body passed the size cap.
    Cap = 2,
    /// Too many Envoy reads were already held for slow clients.
    Busy = 3,
}

impl Incomplete {
    pub fn label(self) -> &'static str {
        ["timeout", "error", "cap", "busy"][self as usize]
    }
}

const ADMIN_REQUESTS: &str = "lifeguard_envoy_admin_requests_total";
const ADMIN_DURATION: &str = "lifeguard_envoy_admin_request_duration_seconds";

/// The drain policies and their `policy` label values.
const POLICIES: [(DrainUntil, &str); 3] = [
    (DrainUntil::Time, "time"),
    (DrainUntil::Connections, "connections"),
    (DrainUntil::Requests, "requests"),
];

impl Metrics {
    /// A new set of metrics on its own recorder. `started` is the agent's
    /// start, for the time to first ready.
    pub fn new(started: Instant) -> Metrics {
        let recorder = PrometheusBuilder::new()
            .with_recommended_naming(true)
            .set_buckets_for_metric(
                Matcher::Full(ADMIN_DURATION.into()),
                &[
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                ],
            )
            .expect("static buckets are not empty")
            .build_recorder();
        let recorder = Arc::new(recorder);
        let handle = recorder.handle();
        let r = Registrar { recorder: &recorder };

        let probe_help = "Answers of the readiness probe (/healthz/ready), by status code.";
        recorder.describe_counter(
            ADMIN_REQUESTS.into(),
            None,
            "Requests lifeguard made to Envoy's admin API, by endpoint and outcome.".into(),
        );
        recorder.describe_histogram(
            ADMIN_DURATION.into(),
            Some(Unit::Seconds),
            "Duration of requests to Envoy's admin API, including failures, by endpoint.".into(),
        );
        let inner = Inner {
            recorder: recorder.clone(),
            handle,
            started,
            probe_ok: r.counter("lifeguard_probe_responses_total", &[("code", "200")], probe_help),
            probe_unavailable: r.counter("lifeguard_probe_responses_total", &[("code", "503")], probe_help),
            ready: r.gauge("lifeguard_ready", &[], None, "1 when the readiness probe answers 200, else 0."),
            time_to_first_ready: r.gauge(
                "lifeguard_time_to_first_ready_seconds",
                &[],
                Some(Unit::Seconds),
                "Seconds from lifeguard's start to the first ready answer (0 until then).",
            ),
            first_ready_seen: AtomicBool::new(false),
            answer_age: r.gauge(
                "lifeguard_envoy_admin_answer_age_seconds",
                &[],
                Some(Unit::Seconds),
                "Age of the readiness answer the probe serves: seconds since the poller's last admin read.",
            ),
            server_state: r.gauge(
                "lifeguard_envoy_server_state",
                &[],
                None,
                "Envoy's server.state at the last successful read: 0 LIVE, 1 DRAINING, 2 PRE_INITIALIZING, 3 INITIALIZING; -1 unknown.",
            ),
            drain_phase: r.gauge(
                "lifeguard_drain_phase",
                &[],
                None,
                "Drain phase: 0 serving, 1 delaying, 2 draining, 3 drained (waiting for SIGTERM), 4 stopping Envoy, 5 Envoy stopped.",
            ),
            drain_started: r.gauge(
                "lifeguard_drain_started_timestamp_seconds",
                &[],
                Some(Unit::Seconds),
                "Unix time the drain began (0: no drain).",
            ),
            drain_deadline: r.gauge(
                "lifeguard_drain_deadline_timestamp_seconds",
                &[],
                Some(Unit::Seconds),
                "Unix time by which Envoy is stopped (0: no drain).",
            ),
            drain_duration: r.gauge(
                "lifeguard_drain_duration_seconds",
                &[],
                Some(Unit::Seconds),
                "Seconds the drain has taken: so far while it runs, to Envoy's stop once stopped.",
            ),
            drain_active_connections: r.gauge(
                "lifeguard_drain_active_connections",
                &[],
                None,
                "Envoy's active downstream connections as last read by the drain (agent listeners left out).",
            ),
            drain_active_requests: r.gauge(
                "lifeguard_drain_active_requests",
                &[],
                None,
                "Envoy's active downstream HTTP requests as last read by the drain (agent prefixes left out).",
            ),
            drain_left_at_stop: r.gauge(
                "lifeguard_drain_left_at_stop",
                &[],
                None,
                "Connections (or requests, by the policy) still active when Envoy was stopped.",
            ),
            drain_cut: r.gauge(
                "lifeguard_drain_cut_by_deadline",
                &[],
                None,
                "1 when the deadline cut the drain before the policy was satisfied.",
            ),
            drain_policy: POLICIES.map(|(_, p)| {
                r.gauge(
                    "lifeguard_drain_policy",
                    &[("policy", p)],
                    None,
                    "The drain policy in force: 1 for the one configured (time, connections or requests).",
                )
            }),
            readiness_kept: r.counter(
                "lifeguard_readiness_kept_total",
                &[],
                "Readiness reads that timed out while the last answer was kept (it is trusted until older than the staleness bound).",
            ),
            readiness_changes: ["ready", "not_ready"].map(|to| {
                r.counter(
                    "lifeguard_readiness_changes_total",
                    &[("to", to)],
                    "Changes of the readiness answer, by the answer changed to.",
                )
            }),
            scrape_reads: ["new", "joined"].map(|read| {
                r.counter(
                    "lifeguard_scrape_envoy_reads_total",
                    &[("read", read)],
                    "Merged scrapes by how they got Envoy's metrics: a new Envoy read, or one shared with other scrapes.",
                )
            }),
            scrape_incomplete: [Incomplete::Timeout, Incomplete::Error, Incomplete::Cap, Incomplete::Busy].map(|why| {
                r.counter(
                    "lifeguard_scrape_envoy_incomplete_total",
                    &[("reason", why.label())],
                    "Merged scrapes whose Envoy part is missing or cut short, by reason (timeout, error, cap, busy).",
                )
            }),
        };
        inner.server_state.set(-1.0);
        Metrics { inner: Arc::new(inner) }
    }

    /// The probe's counters, for the status service to keep.
    pub fn probe_counters(&self) -> (Counter, Counter) {
        (self.inner.probe_ok.clone(), self.inner.probe_unavailable.clone())
    }

    /// Records one admin request: `endpoint` and `outcome` are label values.
    /// Admin calls are a few a second at most, so the series are looked up
    /// per call rather than kept as handles.
    pub fn admin_call(&self, endpoint: &'static str, outcome: &'static str, took: Duration) {
        let recorder = &self.inner.recorder;
        let labels = [("endpoint", endpoint), ("outcome", outcome)];
        recorder
            .register_counter(&Registrar::key(ADMIN_REQUESTS, &labels), &META)
            .increment(1);
        recorder
            .register_histogram(&Registrar::key(ADMIN_DURATION, &labels[..1]), &META)
            .record(took.as_secs_f64());
    }

    /// Records what the poller read from Envoy: whether Envoy said ready,
    /// and its `server.state`. (The `lifeguard_ready` gauge is not set here:
    /// it is the probe's own answer, taken at scrape time.)
    pub fn envoy_read(&self, ready: bool, server_state: Option<u64>) {
        let inner = &*self.inner;
        inner.server_state.set(server_state.map_or(-1.0, |s| s as f64));
        if ready && !inner.first_ready_seen.swap(true, Ordering::Relaxed) {
            inner
                .time_to_first_ready
                .set(inner.started.elapsed().as_secs_f64().max(1e-9));
        }
    }

    /// A readiness read timed out and the last answer was kept.
    pub fn readiness_kept(&self) {
        self.inner.readiness_kept.increment(1);
    }

    /// The readiness answer changed to `ready` (or not).
    pub fn readiness_changed(&self, ready: bool) {
        self.inner.readiness_changes[usize::from(!ready)].increment(1);
    }

    /// A merged scrape started a new Envoy read (or joined one under way).
    pub fn scrape_read(&self, joined: bool) {
        self.inner.scrape_reads[usize::from(joined)].increment(1);
    }

    /// A merged scrape carried less than Envoy's whole body.
    pub fn scrape_incomplete(&self, why: Incomplete) {
        self.inner.scrape_incomplete[why as usize].increment(1);
    }

    /// Renders lifeguard's families, with the gauges that are read at
    /// scrape time brought up to date first.
    pub fn render(&self, readiness: &Readiness, drain: Option<&Status>) -> String {
        let inner = &*self.inner;
        inner.answer_age.set(readiness.verdict().at().elapsed().as_secs_f64());
        inner.ready.set(if readiness.answer().ready { 1.0 } else { 0.0 });
        if let Some(status) = drain {
            inner.drain_phase.set(status.phase as u8 as f64);
            inner.drain_started.set(status.started_at.unwrap_or(0.0));
            inner.drain_deadline.set(status.deadline.unwrap_or(0.0));
            let duration = match (status.duration_seconds, status.started_at) {
                (Some(d), _) => d,
                (None, Some(started)) if status.phase != Phase::Serving => (unix_now() - started).max(0.0),
                _ => 0.0,
            };
            inner.drain_duration.set(duration);
            inner
                .drain_active_connections
                .set(status.active_connections.unwrap_or(0) as f64);
            inner
                .drain_active_requests
                .set(status.active_requests.unwrap_or(0) as f64);
            inner.drain_left_at_stop.set(status.left_at_stop.unwrap_or(0) as f64);
            inner.drain_cut.set(if status.cut_by_deadline { 1.0 } else { 0.0 });
            for (gauge, (policy, _)) in inner.drain_policy.iter().zip(POLICIES) {
                gauge.set(if status.policy == policy { 1.0 } else { 0.0 });
            }
        }
        inner.handle.run_upkeep();
        inner.handle.render()
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Registers handles on our recorder.
struct Registrar<'a> {
    recorder: &'a PrometheusRecorder,
}

const META: Metadata<'static> = Metadata::new("lifeguard", metrics::Level::INFO, Some("lifeguard"));

impl Registrar<'_> {
    fn key(name: &'static str, labels: &[(&'static str, &'static str)]) -> Key {
        Key::from_parts(
            name,
            labels
                .iter()
                .map(|(k, v)| Label::from_static_parts(k, v))
                .collect::<Vec<_>>(),
        )
    }

    fn counter(&self, name: &'static str, labels: &[(&'static str, &'static str)], help: &'static str) -> Counter {
        self.recorder.describe_counter(name.into(), None, help.into());
        self.recorder.register_counter(&Self::key(name, labels), &META)
    }

    fn gauge(
        &self,
        name: &'static str,
        labels: &[(&'static str, &'static str)],
        unit: Option<Unit>,
        help: &'static str,
    ) -> Gauge {
        self.recorder.describe_gauge(name.into(), unit, help.into());
        let gauge = self.recorder.register_gauge(&Self::key(name, labels), &META);
        gauge.set(0.0);
        gauge
    }
}
