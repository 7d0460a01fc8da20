//! lifeguard's own Prometheus metrics: the families, their handles and
//! their text.
//!
//! Two kinds of families, both named by the Prometheus conventions:
//!
//! - **Events**, counted as they happen on a recorder that belongs to the
//!   agent (no global recorder), with handles registered once: probe
//!   answers, admin requests and their durations (by `endpoint`), changes
//!   of Envoy's readiness; and families whose values are another crate's
//!   words, declared where their type lives ([`CounterFamily`],
//!   [`Metrics::counters`]): how the merged scrape read its sources (the
//!   scrape's `Incomplete`, `ScrapeRead`), the app's probes (the status
//!   port's results). The probe path increments a stored counter, with no
//!   name lookup or label formatting per request.
//! - **State**, written at scrape time from what it describes, so it can
//!   never disagree with it: the drain's published status (the same one
//!   `GET /drain` shows), the readiness answer, build info and the process
//!   (`process_*`, read from /proc by the `metrics-process` crate). A state
//!   is one series per value with a label set to 1 (`lifeguard_drain_phase
//!   {phase="draining"} 1`), never a number standing for a name; a value
//!   that does not exist yet (no drain, never ready, nothing stopped) has no
//!   series, rather than a 0 that reads as a real value.
//!
//! [`Metrics::render`] writes them all, as the text format: the state
//! families by `exposition`, the events by the recorder; their names are
//! `names`'. Serving them is another crate's: `lifeguard_scrape` (the
//! merged scrape) streams Envoy's own `/stats/prometheus` (families named
//! `envoy_*`) and the app's metrics around what [`Metrics::render`] writes
//! (`lifeguard_*`, `process_*`). These families read nothing from Envoy:
//! they know nothing of the admin client, and the admin client knows
//! nothing of metrics (the agent wires its call observer to
//! [`Metrics::admin_call`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics::{Counter, Histogram, Key, Label as MetricLabel, Metadata, Recorder, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use tokio::time::Instant;

use exposition::{drain_families, drain_wait_families, process_families, Exposition};
use lifeguard_base::duration::unix_now;
use lifeguard_base::reason::{ByReason, Label};
use lifeguard_checkers::NotCounted;
use lifeguard_drain::{ReadyOrNot, Status};
use lifeguard_drain_wait::DrainWaitStatus;
use lifeguard_drain_wait::WaitWhy;
use lifeguard_envoy::admin::{CallOutcome, Endpoint};
use lifeguard_envoy::poller::ReadinessEvents;
use lifeguard_envoy::readiness::{Audience, Readiness};

mod exposition;

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
    /// `lifeguard_probe_responses_total{code}`.
    probes: ProbeCounters,
    /// `lifeguard_envoy_readiness_changes_total{to}`.
    readiness_changes: ByReason<ReadyOrNot, Counter>,
    /// `lifeguard_readiness_kept_total`.
    readiness_kept: Counter,
    /// `lifeguard_drain_wait_probes_not_counted_total{reason}`, by
    /// `lifeguard_checkers::NotCounted`.
    probes_not_counted: ByReason<NotCounted, Counter>,
    /// Seconds from start to the first ready read, once there was one.
    first_ready: OnceLock<f64>,
    /// Unix time of the last admin read Envoy answered, as f64 bits (0: none).
    last_success: AtomicU64,
}

/// The readiness probe's answers, counted by status code
/// (`lifeguard_probe_responses_total{code}`): handles the status port
/// keeps. Cloning shares them.
#[derive(Clone)]
pub struct ProbeCounters(ByReason<ReadyOrNot, Counter>);

impl ProbeCounters {
    /// Counts one answer, ready (200) or not (503).
    #[inline]
    pub fn count(&self, ready: bool) {
        self.0.get(ReadyOrNot::of(ready)).increment(1);
    }

    /// Counters that count nowhere (no metrics wired).
    pub fn noop() -> ProbeCounters {
        ProbeCounters(ByReason::new(|_| Counter::noop()))
    }
}

/// One of lifeguard's counter families whose series are one per value of
/// a label set another crate declares, where its type lives (the merged
/// scrape's `Incomplete`, the status port's app probe results): the
/// family's name, help and label key are lifeguard_metrics' (the one list
/// of names), the values the caller's.
#[derive(Debug, Clone, Copy)]
pub struct CounterFamily {
    name: &'static str,
    key: &'static str,
    help: &'static str,
}

impl CounterFamily {
    /// `lifeguard_scrape_envoy_reads_total{read}`.
    pub const SCRAPE_ENVOY_READS: CounterFamily = CounterFamily {
        name: SCRAPE_ENVOY_READS,
        key: "read",
        help: "Merged scrapes by how they got Envoy's metrics: a new Envoy read, or one shared with other scrapes.",
    };
    /// `lifeguard_scrape_envoy_incomplete_total{reason}`.
    pub const SCRAPE_ENVOY_INCOMPLETE: CounterFamily = CounterFamily {
        name: SCRAPE_ENVOY_INCOMPLETE,
        key: "reason",
        help: "Merged scrapes whose Envoy part is missing or cut short, by reason (timeout, error, cap, busy, slow).",
    };
    /// `lifeguard_scrape_app_incomplete_total{target,reason}`.
    pub const SCRAPE_APP_INCOMPLETE: CounterFamily = CounterFamily {
        name: SCRAPE_APP_INCOMPLETE,
        key: "reason",
        help: "Merged scrapes whose part from an app target is missing or cut short, by target (port and path) and \
               reason (timeout, error, cap, busy).",
    };
    /// `lifeguard_app_probe_results_total{path,result}`.
    pub const APP_PROBE_RESULTS: CounterFamily = CounterFamily {
        name: APP_PROBE_RESULTS,
        key: "result",
        help: "App probes and hooks run through the status port (/app-health, /app-lifecycle), by path and result: \
               success, failure (the app answered no or not in time) or busy (too many of the path in flight).",
    };
}

/// A source of the merged scrape: the `source` label of
/// `lifeguard_scrape_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ScrapeSource {
    /// Envoy's own `/stats/prometheus`.
    Envoy,
    /// The app's metrics targets.
    App,
}

mod names;

use names::*;

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
            probes: ProbeCounters(ByReason::new(|answer: ReadyOrNot| {
                r.counter(PROBE_RESPONSES, &[("code", answer.status_code())], probe_help)
            })),
            readiness_changes: ByReason::new(|to: ReadyOrNot| {
                r.counter(READINESS_CHANGES, &[("to", to.label())], changes_help)
            }),
            readiness_kept: r.counter(
                READINESS_KEPT,
                &[],
                "Readiness reads that timed out while the last answer was kept (it is trusted until older than the staleness bound).",
            ),
            probes_not_counted: ByReason::new(|why: NotCounted| {
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
        for why in WaitWhy::all() {
            let series = Registrar::key(DRAIN_WAIT, &[("reason", why.label())]);
            drop(inner.recorder.register_histogram(&series, &META));
        }
        Metrics { inner: Arc::new(inner) }
    }

    /// The counters of probes the drain wait did not count, by
    /// `lifeguard_checkers::NotCounted`.
    pub fn probes_not_counted(&self) -> ByReason<NotCounted, Counter> {
        self.inner.probes_not_counted.clone()
    }

    /// The probe's counters, for the status service to keep.
    pub fn probe_counters(&self) -> ProbeCounters {
        self.inner.probes.clone()
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

    /// One counter per value of the label set `L` in `family`, each also
    /// labelled `fixed` (a target, a path), every series there from now,
    /// at 0. Values for which `has_series` says no count nowhere of their
    /// own (a reason a family does not list).
    pub fn counters<L: Label>(
        &self,
        family: CounterFamily,
        fixed: &[(&'static str, &str)],
        has_series: impl Fn(L) -> bool,
    ) -> ByReason<L, Counter> {
        let recorder = &self.inner.recorder;
        recorder.describe_counter(family.name.into(), None, family.help.into());
        ByReason::new(|value: L| match has_series(value) {
            true => {
                let mut labels: Vec<MetricLabel> = fixed
                    .iter()
                    .map(|(k, v)| MetricLabel::new(*k, (*v).to_owned()))
                    .collect();
                labels.push(MetricLabel::from_static_parts(family.key, value.label()));
                recorder.register_counter(&Key::from_parts(family.name, labels), &META)
            }
            false => Counter::noop(),
        })
    }

    /// `counters`, each also counting in `lifeguard_scrape_failures_total
    /// {source}`: every failure of a source of the merged scrape, whatever
    /// the reason.
    pub fn scrape_failures<L: Label>(
        &self,
        source: ScrapeSource,
        counters: ByReason<L, Counter>,
    ) -> ByReason<L, Counter> {
        let r = Registrar {
            recorder: &self.inner.recorder,
        };
        ByReason::new(|value: L| r.failure_counted(source, counters.get(value).clone()))
    }

    /// The duration of one app probe's calls, by its status-port `path`
    /// (`lifeguard_app_probe_duration_seconds{path}`).
    pub fn app_probe_duration(&self, path: &str) -> Histogram {
        let recorder = &self.inner.recorder;
        recorder.describe_histogram(
            APP_PROBE_DURATION.into(),
            Some(Unit::Seconds),
            "Duration of the app probes lifeguard ran, by path.".into(),
        );
        let key = Key::from_parts(APP_PROBE_DURATION, vec![MetricLabel::new("path", path.to_owned())]);
        recorder.register_histogram(&key, &META)
    }

    /// Renders lifeguard's families: the state read now, then the events.
    pub fn render(&self, readiness: &Readiness, drain: Option<&Status>, wait: Option<&DrainWaitStatus>) -> String {
        let inner = &*self.inner;
        let mut out = Exposition::default();
        out.gauge(BUILD_INFO, "lifeguard's version; always 1.");
        out.sample(BUILD_INFO, &[("version", env!("CARGO_PKG_VERSION"))], 1.0);
        out.gauge(
            READY,
            "1 when the readiness probe answers a load balancer 200 (Envoy ready and no drain), else 0.",
        );
        let ready = readiness.answer(Audience::LoadBalancer).ready;
        out.sample(READY, &[], f64::from(u8::from(ready)));
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
        self.inner.readiness_changes.get(ReadyOrNot::of(ready)).increment(1);
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
    fn failure_counted(&self, source: ScrapeSource, counter: Counter) -> Counter {
        Counter::from_arc(Arc::new(Both(counter, self.source_failures(source))))
    }

    /// `lifeguard_scrape_failures_total{source}`.
    fn source_failures(&self, source: ScrapeSource) -> Counter {
        self.counter(
            SCRAPE_FAILURES,
            &[("source", source.label())],
            "Merged scrapes whose part from a source (envoy, app) is missing or cut short, whatever the reason.",
        )
    }

    fn key(name: &'static str, labels: &[(&'static str, &'static str)]) -> Key {
        Key::from_parts(
            name,
            labels
                .iter()
                .map(|(k, v)| MetricLabel::from_static_parts(k, v))
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
    use lifeguard_drain::{DrainUntil, Kubelet, KubeletAnswer, Phase};

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

    fn rendered(metrics: &Metrics) -> String {
        let status = Status::initial(DrainUntil::Requests, String::new());
        metrics.render(&Readiness::standalone(Duration::from_secs(4)), Some(&status), None)
    }

    /// A family of another crate's label set: each value in its series
    /// (labelled with the fixed labels too), from the start at 0; a value
    /// without a series counts nowhere of its own; a scrape source's
    /// failures also count in its total.
    #[test]
    fn a_family_counts_each_value_of_a_label_set_in_its_series() {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr)]
        #[strum(serialize_all = "snake_case")]
        enum Why {
            Timeout,
            Slow,
        }
        let metrics = Metrics::new(Instant::now());
        let fixed = [("target", "8080/metrics")];
        let counters = metrics.counters(CounterFamily::SCRAPE_APP_INCOMPLETE, &fixed, |why| why != Why::Slow);
        let text = rendered(&metrics);
        let series = format!("{SCRAPE_APP_INCOMPLETE}{{target=\"8080/metrics\",reason=\"timeout\"}} 0\n");
        assert!(text.contains(&series), "there from the start: {series}{text}");
        let counted = metrics.scrape_failures(ScrapeSource::App, counters);
        counted.get(Why::Timeout).increment(1);
        counted.get(Why::Slow).increment(1);
        let text = rendered(&metrics);
        assert!(text.contains(&series.replace("} 0", "} 1")), "{text}");
        let slow = |l: &str| l.starts_with(SCRAPE_APP_INCOMPLETE) && l.contains("reason=\"slow\"");
        assert!(!text.lines().any(slow), "{text}");
        let total = format!("{SCRAPE_FAILURES}{{source=\"app\"}} 2\n");
        assert!(text.contains(&total), "{total}{text}");
    }

    /// The probe's answers are labelled by their status code from the
    /// start, the kubelet's in a drain by answer, each with its count.
    #[test]
    fn the_probes_answers_have_their_words() {
        let mut status = Status::initial(DrainUntil::Requests, String::new());
        status.started_at = Some(unix_now());
        status.kubelet = Some(Kubelet {
            answer: KubeletAnswer::FollowsEnvoy,
            serving_window_seconds: Some(31.0),
            not_serving_after_seconds: None,
            not_serving_because: None,
            ready_probes: 2,
            not_ready_probes: 3,
            last_ready_after_seconds: None,
        });
        let text = render(&status);
        for series in [
            "lifeguard_probe_responses_total{code=\"200\"} 0\n",
            "lifeguard_probe_responses_total{code=\"503\"} 0\n",
            "lifeguard_drain_kubelet_probes{answer=\"ready\"} 2\n",
            "lifeguard_drain_kubelet_probes{answer=\"not_ready\"} 3\n",
        ] {
            assert!(text.contains(series), "{series}{text}");
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
