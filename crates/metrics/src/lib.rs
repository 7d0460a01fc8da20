//! lifeguard's own Prometheus metrics, and the merged scrape.
//!
//! Two kinds of families, both named by the Prometheus conventions:
//!
//! - **Events**, counted as they happen on a recorder that belongs to the
//!   agent (no global recorder), with handles registered once: probe
//!   answers, admin requests and their durations (by `endpoint`), changes
//!   of Envoy's readiness. The probe path increments a stored counter, with
//!   no name lookup or label formatting per request.
//! - **State**, written at scrape time from what it describes, so it can
//!   never disagree with it: the drain's published status (the same one
//!   `GET /drain` shows), the readiness answer, build info and the process
//!   (`process_*`, read from /proc by the `metrics-process` crate). A state
//!   is one series per value with a label set to 1 (`lifeguard_drain_phase
//!   {phase="draining"} 1`), never a number standing for a name; a value
//!   that does not exist yet (no drain, never ready, nothing stopped) has no
//!   series, rather than a 0 that reads as a real value.
//!
//! `GET /stats/prometheus` streams Envoy's own `/stats/prometheus`
//! (families named `envoy_*`) and ends with our families (`lifeguard_*`,
//! `process_*`, rendered here): the merge is [`scrape`]'s; the text format
//! of our state families is [`exposition`]'s. Only the scrape reads Envoy
//! (through the admin client); the families know nothing of the admin
//! client, and the admin client knows nothing of metrics (the agent wires
//! its call observer to [`Metrics::admin_call`]).
//! If Envoy cannot be read, our part is still served and the failure is
//! counted.
//!
//! [`linger`] keeps the port answering after Envoy stops, for a last
//! scrape; `settings` holds the scrape's settings ([`Settings`]: the app's
//! metrics, Envoy's merged or not, the linger) and their [`Plan`].

#![deny(unsafe_code)]
#![warn(clippy::too_many_lines)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics::{Counter, Histogram, Key, Label, Metadata, Recorder, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use tokio::time::Instant;

use exposition::{drain_families, drain_wait_families, process_families, Exposition};
use lifeguard_base::duration::unix_now;
use lifeguard_drain::Status;
use lifeguard_drain_wait::checkers::NotCounted;
use lifeguard_drain_wait::DrainWaitStatus;
use lifeguard_drain_wait::WaitWhy;
use lifeguard_envoy::admin::{CallOutcome, Endpoint};
use lifeguard_envoy::poller::ReadinessEvents;
use lifeguard_envoy::readiness::Readiness;

pub mod app;
pub mod exposition;
pub mod linger;
pub mod scrape;
mod settings;
pub(crate) mod window;

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
    /// `lifeguard_envoy_readiness_changes_total{to="ready"}` and `{to="not_ready"}`.
    became_ready: Counter,
    became_not_ready: Counter,
    /// `lifeguard_readiness_kept_total`.
    readiness_kept: Counter,
    /// `lifeguard_scrape_envoy_reads_total{read="new"}`, `{read="joined"}`.
    scrape_reads: [Counter; 2],
    /// `lifeguard_scrape_envoy_incomplete_total{reason}`, by [`Incomplete`].
    scrape_incomplete: [Counter; 5],
    /// `lifeguard_drain_wait_probes_not_counted_total{reason}`, by
    /// `lifeguard_drain_wait::checkers::NotCounted`.
    probes_not_counted: [Counter; 3],
    /// Seconds from start to the first ready read, once there was one.
    first_ready: OnceLock<f64>,
    /// Unix time of the last admin read Envoy answered, as f64 bits (0: none).
    last_success: AtomicU64,
}

/// One app probe's series.
#[derive(Clone)]
pub struct AppProbeMetrics {
    /// `result="success"`, `"failure"`, `"busy"`.
    pub results: [Counter; 3],
    pub duration: Histogram,
}

/// Why a merged scrape carries less than Envoy's whole body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Incomplete {
    /// The scrape's time budget ran out first.
    Timeout = 0,
    /// Envoy could not be read, answered an error, or broke off.
    Error = 1,
    /// Envoy's body passed the size cap.
    Cap = 2,
    /// Too many Envoy reads were already held for slow clients.
    Busy = 3,
    /// The client held the shared window full while others waited, and
    /// was let go (see [`crate::window`]).
    Slow = 4,
}

impl Incomplete {
    pub(crate) fn label(self) -> &'static str {
        ["timeout", "error", "cap", "busy", "slow"][self as usize]
    }
}

pub mod names;

use names::*;
pub use settings::{app_metrics, Plan, PlanError, Settings};

impl Metrics {
    /// A new set of metrics on its own recorder. `started` is the agent's
    /// start, for the time to first ready.
    pub fn new(started: Instant) -> Metrics {
        let recorder = Arc::new(recorder_with_buckets());
        let handle = recorder.handle();
        let r = Registrar { recorder: &recorder };

        let probe_help = "Answers of the readiness probe (/healthz/ready), by status code.";
        let changes_help = "Changes of Envoy's readiness as lifeguard's reads saw it, by the state changed to.";
        describe_per_call_families(&recorder);
        let inner = Inner {
            recorder: recorder.clone(),
            handle,
            started,
            probe_ok: r.counter(PROBE_RESPONSES, &[("code", "200")], probe_help),
            probe_unavailable: r.counter(PROBE_RESPONSES, &[("code", "503")], probe_help),
            became_ready: r.counter(READINESS_CHANGES, &[("to", "ready")], changes_help),
            became_not_ready: r.counter(READINESS_CHANGES, &[("to", "not_ready")], changes_help),
            readiness_kept: r.counter(
                READINESS_KEPT,
                &[],
                "Readiness reads that timed out while the last answer was kept (it is trusted until older than the staleness bound).",
            ),
            scrape_reads: ["new", "joined"].map(|read| {
                r.counter(
                    SCRAPE_ENVOY_READS,
                    &[("read", read)],
                    "Merged scrapes by how they got Envoy's metrics: a new Envoy read, or one shared with other scrapes.",
                )
            }),
            scrape_incomplete: [
                Incomplete::Timeout,
                Incomplete::Error,
                Incomplete::Cap,
                Incomplete::Busy,
                Incomplete::Slow,
            ]
            .map(|why| {
                r.failure_counted("envoy", r.counter(
                    SCRAPE_ENVOY_INCOMPLETE,
                    &[("reason", why.label())],
                    "Merged scrapes whose Envoy part is missing or cut short, by reason (timeout, error, cap, busy, slow).",
                ))
            }),
            probes_not_counted: NotCounted::ALL.map(|why| {
                r.counter(
                    DRAIN_WAIT_NOT_COUNTED,
                    &[("reason", why.label())],
                    "Readiness probes not counted as a load balancer's checks by the drain wait, by reason: \
                     table_full (every entry an established, probing checker), too_many_agents (the address has \
                     its share of checkers), outside_ranges (not from --drain-wait-checker-ranges).",
                )
            }),
            first_ready: OnceLock::new(),
            last_success: AtomicU64::new(0),
        };
        // Every reason's series exists from the start, at 0: a panel or an
        // alert on the drain wait finds it before the first wait.
        for why in WaitWhy::ALL {
            let series = Registrar::key(DRAIN_WAIT, &[("reason", why.label())]);
            drop(inner.recorder.register_histogram(&series, &META));
        }
        Metrics { inner: Arc::new(inner) }
    }

    /// The counters of probes the drain wait did not count, by
    /// `lifeguard_drain_wait::checkers::NotCounted`.
    pub fn probes_not_counted(&self) -> [Counter; 3] {
        self.inner.probes_not_counted.clone()
    }

    /// The probe's counters, for the status service to keep.
    pub fn probe_counters(&self) -> (Counter, Counter) {
        (self.inner.probe_ok.clone(), self.inner.probe_unavailable.clone())
    }

    /// Records one answered drain wait: why it ended and how long it
    /// waited. A few per pod's life: looked up per call.
    pub fn drain_wait(&self, why: WaitWhy, took: Duration) {
        self.inner
            .recorder
            .register_histogram(&Registrar::key(DRAIN_WAIT, &[("reason", why.label())]), &META)
            .record(took.as_secs_f64());
    }

    /// Records one admin request to `endpoint`, and how it ended. Admin
    /// calls are a few a second at most, so the series are looked up per
    /// call rather than kept as handles.
    pub fn admin_call(&self, endpoint: Endpoint, outcome: CallOutcome, took: Duration) {
        let recorder = &self.inner.recorder;
        let labels = [("endpoint", endpoint.label()), ("outcome", outcome.label())];
        recorder
            .register_counter(&Registrar::key(ADMIN_REQUESTS, &labels), &META)
            .increment(1);
        recorder
            .register_histogram(&Registrar::key(ADMIN_DURATION, &labels[..1]), &META)
            .record(took.as_secs_f64());
    }

    /// The handles of one app probe's series, by its status-port `path`:
    /// its results (success, failure, busy) and the duration of its calls.
    pub fn app_probe(&self, path: &str) -> AppProbeMetrics {
        let recorder = &self.inner.recorder;
        recorder.describe_counter(
            APP_PROBE_RESULTS.into(),
            None,
            "App probes and hooks run through the status port (/app-health, /app-lifecycle), by path and result: \
             success, failure (the app answered no or not in time) or busy (too many of the path in flight)."
                .into(),
        );
        recorder.describe_histogram(
            APP_PROBE_DURATION.into(),
            Some(Unit::Seconds),
            "Duration of the app probes lifeguard ran, by path.".into(),
        );
        let key = |name: &'static str, result: Option<&'static str>| {
            let mut labels = vec![Label::new("path", path.to_owned())];
            labels.extend(result.map(|r| Label::from_static_parts("result", r)));
            Key::from_parts(name, labels)
        };
        AppProbeMetrics {
            results: ["success", "failure", "busy"]
                .map(|r| recorder.register_counter(&key(APP_PROBE_RESULTS, Some(r)), &META)),
            duration: recorder.register_histogram(&key(APP_PROBE_DURATION, None), &META),
        }
    }

    /// A merged scrape got Envoy's metrics from a new read or a shared one.
    pub(crate) fn scrape_read(&self, joined: bool) {
        self.inner.scrape_reads[usize::from(joined)].increment(1);
    }

    /// A merged scrape's Envoy part is missing or cut short.
    pub(crate) fn scrape_incomplete(&self, why: Incomplete) {
        self.inner.scrape_incomplete[why as usize].increment(1);
    }

    /// The handles of one app target's failures
    /// (`lifeguard_scrape_app_incomplete_total{target,reason}`), by
    /// [`Incomplete`]; `target` is its port and path.
    pub fn app_scrape(&self, target: &str) -> [Counter; 4] {
        let recorder = &self.inner.recorder;
        recorder.describe_counter(
            SCRAPE_APP_INCOMPLETE.into(),
            None,
            "Merged scrapes whose part from an app target is missing or cut short, by target (port and path) and \
             reason (timeout, error, cap, busy)."
                .into(),
        );
        [
            Incomplete::Timeout,
            Incomplete::Error,
            Incomplete::Cap,
            Incomplete::Busy,
        ]
        .map(|why| {
            let labels = vec![
                Label::new("target", target.to_owned()),
                Label::from_static_parts("reason", why.label()),
            ];
            let counter = recorder.register_counter(&Key::from_parts(SCRAPE_APP_INCOMPLETE, labels), &META);
            Registrar { recorder }.failure_counted("app", counter)
        })
    }

    /// Renders lifeguard's families: the state read now, then the events.
    pub fn render(&self, readiness: &Readiness, drain: Option<&Status>, wait: Option<&DrainWaitStatus>) -> String {
        let inner = &*self.inner;
        let mut out = Exposition::default();
        out.gauge(BUILD_INFO, "lifeguard's version; always 1.");
        out.sample(BUILD_INFO, &[("version", env!("CARGO_PKG_VERSION"))], 1.0);
        out.gauge(
            READY,
            "1 when the readiness probe answers 200 (Envoy ready and no drain), else 0.",
        );
        out.sample(READY, &[], f64::from(u8::from(readiness.answer().ready)));
        if let Some(&took) = inner.first_ready.get() {
            out.single(
                TIME_TO_FIRST_READY,
                "Seconds from lifeguard's start to Envoy's first ready read.",
                took,
            );
        }
        let last_success = f64::from_bits(inner.last_success.load(Ordering::Relaxed));
        if last_success > 0.0 {
            out.single(
                ADMIN_LAST_SUCCESS,
                "Unix time of the last readiness read Envoy's admin API answered.",
                last_success,
            );
        }
        if let Some(status) = drain {
            drain_families(&mut out, status);
        }
        if let Some(wait) = wait {
            drain_wait_families(&mut out, wait);
        }
        process_families(&mut out);
        inner.handle.run_upkeep();
        let mut text = out.0;
        text.push_str(&inner.handle.render());
        text
    }
}

/// The poller's reads, counted.
impl ReadinessEvents for Metrics {
    /// Records one readiness read of the poller: whether Envoy answered at
    /// all, and whether it said ready. (The `lifeguard_ready` gauge is not
    /// set here: it is the probe's own answer, taken at scrape time.)
    fn envoy_read(&self, answered: bool, ready: bool) {
        let inner = &*self.inner;
        if answered {
            inner.last_success.store(unix_now().to_bits(), Ordering::Relaxed);
        }
        if ready {
            inner.first_ready.get_or_init(|| inner.started.elapsed().as_secs_f64());
        }
    }

    /// The readiness answer changed (a read's verdict, or the kept answer
    /// going stale).
    fn readiness_changed(&self, ready: bool) {
        match ready {
            true => self.inner.became_ready.increment(1),
            false => self.inner.became_not_ready.increment(1),
        }
    }

    /// A read timed out and the last answer was kept.
    fn readiness_kept(&self) {
        self.inner.readiness_kept.increment(1);
    }
}

/// A counter that counts in two series.
struct Both(Counter, Counter);

impl metrics::CounterFn for Both {
    fn increment(&self, value: u64) {
        self.0.increment(value);
        self.1.increment(value);
    }

    fn absolute(&self, value: u64) {
        self.0.absolute(value);
        self.1.absolute(value);
    }
}

/// Registers handles on our recorder.
struct Registrar<'a> {
    recorder: &'a PrometheusRecorder,
}

const META: Metadata<'static> = Metadata::new("lifeguard", metrics::Level::INFO, Some("lifeguard"));

impl Registrar<'_> {
    /// `counter`, also counting in `lifeguard_scrape_failures_total{source}`:
    /// every failure of a source of the merged scrape, whatever the reason.
    fn failure_counted(&self, source: &'static str, counter: Counter) -> Counter {
        let all = self.counter(
            SCRAPE_FAILURES,
            &[("source", source)],
            "Merged scrapes whose part from a source (envoy, app) is missing or cut short, whatever the reason.",
        );
        Counter::from_arc(Arc::new(Both(counter, all)))
    }

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
}

/// A recorder with the histograms' buckets.
fn recorder_with_buckets() -> PrometheusRecorder {
    PrometheusBuilder::new()
        .with_recommended_naming(true)
        .set_buckets_for_metric(
            Matcher::Full(ADMIN_DURATION.into()),
            &[
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ],
        )
        .expect("static buckets are not empty")
        .set_buckets_for_metric(
            Matcher::Full(APP_PROBE_DURATION.into()),
            &[
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ],
        )
        .expect("static buckets are not empty")
        .set_buckets_for_metric(
            Matcher::Full(DRAIN_WAIT.into()),
            &[0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0],
        )
        .expect("static buckets are not empty")
        .build_recorder()
}

/// The help of the families registered per call (not kept as handles).
fn describe_per_call_families(recorder: &PrometheusRecorder) {
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
    recorder.describe_histogram(
        DRAIN_WAIT.into(),
        Some(Unit::Seconds),
        "How long each GET /drain/wait (the app's preStop hook) waited, by why it ended: out_of_rotation, timeout, deadline, stopped.".into(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use lifeguard_drain::{DrainUntil, Phase};

    fn render(status: &Status) -> String {
        let metrics = Metrics::new(Instant::now());
        metrics.render(&Readiness::standalone(Duration::from_secs(4)), Some(status), None)
    }

    fn has(text: &str, name: &str) -> bool {
        text.lines()
            .any(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
    }

    #[test]
    fn values_that_do_not_exist_yet_have_no_series() {
        let status = Status::initial(DrainUntil::Requests, String::new());
        let text = render(&status);
        assert!(text.contains("lifeguard_drain_phase{phase=\"serving\"} 1\n"), "{text}");
        assert!(
            text.contains("lifeguard_drain_policy{policy=\"requests\"} 1\n"),
            "{text}"
        );
        for absent in [
            TIME_TO_FIRST_READY,
            ADMIN_LAST_SUCCESS,
            DRAIN_STARTED,
            DRAIN_DEADLINE,
            DRAIN_DURATION,
            DRAIN_ACTIVE_CONNECTIONS,
            DRAIN_ACTIVE_REQUESTS,
            DRAIN_CUT,
            DRAIN_LEFT_AT_STOP,
        ] {
            assert!(!has(&text, absent), "{absent} before a drain:\n{text}");
        }
    }

    /// A dashboard's panel or an alert finds the drain wait's families from
    /// the start, each reason at 0, before the first wait or probe.
    #[test]
    fn the_drain_wait_families_are_there_from_the_start() {
        let text = render(&Status::initial(DrainUntil::AppExit, String::new()));
        for reason in ["out_of_rotation", "timeout", "deadline", "stopped"] {
            let series = format!("lifeguard_drain_wait_seconds_count{{reason=\"{reason}\"}} 0\n");
            assert!(text.contains(&series), "{series}{text}");
        }
        for reason in ["table_full", "too_many_agents", "outside_ranges"] {
            let series = format!("lifeguard_drain_wait_probes_not_counted_total{{reason=\"{reason}\"}} 0\n");
            assert!(text.contains(&series), "{series}{text}");
        }
    }

    #[test]
    fn envoy_exiting_mid_drain_leaves_no_growing_duration() {
        let mut status = Status::initial(DrainUntil::Requests, String::new());
        status.phase = Phase::Stopped;
        status.started_at = Some(unix_now() - 5.0);
        let text = render(&status);
        assert!(has(&text, DRAIN_STARTED) && !has(&text, DRAIN_DURATION), "{text}");
        status.phase = Phase::Draining;
        let text = render(&status);
        let line = text.lines().find(|l| l.starts_with(DRAIN_DURATION)).unwrap();
        let so_far: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!((4.9..6.0).contains(&so_far), "{line}");
    }
}
