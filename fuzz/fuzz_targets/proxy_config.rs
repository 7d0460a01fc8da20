//! `PROXY_CONFIG` (config/proxy_config.rs): Istio's proxy config, JSON or
//! YAML, read as the settings layer under flags and env, through the same
//! load the agent runs (`lifeguard run --proxy-config TEXT`).
//!
//! Input: the text.
//! Holds: a refusal from PROXY_CONFIG names the field as written there
//! (`PROXY_CONFIG statusPort`, `PROXY_CONFIG proxyMetadata.VAR`); every
//! accepted value comes from PROXY_CONFIG or the default; what is loaded,
//! written as a settings file, loads back the same.

use super::{settings_read_back, settings_table};
use lifeguard::fuzzing::{load_settings, ConfigError, Source};

/// One input, as the fuzz target runs it: panics when a promise above is broken.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match load_settings(None, Some(text)) {
        Ok(loaded) => {
            for e in &loaded.effective {
                let (key, source) = (&e.key, e.source);
                assert!(
                    source == Source::Default || source == Source::ProxyConfig,
                    "{key} from {source}"
                );
            }
            settings_read_back(&settings_table(&loaded));
        }
        Err(e) => match &e {
            ConfigError::Invalid { field, origin, .. } => {
                assert!(
                    *origin != Source::ProxyConfig || field.starts_with("PROXY_CONFIG"),
                    "a value from PROXY_CONFIG not named as written there: {e}"
                );
                assert!(matches!(origin, Source::ProxyConfig | Source::Default), "{e}");
            }
            ConfigError::File { .. } => panic!("no file was given: {e}"),
        },
    }
}
