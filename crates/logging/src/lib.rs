//! Log set-up: lines on stderr, as text for people or as one JSON object a
//! line for log pipelines (`--log-format`), filtered by `--log`; the log's
//! settings (the section `[logging]`), and [`init`], which the binary
//! calls once.
//!
//! In JSON each line is an object with `timestamp`, `level` and `fields`
//! (the message is `fields.message`); the exit summary's fields arrive as
//! fields of the last line, not as a string to parse again.
//!
//! A crate of its own so that `tracing-subscriber` is built for the
//! binary and the settings alone: every other crate logs through
//! `tracing`, and a line that can repeat without bound goes through
//! `lifeguard_base::throttle::Throttle`.

use std::fmt;
use std::str::FromStr;

use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use clap::ValueEnum;
use serde::Serialize;

/// The log's settings. In the file: the section `[logging]`, a key a field.
#[derive(Debug, Clone, clap::Args, Serialize)]
#[group(skip)]
pub struct Settings {
    /// Log filter: a level (`info`), or targets and their levels
    /// (`warn,lifeguard=debug`).
    #[arg(long, env = "LIFEGUARD_LOG", value_name = "FILTER", default_value = "info")]
    pub log: LogFilter,

    /// Log line format: text (for people) or json (one JSON object a line,
    /// with `timestamp`, `level` and `fields`, for log pipelines).
    #[arg(long, env = "LIFEGUARD_LOG_FORMAT", value_name = "FORMAT", default_value = "text")]
    pub log_format: LogFormat,
}

/// A log filter, as tracing's `Targets` reads one: a level, or targets
/// and their levels (`warn,lifeguard=debug`); shown as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFilter(String);

/// A log filter that is not a level, nor targets and their levels.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("not a log filter: {0}")]
    Parse(#[from] tracing_subscriber::filter::ParseError),
    #[error(
        "not a log filter: {0:?} is neither a level (trace, debug, info, warn, error, off) nor a target \
         (a Rust path such as lifeguard or lifeguard_drain::machine) with or without =LEVEL"
    )]
    Directive(String),
}

/// A filter as tracing's `Targets` reads it, each directive a level, a
/// target, or `target=level`, a target being a Rust path: `Targets` takes
/// any text for a target (`[[[`), which matches no line and silences the
/// log, so a directive that could name none of ours is refused here.
impl FromStr for LogFilter {
    type Err = FilterError;
    fn from_str(s: &str) -> Result<LogFilter, FilterError> {
        for directive in s.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            let target = match directive.split_once('=') {
                Some((target, _level)) => target,
                None if directive.parse::<tracing_subscriber::filter::LevelFilter>().is_ok() => continue,
                None => directive,
            };
            if !is_rust_path(target) {
                return Err(FilterError::Directive(directive.to_owned()));
            }
        }
        s.parse::<Targets>()?;
        Ok(LogFilter(s.to_owned()))
    }
}

impl fmt::Display for LogFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

lifeguard_base::serialize_as_display!(LogFilter);

impl LogFilter {
    /// The filter tracing applies.
    fn targets(&self) -> Targets {
        self.0.parse().expect("the log filter was checked when read")
    }
}

/// `lifeguard`, `lifeguard_drain::machine`: identifiers joined by `::`.
fn is_rust_path(target: &str) -> bool {
    target.split("::").all(|part| {
        let mut chars = part.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// Starts logging with the filter the settings validated: a level, or
/// targets and their levels (`warn,lifeguard=debug`), as tracing's
/// `Targets` reads them (no regex engine in the binary for it).
pub fn init(settings: &Settings) {
    let format = settings.log_format;
    let filter = settings.log.targets();
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .finish()
            .with(filter)
            .init(),
        LogFormat::Json => builder
            .json()
            .with_ansi(false)
            .with_current_span(false)
            .finish()
            .with(filter)
            .init(),
    }
}

/// The format of log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// `2026-11-22T05:21:00Z  INFO message key=value`, for people.
    Text,
    /// One JSON object a line (timestamp, level, fields), for log pipelines.
    Json,
}

lifeguard_base::display_as_value!(LogFormat);
lifeguard_base::serialize_as_display!(LogFormat);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_is_levels_and_rust_paths_or_it_is_refused() {
        for good in [
            "info",
            "warn,lifeguard=debug",
            "lifeguard_drain::machine=trace",
            "off",
            "lifeguard",
        ] {
            assert_eq!(good.parse::<LogFilter>().unwrap().to_string(), good);
        }
        for bad in [
            "[[[",
            "foo=bar",
            "lifeguard=loud",
            "a b",
            "lifeguard::=info",
            "=info",
            "9lives",
        ] {
            let error = bad.parse::<LogFilter>().unwrap_err().to_string();
            assert!(error.starts_with("not a log filter"), "{bad}: {error}");
        }
    }
}
