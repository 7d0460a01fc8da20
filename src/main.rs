//! The `lifeguard` binary: parses the command line and wires the modules
//! together. The logic lives in the library.

use std::process::ExitCode;
use std::sync::Arc;

use clap::{CommandFactory, FromArgMatches};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use tokio::time::Instant;

use lifeguard::admin::{AdminClient, CallOutcome, Endpoint};
use lifeguard::cli::{Cli, Command};
use lifeguard::config::Settings;
use lifeguard::drain::{exit_code, Drain, Plan};
use lifeguard::envoy::{self, Envoy};
use lifeguard::hooks;
use lifeguard::metrics::Metrics;
use lifeguard::readiness::Readiness;
use lifeguard::scrape::Scraper;
use lifeguard::server::{StatusServer, StatusService};
use lifeguard::signals::Signals;
use lifeguard::{duration::Display as D, poller};

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match cli.command {
        Command::Run { args, envoy } => {
            let (settings, effective) = match Settings::load(&args, matches.subcommand_matches("run")) {
                Ok(loaded) => loaded,
                Err(e) => {
                    eprintln!("lifeguard: configuration error: {e}");
                    return ExitCode::from(exit_code::CONFIG);
                }
            };
            init_logging(&settings.log);
            for e in &effective {
                tracing::debug!(key = e.key, value = %e.value, source = %e.source, "setting");
            }
            for warning in settings.warnings() {
                tracing::warn!("{warning}");
            }
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            ExitCode::from(runtime.block_on(run(settings, envoy)))
        }
        Command::Check { args } => ExitCode::from(check(&args, matches.subcommand_matches("check"))),
        Command::Wait {
            url: (url, path),
            timeout,
            period,
            request_timeout,
        } => {
            let opts = hooks::WaitOptions {
                url,
                path,
                timeout,
                period,
                request_timeout,
            };
            ExitCode::from(helper_runtime().block_on(hooks::wait(&opts)))
        }
        Command::WaitAppExit {
            timeout,
            period,
            ignore_ports,
            ignore_processes,
        } => {
            let opts = hooks::AppExitOptions {
                timeout,
                period,
                ignore_ports,
                ignore_processes,
            };
            ExitCode::from(helper_runtime().block_on(hooks::wait_app_exit(&opts)))
        }
        Command::Drain { url, timeout } => {
            let opts = hooks::DrainOptions { url, timeout };
            ExitCode::from(helper_runtime().block_on(hooks::drain(&opts)))
        }
    }
}

fn helper_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// `lifeguard check`: prints the effective settings and what is wrong.
fn check(args: &lifeguard::config::RunArgs, matches: Option<&clap::ArgMatches>) -> u8 {
    let (settings, effective) = match Settings::load(args, matches) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("lifeguard check: configuration error: {e}");
            return exit_code::CONFIG;
        }
    };
    let width = effective.iter().map(|e| e.key.len()).max().unwrap_or(0);
    for e in &effective {
        println!("{:width$} = {:<24} ({})", e.key, e.value, e.source);
    }
    println!("{:width$} = {}", "drain deadline", D(settings.drain_deadline()));
    let warnings = settings.warnings();
    for w in &warnings {
        eprintln!("lifeguard check: {w}");
    }
    if warnings.is_empty() {
        println!("configuration OK");
        0
    } else {
        1
    }
}

fn init_logging(filter: &str) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("lifeguard: bad log filter {filter:?} ({e}); using info");
        EnvFilter::new("info")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}

/// Runs the agent; returns the process exit code. Runs on the main thread
/// (inside `block_on`), which Envoy's parent-death signal relies on.
async fn run(settings: Settings, envoy_command: Vec<String>) -> u8 {
    let signals = match Signals::install() {
        Ok(signals) => signals,
        Err(e) => {
            tracing::error!(error = %e, "cannot install signal handlers");
            return exit_code::CONFIG;
        }
    };
    let shutdown = CancellationToken::new();
    let metrics = Metrics::new(Instant::now());
    let observer = {
        let metrics = metrics.clone();
        Arc::new(move |e: Endpoint, o: CallOutcome, took| metrics.admin_call(e.label(), o.label(), took))
    };
    let admin = AdminClient::new(settings.admin_url.clone(), settings.admin_timeout).observed(observer);

    let server = match StatusServer::bind(settings.status_addr).await {
        Ok(server) => server,
        Err(e) => {
            tracing::error!(addr = %settings.status_addr, error = %e, "cannot bind the status address");
            return exit_code::CONFIG;
        }
    };

    let ignored_ports = settings.ignore_listener_ports.clone();
    let envoy = if envoy_command.is_empty() {
        Envoy::external(admin.clone(), ignored_ports)
    } else {
        let mut command = envoy_command;
        let extra = envoy::drain_flags(&command, settings.termination_grace_period);
        if !extra.is_empty() {
            tracing::info!("adding {} to Envoy's command line", extra.join(" "));
            command.extend(extra);
        }
        match envoy::Child::spawn(&command) {
            Ok(child) => {
                tracing::info!(pid = child.pid(), command = %command.join(" "), "Envoy started");
                Envoy::child(child, admin.clone(), ignored_ports)
            }
            Err(e) => {
                tracing::error!(program = %command[0], error = %e, "cannot start Envoy");
                return exit_code::CONFIG;
            }
        }
    };

    let (drain, handle) = Drain::new(Plan::new(&settings), envoy);
    let readiness = Readiness::new(settings.stale_after(), handle.watch());
    let heartbeat = poller::Heartbeat::default();
    let scraper = Scraper::new(
        metrics.clone(),
        readiness.clone(),
        settings.merge_envoy_metrics.then(|| admin.clone()),
    )
    .with_drain(handle.clone())
    .with_heartbeat(heartbeat.clone())
    .with_shutdown(shutdown.clone());
    let service = StatusService::new(readiness.clone())
        .with_drain(handle.clone())
        .with_metrics(&metrics, scraper);
    let local = server.local_addr().expect("bound listener has an address");
    tracing::info!(
        status_addr = %local,
        admin_url = %settings.admin_url,
        poll_interval = %D(settings.poll_interval),
        drain_until = %settings.drain_until,
        deadline = %D(settings.drain_deadline()),
        "lifeguard listening"
    );
    let server = tokio::spawn(server.serve(service, shutdown.clone()));
    let poller = tokio::spawn(poller::run(
        poller::Schedule::new(&settings),
        admin,
        readiness,
        metrics,
        heartbeat,
        shutdown.clone(),
    ));
    let signals = tokio::spawn(signals.forward(handle, shutdown.clone()));

    let outcome = drain.run().await;
    let code = outcome.exit_code();
    tracing::info!(?outcome, exit_code = code, "lifeguard exiting");
    shutdown.cancel();
    let _ = tokio::join!(poller, server, signals);
    code
}
