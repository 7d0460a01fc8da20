//! What every crate's settings are made of. A crate owns its settings as a
//! clap `Args` group: each setting's flag, env variable, default and
//! type, declared once. A setting's type says what it takes: it reads its
//! text with `FromStr` (clap's derive calls it for the flag and the env
//! variable; the settings file and `PROXY_CONFIG` are laid through the
//! same arguments, so a file's value is checked by exactly the flag's
//! parser) and writes it back with `Display`, as a user writes it, which
//! is also how serde shows it in `lifeguard check`
//! ([`serialize_as_display!`](crate::serialize_as_display)). The types
//! every crate may take are here: durations ([`Span`], [`PositiveSpan`])
//! and Go's booleans ([`GoBool`]); a value one crate alone takes is that
//! crate's (`lifeguard_envoy::PollInterval`, ...). The code reads the
//! value inside with `get()`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::duration::{self, DurationError, GoDuration};

/// Any duration, zero included: `0s`, `500ms`, `1m30s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span(Duration);

impl Span {
    pub fn get(self) -> Duration {
        self.0
    }
}

impl FromStr for Span {
    type Err = DurationError;
    fn from_str(s: &str) -> Result<Span, DurationError> {
        duration::parse(s).map(Span)
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        GoDuration(self.0).fmt(f)
    }
}

crate::serialize_as_display!(Span);

/// A duration greater than zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PositiveSpan(Duration);

impl PositiveSpan {
    pub fn get(self) -> Duration {
        self.0
    }
}

impl FromStr for PositiveSpan {
    type Err = DurationError;
    fn from_str(s: &str) -> Result<PositiveSpan, DurationError> {
        duration::positive(s).map(PositiveSpan)
    }
}

impl fmt::Display for PositiveSpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        GoDuration(self.0).fmt(f)
    }
}

crate::serialize_as_display!(PositiveSpan);

/// A value that is not one of Go's booleans.
#[derive(Debug, thiserror::Error)]
#[error("expected true or false (or 1, t, T, TRUE, True, 0, f, F, FALSE, False)")]
pub struct NotABool;

/// A boolean the way Go's `strconv.ParseBool` (and so Istio) reads one:
/// `true`, `1`, `t`, `T`, `TRUE`, `True` and their `false` forms; shown
/// as `true` or `false`. A flag of this type takes its value
/// (`--flag false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoBool(bool);

impl GoBool {
    pub fn get(self) -> bool {
        self.0
    }
}

impl FromStr for GoBool {
    type Err = NotABool;
    fn from_str(s: &str) -> Result<GoBool, NotABool> {
        match s {
            "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(GoBool(true)),
            "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(GoBool(false)),
            _ => Err(NotABool),
        }
    }
}

impl fmt::Display for GoBool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

crate::serialize_as_display!(GoBool);

/// A rule across a crate's settings that does not hold, once every layer
/// is in: the setting it refuses (its key, as the file writes it), the
/// value as a user writes it, and why (`Display`). The settings' loader
/// names the key as the user gave it (flag, env variable, file key).
pub trait SettingError: std::error::Error {
    /// The refused setting's key.
    fn key(&self) -> &'static str;
    /// Its value, as a user writes it.
    fn value(&self) -> String;
}

/// A crate's settings at their defaults, as clap makes them with no flag
/// and no environment variable: the plans tests build start from these,
/// never from numbers restated by hand. (Clap is base's for this alone:
/// the `testing` feature.)
#[cfg(feature = "testing")]
pub fn defaults<S: clap::Args + clap::FromArgMatches>() -> S {
    let cmd = S::augment_args(clap::Command::new("defaults")).mut_args(|arg| arg.env(None));
    let matches = cmd
        .try_get_matches_from(["defaults"])
        .expect("every setting has a default");
    S::from_arg_matches(&matches).expect("the defaults parse")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_as_a_user_writes_them_and_show_the_same() {
        let span: Span = "1m30s".parse().unwrap();
        assert_eq!(
            (span.get(), span.to_string()),
            (Duration::from_secs(90), "1m30s".into())
        );
        assert_eq!("0".parse::<Span>().unwrap().to_string(), "0s");
        let err = "0s".parse::<PositiveSpan>().unwrap_err();
        assert_eq!(err.to_string(), "must be greater than zero");
        for (text, b) in [("T", true), ("1", true), ("True", true), ("f", false), ("FALSE", false)] {
            let value: GoBool = text.parse().unwrap();
            assert_eq!((value.get(), value.to_string()), (b, b.to_string()));
        }
        assert!("yes".parse::<GoBool>().is_err());
    }
}
