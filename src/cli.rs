//! The command line of the `lifeguard` binary.

use clap::{Parser, Subcommand};

use crate::config::RunArgs;

#[derive(Debug, Parser)]
#[command(
    name = "lifeguard",
    version,
    about = "Sidecar agent that owns Envoy's readiness, drain and exit"
)]
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
}
