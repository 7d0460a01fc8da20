//! What every crate's settings are made of. A crate owns its settings as a
//! clap `Args` group: each setting's flag, env variable, default and
//! parser, declared once. The settings file and `PROXY_CONFIG` are read
//! through the same arguments (the config crate lays them), so a file's
//! value is checked by exactly the flag's parser; serde only writes the
//! settings out, as `lifeguard check` shows them. The parsers of values
//! every crate may take are here: durations ([`span`], [`positive`]) and
//! Go's booleans ([`go_bool`]).

use std::time::Duration;

use crate::duration::{self, GoDuration};

/// Declares a setting's parser (`NAME::parse`, for clap's `value_parser`)
/// and how its value is shown (`NAME::serialize`, for serde's
/// `serialize_with`): `setting_value!(pub span: Duration = parse_fn, shown
/// as show_fn)`. The calling crate names `serde`.
#[macro_export]
macro_rules! setting_value {
    ($(#[$doc:meta])* $vis:vis $name:ident: $ty:ty = $parse:expr, shown as $show:expr) => {
        $(#[$doc])*
        $vis mod $name {
            #[allow(unused_imports)]
            use super::*;
            /// The value from its text (a flag, an env variable, a file's value).
            pub fn parse(s: &str) -> Result<$ty, impl std::error::Error + Send + Sync + 'static> {
                ($parse)(s)
            }
            /// The value as a user writes it.
            pub fn serialize<S: serde::Serializer>(v: &$ty, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(&($show)(v))
            }
        }
    };
}

setting_value!(
    /// Any duration, zero included.
    pub span: Duration = duration::parse, shown as |d: &Duration| GoDuration(*d)
);
setting_value!(
    /// A duration greater than zero.
    pub positive: Duration = duration::positive, shown as |d: &Duration| GoDuration(*d)
);

/// A value that is not one of Go's booleans.
#[derive(Debug, thiserror::Error)]
#[error("expected true or false (or 1, t, T, TRUE, True, 0, f, F, FALSE, False)")]
pub struct NotABool;

/// A boolean the way Go's `strconv.ParseBool` (and so Istio) reads one.
pub fn go_bool(s: &str) -> Result<bool, NotABool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(NotABool),
    }
}

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
/// never from numbers restated by hand.
pub fn defaults<S: clap::Args + clap::FromArgMatches>() -> S {
    let cmd = S::augment_args(clap::Command::new("defaults")).mut_args(|arg| arg.env(None));
    let matches = cmd
        .try_get_matches_from(["defaults"])
        .expect("every setting has a default");
    S::from_arg_matches(&matches).expect("the defaults parse")
}
