//! `agent::run` in stages, each a type, as kubert builds its admin server:
//!
//! 1. [`Builder`]: what the agent is built from (the plans, Envoy's
//!    command, the open-files limit).
//! 2. [`Builder::build`] catches the signals, binds the status port and
//!    the control socket, launches Envoy and makes every piece from the
//!    plans: a [`Bound`] agent, which knows its addresses and serves
//!    nothing yet. Each step that can fail is a `StartError`, in this
//!    order; nothing is left running after one.
//! 3. [`Bound::spawn`] logs the start and spawns every background task: a
//!    [`Running`] agent.
//! 4. [`Running::until_stopped`] runs the drain until Envoy has stopped,
//!    records how it ended, lingers for a last scrape, then stops every
//!    background task.
//!
//! What a piece needs from another is handed to it here, as a value, when
//! it is made: nothing is configured after it is shared.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::signals::Signals;
use super::StartError;
use crate::checkers::Checkers;
use crate::config::Plan;
use crate::drain::{Drain, DrainHandle, DrainUntil, Outcome};
use crate::drain_wait::{DrainWait, DrainWaitPlan, DrainWaitStatus};
use crate::duration::GoDuration;
use crate::envoy::admin::{AdminClient, CallOutcome, Endpoint};
use crate::envoy::inbound::Inbound;
use crate::envoy::poller::{self, Heartbeat};
use crate::envoy::process::Envoy;
use crate::envoy::readiness::Readiness;
use crate::envoy::version;
use crate::metrics::Metrics;
use crate::pod::app::Watcher;
use crate::scrape::linger::Linger;
use crate::scrape::{Scraper, ScraperBuilder};
use crate::status::connections::connection_limit;
use crate::status::control::ControlServer;
use crate::status::server::StatusServer;
use crate::status::service::StatusService;

/// What the agent is built from.
pub(super) struct Builder {
    pub(super) plan: Plan,
    /// Envoy's command line (empty: an Envoy already running beside).
    pub(super) envoy_command: Vec<String>,
    /// The open-files limit in force (None: unknown or unlimited), which
    /// caps the status server's connections.
    pub(super) open_files: Option<u64>,
}

/// The agent bound and built: its ports bound, Envoy launched, every piece
/// made; nothing served and no task running yet.
pub(super) struct Bound {
    plan: Plan,
    signals: Signals,
    common: Common,
    listeners: Listeners,
    pieces: Pieces,
}

/// The agent running: the drain machine, what its end needs, and the
/// background tasks, each stopped by `shutdown` once the agent ends.
pub(super) struct Running {
    drain: DrainMachine,
    handle: DrainHandle,
    drain_wait: DrainWait,
    linger: Linger,
    message_path: Option<PathBuf>,
    plan: Plan,
    shutdown: CancellationToken,
    /// In the order they are awaited at the end (the control socket's last).
    tasks: Vec<JoinHandle<()>>,
}

/// The drain machine as the agent runs it: the real Envoy, the real app,
/// the drain wait's verdict.
type DrainMachine = Drain<Envoy, Watcher, DrainWait>;

/// What every piece is given from the start: the metrics, Envoy's admin
/// client (telling the metrics of every call), the shutdown of every task.
struct Common {
    metrics: Metrics,
    admin: AdminClient,
    shutdown: CancellationToken,
}

/// The status port and the control socket, bound, not yet serving.
struct Listeners {
    server: StatusServer,
    control: Option<ControlServer>,
    /// The status port's address, as bound (a port 0 resolved).
    local: SocketAddr,
}

/// The pieces made from the plans once Envoy is launched.
struct Pieces {
    drain: DrainPieces,
    readiness: Readiness,
    heartbeat: Heartbeat,
    linger: Linger,
    drain_wait: DrainWaitPieces,
    service: StatusService,
    message_path: Option<PathBuf>,
}

/// The drain: its machine, its handle, and what was decided with it.
struct DrainPieces {
    machine: DrainMachine,
    handle: DrainHandle,
    until: DrainUntil,
    /// With the default policy in a pod (app-exit), the app to look for
    /// until the drain: a pod where none was ever seen is a gateway's.
    look_for_app: Option<Watcher>,
    /// Children lifeguard waits for itself: never reaped as orphans.
    own_children: Vec<i32>,
}

/// The drain wait: its handle (telling the metrics of each answered wait)
/// and what its task is made of.
struct DrainWaitPieces {
    handle: DrainWait,
    plan: DrainWaitPlan,
    inbound: Inbound,
    checkers: Checkers,
    publish: tokio::sync::watch::Sender<DrainWaitStatus>,
}

impl Builder {
    /// Catches the signals (a SIGTERM during start-up must drain, not
    /// kill), binds the status port and the control socket (an address in
    /// use stops start-up before a process is launched), launches Envoy,
    /// and makes every piece from the plans.
    pub(super) async fn build(self) -> Result<Bound, StartError> {
        let Builder {
            plan,
            envoy_command,
            open_files,
        } = self;
        let signals = Signals::install()?;
        let common = Common::new(&plan.envoy);
        let listeners = Listeners::bind(&plan.status, connection_limit(open_files)).await?;
        let ignored = plan.envoy.ignored_listener_ports.clone();
        let envoy = Envoy::start(envoy_command, plan.envoy.drain_time, common.admin.clone(), ignored)?;
        let pieces = Pieces::make(&plan, &common, envoy, listeners.local);
        Ok(Bound {
            plan,
            signals,
            common,
            listeners,
            pieces,
        })
    }
}

impl Bound {
    /// The status port's address (a port 0 resolved).
    pub(super) fn local_addr(&self) -> SocketAddr {
        self.listeners.local
    }

    /// Logs the start, and serves: the status port and the control socket,
    /// Envoy's version, the poller, the signals, the drain wait, the look
    /// for the app.
    pub(super) fn spawn(self) -> Running {
        log_start(&self.plan, self.local_addr(), &self.pieces);
        let Bound {
            plan,
            signals,
            common,
            listeners,
            pieces: p,
        } = self;
        let (service, shutdown, drain) = (p.service, &common.shutdown, &p.drain.handle);
        let control = listeners
            .control
            .map(|c| tokio::spawn(c.serve(service.clone(), shutdown.clone())));
        let startup_poll = plan.envoy.schedule.startup_poll_interval;
        let envoy_version = version::log_once(common.admin.clone(), startup_poll, shutdown.clone());
        let (admin, metrics) = (common.admin.clone(), common.metrics.clone());
        let poller = poller::run(
            plan.envoy.schedule,
            admin,
            p.readiness,
            metrics,
            p.heartbeat,
            shutdown.clone(),
        );
        let drain_wait = p.drain_wait.handle.clone();
        let tasks = [
            tokio::spawn(listeners.server.serve(service, shutdown.clone())),
            tokio::spawn(envoy_version),
            tokio::spawn(poller),
            tokio::spawn(signals.forward(drain.clone(), p.drain.own_children, shutdown.clone())),
            p.drain_wait.spawn(drain, shutdown),
            look_for_app(p.drain.look_for_app, drain, shutdown),
        ];
        Running {
            handle: drain.clone(),
            drain: p.drain.machine,
            drain_wait,
            linger: p.linger,
            message_path: p.message_path,
            plan,
            shutdown: common.shutdown,
            tasks: tasks.into_iter().chain(control).collect(),
        }
    }
}

impl Running {
    /// Runs the drain until Envoy has stopped; then writes the exit
    /// summary, lingers for a last scrape, logs the summary, and stops
    /// every background task. How the drain ended.
    pub(super) async fn until_stopped(self) -> Outcome {
        let outcome = self.drain.run().await;
        let status = self.handle.status();
        let wait = self.drain_wait.published();
        let message_path = self.message_path.as_deref();
        let summary = crate::exit::record(&outcome, &status, Some(&wait), message_path);
        let grace = self.plan.drain.grace();
        self.linger.linger(self.plan.metrics.linger, &status, grace).await;
        summary.log();
        self.shutdown.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
        outcome
    }
}

impl Common {
    fn new(plan: &crate::envoy::Plan) -> Common {
        let metrics = Metrics::new(Instant::now());
        let observed = metrics.clone();
        let observer = Arc::new(move |e: Endpoint, o: CallOutcome, took| observed.admin_call(e, o, took));
        let admin = AdminClient::new(plan.admin_url.clone(), plan.admin_timeout).observed(observer);
        Common {
            metrics,
            admin,
            shutdown: CancellationToken::new(),
        }
    }
}

impl Listeners {
    /// The status port, then the control socket.
    async fn bind(plan: &crate::status::Plan, max_connections: usize) -> Result<Listeners, StartError> {
        let server = StatusServer::bind(plan.addr, max_connections).await?;
        let control = plan.control_socket.as_deref().map(ControlServer::bind).transpose()?;
        let local = server.local_addr().expect("a bound listener has an address");
        Ok(Listeners { server, control, local })
    }
}

impl Pieces {
    /// Every piece, from the plans, around the launched `envoy`, the status
    /// port at `local`.
    fn make(plan: &Plan, common: &Common, envoy: Envoy, local: SocketAddr) -> Pieces {
        let ignored = plan.envoy.ignored_listener_ports.clone();
        let inbound = Inbound::new(common.admin.clone(), envoy.counts(), plan.drain.scope(), ignored);
        let drain_wait = DrainWaitPieces::make(plan, inbound, &common.metrics);
        let drain = DrainPieces::make(plan, envoy, local, drain_wait.handle.clone());
        let readiness = Readiness::new(plan.envoy.stale_after, drain.handle.phase());
        let heartbeat = Heartbeat::default();
        let linger = Linger::new(drain.handle.watch());
        let scraper = scraper(plan, common, &readiness, &drain.handle, &heartbeat)
            .drain_wait(drain_wait.handle.clone())
            .linger(linger.clone())
            .build();
        let service = service(plan, &common.metrics, &readiness, &drain, &drain_wait, scraper, local);
        let message_path = plan.exit.termination_message_path.resolve();
        Pieces {
            drain,
            readiness,
            heartbeat,
            linger,
            drain_wait,
            service,
            message_path,
        }
    }
}

impl DrainPieces {
    /// The machine around `envoy` and the app it finds beside the status
    /// port at `local`, waiting on `rotation` under `out-of-rotation`.
    fn make(plan: &Plan, envoy: Envoy, local: SocketAddr, rotation: DrainWait) -> DrainPieces {
        let own_children = envoy.pid().map(|p| p as i32).into_iter().collect();
        let (app, drain_plan) = crate::pod::app::for_drain(
            &plan.drain,
            local.port(),
            plan.envoy.admin_url.port(),
            envoy.pid(),
            plan.pod.ignore_app_ports.clone(),
        );
        let until = drain_plan.drain_until();
        let look_for_app = drain_plan.gateway_without_app().then(|| app.clone());
        let (machine, handle) = Drain::new(drain_plan, envoy, app);
        DrainPieces {
            machine: machine.with_rotation(rotation),
            handle,
            until,
            look_for_app,
            own_children,
        }
    }
}

impl DrainWaitPieces {
    fn make(plan: &Plan, inbound: Inbound, metrics: &Metrics) -> DrainWaitPieces {
        let plan = plan.drain_wait.clone();
        let checkers = Checkers::new(plan.checker_ranges.clone(), metrics.probes_not_counted());
        let (handle, publish) = DrainWait::new(&plan, checkers.clone());
        let metrics = metrics.clone();
        let handle = handle.observed(Arc::new(move |why, took| metrics.drain_wait(why, took)));
        DrainWaitPieces {
            handle,
            plan,
            inbound,
            checkers,
            publish,
        }
    }

    /// The task that applies the rule from the start of the drain.
    fn spawn(self, drain: &DrainHandle, shutdown: &CancellationToken) -> JoinHandle<()> {
        tokio::spawn(crate::drain_wait::run(
            self.inbound,
            self.checkers,
            drain.watch(),
            self.plan,
            self.publish,
            shutdown.clone(),
        ))
    }
}

/// The merged scrape: Envoy's metrics (unless not merged), the app's, ours.
fn scraper(
    plan: &Plan,
    common: &Common,
    readiness: &Readiness,
    drain: &DrainHandle,
    heartbeat: &Heartbeat,
) -> ScraperBuilder {
    let envoy = plan.metrics.merge_envoy_metrics.then(|| common.admin.clone());
    Scraper::builder(common.metrics.clone(), readiness.clone())
        .envoy(envoy)
        .app_metrics(&plan.metrics.app_metrics)
        .drain(drain.clone())
        .heartbeat(heartbeat.clone())
        .shutdown(common.shutdown.clone())
}

/// The status service: the probe, the drain's routes, the drain wait, the
/// scrape, the app's probes when there are any.
fn service(
    plan: &Plan,
    metrics: &Metrics,
    readiness: &Readiness,
    drain: &DrainPieces,
    drain_wait: &DrainWaitPieces,
    scraper: Scraper,
    local: SocketAddr,
) -> StatusService {
    let service = StatusService::builder(readiness.clone())
        .drain(drain.handle.clone(), plan.status.access.clone())
        .drain_wait(drain_wait.handle.clone())
        .metrics(metrics, scraper);
    match plan.status.app_prober(local.port(), metrics) {
        Some(prober) => service.app_probes(prober),
        None => service,
    }
    .service()
}

/// With the default policy in a pod (app-exit), the task that looks for
/// the app until the drain: a pod where none was ever seen is a gateway's.
fn look_for_app(app: Option<Watcher>, drain: &DrainHandle, shutdown: &CancellationToken) -> JoinHandle<()> {
    let (drain, shutdown) = (drain.watch(), shutdown.clone());
    tokio::spawn(async move {
        if let Some(app) = app {
            crate::pod::app::look_for_app(app, drain, shutdown).await;
        }
    })
}

/// The start-up lines: where lifeguard listens and how it drains, how the
/// kubelet is answered, each way a node gets its traffic.
fn log_start(plan: &Plan, local: SocketAddr, pieces: &Pieces) {
    let message = pieces.message_path.as_deref();
    let drain_until = pieces.drain.until;
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
