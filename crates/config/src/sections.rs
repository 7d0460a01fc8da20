//! The settings file's sections: each crate's settings under a table of
//! their own (`[drain]`, `[envoy]`, ...), the way the crates own them. A key
//! may also sit at the top level, as files written before the sections do;
//! either way it is set once.

use std::sync::OnceLock;

use clap::Command;

use crate::entry::{Entry, Text};

/// One crate's settings as the file and the reference group them.
pub(crate) struct Section {
    /// The file's table: `[drain]`.
    pub(crate) name: &'static str,
    /// The crate that owns the settings.
    pub(crate) krate: &'static str,
    /// The reference's heading.
    pub(crate) heading: &'static str,
    args: fn(Command) -> Command,
    /// Its keys, read once from its arguments.
    keys: OnceLock<Vec<String>>,
}

impl Section {
    pub(crate) const fn new(
        name: &'static str,
        krate: &'static str,
        heading: &'static str,
        args: fn(Command) -> Command,
    ) -> Section {
        Section {
            name,
            krate,
            heading,
            args,
            keys: OnceLock::new(),
        }
    }

    /// The section's clap arguments.
    pub(crate) fn command(&self) -> Command {
        (self.args)(Command::new("lifeguard"))
    }

    /// The section's keys (its clap arguments' ids, read once).
    pub(crate) fn keys(&self) -> &[String] {
        self.keys.get_or_init(|| {
            let args = self.command();
            args.get_arguments().map(|a| a.get_id().to_string()).collect()
        })
    }

    /// The section that owns `key`, if a setting has it.
    pub(crate) fn home(key: &str) -> Option<&'static Section> {
        SECTIONS.iter().find(|s| s.keys().iter().any(|k| k == key))
    }
}

/// Declares the agent's settings once: a crate's settings a field, with
/// its file section, its crate and its reference heading. Makes the
/// flattened `Settings` (one command line, one file) and `SECTIONS` (the
/// file's sections and the reference, in the same order) from that list.
macro_rules! sections {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $field:ident : $ty:ty => $section:literal, $krate:literal, $heading:literal; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, clap::Args, serde::Serialize)]
        #[group(skip)]
        pub struct $name {
            $(
                #[command(flatten)]
                #[serde(flatten)]
                pub $field: $ty,
            )*
        }

        /// Every crate's settings as the file and the reference group
        /// them, in the order [`Settings`] declares them.
        pub(crate) static SECTIONS: [$crate::sections::Section; [$($section),*].len()] = [
            $( $crate::sections::Section::new($section, $krate, $heading, <$ty as clap::Args>::augment_args), )*
        ];
    };
}

sections! {
    /// Every setting of a running agent, each crate's own flattened: one
    /// command line, one file with a section a crate; declared once, with
    /// the file's section, the owning crate and the reference's heading of
    /// each, in the reference's order (`SECTIONS` is made from the same
    /// list).
    pub struct Settings {
        status: lifeguard_status::Settings => "status", "lifeguard-status", "The status port";
        envoy: lifeguard_envoy::Settings => "envoy", "lifeguard-envoy", "Envoy";
        drain: lifeguard_drain::Settings => "drain", "lifeguard-drain", "The drain";
        drain_wait: lifeguard_drain_wait::Settings => "drain_wait", "lifeguard-drain-wait", "The drain wait";
        pod: lifeguard_pod::Settings => "pod", "lifeguard-pod", "The app in the pod";
        metrics: lifeguard_scrape::Settings => "metrics", "lifeguard-scrape", "Metrics and the merged scrape";
        log: lifeguard_logging::Settings => "logging", "lifeguard-logging", "Logs";
        exit: lifeguard_exit::Settings => "exit", "lifeguard-exit", "The exit summary";
    }
}

/// The file's values, each under its setting's key and the name it was
/// written under: `poll_interval` at the top level, `envoy.poll_interval`
/// in its section.
#[derive(Debug, Default)]
pub(crate) struct FileValues {
    pub(crate) entries: Vec<Entry>,
    /// Keys written under a name they no longer have: read, and said.
    pub(crate) renamed: Vec<String>,
}

/// A key of the file that is no setting, or not where it may be.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// At the top level, neither a setting nor a section.
    #[error(
        "unknown field `{key}`, expected one of {} (at the top level or in its section: {})",
        every_key(),
        every_section()
    )]
    Unknown { key: String },
    /// In a section, no setting at all.
    #[error("unknown field `{key}` in [{section}], expected one of {}", section_keys(.section))]
    UnknownInSection { key: String, section: &'static str },
    /// In a section, another section's setting.
    #[error("`{key}` belongs in [{home}], not in [{section}]")]
    Misplaced {
        key: String,
        home: &'static str,
        section: &'static str,
    },
    /// A section's name at the top level, with a value.
    #[error("`{0}` is a section: write [{0}] and its keys under it")]
    NotATable(String),
    /// One setting under two names (the top level and its section, or an
    /// old name and the new).
    #[error("`{key}` is set twice: as `{first}` and as `{second}`")]
    SetTwice { key: String, first: String, second: String },
}

/// Every setting's key, in the sections' order.
fn every_key() -> String {
    let keys: Vec<&str> = SECTIONS.iter().flat_map(Section::keys).map(String::as_str).collect();
    keys.join(", ")
}

/// Every section, as the file writes it: `[status], [envoy], ...`.
fn every_section() -> String {
    let sections: Vec<String> = SECTIONS.iter().map(|s| format!("[{}]", s.name)).collect();
    sections.join(", ")
}

/// The keys of the section named `name`.
fn section_keys(name: &str) -> String {
    let section = SECTIONS.iter().filter(|s| s.name == name);
    section.flat_map(Section::keys).cloned().collect::<Vec<_>>().join(", ")
}

/// Keys renamed, the old name first: the drain wait's keys no longer
/// repeat their section's name (`[drain_wait] app_time`). The old names
/// are still read, with a warning.
const RENAMED: [(&str, &str); 5] = [
    ("drain_wait_unhealthy_threshold", "unhealthy_threshold"),
    ("drain_wait_min_quiet_period", "min_quiet_period"),
    ("drain_wait_checker_ranges", "checker_ranges"),
    ("drain_wait_checker_timeout", "checker_timeout"),
    ("drain_wait_app_time", "app_time"),
];

/// `key` under its current name, and whether it was renamed.
fn current(key: String) -> (String, bool) {
    match RENAMED.iter().find(|(old, _)| *old == key) {
        Some((_, new)) => ((*new).to_owned(), true),
        None => (key, false),
    }
}

impl FileValues {
    /// The file's keys out of their sections. A key that is no setting, a
    /// section that is not a table, a key in a section that does not own
    /// it, and a key set twice are refused, named.
    pub(crate) fn from_file(file: toml::Table) -> Result<FileValues, KeyError> {
        let mut out = FileValues::default();
        for (key, value) in file {
            let Some(section) = SECTIONS.iter().find(|s| s.name == key) else {
                let (now, renamed) = current(key.clone());
                if Section::home(&now).is_none() {
                    return Err(KeyError::Unknown { key });
                }
                out.note_renamed(renamed, &key, &now);
                out.insert(now, key, value)?;
                continue;
            };
            let toml::Value::Table(table) = value else {
                return Err(KeyError::NotATable(key));
            };
            for (inner, value) in table {
                let (now, renamed) = current(inner.clone());
                if !section.keys().contains(&now) {
                    return Err(misplaced(inner, &now, section.name));
                }
                let written = format!("{key}.{inner}");
                out.note_renamed(renamed, &written, &format!("{key}.{now}"));
                out.insert(now, written, value)?;
            }
        }
        Ok(out)
    }

    fn note_renamed(&mut self, renamed: bool, written: &str, now: &str) {
        if renamed {
            self.renamed.push(format!(
                "`{written}` is now `{now}`: read as such; rename it in the file"
            ));
        }
    }

    fn insert(&mut self, key: String, written: String, value: toml::Value) -> Result<(), KeyError> {
        if let Some(first) = self.entries.iter().find(|e| e.key == key) {
            let first = first.field.clone();
            return Err(KeyError::SetTwice {
                key,
                first,
                second: written,
            });
        }
        self.entries.push(Entry {
            key,
            text: Text::of_toml(&value),
            field: written,
        });
        Ok(())
    }
}

/// Why `key` (named `now` today: an old name is read as its new one) may
/// not sit in `[section]`: it belongs in another, or it is no setting at
/// all.
fn misplaced(key: String, now: &str, section: &'static str) -> KeyError {
    match Section::home(now) {
        Some(home) => KeyError::Misplaced {
            key,
            home: home.name,
            section,
        },
        None => KeyError::UnknownInSection { key, section },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(text: &str) -> Result<FileValues, String> {
        FileValues::from_file(text.parse().unwrap()).map_err(|e| e.to_string())
    }

    #[test]
    fn no_section_shares_a_name_with_a_key_and_each_key_has_one_section() {
        let mut every: Vec<&String> = SECTIONS.iter().flat_map(Section::keys).collect();
        let count = every.len();
        every.sort();
        every.dedup();
        assert_eq!(every.len(), count, "a key in two sections");
        for section in &SECTIONS {
            assert!(!every.iter().any(|k| *k == section.name), "[{}] is a key", section.name);
        }
    }

    /// The file's values by key, sorted.
    fn values(file: &FileValues) -> Vec<(&str, String)> {
        let mut all: Vec<_> = file
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.text.to_string()))
            .collect();
        all.sort();
        all
    }

    /// How the file named `key`.
    fn name<'a>(file: &'a FileValues, key: &str) -> &'a str {
        &file.entries.iter().find(|e| e.key == key).unwrap().field
    }

    #[test]
    fn sections_and_the_top_level_give_the_same_values() {
        let sections =
            flat("log = \"debug\"\n[envoy]\npoll_interval = \"2s\"\n[drain]\nshutdown_margin = \"1s\"\n").unwrap();
        let dotted = flat("envoy.poll_interval = \"2s\"\nlog = \"debug\"\ndrain.shutdown_margin = \"1s\"\n").unwrap();
        let top = flat("poll_interval = \"2s\"\nshutdown_margin = \"1s\"\nlog = \"debug\"\n").unwrap();
        assert_eq!(values(&sections), values(&top));
        assert_eq!(values(&dotted), values(&top));
        assert_eq!(name(&sections, "poll_interval"), "envoy.poll_interval");
        assert_eq!(name(&top, "poll_interval"), "poll_interval");
    }

    #[test]
    fn an_old_key_name_is_read_as_the_new_one_and_said() {
        let text = "drain_wait_app_time = \"3s\"\n[drain_wait]\ndrain_wait_checker_timeout = \"9s\"\n";
        let file = FileValues::from_file(text.parse().unwrap()).unwrap();
        assert_eq!(
            values(&file),
            [("app_time", "3s".to_owned()), ("checker_timeout", "9s".to_owned())]
        );
        assert_eq!(
            file.renamed,
            [
                "`drain_wait.drain_wait_checker_timeout` is now `drain_wait.checker_timeout`: read as such; rename it in the file",
                "`drain_wait_app_time` is now `app_time`: read as such; rename it in the file",
            ]
        );
        // The old name and the new one: set twice, refused.
        let err = flat("[drain_wait]\napp_time = \"1s\"\ndrain_wait_app_time = \"2s\"\n").unwrap_err();
        assert!(err.contains("`app_time` is set twice"), "{err}");
        // The new names alone: nothing said.
        let file = FileValues::from_file("[drain_wait]\napp_time = \"1s\"\n".parse().unwrap()).unwrap();
        assert!(file.renamed.is_empty());
    }

    #[test]
    fn a_misplaced_or_repeated_key_is_refused_named() {
        let err = flat("[drain]\npoll_interval = \"2s\"\n").unwrap_err();
        assert_eq!(err, "`poll_interval` belongs in [envoy], not in [drain]");
        // An old name, in the wrong section: named as written, sent home.
        let err = flat("[drain]\ndrain_wait_app_time = \"5s\"\n").unwrap_err();
        assert_eq!(err, "`drain_wait_app_time` belongs in [drain_wait], not in [drain]");
        let err = flat("[drain]\npol_interval = \"2s\"\n").unwrap_err();
        assert!(
            err.starts_with("unknown field `pol_interval` in [drain], expected one of "),
            "{err}"
        );
        assert!(err.contains("shutdown_margin"), "{err}");
        let err = flat("poll_interval = \"1s\"\n[envoy]\npoll_interval = \"2s\"\n").unwrap_err();
        assert_eq!(
            err,
            "`poll_interval` is set twice: as `envoy.poll_interval` and as `poll_interval`"
        );
        let err = flat("pol_interval = \"2s\"\n").unwrap_err();
        assert!(
            err.starts_with("unknown field `pol_interval`, expected one of status_addr, "),
            "{err}"
        );
        assert!(
            err.ends_with(
                "in its section: [status], [envoy], [drain], [drain_wait], [pod], [metrics], [logging], [exit])"
            ),
            "{err}"
        );
        let err = flat("drain = \"5s\"\n").unwrap_err();
        assert_eq!(err, "`drain` is a section: write [drain] and its keys under it");
    }
}
