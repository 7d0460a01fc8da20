//! The fuzz targets' one way in (`fuzz/`, built by `cargo fuzz` with
//! `--cfg fuzzing`, and by `tests/fuzz_seeds.rs`, which replays every
//! committed seed through the targets; absent from the binary): the real
//! types and functions the targets exercise, re-exported here under one
//! name each, so the targets never reach into the modules and a
//! restructuring of `src/` or of the crates updates this file alone; and
//! the two fixtures that assemble what the agent assembles (the settings
//! as `lifeguard run` loads them, the status service as the agent wires
//! it). Nothing here restates or re-implements the agent's code: the
//! targets hold the agent's own values and errors.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, FromArgMatches, Parser};
use tokio::time::Instant;

// ---- Envoy's stats, readiness and version (envoy/) ----

pub use crate::envoy::counts::active as active_counts;
pub use crate::envoy::readiness::{Readiness, Verdict};
pub use crate::envoy::state::{evaluate as readiness_verdict, ReadyAnswer, XdsCheck};
pub use crate::envoy::stats::{find as stats_find, lines as stats_lines, StatValue};
pub use crate::envoy::version::EnvoyVersion;

// ---- Envoy's inbound listeners, for the drain wait (envoy/inbound.rs) ----

pub use crate::drain::DrainScope;
pub use crate::envoy::inbound::{
    choose as inbound_choose, filter as inbound_filter, total as inbound_total, Counted, Selection,
};
pub use crate::envoy::listeners::{dumped_listeners, Listener};

// ---- The app's metrics and the merged scrape's formats (scrape/app/) ----

pub use crate::istio::annotations::{AppMetrics, MetricsTarget};
pub use crate::scrape::app::lines::{note_families, LineFilter};
pub use crate::scrape::format::Format;

// ---- The app's probes (status/app_probe/) ----

pub use crate::istio::probers::{Action, AppProbes};
pub use crate::status::app_probe::call::{
    exchange as app_probe_exchange, follow as app_probe_redirect, forwarded_headers as app_probe_headers, HttpCall,
    BODY_CAP as APP_PROBE_BODY_CAP,
};
pub use crate::status::app_probe::grpc::{read_answer as grpc_health_answer, Health};

// ---- Settings and the command line (config/, cli.rs, duration.rs) ----

pub use crate::cli::{Cli, Command};
pub use crate::config::{ConfigError, Loaded, Source};
pub use crate::duration::{parse as go_duration, GoDuration, MAX as GO_DURATION_MAX};

/// `argv` as `lifeguard` reads it: what to run, or clap's error.
pub fn command_line(argv: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(argv)
}

/// The settings `lifeguard run --config FILE --proxy-config TEXT` loads,
/// with no other flag and no env variable (as the unit tests load them).
pub fn load_settings(file: Option<&Path>, proxy_config: Option<&str>) -> Result<Loaded, ConfigError> {
    let mut argv = vec!["lifeguard".to_owned()];
    argv.extend(file.map(|f| format!("--config={}", f.display())));
    argv.extend(proxy_config.map(|p| format!("--proxy-config={p}")));
    let cmd = crate::config::RunArgs::augment_args(clap::Command::new("lifeguard")).mut_args(|a| a.env(None));
    // Two values, each whole after its `=`: clap takes any text.
    let matches = cmd
        .try_get_matches_from(&argv)
        .expect("the fixture's command line parses");
    let args = crate::config::RunArgs::from_arg_matches(&matches).expect("the fixture's arguments are RunArgs");
    args.load(&matches)
}

// ---- lifeguard inject (inject/) ----

pub use crate::inject::{inject, InjectOptions};

// ---- The status port (status/service.rs) ----

pub use crate::status::service::StatusService;

/// What the status service is built with.
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
    pub app_metrics: AppMetrics,
    /// The app's probes, reaching the app at this address.
    pub app_probes: Option<(AppProbes, IpAddr)>,
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
        let (rotation, publish) = crate::drain_wait::DrainWait::new(&plan, crate::checkers::Checkers::default());
        // No drain wait task: its status stays "not started", for good.
        std::mem::forget(publish);
        svc = svc.drain_wait(rotation);
    }
    if let Some(admin) = &opts.scrape {
        let metrics = crate::metrics::Metrics::new(Instant::now());
        let admin = admin
            .as_deref()
            .map(|p| crate::envoy::admin::AdminClient::new(crate::url::LoopbackUrl::unix(p), Duration::from_secs(2)));
        let scraper = crate::scrape::Scraper::builder(metrics.clone(), readiness.clone())
            .envoy(admin)
            .app_metrics(&opts.app_metrics)
            .build();
        svc = svc.metrics(&metrics, scraper);
    }
    if let Some((probes, dest)) = &opts.app_probes {
        if let Some(prober) = crate::status::app_probe::AppProber::new(probes, *dest, 15020, None) {
            svc = svc.app_probes(prober);
        }
    }
    (svc.service(), readiness)
}
