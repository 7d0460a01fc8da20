//! The configuration reference (`docs/configuration.md`), written from the
//! settings themselves, a table for each crate's: each setting's flag, env
//! variable, file key, default and doc comment, as clap reads them. `tests/docs.rs` keeps the file in step
//! (`LIFEGUARD_UPDATE_DOCS=1 cargo test --test docs` rewrites it).

use clap::{Args, Command};

use super::RunArgs;
use crate::sections::SECTIONS;

const HEAD: &str = "\
# Configuration reference

<!-- Written from each crate's `Settings` (and the config crate's
     `RunArgs`) by
     `LIFEGUARD_UPDATE_DOCS=1 cargo test --test docs`; tests/docs.rs keeps
     it in step. Edit the doc comments there, not this file. -->

`lifeguard run [OPTIONS] [-- ENVOY COMMAND...]` and `lifeguard check
[OPTIONS]` take these settings. Each is a flag, an environment variable,
or a key of the TOML file given with `--config`; **flag beats env beats
Istio's `PROXY_CONFIG` beats file beats default**. `lifeguard check` prints
every effective value and where it came from.

- **Durations** are written the Go way: `500ms`, `5s`, `1m30s` (at most
  `8760h`).
- **Booleans** take Go's forms (`1 t T TRUE true True`,
  `0 f F FALSE false False`), and TOML booleans in the file.
- **The file's values** (and `PROXY_CONFIG`'s) are read by the flag's own
  parser: a string, a number or a boolean as the flag takes it; a list as
  a TOML array (`checker_ranges = [\"35.191.0.0/16\", \"130.211.0.0/22\"]`),
  or as one string split at its commas as the env variable is, each item
  as written (`\"9000,9001\"`; an empty string is no item).
- **The file** must be a regular file of at most 1 MiB. Each crate's keys
  sit in its section (`[drain]`, `[envoy]`, ... named below), or at the
  top level as before the sections; a key set twice, a key in another
  crate's section and an unknown key are errors. `config/lifeguard.toml`
  lists every key in its section with its default. The drain wait's keys
  were once written `drain_wait_app_time` and so on: those names are
  still read, with a warning at start-up and from `lifeguard check`.
- **A bad value stops start-up** (exit code 2) with a message naming the
  field as it was given (flag, env variable, file key such as
  `drain.shutdown_margin`) and the value,
  for example `invalid --poll-interval = \"5x\" (from flag): invalid
  duration \"5x\": unknown unit`. A drain that cannot fit the grace period
  is a warning at start-up.

";

/// The whole of `docs/configuration.md`.
pub fn reference() -> String {
    let mut out = String::from(HEAD);
    out.push_str("## The settings' own layers\n\n`lifeguard-config`'s settings.\n\n");
    out.push_str(TABLE_HEAD);
    let cmd = RunArgs::augment_args(Command::new("lifeguard"));
    for arg in cmd.get_arguments() {
        if matches!(arg.get_id().as_str(), "config" | "proxy_config") {
            out.push_str(&row(arg, None));
        }
    }
    for section in &SECTIONS {
        let (heading, krate, name) = (section.heading, section.krate, section.name);
        out.push_str(&format!(
            "\n## {heading}\n\n`{krate}`'s settings; in the file, the section `[{name}]`.\n\n"
        ));
        out.push_str(TABLE_HEAD);
        for arg in section.command().get_arguments() {
            out.push_str(&row(arg, Some(name)));
        }
    }
    out
}

const TABLE_HEAD: &str = "| flag | env | file key | default | meaning |\n| --- | --- | --- | --- | --- |\n";

/// One setting's row of the reference; its file key in `section`.
fn row(arg: &clap::Arg, section: Option<&str>) -> String {
    let key = arg.get_id().as_str();
    let value = arg
        .get_value_names()
        .and_then(|names| names.first())
        .map_or(String::new(), |n| format!(" {n}"));
    let flag = format!("`--{}{value}`", arg.get_long().unwrap_or(key));
    let env = arg
        .get_env()
        .map_or(String::new(), |e| format!("`{}`", e.to_string_lossy()));
    let file_key = section.map_or(String::new(), |s| format!("`{s}.{key}`"));
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|d| match d.to_string_lossy().as_ref() {
            "" => "(empty)".to_owned(),
            d => format!("`{d}`"),
        })
        .collect();
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map_or(String::new(), |h| h.to_string());
    let meaning = help
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|");
    format!(
        "| {flag} | {env} | {file_key} | {} | {meaning} |\n",
        defaults.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_has_one_row() {
        let text = reference();
        let cmd = RunArgs::augment_args(Command::new("lifeguard"));
        for arg in cmd.get_arguments() {
            let flag = format!("| `--{} ", arg.get_long().unwrap());
            let flag_bare = format!("| `--{}` ", arg.get_long().unwrap());
            let rows = text.matches(&flag).count() + text.matches(&flag_bare).count();
            assert_eq!(rows, 1, "{flag}");
        }
    }
}
