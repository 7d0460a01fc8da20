//! Why settings were refused: a value (named as the user wrote it, with
//! where it came from), a rule across settings, or the settings file as a
//! whole.

use std::fmt;
use std::path::PathBuf;

use clap::error::{ContextKind, ContextValue};

use crate::entry::Source;
use crate::sections::KeyError;

/// A configuration error. The message names the field and the value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {why}")]
    File { path: PathBuf, why: FileError },
    #[error("invalid {field} = {value:?} (from {origin}): {why}")]
    Invalid {
        field: String,
        value: String,
        origin: Source,
        why: Why,
    },
}

/// Why the settings file was refused as a whole.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read: {0}")]
    Read(#[from] std::io::Error),
    #[error("not a regular file")]
    NotARegularFile,
    #[error("larger than 1 MiB")]
    TooLarge,
    #[error("{}", .0.message())]
    NotToml(#[source] toml::de::Error),
    /// A key that is no setting, or not where it may be.
    #[error(transparent)]
    Key(#[from] KeyError),
}

/// Why a value was refused, kept as the error that refused it until the
/// message is written.
#[derive(Debug)]
pub enum Why {
    /// The setting's parser refused it: clap's error, whose cause is the
    /// parser's own.
    Value(clap::Error),
    /// A file's value of a shape no setting takes: what it should be.
    Shape(&'static str),
    /// A rule across settings: the owning crate's error.
    Rule(Box<dyn std::error::Error + Send + Sync>),
    /// `PROXY_CONFIG` that cannot be read (its field is the one named).
    ProxyConfig(lifeguard_istio::proxy_config::ProxyConfigError),
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::Value(e) => clap_why(e, f),
            Why::Shape(expected) => write!(f, "expected {expected}"),
            Why::Rule(e) => write!(f, "{e}"),
            Why::ProxyConfig(e) => f.write_str(&e.why),
        }
    }
}

/// Why clap refused a value: the setting's parser's own error, else the
/// values it takes.
fn clap_why(err: &clap::Error, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match (std::error::Error::source(err), err.get(ContextKind::ValidValue)) {
        (Some(source), _) => write!(f, "{source}"),
        (None, Some(ContextValue::Strings(valid))) => write!(f, "expected one of {}", valid.join(", ")),
        _ => f.write_str("invalid value"),
    }
}
