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
//! - `stages`: `run` in stages (build: the ports bound, Envoy launched,
//!   every piece made; spawn; until stopped), each a type.
//! - `signals`: process signals handed to the drain, and reaping as PID 1.

use std::time::Duration;

use crate::cli::{BadSetting, Invocation, Task};
use crate::config::{Effective, Plan};
use crate::drain::Outcome;
use crate::envoy::process::LaunchError;
use crate::exit::Ended;
use crate::status::{control, server};
use crate::{cli, hooks, inject, logging};
use signals::SignalsError;
use stages::Builder;

mod signals;
mod stages;

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
            log_settings(&plan, &effective);
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

/// The settings in force (each one at debug), and what to say of them.
fn log_settings(plan: &Plan, effective: &[Effective]) {
    for e in effective {
        tracing::debug!(key = e.key, value = %e.value, source = %e.source, "setting");
    }
    for warning in plan.drain.warnings() {
        tracing::warn!("{warning}");
    }
    for renamed in &plan.renamed_keys {
        tracing::warn!("settings file: {renamed}");
    }
    if !plan.set_aside.is_empty() {
        let settings = plan.set_aside.join(", ");
        tracing::info!(settings, "settings given that the drain's policy leaves aside");
    }
    if !plan.proxy_config_unused.is_empty() {
        let fields = plan.proxy_config_unused.join(", ");
        tracing::info!(
            fields,
            "PROXY_CONFIG fields lifeguard does not use (Istio's agent and injector read them)"
        );
    }
}

/// Why the agent could not start, one variant per start-up step in the
/// order `run` takes them; nothing is left running.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    #[error(transparent)]
    Signals(#[from] SignalsError),
    #[error(transparent)]
    StatusAddress(#[from] server::AddrBindError),
    #[error(transparent)]
    ControlSocket(#[from] control::SocketBindError),
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
    let builder = Builder {
        plan,
        envoy_command,
        open_files,
    };
    let bound = builder.build().await?;
    Ok(bound.spawn().until_stopped().await)
}
