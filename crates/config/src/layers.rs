//! The layers under the settings: flags and env (clap), then
//! `PROXY_CONFIG`, then the TOML file, then defaults; every effective value
//! listed with its source; and clap's errors about a value rewritten to
//! name the field as the user wrote it.
//!
//! A lower layer is typed the way the command line is: each of its values
//! is handed, as the text a user would type, to the setting's own clap
//! argument (its parser, with no env variable and no default), and clap's
//! derived update writes that one field. So a file's value is checked by
//! exactly the parser that checks the flag, and nothing else moves.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Args, Command, FromArgMatches};

use crate::entry::{Entry, Source, Text};
use crate::error::{ConfigError, FileError, Why};
use crate::proxy_config::{EnvNames, ProxyLayer};
use crate::sections::FileValues;
use crate::sections::Settings;
use crate::{Effective, Loaded, Plan, RunArgs};
use lifeguard_base::duration::GoDuration;
use lifeguard_base::settings::SettingError;

/// The settings' clap arguments, for their flags and env names.
fn settings_command() -> Command {
    Settings::augment_args(Command::new("lifeguard"))
}

/// The settings' arguments for a lower layer: no env variable and no
/// default, so a parse holds the one value given and nothing else; a
/// list may be given empty.
fn layer_command() -> Command {
    settings_command().mut_args(|arg| {
        let list = matches!(arg.get_action(), ArgAction::Append);
        let arg = arg.env(None).default_value(None::<&str>);
        if list {
            arg.num_args(0..)
        } else {
            arg
        }
    })
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

/// The settings as the layers make them, and where each value that is no
/// default came from, with the name it was given under.
struct Layering {
    settings: Settings,
    cmd: Command,
    from: HashMap<String, (Source, String)>,
}

impl Layering {
    /// Lays `entry` over the settings through its setting's argument: its
    /// parser checks the value, clap's update sets that field alone.
    fn lay(&mut self, entry: &Entry, origin: Source) -> Result<(), ConfigError> {
        let invalid = |why| ConfigError::Invalid {
            field: entry.field.clone(),
            value: entry.text.to_string(),
            origin,
            why,
        };
        // Every key was checked against the settings when read.
        let Some(arg) = self.cmd.get_arguments().find(|a| a.get_id() == entry.key.as_str()) else {
            return Err(invalid(Why::Shape("one of lifeguard's settings")));
        };
        let flag = format!("--{}", arg.get_long().unwrap_or(&entry.key));
        let list = matches!(arg.get_action(), ArgAction::Append);
        // A list in one text (an env variable's form: `9000,9001`) is
        // split here at its commas, each item as written, as clap splits
        // the env variable: the same text means the same, or is refused
        // the same (` 9001`, an empty item), in every layer. An empty text
        // is no item: a `proxyMetadata` value, always a string, has no
        // other way to say none.
        let split;
        let text = match &entry.text {
            Text::One(text) if list => {
                let items = text.split(',').map(Into::into);
                split = Text::List(items.filter(|_| !text.is_empty()).collect());
                &split
            }
            text => text,
        };
        let argv: Vec<String> = match text {
            Text::One(text) => vec![format!("{flag}={text}")],
            Text::List(_) if !list => return Err(invalid(Why::Shape("one value, not a list"))),
            Text::List(items) if items.is_empty() => vec![flag],
            Text::List(items) => items.iter().map(|item| format!("{flag}={item}")).collect(),
            Text::Unfit(_) => return Err(invalid(Why::Shape("a value or a list of values"))),
        };
        let argv = std::iter::once("lifeguard".to_owned()).chain(argv);
        let matches = self
            .cmd
            .try_get_matches_from_mut(argv)
            .map_err(|e| invalid(Why::Value(e)))?;
        self.settings
            .update_from_arg_matches(&matches)
            .map_err(|e| invalid(Why::Value(e)))?;
        self.from.insert(entry.key.clone(), (origin, entry.field.clone()));
        Ok(())
    }
}

impl RunArgs {
    /// Lays the config file, then `PROXY_CONFIG`, under the flags and env
    /// values clap parsed (`matches`, of this subcommand, tells which were
    /// given), makes each crate's plan (the rules across settings) and
    /// lists every effective value with its source.
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
        let mut layers = Layering {
            settings: self.settings,
            cmd: layer_command(),
            from: HashMap::new(),
        };
        // The layers under flags and env, lowest first: the file, then PROXY_CONFIG.
        for entry in file.entries.iter().filter(|e| given(&e.key).is_none()) {
            layers.lay(entry, Source::File)?;
        }
        let proxy = match &self.proxy_config {
            Some(text) => {
                ProxyLayer::parse(text, &layers.settings, &env_names()).map_err(|e| ConfigError::Invalid {
                    field: e.field.clone(),
                    value: text.trim().to_owned(),
                    origin: Source::ProxyConfig,
                    why: Why::ProxyConfig(e),
                })?
            }
            None => ProxyLayer::default(),
        };
        for entry in proxy.entries.iter().filter(|e| given(&e.key).is_none()) {
            layers.lay(entry, Source::ProxyConfig)?;
        }
        // The pod's address: INSTANCE_IP (the setting's env), else POD_IP,
        // which Kubernetes manifests set too; an env variable either way.
        if let (None, Ok(ip)) = (given("pod_ip"), std::env::var("POD_IP")) {
            let entry = Entry {
                key: "pod_ip".into(),
                text: Text::One(ip),
                field: "POD_IP".into(),
            };
            layers.lay(&entry, Source::Env)?;
        }
        let Layering { settings, from, .. } = layers;
        // Each value as the user gave it: a flag, an env variable, a file
        // key, PROXY_CONFIG's field; or its default.
        let named = |key: &str| match (given(key), from.get(key)) {
            (Some(source), _) => (field_name(key, source), source),
            (None, Some((source, field))) => (field.clone(), *source),
            (None, None) => (key.to_owned(), Source::Default),
        };
        let plan = settings.plan(&named, proxy.unused, file.renamed.clone())?;
        let effective = effective(&settings, &plan, &named);
        Ok(Loaded {
            settings,
            plan,
            effective,
        })
    }
}

/// Every setting's effective value as a user writes it, and its source.
/// What the plans made of three settings is what runs: the policy the
/// defaults chose, the fixed drain's default, the listener ports always
/// left out.
fn effective(settings: &Settings, plan: &Plan, named: &dyn Fn(&str) -> (String, Source)) -> Vec<Effective> {
    // Serialized only to be shown, each value as its flag reads it.
    let (mut table, unshown) = match toml::Table::try_from(settings) {
        Ok(table) => (table, None),
        Err(e) => (toml::Table::new(), Some(format!("(cannot be shown: {e})"))),
    };
    table.insert("drain_until".into(), plan.drain.drain_until().to_string().into());
    let fixed = GoDuration(plan.drain.termination_drain_duration()).to_string();
    table.insert("termination_drain_duration".into(), fixed.into());
    let ports = plan.envoy.ignored_listener_ports.iter().map(|p| i64::from(*p).into());
    table.insert("ignore_listener_ports".into(), toml::Value::Array(ports.collect()));
    settings_command()
        .get_arguments()
        .map(|arg| {
            let key = arg.get_id().as_str();
            let value = match (table.get(key), &unshown) {
                (Some(value), _) => Text::of_toml(value).to_string(),
                (None, Some(why)) => why.clone(),
                (None, None) => String::new(),
            };
            Effective {
                key: key.into(),
                value,
                source: named(key).1,
            }
        })
        .collect()
}

impl Settings {
    /// Each crate's plan, each made from its settings (and the plans it
    /// needs); a rule that does not hold names its setting by `named`.
    fn plan(
        &self,
        named: &dyn Fn(&str) -> (String, Source),
        proxy_config_unused: Vec<String>,
        renamed_keys: Vec<String>,
    ) -> Result<Plan, ConfigError> {
        fn refused<E>(named: &dyn Fn(&str) -> (String, Source)) -> impl Fn(E) -> ConfigError + '_
        where
            E: SettingError + Send + Sync + 'static,
        {
            move |e: E| {
                let (field, origin) = named(e.key());
                ConfigError::Invalid {
                    field,
                    value: e.value(),
                    origin,
                    why: Why::Rule(Box::new(e)),
                }
            }
        }
        let drain = self
            .drain
            .plan(self.envoy.reads(), self.drain_wait.node_checks())
            .map_err(refused(named))?;
        let drain_wait = self.drain_wait.plan(&drain).map_err(refused(named))?;
        let status = self.status.plan().map_err(refused(named))?;
        let (status_port, admin_port) = (self.status.status_addr.get().port(), self.envoy.admin_url.port());
        let metrics = self.metrics.plan(status_port, admin_port).map_err(refused(named))?;
        // Each as the user gave it: `TERMINATION_DRAIN_DURATION=10s (env)`.
        let set_aside = drain
            .set_aside()
            .iter()
            .map(|s| {
                let (field, source) = named(s.key);
                format!("{field}={} ({source}; drain_until is {})", s.value, drain.drain_until())
            })
            .collect();
        Ok(Plan {
            log: self.log.clone(),
            envoy: self.envoy.plan(drain.grace()),
            drain_wait,
            drain,
            status,
            metrics,
            pod: self.pod.clone(),
            exit: self.exit.clone(),
            proxy_config_unused,
            set_aside,
            renamed_keys,
        })
    }
}

/// Every setting's env variable, and the setting's key.
fn env_names() -> EnvNames {
    settings_command()
        .get_arguments()
        .filter_map(|a| Some((a.get_env()?.to_str()?.to_owned(), a.get_id().as_str().to_owned())))
        .collect()
}

/// The agent's message for clap's error about a bad setting value, naming
/// the env variable when the value came from there (clap names the flag
/// either way). Any other error is handed back, for clap to report.
pub fn from_clap_error(err: clap::Error, argv: &[OsString]) -> Result<ConfigError, clap::Error> {
    if !matches!(err.kind(), ErrorKind::ValueValidation | ErrorKind::InvalidValue) {
        return Err(err);
    }
    let text = |kind| match err.get(kind) {
        Some(ContextValue::String(s)) => Some(s.to_owned()),
        _ => None,
    };
    let (Some(invalid), Some(value)) = (text(ContextKind::InvalidArg), text(ContextKind::InvalidValue)) else {
        return Err(err);
    };
    let flag = invalid.split(' ').next().unwrap_or_default().to_owned();
    let cmd = settings_command();
    let Some(arg) = cmd
        .get_arguments()
        .find(|a| a.get_long().is_some_and(|l| flag == format!("--{l}")))
    else {
        return Err(err);
    };
    let on_command_line = argv
        .iter()
        .take_while(|a| a.as_os_str() != OsStr::new("--"))
        .filter_map(|a| a.to_str())
        .any(|a| a == flag || a.strip_prefix(flag.as_str()).is_some_and(|rest| rest.starts_with('=')));
    let origin = if on_command_line { Source::Flag } else { Source::Env };
    let field = field_name(arg.get_id().as_str(), origin);
    Ok(ConfigError::Invalid {
        field,
        value,
        origin,
        why: Why::Value(err),
    })
}

/// The longest config file read.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// Reads the TOML file: a regular file of at most 1 MiB. It is opened
/// without blocking, so a FIFO is refused at once rather than waited on.
/// Its keys come out of their sections.
fn read_file(path: &Path) -> Result<FileValues, ConfigError> {
    let values = || {
        let mut options = std::fs::OpenOptions::new();
        let file = options.read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
        if !file.metadata().is_ok_and(|m| m.is_file()) {
            return Err(FileError::NotARegularFile);
        }
        let mut text = String::new();
        file.take(MAX_FILE_BYTES + 1).read_to_string(&mut text)?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(FileError::TooLarge);
        }
        let table = text.parse().map_err(FileError::NotToml)?;
        Ok(FileValues::from_file(table)?)
    };
    values().map_err(|why| ConfigError::File {
        path: path.to_owned(),
        why,
    })
}
