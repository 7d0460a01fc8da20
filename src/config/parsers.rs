//! The parsers of the settings' values, each shared by clap (a flag or an
//! env variable) and serde (the file), so a file value is checked exactly
//! like a flag.

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use serde::{de, Deserialize, Deserializer};

use crate::duration::{self, Display as D};
use crate::exit::MessagePath;
use crate::istio::annotations::AppMetrics;
use crate::istio::probers::{AppProbes, PodIp};
use crate::status::control::ControlSocket;
use crate::url::LoopbackUrl;

/// Declares a parser that clap (`NAME::parse`) and serde (`with = "NAME"`)
/// share, so a file value is checked exactly like a flag.
macro_rules! shared_parser {
    ($name:ident: $ty:ty = $parse:expr, shown as $show:expr) => {
        pub(super) mod $name {
            use super::*;
            pub(crate) fn parse(s: &str) -> Result<$ty, String> {
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
shared_parser!(poll: Duration = |s| at_least(s, Duration::from_millis(10)), shown as |d: &Duration| D(*d));
shared_parser!(positive: Duration = |s| at_least(s, Duration::from_nanos(1)), shown as |d: &Duration| D(*d));
shared_parser!(span: Duration = |s| at_least(s, Duration::ZERO), shown as |d: &Duration| D(*d));
shared_parser!(grace: Duration = grace_period, shown as |d: &Duration| D(*d));
shared_parser!(message_path: MessagePath = MessagePath::from_str, shown as |p: &MessagePath| p.clone());
shared_parser!(app_probes: AppProbes = AppProbes::parse, shown as |p: &AppProbes| p.to_json());
shared_parser!(app_metrics: AppMetrics = AppMetrics::parse, shown as |m: &AppMetrics| m.to_json());
shared_parser!(pod_ip: PodIp = PodIp::from_str, shown as |p: &PodIp| *p);
shared_parser!(control_socket: ControlSocket = ControlSocket::from_str, shown as |p: &ControlSocket| p.clone());

/// A Go duration (at most [`duration::MAX`]) no shorter than `min`.
fn at_least(s: &str, min: Duration) -> Result<Duration, String> {
    match duration::parse(s).map_err(|e| e.to_string())? {
        d if d >= min => Ok(d),
        _ if min == Duration::from_nanos(1) => Err("must be greater than zero".into()),
        _ => Err(format!("must be at least {}", D(min))),
    }
}

/// Kubernetes writes terminationGracePeriodSeconds as a bare number of
/// seconds; accept that too.
fn grace_period(s: &str) -> Result<Duration, String> {
    let bare = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    at_least(
        &if bare { format!("{s}s") } else { s.to_owned() },
        Duration::from_nanos(1),
    )
}

fn status_addr(s: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = s.parse().map_err(|_| "expected IP:PORT, for example 0.0.0.0:15020")?;
    if addr.port() == 0 {
        return Err("port 0 is not allowed: Envoy must know where to send probes".into());
    }
    Ok(addr)
}

fn log_filter(s: &str) -> Result<String, String> {
    match tracing_subscriber::EnvFilter::try_new(s) {
        Ok(_) => Ok(s.to_owned()),
        Err(e) => Err(format!("not a log filter: {e}")),
    }
}

/// A boolean the way Go's `strconv.ParseBool` (and so Istio) reads one.
pub(crate) fn go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err("expected true or false (or 1, t, T, TRUE, True, 0, f, F, FALSE, False)".into()),
    }
}

/// A count of failed probes in a row, 1 to 100: a flag's text, or a
/// file's integer.
pub(super) mod threshold {
    use super::*;
    pub(crate) fn parse(s: &str) -> Result<u32, String> {
        let n: u32 = s.trim().parse().map_err(|_| "expected a whole number from 1 to 100")?;
        check(n)
    }
    fn check(n: u32) -> Result<u32, String> {
        match n {
            1..=100 => Ok(n),
            _ => Err("expected a whole number from 1 to 100".into()),
        }
    }
    pub(crate) fn deserialize<'de, De: Deserializer<'de>>(d: De) -> Result<u32, De::Error> {
        check(u32::deserialize(d)?).map_err(de::Error::custom)
    }
}

pub(super) fn ports<'de, De: Deserializer<'de>>(d: De) -> Result<Vec<u16>, De::Error> {
    let ports = Vec::<u16>::deserialize(d)?;
    match ports.contains(&0) {
        true => Err(de::Error::custom("0 is not a port (1-65535)")),
        false => Ok(ports),
    }
}
