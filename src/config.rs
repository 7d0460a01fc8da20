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

/// Envoy's admin address: `http://` plus a loopback host and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminUrl {
    addr: SocketAddr,
    authority: String,
}

impl AdminUrl {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    pub fn authority(&self) -> &str {
        &self.authority
    }
}

impl fmt::Display for AdminUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}", self.authority)
    }
}

impl FromStr for AdminUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let rest = s
            .strip_prefix("http://")
            .ok_or("must start with http:// (the admin API is plain HTTP on loopback)")?;
        let authority = rest.trim_end_matches('/');
        if authority.contains('/') {
            return Err("must not have a path".into());
        }
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
        Ok(Self {
            addr,
            authority: authority.to_owned(),
        })
    }
}

/// Validated settings of a running agent.
#[derive(Debug, Clone)]
pub struct Settings {
    pub status_addr: SocketAddr,
    pub admin_url: AdminUrl,
    pub poll_interval: Duration,
    pub startup_poll_interval: Duration,
    pub admin_timeout: Duration,
    pub xds_check: XdsCheck,
    pub log: String,
}

impl Settings {
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
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },
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
pub struct Loader<'a> {
    matches: Option<&'a ArgMatches>,
    file: FileSettings,
    effective: Vec<Effective>,
}

impl Settings {
    /// Builds the settings. `matches` is the clap match of the subcommand,
    /// used to tell a flag from an env variable; without it every value
    /// given in `args` counts as a flag.
    pub fn load(
        args: &RunArgs,
        matches: Option<&ArgMatches>,
    ) -> Result<(Settings, Vec<Effective>), ConfigError> {
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
                    return Err(
                        "port 0 is not allowed: Envoy must know where to send probes".into(),
                    );
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
            |s| s.parse::<AdminUrl>(),
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

        let settings = Settings {
            status_addr,
            admin_url,
            poll_interval,
            startup_poll_interval,
            admin_timeout,
            xds_check,
            log,
        };
        Ok((settings, l.effective))
    }
}

impl Loader<'_> {
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
        Source::Flag => format!("--{}", key.replace('_', "-")),
        Source::Env => env_name(key),
        Source::File | Source::Default => key.to_owned(),
    }
}

/// The environment variable of a setting.
pub fn env_name(key: &str) -> String {
    format!("LIFEGUARD_{}", key.to_ascii_uppercase())
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
    fn admin_url_forms() {
        assert_eq!(
            "http://localhost:15000".parse::<AdminUrl>().unwrap().addr(),
            "127.0.0.1:15000".parse().unwrap()
        );
        assert_eq!(
            "http://[::1]:15000/".parse::<AdminUrl>().unwrap().addr(),
            "[::1]:15000".parse().unwrap()
        );
        assert!("http://127.0.0.1:15000/stats".parse::<AdminUrl>().is_err());
        assert!("http://127.0.0.1:0".parse::<AdminUrl>().is_err());
    }
}
