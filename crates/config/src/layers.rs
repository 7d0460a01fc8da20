//! The layers under the settings: flags and env (clap), then the TOML
//! file, then defaults; every effective value listed with its source; and
//! clap's errors about a value rewritten to name the field as the user
//! wrote it.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{ArgMatches, Args};

use super::proxy_config::{EnvNames, ProxyLayer};
use super::sections::FileValues;
use super::{ConfigError, Effective, Loaded, Plan, RunArgs, Settings, Source};
use lifeguard_base::settings::SettingError;

/// `POD_IP`, checked as the setting's own parser checks `INSTANCE_IP`.
fn check_pod_ip(ip: &str) -> Result<(), ConfigError> {
    match lifeguard_status::pod_ip::parse(ip) {
        Ok(_) => Ok(()),
        Err(why) => Err(ConfigError::Invalid {
            field: "POD_IP".into(),
            value: ip.to_owned(),
            origin: Source::Env,
            why: why.to_string(),
        }),
    }
}

/// The settings' clap arguments, for their flags and env names.
fn settings_command() -> clap::Command {
    Settings::augment_args(clap::Command::new("lifeguard"))
}

/// A key as the user wrote it for `source`: `--poll-interval`,
/// `LIFEGUARD_POLL_INTERVAL` or `poll_interval`.
fn field_name(key: &str, source: Source) -> String {
    let cmd = settings_command();
    let arg = cmd.get_arguments().find(|a| a.get_id() == key);
    match (source, arg) {
        (Source::Flag, Some(arg)) => format!("--{}", arg.get_long().unwrap_or(key)),
        (Source::Env, Some(arg)) => arg.get_env().map_or(key.into(), |e| e.to_string_lossy().into()),
        _ => key.to_owned(),
    }
}

impl RunArgs {
    /// Lays the config file under the flags and env values clap parsed
    /// (`matches`, of this subcommand, tells which were given), makes each
    /// crate's plan (the rules across settings) and lists every effective
    /// value with its source.
    pub fn load(self, matches: &ArgMatches) -> Result<Loaded, ConfigError> {
        let file = match &self.config {
            Some(path) => read_file(path)?,
            None => FileValues::default(),
        };
        let given = |key: &str| match matches.value_source(key) {
            Some(ValueSource::CommandLine) => Some(Source::Flag),
            Some(ValueSource::EnvVariable) => Some(Source::Env),
            _ => None,
        };
        let mut table = toml::Table::try_from(&self.settings).expect("settings serialize");
        // The layers under flags and env, lowest first: the file, then PROXY_CONFIG.
        let with_file = layer(&table, &file.values, &given, |key| (file.name(key), Source::File))?;
        let proxy = match &self.proxy_config {
            Some(text) => ProxyLayer::parse(text, &with_file, &env_names()).map_err(|e| ConfigError::Invalid {
                field: e.field,
                value: text.trim().to_owned(),
                origin: Source::ProxyConfig,
                why: e.why,
            })?,
            None => ProxyLayer::default(),
        };
        let named = |key: &str| (proxy.fields.get(key).cloned().unwrap_or_default(), Source::ProxyConfig);
        table = layer(&with_file, &proxy.values, &given, named)?;
        // The pod's address: INSTANCE_IP (the setting's env), else POD_IP,
        // which Kubernetes manifests set too; an env variable either way.
        let pod_ip_env = given("pod_ip")
            .is_none()
            .then(|| std::env::var("POD_IP").ok())
            .flatten();
        if let Some(ip) = &pod_ip_env {
            check_pod_ip(ip)?;
            table.insert("pod_ip".into(), ip.clone().into());
        }
        let source = |key: &str| {
            if key == "pod_ip" && pod_ip_env.is_some() {
                return Source::Env;
            }
            given(key).unwrap_or(if proxy.values.contains_key(key) {
                Source::ProxyConfig
            } else if file.values.contains_key(key) {
                Source::File
            } else {
                Source::Default
            })
        };
        let settings: Settings = table.try_into().expect("every layered value was checked");
        // A rule across settings names each value as the user wrote it:
        // a flag, an env variable, a file key, or PROXY_CONFIG's field.
        let named = |key: &str| match (source(key), proxy.fields.get(key)) {
            (Source::ProxyConfig, Some(field)) => (field.clone(), Source::ProxyConfig),
            (Source::File, _) => (file.name(key), Source::File),
            (source, _) => (field_name(key, source), source),
        };
        let given = |key: &str| source(key) != Source::Default;
        let plan = settings.plan(&given, named, proxy.unused, file.renamed.clone())?;

        let mut table = toml::Table::try_from(&settings).expect("settings serialize");
        // What the plans made of two settings is what runs: the policy the
        // defaults chose, the listener ports always left out.
        table.insert("drain_until".into(), plan.drain.drain_until().to_string().into());
        let ports = plan.envoy.ignored_listener_ports.iter().map(|p| i64::from(*p).into());
        table.insert("ignore_listener_ports".into(), toml::Value::Array(ports.collect()));
        let effective = settings_command()
            .get_arguments()
            .map(|arg| {
                let key = arg.get_id().as_str();
                let value = table.get(key).map_or(String::new(), shown);
                let source = source(key);
                Effective {
                    key: key.into(),
                    value,
                    source,
                }
            })
            .collect();
        Ok(Loaded {
            settings,
            plan,
            effective,
        })
    }
}

impl Settings {
    /// Each crate's plan, each made from its settings (and the plans it
    /// needs); a rule that does not hold names its setting by `named`.
    fn plan(
        &self,
        given: &dyn Fn(&str) -> bool,
        named: impl Fn(&str) -> (String, Source),
        proxy_config_unused: Vec<String>,
        renamed_keys: Vec<String>,
    ) -> Result<Plan, ConfigError> {
        let refused = |e: &dyn SettingError| {
            let (field, origin) = named(e.key());
            ConfigError::Invalid {
                field,
                value: e.value(),
                origin,
                why: e.to_string(),
            }
        };
        let drain = self.drain.plan(given, self.envoy.reads()).map_err(|e| refused(&e))?;
        let status = self.status.plan().map_err(|e| refused(&e))?;
        let (status_port, admin_port) = (self.status.status_addr.port(), self.envoy.admin_url.port());
        let metrics = self.metrics.plan(status_port, admin_port).map_err(|e| refused(&e))?;
        Ok(Plan {
            log: self.log.clone(),
            envoy: self.envoy.plan(drain.grace()),
            drain_wait: self.drain_wait.plan(&drain),
            drain,
            status,
            metrics,
            pod: self.pod.clone(),
            exit: self.exit.clone(),
            proxy_config_unused,
            renamed_keys,
        })
    }
}

/// `base` with the values of a lower layer laid in, each checked by the
/// settings' own parsers, except where a flag or env variable was `given`.
/// `named` says how the layer names a key in errors.
fn layer(
    base: &toml::Table,
    values: &toml::Table,
    given: &impl Fn(&str) -> Option<Source>,
    named: impl Fn(&str) -> (String, Source),
) -> Result<toml::Table, ConfigError> {
    let mut table = base.clone();
    for (key, value) in values {
        if given(key).is_some() {
            continue;
        }
        let mut trial = table.clone();
        trial.insert(key.clone(), value.clone());
        if let Err(e) = trial.try_into::<Settings>() {
            let (field, origin) = named(key);
            return Err(ConfigError::Invalid {
                field,
                value: shown(value),
                origin,
                why: e.message().to_owned(),
            });
        }
        table.insert(key.clone(), value.clone());
    }
    Ok(table)
}

/// Every setting's env variable, and the setting's key.
fn env_names() -> EnvNames {
    settings_command()
        .get_arguments()
        .filter_map(|a| Some((a.get_env()?.to_str()?.to_owned(), a.get_id().as_str().to_owned())))
        .collect()
}

/// A TOML value the way a user types it on the command line.
fn shown(value: &toml::Value) -> String {
    match value {
        toml::Value::String(s) => s.clone(),
        toml::Value::Array(items) => items.iter().map(shown).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// The agent's message for clap's error about a bad setting value, naming
/// the env variable when the value came from there (clap names the flag
/// either way). `None` for any other error, which clap reports itself.
pub fn from_clap_error(err: &clap::Error, argv: &[OsString]) -> Option<ConfigError> {
    if !matches!(err.kind(), ErrorKind::ValueValidation | ErrorKind::InvalidValue) {
        return None;
    }
    let text = |kind| match err.get(kind) {
        Some(ContextValue::String(s)) => Some(s.as_str()),
        _ => None,
    };
    let flag = text(ContextKind::InvalidArg)?.split(' ').next()?;
    let value = text(ContextKind::InvalidValue)?.to_owned();
    let cmd = settings_command();
    let arg = cmd
        .get_arguments()
        .find(|a| a.get_long().is_some_and(|l| flag == format!("--{l}")))?;
    let on_command_line = argv
        .iter()
        .take_while(|a| a.as_os_str() != OsStr::new("--"))
        .filter_map(|a| a.to_str())
        .any(|a| a == flag || a.strip_prefix(flag).is_some_and(|rest| rest.starts_with('=')));
    let origin = if on_command_line { Source::Flag } else { Source::Env };
    let why = match (std::error::Error::source(err), err.get(ContextKind::ValidValue)) {
        (Some(source), _) => source.to_string(),
        (None, Some(ContextValue::Strings(valid))) => format!("expected one of {}", valid.join(", ")),
        _ => "invalid value".into(),
    };
    let field = field_name(arg.get_id().as_str(), origin);
    Some(ConfigError::Invalid {
        field,
        value,
        origin,
        why,
    })
}

/// The longest config file read.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// Reads the TOML file: a regular file of at most 1 MiB. It is opened
/// without blocking, so a FIFO is refused at once rather than waited on.
/// Its keys come out of their sections.
fn read_file(path: &Path) -> Result<FileValues, ConfigError> {
    let bad = |message: &dyn fmt::Display| ConfigError::File {
        path: path.to_owned(),
        message: message.to_string(),
    };
    let mut options = std::fs::OpenOptions::new();
    let file = options.read(true).custom_flags(libc::O_NONBLOCK).open(path);
    let file = file.map_err(|e| bad(&format_args!("cannot read: {e}")))?;
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return Err(bad(&"not a regular file"));
    }
    let mut text = String::new();
    let read = file.take(MAX_FILE_BYTES + 1).read_to_string(&mut text);
    read.map_err(|e| bad(&format_args!("cannot read: {e}")))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(bad(&"larger than 1 MiB"));
    }
    let table = text.parse().map_err(|e: toml::de::Error| bad(&e.message()))?;
    FileValues::from_file(table).map_err(|message| bad(&message))
}
