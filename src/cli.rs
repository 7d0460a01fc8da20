//! The command line of the `lifeguard` binary: clap's definition (the
//! agent's settings are the config crate's `RunArgs`; the hooks' and
//! `inject`'s options their crates'), [`parse`], which turns `argv` into
//! what to run ([`Invocation`]) or a bad setting ([`BadSetting`], naming
//! the field as the user wrote it), and `lifeguard check`'s report.

use std::ffi::OsString;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use lifeguard_base::duration::GoDuration;
use lifeguard_config::{ConfigError, Effective, Plan, RunArgs};
use lifeguard_hooks::{AppExitOptions, DrainOptions, WaitOptions};
use lifeguard_inject::InjectOptions;

#[derive(Debug, Parser)]
#[command(name = "lifeguard", version, about = "Sidecar agent that owns Envoy's readiness, drain and exit")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent: serve readiness from Envoy's admin stats, drain Envoy
    /// and stop it on SIGTERM. With `-- ENVOY_COMMAND...` Envoy is launched
    /// as lifeguard's child; without it, lifeguard looks after an Envoy that
    /// runs beside it and stops it through its admin API.
    Run {
        #[command(flatten)]
        args: RunArgs,
        /// Envoy's command line, after `--`.
        #[arg(last = true, value_name = "ENVOY_COMMAND")]
        envoy: Vec<String>,
    },

    /// Validate a configuration without starting anything: print every
    /// effective setting with where it came from. Exit 0 when good, 1 when a
    /// duration cannot fit the grace period, 2 on an error.
    Check {
        #[command(flatten)]
        args: RunArgs,
    },

    /// postStart hook: wait until the proxy is ready (exit 0), or give up
    /// after the timeout (exit 1, with the last answer on stderr).
    Wait(WaitOptions),

    /// preStop helper: tell the agent that termination began, then wait
    /// until the app holds no TCP socket in the pod (IPv4 and IPv6, listening
    /// or connected) and, with a shared process namespace, no process; the
    /// proxy is known by pid. Reports what it waits for.
    WaitAppExit(AppExitOptions),

    /// Rewrite a pod's probes and hooks to the status port as Istio's
    /// injector does, and hand the originals to the proxy container in
    /// ISTIO_KUBE_APP_PROBERS: Kubernetes YAML in (a file, or stdin), the
    /// rewritten YAML out. Idempotent.
    Inject(InjectOptions),

    /// Native-sidecar preStop hook: `POST /drain` on the agent and wait until
    /// it answers (drained). Exit 1 with the reason when it does not answer 200.
    Drain(DrainOptions),

    /// Print a shell's completion script for lifeguard, e.g.
    /// `lifeguard completions bash > /etc/bash_completion.d/lifeguard`.
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },

    /// Print lifeguard's man page (roff), e.g. `lifeguard man > lifeguard.1`:
    /// every command, option, environment variable and default.
    Man,
}

/// `lifeguard check`: prints every effective setting with its source, the
/// drain deadline and the warnings; returns how many warnings.
pub fn check_report(plan: &Plan, effective: &[Effective]) -> usize {
    let width = effective.iter().map(|e| e.key.len()).max().unwrap_or(0);
    for e in effective {
        println!("{:width$} = {:<24} ({})", e.key, e.value, e.source);
    }
    println!(
        "{:width$} = {}",
        "drain deadline",
        GoDuration(plan.drain.grace().deadline())
    );
    if !plan.set_aside.is_empty() {
        println!(
            "settings the drain's policy leaves aside: {}",
            plan.set_aside.join(", ")
        );
    }
    if !plan.proxy_config_unused.is_empty() {
        println!("PROXY_CONFIG fields not used: {}", plan.proxy_config_unused.join(", "));
    }
    // An old name is read as the new one: said, not a failed check.
    for renamed in &plan.renamed_keys {
        eprintln!("lifeguard check: {renamed}");
    }
    println!("{:width$} = {}", "the kubelet, terminating", plan.drain.kubelet_rule());
    let mut warnings = plan.drain.warnings();
    // Each way a node gets its traffic, what it needs of the grace period:
    // held to when its settings were set, said when assumed.
    println!("load balancers that check the pod: learned from their probes while lifeguard runs (GET /drain: drain_wait.budget)");
    for way in plan.drain_wait.way_budgets(plan.drain.drain_until()) {
        match (way.fits, way.declared) {
            (true, _) => println!("{}", way.words),
            (false, false) => println!("note (assumed, not held to): {}", way.words),
            (false, true) => warnings.push(way.words),
        }
    }
    for w in &warnings {
        eprintln!("lifeguard check: {w}");
    }
    if warnings.is_empty() {
        println!("configuration OK");
    }
    warnings.len()
}

/// What the command line asks for, its settings loaded and checked: made
/// by [`parse`], run by the binary's agent (`lifeguard::agent::main`).
#[derive(Debug)]
pub struct Invocation(pub Task);

/// What to run.
#[derive(Debug)]
pub enum Task {
    /// `lifeguard run`: the agent, and Envoy's command line (empty: an
    /// Envoy that runs beside lifeguard).
    Run {
        plan: Plan,
        effective: Vec<Effective>,
        envoy: Vec<String>,
    },
    /// `lifeguard check`.
    Check { plan: Plan, effective: Vec<Effective> },
    /// `lifeguard wait`.
    Wait(WaitOptions),
    /// `lifeguard wait-app-exit`.
    WaitAppExit(AppExitOptions),
    /// `lifeguard drain`.
    Drain(DrainOptions),
    /// `lifeguard inject`.
    Inject(InjectOptions),
    /// `lifeguard completions` and `man`: text to print.
    Print(Vec<u8>),
}

/// A shell's completion script for the whole command line.
fn completions(shell: clap_complete::Shell) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "lifeguard", &mut out);
    out
}

/// The man page: the command, then each subcommand's section with its
/// options, environment variables and defaults.
fn man_page() -> Vec<u8> {
    let cmd = Cli::command();
    let mut out = Vec::new();
    let man = clap_mangen::Man::new(cmd.clone());
    // Writing to a Vec cannot fail.
    let _ = man.render(&mut out);
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let name = format!("lifeguard-{}", sub.get_name());
        let _ = clap_mangen::Man::new(sub.clone()).title(name).render(&mut out);
    }
    out
}

/// A setting the command line, the environment or a file got wrong, as
/// `lifeguard` (or `lifeguard check`) reports it: nothing is started.
#[derive(Debug, thiserror::Error)]
#[error("{}: configuration error: {error}", if *.check { "lifeguard check" } else { "lifeguard" })]
pub struct BadSetting {
    /// Whether `lifeguard check` was asked.
    check: bool,
    error: ConfigError,
}

/// Parses `argv`. Help, version and usage errors are printed by clap, which
/// exits; a bad setting is `Err`, for the caller to report.
pub fn parse(argv: Vec<OsString>) -> Result<Invocation, BadSetting> {
    let check = argv.get(1).is_some_and(|a| a == "check");
    let matches = match Cli::command().try_get_matches_from(&argv) {
        Ok(matches) => matches,
        Err(e) => match lifeguard_config::from_clap_error(e, &argv) {
            Ok(error) => return Err(BadSetting { check, error }),
            Err(e) => e.exit(),
        },
    };
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let sub = |name| {
        matches
            .subcommand_matches(name)
            .expect("the subcommand that was parsed")
    };
    let load = |args: RunArgs, name| args.load(sub(name)).map_err(|error| BadSetting { check, error });
    Ok(Invocation(match cli.command {
        Command::Run { args, envoy } => {
            let loaded = load(args, "run")?;
            Task::Run {
                plan: loaded.plan,
                effective: loaded.effective,
                envoy,
            }
        }
        Command::Check { args } => {
            let loaded = load(args, "check")?;
            Task::Check {
                plan: loaded.plan,
                effective: loaded.effective,
            }
        }
        Command::Wait(opts) => Task::Wait(opts),
        Command::WaitAppExit(opts) => Task::WaitAppExit(opts),
        Command::Inject(opts) => Task::Inject(opts),
        Command::Drain(opts) => Task::Drain(opts),
        Command::Completions { shell } => Task::Print(completions(shell)),
        Command::Man => Task::Print(man_page()),
    }))
}
