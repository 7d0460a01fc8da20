//! The `lifeguard` binary: parses the command line and wires the modules
//! together. The logic lives in the library.

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{CommandFactory, FromArgMatches};
use tokio_util::sync::CancellationToken;

use tokio::time::Instant;

use lifeguard::admin::{AdminClient, CallOutcome, Endpoint};
use lifeguard::app;
use lifeguard::cli::{Cli, Command};
use lifeguard::config::{self, Settings};
use lifeguard::drain::{exit_code, Drain};
use lifeguard::envoy::Envoy;
use lifeguard::hooks;
use lifeguard::linger::Linger;
use lifeguard::logging;
use lifeguard::metrics::Metrics;
use lifeguard::outcome;
use lifeguard::readiness::Readiness;
use lifeguard::scrape::Scraper;
use lifeguard::server::{StatusServer, StatusService};
use lifeguard::signals::Signals;
use lifeguard::{duration::Display as D, poller};

/// mimalloc gives memory back to the system once freed (glibc's allocator
/// kept hundreds of MB after thousands of slow readers had gone) and
/// fragments less under many short-lived connections.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let matches = match Cli::command().try_get_matches_from(&argv) {
        Ok(matches) => matches,
        Err(e) => match config::from_clap_error(&e, &argv) {
            Some(e) => return config_error(argv.get(1).is_some_and(|a| a == "check"), &e),
            None => e.exit(),
        },
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match cli.command {
        Command::Run { args, envoy } => {
            let (settings, effective) = match args.load(matches.subcommand_matches("run").expect("run")) {
                Ok(loaded) => loaded,
                Err(e) => return config_error(false, &e),
            };
            logging::init(&settings.log, settings.log_format);
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
        Command::Check { args } => match args.load(matches.subcommand_matches("check").expect("check")) {
            Ok((settings, effective)) => ExitCode::from(lifeguard::cli::check_report(&settings, &effective)),
            Err(e) => config_error(true, &e),
        },
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
            agent_url,
            admin_url,
        } => {
            let opts = hooks::AppExitOptions {
                timeout,
                period,
                ignore_ports,
                agent: agent_url,
                admin: admin_url,
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

/// Reports a bad setting: exit code 2, nothing started.
fn config_error(check: bool, e: &config::ConfigError) -> ExitCode {
    let who = if check { "lifeguard check" } else { "lifeguard" };
    eprintln!("{who}: configuration error: {e}");
    ExitCode::from(exit_code::CONFIG)
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
    let local = server.local_addr().expect("bound listener has an address");
    let local_port = local.port();

    let (grace, scope) = (settings.termination_grace_period, settings.drain_scope);
    let ignored = settings.ignore_listener_ports.clone();
    let envoy = match Envoy::start(envoy_command, grace, admin.clone(), ignored, scope) {
        Ok(envoy) => envoy,
        Err(e) => {
            tracing::error!(error = %e, "cannot start Envoy");
            return exit_code::CONFIG;
        }
    };
    // Children lifeguard waits for itself: never reaped as orphans.
    let own_children: Vec<i32> = envoy.pid().map(|p| p as i32).into_iter().collect();

    let mut plan = settings.drain_plan();
    let admin_port = settings.admin_url.addr().port();
    let ignored_app = settings.ignore_app_ports.clone();
    let app = app::Watcher::for_policy(&mut plan.policy, local_port, admin_port, envoy.pid(), ignored_app);
    let message_path = settings.termination_message_path.resolve();
    let (linger_for, grace) = (settings.linger, settings.termination_grace_period);
    let (drain, handle) = Drain::new(plan, envoy, app);
    let linger = Linger::new(handle.watch());
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
        .with_metrics(&metrics, scraper)
        .with_linger(linger.clone());
    tracing::info!(
        status_addr = %local,
        admin_url = %settings.admin_url,
        poll_interval = %D(settings.poll_interval),
        drain_until = %handle.status().policy,
        deadline = %D(settings.drain_deadline()),
        termination_message = %message_path.as_deref().map_or("none".into(), |p| p.display().to_string()),
        "lifeguard listening"
    );
    let server = tokio::spawn(server.serve(service, shutdown.clone()));
    let poller = tokio::spawn(poller::run(
        settings.poll_schedule(),
        admin,
        readiness,
        metrics,
        heartbeat,
        shutdown.clone(),
    ));
    let signals = tokio::spawn(signals.forward(handle.clone(), own_children, shutdown.clone()));

    let outcome = drain.run().await;
    let code = outcome::conclude(
        &outcome,
        &handle.status(),
        message_path.as_deref(),
        &linger,
        linger_for,
        grace,
    )
    .await;
    shutdown.cancel();
    let _ = tokio::join!(poller, server, signals);
    code
}
