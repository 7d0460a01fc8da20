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
    /// Run the agent: serve readiness on the status port from Envoy's admin stats.
    Run {
        #[command(flatten)]
        args: RunArgs,
        /// Envoy's command line, after `--` (launching Envoy as a child is not
        /// supported yet: lifeguard watches an Envoy that runs beside it).
        #[arg(last = true, value_name = "ENVOY_COMMAND")]
        envoy: Vec<String>,
    },
}
