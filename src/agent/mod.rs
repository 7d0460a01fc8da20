//! The composition root: the one place that builds every piece from the
//! crates' plans and wires them together. Nothing else constructs another
//! crate's parts; each crate made its own plan from its own settings
//! (`lifeguard_config::Plan`).
//!
//! The order of `run` matters: signals are caught before anything may take
//! time (a SIGTERM during start-up must drain, not kill); the status port
//! is bound before Envoy starts (a port in use stops start-up before a
//! process is launched); Envoy is launched from the main thread (its
//! parent-death signal is tied to the thread that forks).
//!
//! What it runs ends in an [`Ended`], which [`crate::exit`] turns into the
//! process exit code; a start-up step that fails is a `StartError`.
//!
//! - [`signals`]: process signals handed to the drain, and reaping as PID 1.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cli::{BadSetting, Invocation, Task};
use crate::config::Plan;
use crate::drain::{Drain, DrainHandle, DrainUntil, Outcome};
use crate::drain_wait::{Checkers, DrainWait, DrainWaitPlan};
use crate::duration::GoDuration;
use crate::envoy::admin::{AdminClient, CallOutcome, Endpoint};
use crate::envoy::inbound::Inbound;
use crate::envoy::poller::{self, Heartbeat};
use crate::envoy::process::{Envoy, LaunchError};
use crate::envoy::readiness::Readiness;
use crate::envoy::version;
use crate::exit::Ended;
use crate::metrics::Metrics;
use crate::scrape::linger::Linger;
use crate::scrape::Scraper;
use crate::status::connections::connection_limit;
use crate::status::control::{self, ControlServer};
use crate::status::server::{self, StatusServer};
use crate::status::service::StatusService;
use crate::{cli, hooks, inject, logging};
use signals::{Signals, SignalsError};

pub mod signals;

/// Runs what the command line asked for, or reports the bad setting that
/// stopped it; how it ended, for `crate::exit` to make the exit code of.
pub fn main(invocation: Result<Invocation, BadSetting>) -> Ended {
    let task = match invocation {
        Ok(Invocation(task)) => task,
        Err(bad) => {
            eprintln!("{bad}");
            return Ended::BadSetting;
        }
    };
    match task {
        Task::Run { plan, effective, envoy } => {
            logging::init(&plan.log);
            for e in &effective {
                tracing::debug!(key = e.key, value = %e.value, source = %e.source, "setting");
            }
            for warning in plan.drain.warnings() {
                tracing::warn!("{warning}");
            }
            for renamed in &plan.renamed_keys {
                tracing::warn!("settings file: {renamed}");
            }
            if !plan.proxy_config_unused.is_empty() {
                let fields = plan.proxy_config_unused.join(", ");
                tracing::info!(
                    fields,
                    "PROXY_CONFIG fields lifeguard does not use (Istio's agent and injector read them)"
                );
            }
            // Start-up tuning, once, before the runtime: memory and open files.
            let open_files = lifeguard_sys::tune_for_run();
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .on_thread_park(return_freed_memory_now_and_then)
                .build();
            match runtime.expect("tokio runtime").block_on(run(plan, envoy, open_files)) {
                Ok(outcome) => Ended::Stopped(outcome),
                Err(e) => {
                    log_start_error(&e);
                    Ended::StartFailed
                }
            }
        }
        Task::Check { plan, effective } => Ended::Checked {
            warnings: cli::check_report(&plan, &effective),
        },
        Task::Wait(opts) => Ended::Hook(helper_runtime().block_on(hooks::wait(&opts))),
        Task::WaitAppExit(opts) => Ended::Hook(helper_runtime().block_on(hooks::wait_app_exit(&opts))),
        Task::Drain(opts) => Ended::Hook(helper_runtime().block_on(hooks::drain(&opts))),
        Task::Print(text) => {
            use std::io::Write;
            match std::io::stdout().write_all(&text) {
                Ok(()) => Ended::Printed,
                Err(_) => Ended::NotPrinted,
            }
        }
        Task::Inject(opts) => match inject::run(&opts) {
            Ok(()) => Ended::Injected,
            Err(e) => {
                eprintln!("lifeguard inject: {e}");
                Ended::NotInjected
            }
        },
    }
}

/// Why the agent could not start, one variant per start-up step in the
/// order `run` takes them; nothing is left running.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    #[error(transparent)]
    Signals(#[from] SignalsError),
    #[error(transparent)]
    StatusAddress(#[from] server::BindError),
    #[error(transparent)]
    ControlSocket(#[from] control::BindError),
    #[error(transparent)]
    Envoy(#[from] LaunchError),
}

/// A start-up error in the log: the step that failed, and why.
fn log_start_error(e: &StartError) {
    match std::error::Error::source(e) {
        Some(why) => tracing::error!(error = %why, "{e}"),
        None => tracing::error!("{e}"),
    }
}

/// When a worker goes idle: gives the memory its heap freed back to the
/// system, at most every 100 ms per thread (a burst, such as a merged
/// scrape, is then not kept while the agent idles).
fn return_freed_memory_now_and_then() {
    thread_local!(static LAST: std::cell::Cell<Option<Duration>> = const { std::cell::Cell::new(None) });
    // A coarse clock: the hook runs at every park, many times a second
    // under load.
    let now = lifeguard_sys::coarse_monotonic();
    let due = LAST
        .get()
        .is_none_or(|last| now.saturating_sub(last) >= Duration::from_millis(100));
    if due {
        LAST.set(Some(now));
        return_freed_memory();
    }
}

/// Gives the memory this thread's heap has freed back to the system.
/// mimalloc (the binary's allocator, `src/main.rs`) returns freed pages
/// only as the thread allocates again, so a worker that goes idle after a
/// burst (a merged scrape) would keep them.
#[allow(unsafe_code)]
fn return_freed_memory() {
    // SAFETY: mi_collect only walks and purges the calling thread's heap
    // and mimalloc's own structures; it takes no pointer.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

fn helper_runtime() -> tokio::runtime::Runtime {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    runtime.expect("tokio runtime")
}

/// Runs the agent until Envoy has stopped; how the drain ended. Runs on
/// the main thread (inside `block_on`), which Envoy's parent-death signal
/// relies on.
/// `open_files`: the open-files limit in force (None: unknown or
/// unlimited), which caps the status server's connections.
pub(crate) async fn run(
    plan: Plan,
    envoy_command: Vec<String>,
    open_files: Option<u64>,
) -> Result<Outcome, StartError> {
    let signals = Signals::install()?;
    let shutdown = CancellationToken::new();
    let metrics = Metrics::new(Instant::now());
    let admin = admin_client(&plan.envoy, &metrics);
    let (server, control) = bind(&plan.status, connection_limit(open_files)).await?;
    let local = server.local_addr().expect("a bound listener has an address");
    let ignored = plan.envoy.ignored_listener_ports.clone();
    let envoy = Envoy::start(envoy_command, plan.envoy.drain_time, admin.clone(), ignored.clone())?;
    let inbound = Inbound::new(admin.clone(), envoy.counts(), plan.drain.scope(), ignored);
    // Children lifeguard waits for itself: never reaped as orphans.
    let own_children: Vec<i32> = envoy.pid().map(|p| p as i32).into_iter().collect();
    let (app, drain_plan) = crate::pod::app::for_drain(
        &plan.drain,
        local.port(),
        plan.envoy.admin_url.port(),
        envoy.pid(),
        plan.pod.ignore_app_ports.clone(),
    );
    let drain_until = drain_plan.drain_until();
    let look_for_app = drain_plan.gateway_without_app().then(|| app.clone());
    let (drain, handle) = Drain::new(drain_plan, envoy, app);
    let readiness = Readiness::new(plan.envoy.stale_after, handle.phase());
    let heartbeat = Heartbeat::default();
    let linger = Linger::new(handle.watch());
    let checkers = Checkers::new(plan.drain_wait.checker_ranges.clone(), metrics.probes_not_counted());
    let (wait, drain_wait_task) = drain_wait(plan.drain_wait.clone(), inbound, checkers, &handle, &metrics, &shutdown);
    let scraper = scraper(&plan, &metrics, &readiness, &admin, &handle, &heartbeat, &shutdown);
    let scraper = scraper.with_drain_wait(wait.clone()).with_linger(linger.clone());
    let drain = drain.with_rotation(wait.clone());
    let wait_status = wait.clone();
    let service = StatusService::builder(readiness.clone())
        .drain(handle.clone(), plan.status.access.clone())
        .drain_wait(wait)
        .metrics(&metrics, scraper);
    let service = match plan.status.app_prober(local.port(), &metrics) {
        Some(prober) => service.app_probes(prober),
        None => service,
    }
    .service();
    let message_path = plan.exit.termination_message_path.resolve();
    log_start(&plan, local, drain_until, message_path.as_deref());
    let control = control.map(|c| tokio::spawn(c.serve(service.clone(), shutdown.clone())));
    let startup_poll = plan.envoy.schedule.startup_poll_interval;
    let envoy_version = version::log_once(admin.clone(), startup_poll, shutdown.clone());
    let tasks = [
        tokio::spawn(server.serve(service, shutdown.clone())),
        tokio::spawn(envoy_version),
        tokio::spawn(poller::run(
            plan.envoy.schedule,
            admin,
            readiness,
            metrics,
            heartbeat,
            shutdown.clone(),
        )),
        tokio::spawn(signals.forward(handle.clone(), own_children, shutdown.clone())),
        drain_wait_task,
        look_for_app_task(look_for_app, &handle, &shutdown),
    ];
    let outcome = drain.run().await;
    let status = handle.status();
    let summary = crate::exit::record(
        &outcome,
        &status,
        Some(&wait_status.published()),
        message_path.as_deref(),
    );
    linger.linger(plan.metrics.linger, &status, plan.drain.grace()).await;
    summary.log();
    shutdown.cancel();
    for task in tasks.into_iter().chain(control) {
        let _ = task.await;
    }
    Ok(outcome)
}

/// With the default policy in a pod (app-exit), the task that looks for
/// the app until the drain: a pod where none was ever seen is a gateway's.
fn look_for_app_task(
    app: Option<crate::pod::app::Watcher>,
    drain: &DrainHandle,
    shutdown: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let (drain, shutdown) = (drain.watch(), shutdown.clone());
    tokio::spawn(async move {
        if let Some(app) = app {
            crate::pod::app::look_for_app(app, drain, shutdown).await;
        }
    })
}

/// The merged scrape: Envoy's metrics (unless not merged), the app's, ours.
fn scraper(
    plan: &Plan,
    metrics: &Metrics,
    readiness: &Readiness,
    admin: &AdminClient,
    drain: &DrainHandle,
    heartbeat: &Heartbeat,
    shutdown: &CancellationToken,
) -> Scraper {
    let envoy = plan.metrics.merge_envoy_metrics.then(|| admin.clone());
    Scraper::new(metrics.clone(), readiness.clone(), envoy)
        .with_app_metrics(&plan.metrics.app_metrics)
        .with_drain(drain.clone())
        .with_heartbeat(heartbeat.clone())
        .with_shutdown(shutdown.clone())
}

/// The drain wait: its handle (telling the metrics of each answered wait)
/// and the task that applies the rule from the start of the drain.
fn drain_wait(
    plan: DrainWaitPlan,
    inbound: Inbound,
    checkers: Checkers,
    drain: &DrainHandle,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) -> (DrainWait, tokio::task::JoinHandle<()>) {
    let (wait, publish) = DrainWait::new(&plan, checkers.clone());
    let metrics = metrics.clone();
    let wait = wait.observed(Arc::new(move |why, took| metrics.drain_wait(why, took)));
    let task = tokio::spawn(crate::drain_wait::run(
        inbound,
        checkers,
        drain.watch(),
        plan,
        publish,
        shutdown.clone(),
    ));
    (wait, task)
}

/// The status port and the control socket, bound before anything starts:
/// an address in use stops start-up before a process is launched.
async fn bind(
    plan: &crate::status::Plan,
    max_connections: usize,
) -> Result<(StatusServer, Option<ControlServer>), StartError> {
    let server = StatusServer::bind(plan.addr, max_connections).await?;
    let control = plan.control_socket.as_deref().map(ControlServer::bind).transpose()?;
    Ok((server, control))
}

/// The admin client, telling the metrics of every call.
fn admin_client(plan: &crate::envoy::Plan, metrics: &Metrics) -> AdminClient {
    let metrics = metrics.clone();
    let observer = Arc::new(move |e: Endpoint, o: CallOutcome, took| metrics.admin_call(e, o, took));
    AdminClient::new(plan.admin_url.clone(), plan.admin_timeout).observed(observer)
}

fn log_start(plan: &Plan, local: std::net::SocketAddr, drain_until: DrainUntil, message: Option<&std::path::Path>) {
    tracing::info!(
        status_addr = %local,
        admin_url = %plan.envoy.admin_url,
        poll_interval = %GoDuration(plan.envoy.schedule.poll_interval),
        drain_until = %drain_until,
        deadline = %GoDuration(plan.drain.grace().deadline()),
        termination_message = %message.map_or("none".into(), |p| p.display().to_string()),
        control_socket = %plan.status.control_socket.as_deref().map_or("none".into(), |p| p.display().to_string()),
        loopback_control = plan.status.access.loopback,
        "lifeguard listening"
    );
    tracing::info!("the kubelet, while the pod terminates: {}", plan.drain.kubelet_rule());
    for way in plan.drain_wait.way_budgets(drain_until) {
        match way.fits || !way.declared {
            true => tracing::info!("{}", way.words),
            false => tracing::warn!("{}", way.words),
        }
    }
}
