//! The fuzz targets' one way in (`fuzz/`, built by `cargo fuzz` with
//! `--cfg fuzzing`, and by the unit tests, which replay every committed
//! seed through the targets (`seeds` below); absent from the binary): thin
//! wrappers of the parsers of outside input and of the status service, so
//! the targets never reach into the modules, and a restructuring of `src/`
//! updates this file alone. Each wrapper calls the code the agent runs;
//! none re-implements it.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use clap::{Args, CommandFactory, FromArgMatches};
use hyper::header::{HeaderMap, HeaderValue, ACCEPT};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use crate::config::{ConfigError, RunArgs};
use crate::scrape::app::lines::{Format, LineFilter};
use crate::status::app_probe::call::{self, HttpCall};
use crate::status::app_probe::grpc::{self, Health};

pub use crate::drain::Active;
pub use crate::envoy::readiness::{Readiness, Verdict};
pub use crate::envoy::state::XdsCheck;
pub use crate::envoy::stats::{Line as StatLine, Value as StatValue};
pub use crate::istio::annotations::{AppMetrics, Target as AppMetricsTarget};
pub use crate::istio::probers::{Action, AppProbes, Checked};
pub use crate::status::service::{Body, StatusService};

/// A refusal or a failure, as the agent words it: what the targets assert
/// on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl Refused {
    fn of(e: impl std::fmt::Display) -> Self {
        Refused(e.to_string())
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

// ---- Envoy's stats (envoy/stats.rs, counts.rs, state.rs) ----

/// The lines of a `/stats` answer.
pub fn stats_lines(body: &str) -> Vec<StatLine<'_>> {
    crate::envoy::stats::lines(body).collect()
}

/// One stat by exact name.
pub fn stats_find<'a>(body: &'a str, name: &str) -> Option<StatValue<'a>> {
    crate::envoy::stats::find(body, name)
}

/// The drain's active counts.
pub fn active_counts(body: &str, ignored_ports: &[u16]) -> Active {
    crate::envoy::counts::active(body, ignored_ports)
}

/// The readiness verdict on one answer to the readiness stats: ready, and
/// the probe's body.
pub fn readiness_verdict(body: &str, xds: XdsCheck) -> (bool, String) {
    let verdict = crate::envoy::state::evaluate(body, xds, Instant::now());
    (verdict.is_ready(), verdict.text().to_owned())
}

/// What `GET /ready` said: Ok(the state's name), or Err(the text kept of
/// an answer that is not Envoy's).
pub fn ready_answer(status: u16, body: &[u8]) -> Result<&'static str, Refused> {
    use crate::envoy::state::ReadyAnswer;
    let status = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
    match ReadyAnswer::parse(status, body) {
        ReadyAnswer::State(state) => Ok(state.name()),
        ReadyAnswer::Unrecognized(text) => Err(Refused(text)),
    }
}

/// Envoy's version from a `/server_info` answer (envoy/version.rs): major,
/// minor, patch.
pub fn envoy_version(server_info: &str) -> Result<(u32, u32, u32), Refused> {
    let v = crate::envoy::version::EnvoyVersion::from_server_info(server_info).map_err(Refused::of)?;
    Ok((v.major, v.minor, v.patch))
}

// ---- Envoy's inbound listeners, for the drain wait (envoy/inbound.rs) ----

/// A listener of a `/config_dump` answer: its stat name, whether it is
/// inbound, its port, its HTTP managers' and TCP proxies' stat prefixes.
pub type DumpedListener = (Option<String>, bool, Option<u16>, Vec<String>, Vec<String>);

/// The listeners of a `/config_dump` answer, or why it is refused.
pub fn inbound_dumped_listeners(body: &str) -> Result<Vec<DumpedListener>, Refused> {
    let listeners = crate::envoy::listeners::dumped_listeners(body).map_err(Refused::of)?;
    Ok(listeners
        .into_iter()
        .map(|l| (l.stat_name, l.inbound, l.port, l.http, l.tcp))
        .collect())
}

/// What is counted (every listener's with `all`, else the inbound ones'):
/// None when nothing could be chosen (every listener then counts), else
/// the listeners' stat names, their HTTP managers', TCP proxies' and bare
/// listeners' names.
pub type Chosen = Option<[Vec<String>; 4]>;

/// What is counted, and the words that say so.
pub fn inbound_choose(listeners: &[DumpedListener], all: bool, ignored_ports: &[u16]) -> (Chosen, String) {
    use crate::drain::DrainScope;
    use crate::envoy::inbound::{choose, Counted};
    use crate::envoy::listeners::Listener;
    let listeners: Vec<_> = listeners
        .iter()
        .map(|(stat_name, inbound, port, http, tcp)| Listener {
            name: String::new(),
            stat_name: stat_name.clone(),
            inbound: *inbound,
            port: *port,
            http: http.clone(),
            tcp: tcp.clone(),
            ..Listener::default()
        })
        .collect();
    let scope = if all { DrainScope::All } else { DrainScope::Inbound };
    let (counted, words) = choose(&listeners, scope, ignored_ports);
    let chosen = match counted {
        Counted::Chosen(s) => Some([s.listeners, s.http, s.tcp, s.bare]),
        Counted::Every => None,
    };
    (chosen, words)
}

fn counted(chosen: &Chosen) -> crate::envoy::inbound::Counted {
    use crate::envoy::inbound::{Counted, Selection};
    match chosen {
        Some([listeners, http, tcp, bare]) => Counted::Chosen(Selection {
            listeners: listeners.clone(),
            http: http.clone(),
            tcp: tcp.clone(),
            bare: bare.clone(),
            health_checks: false,
        }),
        None => Counted::Every,
    }
}

/// The stats filter (a regex) the counts read asks Envoy for.
pub fn inbound_filter(chosen: &Chosen) -> String {
    crate::envoy::inbound::filter(&counted(chosen))
}

/// The arrivals of a counts answer, and the listener manager's change count.
pub fn inbound_total(body: &str, chosen: &Chosen, ignored_ports: &[u16]) -> (u64, u64) {
    crate::envoy::inbound::total(body, &counted(chosen), ignored_ports)
}

// ---- The app's metrics and the merged scrape's formats (scrape/app/) ----

/// An exposition format of the merged scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposition {
    Text,
    /// OpenMetrics 1.0.0.
    OpenMetrics1,
    /// OpenMetrics 0.0.1.
    OpenMetrics0,
}

impl Exposition {
    fn format(self) -> Format {
        match self {
            Exposition::Text => Format::Text,
            Exposition::OpenMetrics1 => Format::OpenMetrics { v1: true },
            Exposition::OpenMetrics0 => Format::OpenMetrics { v1: false },
        }
    }

    fn of(format: Format) -> Self {
        match format {
            Format::Text => Exposition::Text,
            Format::OpenMetrics { v1: true } => Exposition::OpenMetrics1,
            Format::OpenMetrics { v1: false } => Exposition::OpenMetrics0,
        }
    }

    /// The answer's `Content-Type`.
    pub fn content_type(self) -> &'static str {
        self.format().content_type()
    }

    /// The `Accept` an app target is sent.
    pub fn accept_for_app(self) -> &'static str {
        self.format().accept_for_app()
    }
}

/// The answer's format for a client's `Accept` values (those that are not
/// header values are left out, as hyper would refuse them).
pub fn exposition_for_accept(values: &[&[u8]]) -> Exposition {
    let mut headers = HeaderMap::new();
    for v in values {
        if let Ok(v) = HeaderValue::from_bytes(v) {
            headers.append(ACCEPT, v);
        }
    }
    Exposition::of(Format::for_accept(&headers))
}

/// The format of a source's answer, by its `Content-Type`.
pub fn exposition_of_content_type(value: &str) -> Exposition {
    Exposition::of(Format::of_content_type(value))
}

/// The families declared (`# TYPE NAME ...`) in `text`, added to `into`.
pub fn note_families(text: &[u8], into: &mut HashSet<String>) {
    crate::scrape::app::lines::note_families(text, into)
}

/// One app target's line filter.
pub struct AppLines(LineFilter);

impl AppLines {
    pub fn new(from: Exposition, to: Exposition) -> Self {
        AppLines(LineFilter::new(from.format(), to.format()))
    }

    /// Appends the lines of `text` that belong in the answer to `out`.
    pub fn push(&mut self, text: &[u8], taken: &HashSet<String>, out: &mut Vec<u8>) {
        self.0.push(text, taken, out)
    }

    /// Adds the target's families to `taken`; the families left out.
    pub fn finish(self, taken: &mut HashSet<String>) -> Vec<String> {
        self.0.finish(taken)
    }
}

/// `ISTIO_PROMETHEUS_ANNOTATIONS`.
pub fn prometheus_annotations(json: &str) -> Result<AppMetrics, Refused> {
    AppMetrics::parse(json).map_err(Refused::of)
}

// ---- The app's probes (status/app_probe/) ----

/// `ISTIO_KUBE_APP_PROBERS`.
pub fn app_probers(json: &str) -> Result<AppProbes, Refused> {
    AppProbes::parse(json).map_err(Refused::of)
}

/// The most of an app's answer passed on to the kubelet.
pub const APP_PROBE_BODY_CAP: usize = call::BODY_CAP;

/// One HTTP probe's exchange over `io` (the app's end of it is the
/// caller's): the status, the Location and the body's first bytes.
pub async fn app_probe_exchange<IO>(
    io: IO,
    h2: bool,
    path: &str,
    headers: HeaderMap,
    app: SocketAddr,
) -> Result<(u16, Option<String>, Bytes), Refused>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let call = HttpCall {
        port: app.port(),
        https: h2,
        path: path.to_owned(),
        headers,
    };
    let answer = call::exchange(TokioIo::new(io), h2, &call, app.ip()).await;
    let (status, location, body) = answer.map_err(Refused::of)?;
    Ok((status.as_u16(), location, body))
}

/// Where a redirect of a probe to `app` (`https`, `path`) leads, when it
/// stays on the app's host: scheme (https), port and path.
pub fn app_probe_redirect(app: SocketAddr, https: bool, location: &str) -> Option<(bool, u16, String)> {
    let call = HttpCall {
        port: app.port(),
        https,
        path: "/".into(),
        headers: HeaderMap::new(),
    };
    call::follow(&call, location, app.ip())
}

/// The headers a probe sends the app: the kubelet's, the probe's own.
pub fn app_probe_headers(
    kubelet: &HeaderMap,
    probe: &[(String, String)],
    status_port: u16,
    app: SocketAddr,
) -> HeaderMap {
    call::forwarded_headers(kubelet, probe, status_port, app)
}

/// The gRPC health answer: Ok(Ok(status name)), Ok(Err(the failed call's
/// code and message)), or Err(why it is no answer).
pub fn grpc_health_answer(
    head: &HeaderMap,
    trailers: &HeaderMap,
    body: Bytes,
) -> Result<Result<&'static str, Refused>, Refused> {
    match grpc::read_answer(head, trailers, body).map_err(Refused::of)? {
        Health::Status(status) => Ok(Ok(status.name())),
        Health::Failed(why) => Ok(Err(Refused::of(why))),
    }
}

// ---- Settings (config/, cli.rs, duration.rs) ----

/// A Go duration.
pub fn go_duration(text: &str) -> Result<Duration, Refused> {
    crate::duration::parse(text).map_err(Refused::of)
}

/// A duration written the Go way.
pub fn go_duration_display(d: Duration) -> String {
    crate::duration::GoDuration(d).to_string()
}

/// The longest duration accepted.
pub const GO_DURATION_MAX: Duration = crate::duration::MAX;

/// `lifeguard wait --timeout TEXT --period TEXT` (the hooks' two duration
/// parsers: any duration, and a positive one), as clap reads it: the two
/// values, or clap's error.
pub fn cli_wait_durations(timeout: &str, period: &str) -> Result<(Duration, Duration), Refused> {
    use crate::cli::{Cli, Command};
    let argv = [
        "lifeguard",
        "wait",
        &format!("--timeout={timeout}"),
        &format!("--period={period}"),
    ];
    let matches = Cli::command().try_get_matches_from(argv).map_err(Refused::of)?;
    match Cli::from_arg_matches(&matches).map_err(Refused::of)?.command {
        Command::Wait(opts) => Ok((opts.timeout.get(), opts.period.get())),
        _ => Err(Refused("not the wait command".into())),
    }
}

/// A settings error as the agent reports it.
#[derive(Debug)]
pub enum SettingsError {
    /// The file itself: unreadable, not TOML, an unknown key.
    File(String),
    /// A value: the field as the user wrote it, the value, where it came
    /// from (`file`, `PROXY_CONFIG`, `default`, ...), why; and the message.
    Invalid {
        field: String,
        value: String,
        origin: String,
        why: String,
        message: String,
    },
}

/// Each effective setting: its key, its value, where it came from.
pub type Effective = Vec<(String, String, String)>;

/// The settings `lifeguard run --config FILE --proxy-config TEXT` loads,
/// with no flag and no env variable (as the unit tests load them): every
/// setting as TOML (the form the file takes), and each effective value
/// (key, value, source).
pub fn load_settings(
    file: Option<&Path>,
    proxy_config: Option<&str>,
) -> Result<(toml::Table, Effective), SettingsError> {
    let mut argv = vec!["lifeguard".to_owned()];
    argv.extend(file.map(|f| format!("--config={}", f.display())));
    argv.extend(proxy_config.map(|p| format!("--proxy-config={p}")));
    let cmd = RunArgs::augment_args(clap::Command::new("lifeguard")).mut_args(|a| a.env(None));
    let matches = cmd
        .try_get_matches_from(&argv)
        .map_err(|e| SettingsError::File(format!("the command line: {e}")))?;
    let args = RunArgs::from_arg_matches(&matches).map_err(|e| SettingsError::File(e.to_string()))?;
    let crate::config::Loaded {
        settings, effective, ..
    } = args.load(&matches).map_err(|e| match &e {
        ConfigError::File { .. } => SettingsError::File(e.to_string()),
        ConfigError::Invalid {
            field,
            value,
            origin,
            why,
        } => SettingsError::Invalid {
            field: field.clone(),
            value: value.clone(),
            origin: origin.to_string(),
            why: why.to_string(),
            message: e.to_string(),
        },
    })?;
    let table = toml::Table::try_from(&settings).expect("settings serialize");
    let effective = effective
        .into_iter()
        .map(|e| (e.key, e.value, e.source.to_string()))
        .collect();
    Ok((table, effective))
}

// ---- lifeguard inject (inject/) ----

/// `lifeguard inject` on `yaml` (`--proxy-container`, `--status-port`,
/// `--drain-wait`).
pub fn inject(
    yaml: &str,
    proxy_container: Option<&str>,
    status_port: Option<u16>,
    drain_wait: bool,
) -> Result<String, Refused> {
    let opts = crate::inject::InjectOptions {
        input: None,
        proxy_container: proxy_container.map(str::to_owned),
        status_port,
        drain_wait,
    };
    crate::inject::inject(yaml, &opts).map_err(Refused::of)
}

// ---- The status port (status/service.rs) ----

/// What the status service is built with.
#[derive(Debug, Clone, Default)]
pub struct StatusOptions {
    /// Whether loopback callers may drain and stop.
    pub loopback_control: bool,
    /// The control socket named in a 403.
    pub control_socket: Option<PathBuf>,
    /// Serve the drain routes (from a drain machine that has ended, so
    /// `POST /drain` and `/quitquitquit` answer at once).
    pub drain: bool,
    /// Record the probes' checkers and serve `GET /drain/wait` (whose
    /// deadline is 1 ms, so it answers at once).
    pub drain_wait: bool,
    /// Serve `/stats/prometheus`: Envoy's admin on this Unix socket
    /// (`Some(None)`: lifeguard's part alone), and the app's targets.
    pub scrape: Option<Option<PathBuf>>,
    pub app_metrics: Vec<(u16, String)>,
    /// The app probes' JSON, reaching the app at this address.
    pub app_probes: Option<(String, IpAddr)>,
}

/// The status service, and the readiness it answers from.
pub fn status_service(opts: &StatusOptions) -> (StatusService, Readiness) {
    let stale = Duration::from_secs(4);
    let (mut svc, readiness) = match opts.drain {
        true => {
            let plan = crate::drain::Plan::for_status_tests();
            let admin = crate::envoy::admin::AdminClient::new(
                "http://127.0.0.1:1".parse().expect("a URL"),
                Duration::from_millis(100),
            );
            let envoy = crate::envoy::process::Envoy::external(admin, vec![]);
            // The machine is dropped: the handle answers at once.
            let (_machine, handle) = crate::drain::Drain::new(plan, envoy, ());
            let readiness = Readiness::new(stale, handle.phase());
            let access = crate::status::service::ControlAccess {
                loopback: opts.loopback_control,
                socket: opts.control_socket.clone(),
            };
            (
                StatusService::builder(readiness.clone()).drain(handle, access),
                readiness,
            )
        }
        false => {
            let readiness = Readiness::standalone(stale);
            (StatusService::builder(readiness.clone()), readiness)
        }
    };
    if opts.drain_wait {
        let plan = crate::drain_wait::DrainWaitPlan {
            min_quiet_period: Duration::from_secs(1),
            // A deadline of 1ms.
            grace: lifeguard_base::grace::Grace::new(Duration::from_millis(2001), Duration::from_secs(2))
                .expect("a 2s margin under 2.001s"),
            app_time: Duration::ZERO,
            ..crate::drain_wait::DrainWaitPlan::for_tests()
        };
        let (rotation, publish) = crate::drain_wait::DrainWait::new(&plan, crate::drain_wait::Checkers::default());
        // No drain wait task: its status stays "not started", for good.
        std::mem::forget(publish);
        svc = svc.drain_wait(rotation);
    }
    if let Some(admin) = &opts.scrape {
        let metrics = crate::metrics::Metrics::new(Instant::now());
        let admin = admin
            .as_deref()
            .map(|p| crate::envoy::admin::AdminClient::new(crate::url::LoopbackUrl::unix(p), Duration::from_secs(2)));
        let targets = opts
            .app_metrics
            .iter()
            .map(|(port, path)| AppMetricsTarget {
                port: *port,
                path: path.clone(),
            })
            .collect();
        let scraper = crate::scrape::Scraper::new(metrics.clone(), readiness.clone(), admin)
            .with_app_metrics(&AppMetrics(targets));
        svc = svc.metrics(&metrics, scraper);
    }
    if let Some((json, dest)) = &opts.app_probes {
        let probes = AppProbes::parse(json).unwrap_or_default();
        if let Some(prober) = crate::status::app_probe::AppProber::new(&probes, *dest, 15020, None) {
            svc = svc.app_probes(prober);
        }
    }
    (svc.service(), readiness)
}

/// The same service, answering a TCP connection from `peer`.
pub fn status_for_peer(svc: &StatusService, peer: SocketAddr) -> StatusService {
    svc.for_peer(peer)
}

/// The same service, answering a connection of the control socket.
pub fn status_for_control_socket(svc: &StatusService) -> StatusService {
    svc.for_control_socket()
}
