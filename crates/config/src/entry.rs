//! One value of a lower layer (the settings file, `PROXY_CONFIG`): the
//! setting's key, its text as a user types it on the command line, and the
//! name the user gave it under. The file's sections and `PROXY_CONFIG`
//! make these; the layers lay them. And where a setting's value came
//! from ([`Source`]).

use std::fmt;

/// A value a lower layer gives, in the words a user types on the command
/// line: one value, or a list (a TOML array); or a file's value of a shape
/// no setting takes (a table, an array in an array), refused when laid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Text {
    One(String),
    List(Vec<String>),
    Unfit(String),
}

/// A list the way a user types it on the command line: comma-separated.
impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Text::One(text) | Text::Unfit(text) => f.write_str(text),
            Text::List(items) => f.write_str(&items.join(",")),
        }
    }
}

impl Text {
    /// A file's value: a string as written, a number or a boolean as a
    /// user types it, an array as a list of those.
    pub(crate) fn of_toml(value: &toml::Value) -> Text {
        let one = |value: &toml::Value| match value {
            toml::Value::String(s) => Some(s.clone()),
            toml::Value::Integer(i) => Some(i.to_string()),
            toml::Value::Float(x) => Some(x.to_string()),
            toml::Value::Boolean(b) => Some(b.to_string()),
            toml::Value::Datetime(d) => Some(d.to_string()),
            toml::Value::Array(_) | toml::Value::Table(_) => None,
        };
        let text = match value {
            toml::Value::Array(items) => items.iter().map(one).collect::<Option<_>>().map(Text::List),
            other => one(other).map(Text::One),
        };
        text.unwrap_or_else(|| Text::Unfit(value.to_string()))
    }
}

/// One value of a lower layer: the setting's key, its text, and the name
/// the user gave it under (`drain.shutdown_margin`, `PROXY_CONFIG
/// drainDuration`, `POD_IP`).
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) key: String,
    pub(crate) text: Text,
    pub(crate) field: String,
}

/// Where a setting's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Flag,
    Env,
    /// Istio's `PROXY_CONFIG`.
    ProxyConfig,
    File,
    Default,
}

/// `flag`, `env`, `PROXY_CONFIG`, `file`, `default`.
impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::ProxyConfig => f.write_str("PROXY_CONFIG"),
            other => f.write_str(&format!("{other:?}").to_lowercase()),
        }
    }
}
