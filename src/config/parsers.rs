//! The parsers of the settings' values, each shared by clap (a flag or an
//! env variable) and serde (the file), so a file value is checked exactly
//! like a flag. Each refuses with its concern's error (a
//! [`DurationError`], a [`crate::url::UrlError`], Istio's formats' own,
//! ...); the settings' own small values with a [`ValueError`]. clap and
//! serde put the field's name in front ([`super::ConfigError`]).

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use serde::{de, Deserialize, Deserializer};

use crate::duration::{self, DurationError, GoDuration};
use crate::exit::MessagePath;
use crate::istio::annotations::AppMetrics;
use crate::istio::probers::{AppProbes, PodIp};
use crate::url::ControlSocket;
use crate::url::LoopbackUrl;

/// Declares a parser that clap (`NAME::parse`) and serde (`with = "NAME"`)
/// share, so a file value is checked exactly like a flag.
macro_rules! shared_parser {
    ($name:ident: $ty:ty = $parse:expr, shown as $show:expr) => {
        pub(super) mod $name {
            use super::*;
            pub(crate) fn parse(s: &str) -> Result<$ty, impl std::error::Error + Send + Sync + 'static> {
                ($parse)(s)
            }
            pub(crate) fn serialize<S: serde::Serializer>(v: &$ty, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(&($show)(v))
            }
            pub(crate) fn deserialize<'de, De: Deserializer<'de>>(d: De) -> Result<$ty, De::Error> {
                parse(&String::deserialize(d)?).map_err(de::Error::custom)
            }
        }
    };
}

shared_parser!(addr: SocketAddr = status_addr, shown as |a: &SocketAddr| *a);
shared_parser!(url: LoopbackUrl = LoopbackUrl::from_str, shown as |u: &LoopbackUrl| u.clone());
shared_parser!(filter: String = log_filter, shown as |f: &String| f.clone());
shared_parser!(poll: Duration = |s| duration::at_least(s, Duration::from_millis(10)), shown as |d: &Duration| GoDuration(*d));
shared_parser!(positive: Duration = duration::positive, shown as |d: &Duration| GoDuration(*d));
shared_parser!(span: Duration = duration::parse, shown as |d: &Duration| GoDuration(*d));
shared_parser!(grace: Duration = grace_period, shown as |d: &Duration| GoDuration(*d));
shared_parser!(message_path: MessagePath = MessagePath::from_str, shown as |p: &MessagePath| p.clone());
shared_parser!(app_probes: AppProbes = AppProbes::parse, shown as |p: &AppProbes| p.to_json());
shared_parser!(app_metrics: AppMetrics = AppMetrics::parse, shown as |m: &AppMetrics| m.to_json());
shared_parser!(pod_ip: PodIp = PodIp::from_str, shown as |p: &PodIp| *p);
shared_parser!(control_socket: ControlSocket = ControlSocket::from_str, shown as |p: &ControlSocket| p.clone());

/// Why a setting's own value was refused (the values of other concerns
/// have their own errors: durations, URLs, Istio's formats, paths).
#[derive(Debug, thiserror::Error)]
pub enum ValueError {
    #[error("expected IP:PORT, for example 0.0.0.0:15020")]
    NotAnAddress,
    #[error("expected an address range (CIDR), for example 35.191.0.0/16, or an address")]
    NotARange,
    #[error("port 0 is not allowed: Envoy must know where to send probes")]
    StatusPortZero,
    #[error("not a log filter: {0}")]
    LogFilter(#[from] tracing_subscriber::filter::ParseError),
    #[error("expected true or false (or 1, t, T, TRUE, True, 0, f, F, FALSE, False)")]
    NotABool,
    #[error("expected a whole number from 1 to 100")]
    NotAThreshold,
}

/// Kubernetes writes terminationGracePeriodSeconds as a bare number of
/// seconds; accept that too. Greater than zero.
fn grace_period(s: &str) -> Result<Duration, DurationError> {
    let bare = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    duration::positive(&if bare { format!("{s}s") } else { s.to_owned() })
}

fn status_addr(s: &str) -> Result<SocketAddr, ValueError> {
    let addr: SocketAddr = s.parse().map_err(|_| ValueError::NotAnAddress)?;
    if addr.port() == 0 {
        return Err(ValueError::StatusPortZero);
    }
    Ok(addr)
}

fn log_filter(s: &str) -> Result<String, ValueError> {
    s.parse::<tracing_subscriber::filter::Targets>()?;
    Ok(s.to_owned())
}

/// A boolean the way Go's `strconv.ParseBool` (and so Istio) reads one.
pub(crate) fn go_bool(s: &str) -> Result<bool, ValueError> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(ValueError::NotABool),
    }
}

/// A count of failed probes in a row, 1 to 100: a flag's text, or a
/// file's integer.
pub(super) mod threshold {
    use super::*;
    pub(crate) fn parse(s: &str) -> Result<u32, ValueError> {
        let n: u32 = s.trim().parse().map_err(|_| ValueError::NotAThreshold)?;
        check(n)
    }
    fn check(n: u32) -> Result<u32, ValueError> {
        match n {
            1..=100 => Ok(n),
            _ => Err(ValueError::NotAThreshold),
        }
    }
    pub(crate) fn deserialize<'de, De: Deserializer<'de>>(d: De) -> Result<u32, De::Error> {
        check(u32::deserialize(d)?).map_err(de::Error::custom)
    }
}

/// An address range: `35.191.0.0/16`, `2600:2d00:1:b029::/64`, or one
/// address (`10.0.0.5`, a range of one).
pub(super) mod range {
    use super::ValueError;
    use ipnet::IpNet;
    use std::net::IpAddr;

    pub(crate) fn parse(s: &str) -> Result<IpNet, ValueError> {
        let s = s.trim();
        if let Ok(net) = s.parse::<IpNet>() {
            return Ok(net.trunc());
        }
        s.parse::<IpAddr>().map(IpNet::from).map_err(|_| ValueError::NotARange)
    }
}

pub(super) fn ranges<'de, De: Deserializer<'de>>(d: De) -> Result<Vec<ipnet::IpNet>, De::Error> {
    let texts = Vec::<String>::deserialize(d)?;
    texts
        .iter()
        .map(|t| range::parse(t).map_err(|e| de::Error::custom(format!("{t:?}: {e}"))))
        .collect()
}

pub(super) fn ranges_shown<S: serde::Serializer>(v: &[ipnet::IpNet], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(ToString::to_string))
}

pub(super) fn ports<'de, De: Deserializer<'de>>(d: De) -> Result<Vec<u16>, De::Error> {
    let ports = Vec::<u16>::deserialize(d)?;
    match ports.contains(&0) {
        true => Err(de::Error::custom("0 is not a port (1-65535)")),
        false => Ok(ports),
    }
}
