//! The `lifeguard` binary: parses the command line and wires the modules
//! together. The logic lives in the library.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use lifeguard::admin::AdminClient;
use lifeguard::cli::{Cli, Command};
use lifeguard::config::Settings;
use lifeguard::readiness::Readiness;
use lifeguard::server::{StatusServer, StatusService};
use lifeguard::{duration::Display as D, poller};

/// Exit code of a configuration or start-up error.
const EXIT_CONFIG: u8 = 2;

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match cli.command {
        Command::Run { args, envoy } => {
            let sub = matches.subcommand_matches("run");
            let (settings, effective) = match Settings::load(&args, sub) {
                Ok(loaded) => loaded,
                Err(e) => {
                    eprintln!("lifeguard: configuration error: {e}");
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            if !envoy.is_empty() {
                eprintln!(
                    "lifeguard: configuration error: launching Envoy after `--` is not supported yet; start Envoy beside lifeguard"
                );
                return ExitCode::from(EXIT_CONFIG);
            }
            init_logging(&settings.log);
            for e in &effective {
                tracing::debug!(key = e.key, value = %e.value, source = %e.source, "setting");
            }
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            runtime.block_on(run(settings))
        }
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

async fn run(settings: Settings) -> ExitCode {
    let shutdown = CancellationToken::new();
    let readiness = Readiness::new(settings.stale_after());
    let admin = AdminClient::new(settings.admin_url.clone(), settings.admin_timeout);

    let server = match StatusServer::bind(
        settings.status_addr,
        StatusService::new(readiness.clone()),
    )
    .await
    {
        Ok(server) => server,
        Err(e) => {
            tracing::error!(addr = %settings.status_addr, error = %e, "cannot bind the status address");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let local = server.local_addr().expect("bound listener has an address");
    tracing::info!(
        status_addr = %local,
        admin_url = %settings.admin_url,
        poll_interval = %D(settings.poll_interval),
        "lifeguard listening"
    );
    let server = tokio::spawn(server.serve(shutdown.clone()));
    let poller = tokio::spawn(poller::run(
        settings,
        admin,
        readiness.clone(),
        shutdown.clone(),
    ));

    let signal = wait_for_signal().await;
    readiness.start_draining();
    tracing::info!(signal, "stopping");
    shutdown.cancel();
    let _ = poller.await;
    let _ = server.await;
    ExitCode::SUCCESS
}

async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}
