//! Log set-up: lines on stderr, as text for people or as one JSON object a
//! line for log pipelines (`--log-format`), filtered by `--log`.
//!
//! In JSON each line is an object with `timestamp`, `level` and `fields`
//! (the message is `fields.message`); the exit summary's fields arrive as
//! fields of the last line, not as a string to parse again.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Starts logging with the filter the configuration validated.
pub fn init(filter: &str, format: LogFormat) {
    let filter = EnvFilter::try_new(filter).expect("the log filter was validated with the settings");
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder.json().with_ansi(false).with_current_span(false).init(),
    }
}
