//! The TOML settings file (config/), under PROXY_CONFIG, through the load
//! the agent runs (`lifeguard run --config FILE [--proxy-config TEXT]`).
//!
//! Input: NUL-separated: the file's text, PROXY_CONFIG (absent when empty).
//! Holds: a file that is no TOML, or has an unknown key (or a key out of
//! its section, or one set twice), is refused naming the file; a bad value
//! is refused naming the key as the file has it (`key`, or `section.key`)
//! or the PROXY_CONFIG field; every accepted value comes from the file,
//! PROXY_CONFIG or the default; what is loaded, written as a settings file,
//! loads back the same.

use super::{fields, settings_file, settings_read_back, settings_table};
use lifeguard::fuzzing::{load_settings, ConfigError, Source};

/// One input, as the fuzz target runs it: panics when a promise above is broken.
pub fn run(data: &[u8]) {
    let f = fields(data, 2);
    let (Ok(file), Ok(proxy)) = (std::str::from_utf8(f[0]), std::str::from_utf8(f[1])) else {
        return;
    };
    // The file's keys as written: `key` at the top level, `section.key` in
    // a table.
    let keys: Vec<String> = file
        .parse::<toml::Table>()
        .map(|t| {
            let inner = |(k, v): (&String, &toml::Value)| match v {
                toml::Value::Table(t) => t.keys().map(|i| format!("{k}.{i}")).collect(),
                _ => vec![],
            };
            t.keys().cloned().chain(t.iter().flat_map(inner)).collect()
        })
        .unwrap_or_default();
    let in_file = |key: &str| keys.iter().any(|k| k == key || k.ends_with(&format!(".{key}")));
    let path = settings_file(file);
    let proxy = (!proxy.is_empty()).then_some(proxy);
    match load_settings(Some(&path), proxy) {
        Ok(loaded) => {
            for e in &loaded.effective {
                let (key, source) = (&e.key, e.source);
                assert!(
                    matches!(source, Source::Default | Source::File | Source::ProxyConfig),
                    "{key} from {source}"
                );
                assert!(
                    source != Source::File || in_file(key),
                    "{key} from the file, which has no such key"
                );
            }
            settings_read_back(&settings_table(&loaded));
        }
        Err(e) => {
            let message = e.to_string();
            match &e {
                ConfigError::File { .. } => {
                    let file = format!("config file {}: ", path.display());
                    assert!(message.starts_with(&file), "{message}");
                }
                ConfigError::Invalid { field, origin, .. } => match origin {
                    Source::File => assert!(keys.contains(field), "not the file's key: {message}"),
                    Source::ProxyConfig => assert!(
                        field.starts_with("PROXY_CONFIG"),
                        "not as PROXY_CONFIG has it: {message}"
                    ),
                    Source::Default => {}
                    Source::Flag | Source::Env => panic!("no flag or env variable was given: {message}"),
                },
            }
        }
    }
}
