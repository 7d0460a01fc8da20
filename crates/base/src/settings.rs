//! What every crate's settings are made of. A crate owns its settings as a
//! clap `Args` group that serde reads too (the settings file's keys are
//! the fields' names); each value's parser is shared by both
//! ([`crate::shared_parser`]), so a file value is checked exactly like a flag.
//! The parsers of values every crate may take are here: durations
//! ([`span`], [`positive`]), ports ([`ports`]) and Go's booleans
//! ([`go_bool`]).

use std::time::Duration;

use serde::{de, Deserialize, Deserializer};

use crate::duration::{self, GoDuration};

/// Declares a parser that clap (`NAME::parse`) and serde (`with = "NAME"`)
/// share: `shared_parser!(pub span: Duration = parse_fn, shown as show_fn)`.
/// The calling crate names `serde`.
#[macro_export]
macro_rules! shared_parser {
    ($(#[$doc:meta])* $vis:vis $name:ident: $ty:ty = $parse:expr, shown as $show:expr) => {
        $(#[$doc])*
        $vis mod $name {
            #[allow(unused_imports)]
            use super::*;
            /// The value from its text (a flag, an env variable, a file's string).
            pub fn parse(s: &str) -> Result<$ty, impl std::error::Error + Send + Sync + 'static> {
                ($parse)(s)
            }
            /// The value as a user writes it.
            pub fn serialize<S: serde::Serializer>(v: &$ty, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(&($show)(v))
            }
            /// The value from a file's string, checked by [`parse`].
            pub fn deserialize<'de, De: serde::Deserializer<'de>>(d: De) -> Result<$ty, De::Error> {
                let text = <String as serde::Deserialize>::deserialize(d)?;
                parse(&text).map_err(<De::Error as serde::de::Error>::custom)
            }
        }
    };
}

shared_parser!(
    /// Any duration, zero included.
    pub span: Duration = duration::parse, shown as |d: &Duration| GoDuration(*d)
);
shared_parser!(
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

/// A file's list of ports: 1 to 65535 each (`deserialize_with`).
pub fn ports<'de, De: Deserializer<'de>>(d: De) -> Result<Vec<u16>, De::Error> {
    let ports = Vec::<u16>::deserialize(d)?;
    match ports.contains(&0) {
        true => Err(de::Error::custom("0 is not a port (1-65535)")),
        false => Ok(ports),
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
