//! The composition root: the one place that builds every piece from the
//! settings and wires them together. Nothing else constructs another
//! module's parts, and every module's options are derived from the
//! settings here, once ([`Options`]).
//!
//! The order of `run` matters: signals are caught before anything may take
//! time (a SIGTERM during start-up must drain, not kill); the status port
//! is bound before Envoy starts (a port in use stops start-up before a
//! process is launched); Envoy is launched from the main thread (its
//! parent-death signal is tied to the thread that forks).
//!
//! What it runs ends in an [`Ended`], which `crate::exit` turns into the
//! process exit code; a start-up step that fails is a [`StartError`].
//!
//! - [`signals`]: process signals handed to the drain, and reaping as PID 1.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cli::{BadSetting, Invocation, Task};
use crate::config::Settings;
use crate::drain::{Drain, DrainHandle, DrainUntil, Outcome, Plan};
use crate::drain_wait::{Checkers, DrainWait, DrainWaitPlan};
use crate::duration::GoDuration;
use crate::envoy::admin::{AdminClient, CallOutcome, Endpoint};
use crate::envoy::inbound::Inbound;
use crate::envoy::poller::{self, Heartbeat, Schedule};
use crate::envoy::process::{Envoy, LaunchError};
use crate::envoy::readiness::Readiness;
use crate::envoy::version;
use crate::exit::linger::Linger;
use crate::exit::Ended;
use crate::metrics::scrape::Scraper;
use crate::metrics::Metrics;
use crate::pod::app::{in_a_pod, Watcher};
use crate::status::app_probe::AppProber;
use crate::status::connections::connection_limit;
use crate::status::control::{self, ControlServer};
use crate::status::server::{self, StatusServer};
use crate::status::service::{ControlAccess, StatusService};
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
        Task::Run {
            settings,
            effective,
            envoy,
        } => {
            logging::init(&settings.log, settings.log_format);
            for e in &effective {
                tracing::debug!(key = e.key, value = %e.value, source = %e.source, "setting");
            }
            for warning in settings.warnings() {
                tracing::warn!("{warning}");
            }
            if !settings.proxy_config_unused.is_empty() {
                let fields = settings.proxy_config_unused.join(", ");
                tracing::info!(
                    fields,
                    "PROXY_CONFIG fields lifeguard does not use (Istio's agent and injector read them)"
                );
            }
            // Start-up tuning, once, before the runtime: memory and open files.
            let open_files = crate::sys::tune_for_run();
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .on_thread_park(return_freed_memory_now_and_then)
                .build();
            match runtime
                .expect("tokio runtime")
                .block_on(run(settings, envoy, open_files))
            {
                Ok(outcome) => Ended::Stopped(outcome),
                Err(e) => {
                    log_start_error(&e);
                    Ended::StartFailed
                }
            }
        }
        Task::Check { settings, effective } => Ended::Checked {
            warnings: cli::check_report(&settings, &effective),
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
    let now = crate::sys::coarse_monotonic();
    let due = LAST
        .get()
        .is_none_or(|last| now.saturating_sub(last) >= Duration::from_millis(100));
    if due {
        LAST.set(Some(now));
        crate::sys::return_freed_memory();
    }
}

fn helper_runtime() -> tokio::runtime::Runtime {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    runtime.expect("tokio runtime")
}

/// Every module's options, derived from the settings in one place. The
/// drain's [`Plan`] is derived here too ([`Options::plan`]), once the one
/// fact it needs from the running pod is known: the policy in force
/// ([`app_watcher`]).
pub(crate) struct Options {
    pub(crate) schedule: Schedule,
    /// How old the last successful admin read may be before readiness stops
    /// trusting it: three poll intervals plus one read timeout.
    pub(crate) stale_after: Duration,
    pub(crate) drain_wait: DrainWaitPlan,
}

impl Options {
    pub(crate) fn from(settings: &Settings) -> Options {
        Options {
            schedule: Schedule {
                poll_interval: settings.poll_interval,
                startup_poll_interval: settings.startup_poll_interval,
                xds_check: settings.xds_check,
            },
            stale_after: settings.poll_interval * 3 + settings.admin_timeout,
            drain_wait: DrainWaitPlan {
                unhealthy_threshold: settings.drain_wait_unhealthy_threshold,
                min_quiet_period: settings.drain_wait_min_quiet_period,
                checker_timeout: settings.drain_wait_checker_timeout,
                drain_deadline: settings.drain_deadline(),
                grace_period: settings.termination_grace_period,
                shutdown_margin: settings.shutdown_margin,
                app_time: DrainWaitPlan::app_time_of(settings.drain_wait_app_time, settings.drain_deadline()),
            },
        }
    }

    /// The drain's plan, with `drain_until` the policy in force.
    pub(crate) fn plan(settings: &Settings, drain_until: DrainUntil) -> Plan {
        Plan {
            drain_until,
            gateway_without_app: drain_until == DrainUntil::AppExit && !settings.drain_until_given,
            scope: settings.drain_scope,
            drain_delay: settings.drain_delay,
            readiness_fail_delay: settings.readiness_fail_delay,
            termination_drain_duration: settings.termination_drain_duration,
            minimum_drain_duration: settings.minimum_drain_duration,
            drain_deadline: settings.drain_deadline(),
            admin_timeout: settings.admin_timeout,
            shutdown_margin: settings.shutdown_margin,
            poll_interval: settings.poll_interval,
        }
    }
}

/// The app's probes, reaching the app where the kubelet would: the pod's
/// address (the `pod_ip` setting: INSTANCE_IP, else POD_IP), or loopback.
fn app_prober(settings: &Settings, status_port: u16, metrics: &Metrics) -> Option<AppProber> {
    let pod_ip = settings.pod_ip;
    let dest = pod_ip.probe_destination(settings.app_probe_localhost);
    let prober = AppProber::new(&settings.app_probers, dest, status_port, Some(metrics))?;
    let paths = settings.app_probers.0.len();
    match pod_ip.0 {
        None if !settings.app_probe_localhost => tracing::warn!(
            paths, %dest, "app probes served; the pod's address is unknown (no INSTANCE_IP or POD_IP), so they go to loopback, \
             which an app listening only on the pod's address does not answer"
        ),
        _ => tracing::info!(paths, %dest, "app probes served"),
    }
    Some(prober)
}

/// Runs the agent until Envoy has stopped; how the drain ended. Runs on
/// the main thread (inside `block_on`), which Envoy's parent-death signal
/// relies on.
/// `open_files`: the open-files limit in force (None: unknown or
/// unlimited), which caps the status server's connections.
pub(crate) async fn run(
    settings: Settings,
    envoy_command: Vec<String>,
    open_files: Option<u64>,
) -> Result<Outcome, StartError> {
    let signals = Signals::install()?;
    let Options {
        schedule,
        stale_after,
        drain_wait: wait_plan,
    } = Options::from(&settings);
    let shutdown = CancellationToken::new();
    let metrics = Metrics::new(Instant::now());
    let admin = admin_client(&settings, &metrics);
    let (server, control) = bind(&settings, connection_limit(open_files)).await?;
    let local = server.local_addr().expect("a bound listener has an address");
    let (envoy_drain, scope) = (settings.envoy_drain(), settings.drain_scope);
    let ignored = settings.ignore_listener_ports.clone();
    let envoy = Envoy::start(envoy_command, envoy_drain, admin.clone(), ignored.clone())?;
    let inbound = Inbound::new(admin.clone(), envoy.counts(), scope, ignored);
    // Children lifeguard waits for itself: never reaped as orphans.
    let own_children: Vec<i32> = envoy.pid().map(|p| p as i32).into_iter().collect();
    let (app, drain_until) = app_watcher(&settings, local.port(), envoy.pid());
    let plan = Options::plan(&settings, drain_until);
    let look_for_app = plan.gateway_without_app.then(|| app.clone());
    let (drain, handle) = Drain::new(plan, envoy, app);
    let readiness = Readiness::new(stale_after, handle.phase());
    let heartbeat = Heartbeat::default();
    let linger = Linger::new(handle.watch());
    let checkers = Checkers::new(settings.drain_wait_checker_ranges.clone(), metrics.probes_not_counted());
    let (wait, drain_wait_task) = drain_wait(wait_plan, inbound, checkers, &handle, &metrics, &shutdown);
    let scraper = scraper(&settings, &metrics, &readiness, &admin, &handle, &heartbeat, &shutdown);
    let scraper = scraper.with_drain_wait(wait.clone()).with_linger(linger.clone());
    let drain = drain.with_rotation(wait.clone());
    let wait_status = wait.clone();
    let service = StatusService::builder(readiness.clone())
        .drain(handle.clone(), control_access(&settings))
        .drain_wait(wait)
        .metrics(&metrics, scraper);
    let service = match app_prober(&settings, local.port(), &metrics) {
        Some(prober) => service.app_probes(prober),
        None => service,
    }
    .service();
    let message_path = settings.termination_message_path.resolve();
    log_start(&settings, local, drain_until, message_path.as_deref());
    let control = control.map(|c| tokio::spawn(c.serve(service.clone(), shutdown.clone())));
    let envoy_version = version::log_once(admin.clone(), settings.startup_poll_interval, shutdown.clone());
    let tasks = [
        tokio::spawn(server.serve(service, shutdown.clone())),
        tokio::spawn(envoy_version),
        tokio::spawn(poller::run(
            schedule,
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
    crate::exit::conclude(
        &outcome,
        &handle.status(),
        Some(&wait_status.published()),
        message_path.as_deref(),
        &linger,
        settings.linger,
        settings.termination_grace_period,
    )
    .await;
    shutdown.cancel();
    for task in tasks.into_iter().chain(control) {
        let _ = task.await;
    }
    Ok(outcome)
}

/// With the default policy in a pod (app-exit), the task that looks for
/// the app until the drain: a pod where none was ever seen is a gateway's.
fn look_for_app_task(
    app: Option<Watcher>,
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

/// Who may drain and stop Envoy through the status service.
fn control_access(settings: &Settings) -> ControlAccess {
    ControlAccess {
        loopback: settings.loopback_control,
        socket: settings.control_socket.0.clone(),
    }
}

/// The merged scrape: Envoy's metrics (unless not merged), the app's, ours.
fn scraper(
    settings: &Settings,
    metrics: &Metrics,
    readiness: &Readiness,
    admin: &AdminClient,
    drain: &DrainHandle,
    heartbeat: &Heartbeat,
    shutdown: &CancellationToken,
) -> Scraper {
    let envoy = settings.merge_envoy_metrics.then(|| admin.clone());
    Scraper::new(metrics.clone(), readiness.clone(), envoy)
        .with_app_metrics(&settings.app_metrics)
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
    settings: &Settings,
    max_connections: usize,
) -> Result<(StatusServer, Option<ControlServer>), StartError> {
    let server = StatusServer::bind(settings.status_addr, max_connections).await?;
    let control = settings
        .control_socket
        .0
        .as_deref()
        .map(ControlServer::bind)
        .transpose()?;
    Ok((server, control))
}

/// The admin client, telling the metrics of every call.
fn admin_client(settings: &Settings, metrics: &Metrics) -> AdminClient {
    let metrics = metrics.clone();
    let observer = Arc::new(move |e: Endpoint, o: CallOutcome, took| metrics.admin_call(e, o, took));
    AdminClient::new(settings.admin_url.clone(), settings.admin_timeout).observed(observer)
}

/// What the drain watches of the app, and the policy in force: the one
/// asked, except that `app-exit` falls back to `requests` (with a warning)
/// when the app's sockets cannot be attributed here. The other policies
/// watch nothing.
fn app_watcher(settings: &Settings, status_port: u16, envoy: Option<u32>) -> (Watcher, DrainUntil) {
    if settings.drain_until != DrainUntil::AppExit {
        return (Watcher::inert(), settings.drain_until);
    }
    let instead = (Watcher::inert(), DrainUntil::Requests);
    if let Err(why) = in_a_pod() {
        if !settings.drain_until_given {
            tracing::info!("{why}: draining until zero requests (app-exit would wait on every socket of the machine)");
            return instead;
        }
        tracing::warn!("{why}: app-exit, as asked, waits on every socket of this machine that is not the proxy's");
    }
    let admin_port = settings.admin_url.port();
    let ignored = settings.ignore_app_ports.clone();
    match Watcher::for_pod(status_port, admin_port, envoy, ignored) {
        Ok(app) => {
            let processes = app.watches_processes();
            let and = if processes {
                " and processes (shared process namespace)"
            } else {
                ""
            };
            tracing::info!(processes, "app-exit: waiting for the app's sockets{and}");
            (app, DrainUntil::AppExit)
        }
        Err(why) => {
            tracing::warn!("the app's sockets cannot be attributed ({why}): draining until zero requests instead");
            instead
        }
    }
}

fn log_start(
    settings: &Settings,
    local: std::net::SocketAddr,
    drain_until: DrainUntil,
    message: Option<&std::path::Path>,
) {
    tracing::info!(
        status_addr = %local,
        admin_url = %settings.admin_url,
        poll_interval = %GoDuration(settings.poll_interval),
        drain_until = %drain_until,
        deadline = %GoDuration(settings.drain_deadline()),
        termination_message = %message.map_or("none".into(), |p| p.display().to_string()),
        control_socket = %settings.control_socket,
        loopback_control = settings.loopback_control,
        "lifeguard listening"
    );
}
