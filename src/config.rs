//! Configuration: every setting comes from a flag, an environment variable,
//! a TOML file given with `--config`, or its default — in that order of
//! precedence — and is validated once, here, before anything starts.
//!
//! A bad value stops start-up with a message that names the field (as flag,
//! env variable or file key) and the value. The rest of the agent receives a
//! [`Settings`] whose values are known to be good.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args};
use serde::Deserialize;

use crate::duration::{self, Display as D};

/// Options of `lifeguard run` (and of `check`), as clap sees them. Every
/// field is optional here: a missing one falls through to the file, then to
/// the default.
#[derive(Debug, Clone, Default, Args)]
pub struct RunArgs {
    /// TOML file with settings (flags and env variables override it).
    #[arg(long, env = "LIFEGUARD_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Address the status server (readiness, drain, metrics) listens on.
    #[arg(long, env = "LIFEGUARD_STATUS_ADDR", value_name = "ADDR")]
    pub status_addr: Option<String>,

    /// Envoy's admin API (loopback only).
    #[arg(long, env = "LIFEGUARD_ADMIN_URL", value_name = "URL")]
    pub admin_url: Option<String>,

    /// How often Envoy's admin stats are read once Envoy is ready [default: 1s].
    #[arg(long, env = "LIFEGUARD_POLL_INTERVAL", value_name = "DURATION")]
    pub poll_interval: Option<String>,

    /// How often they are read while Envoy is not ready [default: 100ms].
    #[arg(long, env = "LIFEGUARD_STARTUP_POLL_INTERVAL", value_name = "DURATION")]
    pub startup_poll_interval: Option<String>,

    /// Timeout of one admin API call: connect, request and body [default: 1s].
    #[arg(long, env = "LIFEGUARD_ADMIN_TIMEOUT", value_name = "DURATION")]
    pub admin_timeout: Option<String>,

    /// Require the first CDS/LDS update: auto (when Envoy has those
    /// counters), required, or off [default: auto].
    #[arg(long, env = "LIFEGUARD_XDS_CHECK", value_name = "MODE")]
    pub xds_check: Option<String>,

    /// Log filter, as tracing's EnvFilter reads it [default: info].
    #[arg(long, env = "LIFEGUARD_LOG", value_name = "FILTER")]
    pub log: Option<String>,

    /// The pod's terminationGracePeriodSeconds; the drain ends by this
    /// minus the shutdown margin [default: 30s].
    #[arg(long, env = "TERMINATION_GRACE_PERIOD", value_name = "DURATION")]
    pub termination_grace_period: Option<String>,

    /// Time kept back from the grace period to stop Envoy and exit [default: 2s].
    #[arg(long, env = "LIFEGUARD_SHUTDOWN_MARGIN", value_name = "DURATION")]
    pub shutdown_margin: Option<String>,

    /// Pause after readiness turns 503 and before Envoy starts draining, so
    /// endpoint removal can propagate [default: 0s].
    #[arg(long, env = "LIFEGUARD_DRAIN_DELAY", value_name = "DURATION")]
    pub drain_delay: Option<String>,

    /// Fixed policy: how long Envoy drains before it is stopped [default: 5s].
    #[arg(long, env = "TERMINATION_DRAIN_DURATION", value_name = "DURATION")]
    pub termination_drain_duration: Option<String>,

    /// Stop Envoy once its active downstream connections reach zero
    /// (true or false) [default: false].
    #[arg(long, env = "EXIT_ON_ZERO_ACTIVE_CONNECTIONS", value_name = "BOOL")]
    pub exit_on_zero_active_connections: Option<String>,

    /// Exit-on-zero policies: the shortest drain [default: 5s].
    #[arg(long, env = "MINIMUM_DRAIN_DURATION", value_name = "DURATION")]
    pub minimum_drain_duration: Option<String>,

    /// What the drain waits for: time (fixed), connections or requests
    /// (zero active) [default: time, or connections when
    /// EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true].
    #[arg(long, env = "LIFEGUARD_DRAIN_UNTIL", value_name = "WHAT")]
    pub drain_until: Option<String>,

    /// Listener port whose connections the drain does not wait for
    /// (repeatable; 15021 and 15090 are always left out).
    #[arg(
        long = "ignore-listener-port",
        env = "LIFEGUARD_IGNORE_LISTENER_PORTS",
        value_name = "PORT",
        value_delimiter = ','
    )]
    pub ignore_listener_ports: Vec<String>,

    /// Append Envoy's own metrics to `/stats/prometheus` (true or false)
    /// [default: true].
    #[arg(long, env = "LIFEGUARD_MERGE_ENVOY_METRICS", value_name = "BOOL")]
    pub merge_envoy_metrics: Option<String>,
}

/// The same settings as written in the TOML file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    status_addr: Option<String>,
    admin_url: Option<String>,
    poll_interval: Option<String>,
    startup_poll_interval: Option<String>,
    admin_timeout: Option<String>,
    xds_check: Option<String>,
    log: Option<String>,
    termination_grace_period: Option<String>,
    shutdown_margin: Option<String>,
    drain_delay: Option<String>,
    termination_drain_duration: Option<String>,
    exit_on_zero_active_connections: Option<bool>,
    minimum_drain_duration: Option<String>,
    drain_until: Option<String>,
    ignore_listener_ports: Option<Vec<u16>>,
    merge_envoy_metrics: Option<bool>,
}

/// When readiness also requires Envoy's first xDS (CDS and LDS) updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdsCheck {
    /// Required for each of CDS and LDS whose counters Envoy reports: a
    /// static bootstrap has none and is not held back; an xDS-fed Envoy is.
    Auto,
    /// Always required (both CDS and LDS).
    Required,
    /// Never checked.
    Off,
}

impl FromStr for XdsCheck {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "required" | "on" | "true" => Ok(Self::Required),
            "off" | "false" => Ok(Self::Off),
            _ => Err("expected auto, required or off".into()),
        }
    }
}

impl fmt::Display for XdsCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Required => "required",
            Self::Off => "off",
        })
    }
}

/// What the drain waits for before Envoy is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DrainUntil {
    /// A fixed time: `termination_drain_duration`.
    Time,
    /// Zero active downstream connections (after the minimum duration).
    Connections,
    /// Zero active downstream HTTP requests (after the minimum duration):
    /// idle keep-alive connections do not hold the pod.
    Requests,
}

impl FromStr for DrainUntil {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "time" => Ok(Self::Time),
            "connections" => Ok(Self::Connections),
            "requests" => Ok(Self::Requests),
            _ => Err("expected time, connections or requests".into()),
        }
    }
}

impl fmt::Display for DrainUntil {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Time => "time",
            Self::Connections => "connections",
            Self::Requests => "requests",
        })
    }
}

/// Listener ports never waited for: Istio's status (15021) and Prometheus
/// (15090) listeners, whose own probe and scrape traffic never ends.
pub const ALWAYS_IGNORED_PORTS: [u16; 2] = [15021, 15090];

/// A loopback HTTP address: `http://` plus a loopback host and a port
/// (Envoy's admin API, the agent, the readiness URL of `wait`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopbackUrl {
    addr: SocketAddr,
    authority: String,
}

impl LoopbackUrl {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    pub fn authority(&self) -> &str {
        &self.authority
    }
}

impl fmt::Display for LoopbackUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}", self.authority)
    }
}

impl FromStr for LoopbackUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (url, path) = parse_loopback_url(s)?;
        if path != "/" {
            return Err("must not have a path".into());
        }
        Ok(url)
    }
}

/// Parses `http://HOST:PORT[/PATH]` where HOST is a loopback address (or
/// `localhost`); returns the address and the path (`/` when none).
pub fn parse_loopback_url(s: &str) -> Result<(LoopbackUrl, String), String> {
    let rest = s
        .strip_prefix("http://")
        .ok_or("must start with http:// (plain HTTP on loopback)")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let path = if path.trim_end_matches('/').is_empty() {
        "/"
    } else {
        path
    };
    let addr: SocketAddr = if let Some(port) = authority.strip_prefix("localhost:") {
        let port: u16 = port.parse().map_err(|_| "bad port")?;
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
    } else {
        authority
            .parse()
            .map_err(|_| "expected http://IP:PORT, for example http://127.0.0.1:15000")?
    };
    if !addr.ip().is_loopback() {
        return Err("must be a loopback address (127.0.0.0/8, ::1 or localhost)".into());
    }
    if addr.port() == 0 {
        return Err("port 0 is not allowed".into());
    }
    let url = LoopbackUrl {
        addr,
        authority: authority.to_owned(),
    };
    Ok((url, path.to_owned()))
}

/// Validated settings of a running agent.
#[derive(Debug, Clone)]
pub struct Settings {
    pub status_addr: SocketAddr,
    pub admin_url: LoopbackUrl,
    pub poll_interval: Duration,
    pub startup_poll_interval: Duration,
    pub admin_timeout: Duration,
    pub xds_check: XdsCheck,
    pub log: String,
    pub termination_grace_period: Duration,
    pub shutdown_margin: Duration,
    pub drain_delay: Duration,
    pub termination_drain_duration: Duration,
    pub minimum_drain_duration: Duration,
    pub drain_until: DrainUntil,
    /// Ports left out of the active count, including [`ALWAYS_IGNORED_PORTS`].
    pub ignore_listener_ports: Vec<u16>,
    pub merge_envoy_metrics: bool,
}

impl Settings {
    /// How long after the drain begins Envoy must be stopped: the grace
    /// period less the shutdown margin.
    pub fn drain_deadline(&self) -> Duration {
        self.termination_grace_period.saturating_sub(self.shutdown_margin)
    }

    /// Durations that do not fit inside the drain deadline, as warnings.
    pub fn warnings(&self) -> Vec<String> {
        let budget = self.drain_deadline();
        let (what, wait) = match self.drain_until {
            DrainUntil::Time => ("termination_drain_duration", self.termination_drain_duration),
            _ => ("minimum_drain_duration", self.minimum_drain_duration),
        };
        let mut out = Vec::new();
        if self.drain_delay + wait > budget {
            out.push(format!(
                "drain_delay ({}) + {what} ({}) = {} does not fit the {} left by termination_grace_period ({}) - shutdown_margin ({}): the drain will be cut at the deadline",
                D(self.drain_delay),
                D(wait),
                D(self.drain_delay + wait),
                D(budget),
                D(self.termination_grace_period),
                D(self.shutdown_margin),
            ));
        }
        out
    }

    /// How old the last successful admin read may be before readiness stops
    /// trusting it: three poll intervals plus one read timeout.
    pub fn stale_after(&self) -> Duration {
        self.poll_interval * 3 + self.admin_timeout
    }
}

/// Where a setting's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Flag,
    Env,
    File,
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Flag => "flag",
            Self::Env => "env",
            Self::File => "file",
            Self::Default => "default",
        })
    }
}

/// One effective setting, for `lifeguard check` and the start-up log.
#[derive(Debug, Clone)]
pub struct Effective {
    pub key: &'static str,
    pub value: String,
    pub source: Source,
}

/// A configuration error. The message names the field and the value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    ReadFile { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {message}")]
    ParseFile { path: PathBuf, message: String },
    #[error("invalid {field} = {value:?} (from {origin}): {why}")]
    Invalid {
        field: String,
        value: String,
        origin: Source,
        why: String,
    },
}

/// Merges flags, env, file and defaults for one `RunArgs` and validates them.
struct Loader<'a> {
    matches: Option<&'a ArgMatches>,
    file: FileSettings,
    effective: Vec<Effective>,
}

impl Settings {
    /// Builds the settings. `matches` is the clap match of the subcommand,
    /// used to tell a flag from an env variable; without it every value
    /// given in `args` counts as a flag.
    pub fn load(args: &RunArgs, matches: Option<&ArgMatches>) -> Result<(Settings, Vec<Effective>), ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileSettings::default(),
        };
        let mut l = Loader {
            matches,
            file,
            effective: Vec::new(),
        };
        let status_addr = l.value(
            "status_addr",
            args.status_addr.clone(),
            |f| f.status_addr.take(),
            "0.0.0.0:15020",
            |s| {
                let addr: SocketAddr = s
                    .parse()
                    .map_err(|_| "expected IP:PORT, for example 0.0.0.0:15020".to_string())?;
                if addr.port() == 0 {
                    return Err("port 0 is not allowed: Envoy must know where to send probes".into());
                }
                Ok(addr)
            },
            |a| a.to_string(),
        )?;
        let admin_url = l.value(
            "admin_url",
            args.admin_url.clone(),
            |f| f.admin_url.take(),
            "http://127.0.0.1:15000",
            |s| s.parse::<LoopbackUrl>(),
            |u| u.to_string(),
        )?;
        let poll_interval = l.duration(
            "poll_interval",
            args.poll_interval.clone(),
            |f| f.poll_interval.take(),
            "1s",
            true,
        )?;
        let startup_poll_interval = l.duration(
            "startup_poll_interval",
            args.startup_poll_interval.clone(),
            |f| f.startup_poll_interval.take(),
            "100ms",
            true,
        )?;
        let admin_timeout = l.duration(
            "admin_timeout",
            args.admin_timeout.clone(),
            |f| f.admin_timeout.take(),
            "1s",
            true,
        )?;
        let xds_check = l.value(
            "xds_check",
            args.xds_check.clone(),
            |f| f.xds_check.take(),
            "auto",
            |s| s.parse::<XdsCheck>(),
            |x| x.to_string(),
        )?;
        let log = l.value(
            "log",
            args.log.clone(),
            |f| f.log.take(),
            "info",
            |s| Ok::<_, String>(s.to_owned()),
            |s| s.clone(),
        )?;
        let termination_grace_period = l.value(
            "termination_grace_period",
            args.termination_grace_period.clone(),
            |f| f.termination_grace_period.take(),
            "30s",
            |s| {
                // Kubernetes writes terminationGracePeriodSeconds as a bare
                // number of seconds; accept that too.
                let d = match s.parse::<u64>() {
                    Ok(secs) => Duration::from_secs(secs),
                    Err(_) => duration::parse(s).map_err(|e| e.to_string())?,
                };
                if d.is_zero() {
                    return Err("must be greater than zero".into());
                }
                Ok(d)
            },
            |d| D(*d).to_string(),
        )?;
        let shutdown_margin = l.duration(
            "shutdown_margin",
            args.shutdown_margin.clone(),
            |f| f.shutdown_margin.take(),
            "2s",
            false,
        )?;
        let drain_delay = l.duration(
            "drain_delay",
            args.drain_delay.clone(),
            |f| f.drain_delay.take(),
            "0s",
            false,
        )?;
        let termination_drain_duration = l.duration(
            "termination_drain_duration",
            args.termination_drain_duration.clone(),
            |f| f.termination_drain_duration.take(),
            "5s",
            false,
        )?;
        let exit_on_zero = l.boolean(
            "exit_on_zero_active_connections",
            args.exit_on_zero_active_connections.clone(),
            |f| f.exit_on_zero_active_connections.take(),
            false,
        )?;
        let merge_envoy_metrics = l.boolean(
            "merge_envoy_metrics",
            args.merge_envoy_metrics.clone(),
            |f| f.merge_envoy_metrics.take(),
            true,
        )?;
        let minimum_drain_duration = l.duration(
            "minimum_drain_duration",
            args.minimum_drain_duration.clone(),
            |f| f.minimum_drain_duration.take(),
            "5s",
            false,
        )?;
        let default_until = if exit_on_zero { "connections" } else { "time" };
        let drain_until = l.value(
            "drain_until",
            args.drain_until.clone(),
            |f| f.drain_until.take(),
            default_until,
            |s| s.parse::<DrainUntil>(),
            |d| d.to_string(),
        )?;
        let given_ports = (!args.ignore_listener_ports.is_empty()).then(|| args.ignore_listener_ports.join(","));
        let ignore_listener_ports = l.value(
            "ignore_listener_ports",
            given_ports,
            |f| {
                f.ignore_listener_ports
                    .take()
                    .map(|ports| ports.iter().map(u16::to_string).collect::<Vec<_>>().join(","))
            },
            "",
            |s| {
                let mut ports = ALWAYS_IGNORED_PORTS.to_vec();
                for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                    match part.parse::<u16>() {
                        Ok(p) if p > 0 => ports.push(p),
                        _ => return Err(format!("{part:?} is not a port (1-65535)")),
                    }
                }
                ports.sort_unstable();
                ports.dedup();
                Ok(ports)
            },
            |ports| ports.iter().map(u16::to_string).collect::<Vec<_>>().join(","),
        )?;
        if shutdown_margin >= termination_grace_period {
            let origin = l.source_recorded("shutdown_margin");
            return Err(ConfigError::Invalid {
                field: field_name("shutdown_margin", origin),
                value: D(shutdown_margin).to_string(),
                origin,
                why: format!(
                    "must be shorter than termination_grace_period ({})",
                    D(termination_grace_period)
                ),
            });
        }

        let settings = Settings {
            status_addr,
            admin_url,
            poll_interval,
            startup_poll_interval,
            admin_timeout,
            xds_check,
            log,
            termination_grace_period,
            shutdown_margin,
            drain_delay,
            termination_drain_duration,
            minimum_drain_duration,
            drain_until,
            ignore_listener_ports,
            merge_envoy_metrics,
        };
        Ok((settings, l.effective))
    }
}

impl Loader<'_> {
    fn source_recorded(&self, key: &str) -> Source {
        self.effective
            .iter()
            .find(|e| e.key == key)
            .map_or(Source::Default, |e| e.source)
    }

    fn source_of(&self, key: &str) -> Source {
        match self.matches.and_then(|m| m.value_source(key)) {
            Some(ValueSource::EnvVariable) => Source::Env,
            _ => Source::Flag,
        }
    }

    /// Resolves one setting: the given (flag or env) value, else the file's,
    /// else the default; parses it and records where it came from.
    #[allow(clippy::too_many_arguments)]
    fn value<T>(
        &mut self,
        key: &'static str,
        given: Option<String>,
        from_file: impl FnOnce(&mut FileSettings) -> Option<String>,
        default: &str,
        parse: impl Fn(&str) -> Result<T, String>,
        show: impl Fn(&T) -> String,
    ) -> Result<T, ConfigError> {
        let (text, source) = match (given, from_file(&mut self.file)) {
            (Some(v), _) => (v, self.source_of(key)),
            (None, Some(v)) => (v, Source::File),
            (None, None) => (default.to_owned(), Source::Default),
        };
        let value = parse(&text).map_err(|why| ConfigError::Invalid {
            field: field_name(key, source),
            value: text.clone(),
            origin: source,
            why,
        })?;
        self.effective.push(Effective {
            key,
            value: show(&value),
            source,
        });
        Ok(value)
    }

    fn boolean(
        &mut self,
        key: &'static str,
        given: Option<String>,
        from_file: impl FnOnce(&mut FileSettings) -> Option<bool>,
        default: bool,
    ) -> Result<bool, ConfigError> {
        self.value(
            key,
            given,
            |f| from_file(f).map(|b| b.to_string()),
            if default { "true" } else { "false" },
            |s| match s {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err("expected true or false".to_string()),
            },
            |b| b.to_string(),
        )
    }

    fn duration(
        &mut self,
        key: &'static str,
        given: Option<String>,
        from_file: impl FnOnce(&mut FileSettings) -> Option<String>,
        default: &str,
        nonzero: bool,
    ) -> Result<Duration, ConfigError> {
        self.value(
            key,
            given,
            from_file,
            default,
            |s| {
                let d = duration::parse(s).map_err(|e| e.to_string())?;
                if nonzero && d.is_zero() {
                    return Err("must be greater than zero".into());
                }
                Ok(d)
            },
            |d| D(*d).to_string(),
        )
    }
}

/// How a user wrote the field: `--poll-interval`, `LIFEGUARD_POLL_INTERVAL`
/// or `poll_interval` in the file.
fn field_name(key: &str, source: Source) -> String {
    match source {
        Source::Flag if key == "ignore_listener_ports" => "--ignore-listener-port".into(),
        Source::Flag => format!("--{}", key.replace('_', "-")),
        Source::Env => env_name(key),
        Source::File | Source::Default => key.to_owned(),
    }
}

/// The environment variable of a setting: Istio's name where a pod spec may
/// already set it, `LIFEGUARD_<KEY>` otherwise.
pub fn env_name(key: &str) -> String {
    match key {
        "termination_grace_period"
        | "termination_drain_duration"
        | "exit_on_zero_active_connections"
        | "minimum_drain_duration" => key.to_ascii_uppercase(),
        _ => format!("LIFEGUARD_{}", key.to_ascii_uppercase()),
    }
}

fn read_file(path: &Path) -> Result<FileSettings, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::ParseFile {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(args: RunArgs) -> Result<Settings, ConfigError> {
        Settings::load(&args, None).map(|(s, _)| s)
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let (s, eff) = Settings::load(&RunArgs::default(), None).unwrap();
        assert_eq!(s.status_addr, "0.0.0.0:15020".parse().unwrap());
        assert_eq!(s.admin_url.addr(), "127.0.0.1:15000".parse().unwrap());
        assert_eq!(s.poll_interval, Duration::from_secs(1));
        assert_eq!(s.startup_poll_interval, Duration::from_millis(100));
        assert_eq!(s.admin_timeout, Duration::from_secs(1));
        assert_eq!(s.xds_check, XdsCheck::Auto);
        assert_eq!(s.stale_after(), Duration::from_secs(4));
        assert!(eff.iter().all(|e| e.source == Source::Default));
    }

    #[test]
    fn flag_beats_file_beats_default() {
        let dir = std::env::temp_dir().join(format!("lifeguard-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.toml");
        std::fs::write(&path, "poll_interval = \"2s\"\nadmin_timeout = \"300ms\"\n").unwrap();
        let args = RunArgs {
            config: Some(path.clone()),
            poll_interval: Some("500ms".into()),
            ..Default::default()
        };
        let (s, eff) = Settings::load(&args, None).unwrap();
        assert_eq!(s.poll_interval, Duration::from_millis(500));
        assert_eq!(s.admin_timeout, Duration::from_millis(300));
        let src = |k| eff.iter().find(|e| e.key == k).unwrap().source;
        assert_eq!(src("poll_interval"), Source::Flag);
        assert_eq!(src("admin_timeout"), Source::File);
        assert_eq!(src("status_addr"), Source::Default);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn bad_values_name_the_field_and_value() {
        let cases = [
            (
                RunArgs {
                    poll_interval: Some("5x".into()),
                    ..Default::default()
                },
                "--poll-interval",
                "5x",
            ),
            (
                RunArgs {
                    admin_timeout: Some("0s".into()),
                    ..Default::default()
                },
                "--admin-timeout",
                "0s",
            ),
            (
                RunArgs {
                    status_addr: Some("nowhere".into()),
                    ..Default::default()
                },
                "--status-addr",
                "nowhere",
            ),
            (
                RunArgs {
                    status_addr: Some("127.0.0.1:0".into()),
                    ..Default::default()
                },
                "--status-addr",
                "127.0.0.1:0",
            ),
            (
                RunArgs {
                    admin_url: Some("http://10.0.0.1:15000".into()),
                    ..Default::default()
                },
                "--admin-url",
                "loopback",
            ),
            (
                RunArgs {
                    admin_url: Some("https://127.0.0.1:15000".into()),
                    ..Default::default()
                },
                "--admin-url",
                "http://",
            ),
            (
                RunArgs {
                    xds_check: Some("maybe".into()),
                    ..Default::default()
                },
                "--xds-check",
                "maybe",
            ),
        ];
        for (args, field, needle) in cases {
            let msg = load(args).unwrap_err().to_string();
            assert!(msg.contains(field) && msg.contains(needle), "{msg}");
        }
    }

    #[test]
    fn drain_policy_follows_istio_names() {
        let s = load(RunArgs::default()).unwrap();
        assert_eq!(s.drain_until, DrainUntil::Time);
        assert_eq!(s.termination_drain_duration, Duration::from_secs(5));
        assert_eq!(s.drain_deadline(), Duration::from_secs(28));
        assert_eq!(s.ignore_listener_ports, vec![15021, 15090]);
        assert!(s.warnings().is_empty());
        let s = load(RunArgs {
            exit_on_zero_active_connections: Some("true".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(s.drain_until, DrainUntil::Connections);
        let s = load(RunArgs {
            exit_on_zero_active_connections: Some("true".into()),
            drain_until: Some("requests".into()),
            termination_grace_period: Some("45".into()),
            ignore_listener_ports: vec!["8081".into(), "15021".into()],
            ..Default::default()
        })
        .unwrap();
        assert_eq!(s.drain_until, DrainUntil::Requests);
        assert_eq!(s.termination_grace_period, Duration::from_secs(45));
        assert_eq!(s.ignore_listener_ports, vec![8081, 15021, 15090]);
    }

    #[test]
    fn drain_that_cannot_fit_the_grace_period_is_a_warning() {
        let s = load(RunArgs {
            termination_grace_period: Some("10s".into()),
            termination_drain_duration: Some("9s".into()),
            ..Default::default()
        })
        .unwrap();
        let w = s.warnings();
        assert_eq!(w.len(), 1);
        assert!(
            w[0].contains("termination_drain_duration (9s)") && w[0].contains("8s"),
            "{w:?}"
        );
    }

    #[test]
    fn bad_drain_values_name_the_field() {
        let cases = [
            (
                RunArgs {
                    exit_on_zero_active_connections: Some("maybe".into()),
                    ..Default::default()
                },
                "--exit-on-zero-active-connections",
                "maybe",
            ),
            (
                RunArgs {
                    drain_until: Some("forever".into()),
                    ..Default::default()
                },
                "--drain-until",
                "forever",
            ),
            (
                RunArgs {
                    ignore_listener_ports: vec!["0".into()],
                    ..Default::default()
                },
                "--ignore-listener-port",
                "0",
            ),
            (
                RunArgs {
                    shutdown_margin: Some("30s".into()),
                    ..Default::default()
                },
                "--shutdown-margin",
                "termination_grace_period",
            ),
            (
                RunArgs {
                    termination_grace_period: Some("0".into()),
                    ..Default::default()
                },
                "--termination-grace-period",
                "0",
            ),
        ];
        for (args, field, needle) in cases {
            let msg = load(args).unwrap_err().to_string();
            assert!(msg.contains(field) && msg.contains(needle), "{msg}");
        }
    }

    #[test]
    fn unknown_file_key_is_an_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("lifeguard-cfg2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("b.toml");
        std::fs::write(&path, "pol_interval = \"2s\"\n").unwrap();
        let args = RunArgs {
            config: Some(path),
            ..Default::default()
        };
        let msg = load(args).unwrap_err().to_string();
        assert!(msg.contains("pol_interval"), "{msg}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_shipped_config_file_lists_every_setting() {
        let text = include_str!("../config/lifeguard.toml");
        let (_, effective) = Settings::load(&RunArgs::default(), None).unwrap();
        for e in effective {
            let set = format!("\n{} = ", e.key);
            let commented = format!("\n# {} = ", e.key);
            assert!(
                text.contains(&set) || text.contains(&commented),
                "config/lifeguard.toml lacks {}",
                e.key
            );
            assert!(
                text.contains(&env_name(e.key)),
                "config/lifeguard.toml does not name {}",
                env_name(e.key)
            );
        }
    }

    #[test]
    fn admin_url_forms() {
        assert_eq!(
            "http://localhost:15000".parse::<LoopbackUrl>().unwrap().addr(),
            "127.0.0.1:15000".parse().unwrap()
        );
        assert_eq!(
            "http://[::1]:15000/".parse::<LoopbackUrl>().unwrap().addr(),
            "[::1]:15000".parse().unwrap()
        );
        assert!("http://127.0.0.1:15000/stats".parse::<LoopbackUrl>().is_err());
        assert!("http://127.0.0.1:0".parse::<LoopbackUrl>().is_err());
    }
}
