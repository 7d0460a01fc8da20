//! Istio's `PROXY_CONFIG`: the proxy's settings as the injector writes
//! them into the pod (JSON, or YAML), read as a settings layer between the
//! env variables and the file. The fields lifeguard acts on:
//!
//! | field | setting |
//! | --- | --- |
//! | `terminationDrainDuration` | `termination_drain_duration` |
//! | `drainDuration` | `envoy_drain_time` (Envoy's `--drain-time-s`) |
//! | `statusPort` | the port of `status_addr` |
//! | `proxyAdminPort` | the port of `admin_url` (when it is TCP) |
//! | `proxyMetadata.<VAR>` | the setting whose env variable is `VAR` (`EXIT_ON_ZERO_ACTIVE_CONNECTIONS`, `MINIMUM_DRAIN_DURATION`, ...) |
//!
//! Every other field is listed once at start-up as not used. Values go
//! through the same parsers as a flag's.

use std::collections::BTreeMap;

use lifeguard_istio::proxy_config::{ProxyConfig, ProxyConfigError};

use crate::entry::{Entry, Text};
use crate::Settings;

/// What `PROXY_CONFIG` sets: a value by setting key, as a user types it,
/// with the field it was written under (`PROXY_CONFIG
/// terminationDrainDuration`); and the fields left unused.
#[derive(Debug, Default)]
pub(crate) struct ProxyLayer {
    pub(crate) entries: Vec<Entry>,
    pub(crate) unused: Vec<String>,
}

/// The settings' env variables, for `proxyMetadata`: env name → setting key.
pub(crate) type EnvNames = BTreeMap<String, String>;

impl ProxyLayer {
    /// Reads `text` against `below`, the settings as the lower layers have
    /// them (the addresses its ports go into). Each value is checked when
    /// laid, by its setting's parser.
    pub(crate) fn parse(text: &str, below: &Settings, env: &EnvNames) -> Result<ProxyLayer, ProxyConfigError> {
        let config = ProxyConfig::parse(text)?;
        let mut layer = ProxyLayer::default();
        let field = |name: &str| format!("PROXY_CONFIG {name}");
        if let Some(d) = config.termination_drain_duration {
            layer.set("termination_drain_duration", field("terminationDrainDuration"), d);
        }
        if let Some(d) = config.drain_duration {
            layer.set("envoy_drain_time", field("drainDuration"), d);
        }
        if let Some(port) = config.status_port {
            let mut addr = below.status.status_addr.get();
            addr.set_port(port);
            layer.set("status_addr", field("statusPort"), addr.to_string());
        }
        if let Some(port) = config.proxy_admin_port {
            match below.envoy.admin_url.port() {
                Some(_) => layer.set("admin_url", field("proxyAdminPort"), format!("http://127.0.0.1:{port}")),
                None => layer.unused.push("proxyAdminPort (admin_url is a Unix socket)".into()),
            }
        }
        layer.unused.extend(config.other);
        // A `proxyMetadata` entry is a setting when it names one's env
        // variable, its text read as that variable's would be.
        for (name, text) in config.proxy_metadata {
            match env.get(&name) {
                Some(key) => layer.set(key, field(&format!("proxyMetadata.{name}")), text),
                None => layer.unused.push(format!("proxyMetadata.{name}")),
            }
        }
        Ok(layer)
    }

    /// Sets `key` from `field`. Istio's fields are read first, then
    /// `proxyMetadata`: a variable there that sets the same setting wins,
    /// as it does in the pod, where the injector makes it the container's
    /// env variable too (which beats `PROXY_CONFIG`); the field it
    /// overrides is listed as not used, and why.
    fn set(&mut self, key: &str, field: String, text: String) {
        if let Some(at) = self.entries.iter().position(|e| e.key == key) {
            let first = self.entries.remove(at);
            let name = |f: &str| f.trim_start_matches("PROXY_CONFIG ").to_owned();
            self.unused.push(format!(
                "{} ({} sets {key} too, and wins)",
                name(&first.field),
                name(&field)
            ));
        }
        self.entries.push(Entry {
            key: key.to_owned(),
            text: Text::One(text),
            field,
        });
    }

    #[cfg(test)]
    fn value(&self, key: &str) -> Option<&str> {
        let entry = self.entries.iter().find(|e| e.key == key)?;
        match &entry.text {
            Text::One(text) => Some(text),
            Text::List(_) | Text::Unfit(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn below() -> Settings {
        lifeguard_base::settings::defaults()
    }

    fn env() -> EnvNames {
        [
            ("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "exit_on_zero_active_connections"),
            ("LIFEGUARD_IGNORE_APP_PORTS", "ignore_app_ports"),
            ("MINIMUM_DRAIN_DURATION", "minimum_drain_duration"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .collect()
    }

    #[test]
    fn istio_fields_become_settings_and_the_rest_is_listed() {
        let layer = ProxyLayer::parse(
            r#"{"terminationDrainDuration":"30s","drainDuration":"23s","statusPort":15120,"proxyAdminPort":"15100",
                "discoveryAddress":"istiod:15012","proxyMetadata":{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS":"true",
                "LIFEGUARD_IGNORE_APP_PORTS":"9000,9001","MINIMUM_DRAIN_DURATION":"10s","FOO":"bar"}}"#,
            &below(),
            &env(),
        )
        .unwrap();
        let v = |key| layer.value(key);
        assert_eq!(v("termination_drain_duration"), Some("30s"));
        assert_eq!(v("envoy_drain_time"), Some("23s"));
        assert_eq!(v("status_addr"), Some("0.0.0.0:15120"));
        assert_eq!(v("admin_url"), Some("http://127.0.0.1:15100"));
        assert_eq!(v("exit_on_zero_active_connections"), Some("true"));
        assert_eq!(v("ignore_app_ports"), Some("9000,9001"));
        assert_eq!(v("minimum_drain_duration"), Some("10s"));
        assert_eq!(layer.unused, ["discoveryAddress", "proxyMetadata.FOO"]);
        let status = layer.entries.iter().find(|e| e.key == "status_addr").unwrap();
        assert_eq!(status.field, "PROXY_CONFIG statusPort");
    }

    #[test]
    fn a_proxy_metadata_variable_beats_the_field_it_overrides_which_is_listed() {
        let layer = ProxyLayer::parse(
            r#"{"terminationDrainDuration":"5s","proxyMetadata":{"MINIMUM_DRAIN_DURATION":"10s"},
                "statusPort":15120}"#,
            &below(),
            &[
                ("MINIMUM_DRAIN_DURATION", "minimum_drain_duration"),
                ("TERMINATION_DRAIN_DURATION", "termination_drain_duration"),
            ]
            .into_iter()
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .collect(),
        )
        .unwrap();
        assert!(layer.unused.is_empty(), "{:?}", layer.unused);
        let layer = ProxyLayer::parse(
            r#"{"terminationDrainDuration":"5s","proxyMetadata":{"TERMINATION_DRAIN_DURATION":"20s"}}"#,
            &below(),
            &[("TERMINATION_DRAIN_DURATION", "termination_drain_duration")]
                .into_iter()
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .collect(),
        )
        .unwrap();
        assert_eq!(layer.value("termination_drain_duration"), Some("20s"));
        let entry = layer
            .entries
            .iter()
            .find(|e| e.key == "termination_drain_duration")
            .unwrap();
        assert_eq!(entry.field, "PROXY_CONFIG proxyMetadata.TERMINATION_DRAIN_DURATION");
        assert_eq!(
            layer.unused,
            ["terminationDrainDuration (proxyMetadata.TERMINATION_DRAIN_DURATION sets termination_drain_duration too, and wins)"]
        );
    }

    #[test]
    fn yaml_as_istio_also_accepts_and_empty_is_nothing() {
        let layer = ProxyLayer::parse(
            "terminationDrainDuration: 45s\nholdApplicationUntilProxyStarts: true\n",
            &below(),
            &env(),
        )
        .unwrap();
        assert_eq!(layer.value("termination_drain_duration"), Some("45s"));
        assert_eq!(layer.unused, ["holdApplicationUntilProxyStarts"]);
        assert!(ProxyLayer::parse("{}\n", &below(), &env()).unwrap().entries.is_empty());
        assert!(ProxyLayer::parse("", &below(), &env()).unwrap().entries.is_empty());
    }

    #[test]
    fn malformed_text_names_proxy_config() {
        // Istio's own fields are named by istio::proxy_config (its tests);
        // here, that its errors pass through. A setting's bad value is
        // refused when laid, by its parser (the crate's tests).
        let e = ProxyLayer::parse("{not json", &below(), &env()).unwrap_err();
        assert_eq!(e.field, "PROXY_CONFIG");
    }
}
