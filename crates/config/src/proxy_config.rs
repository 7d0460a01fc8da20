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

/// What `PROXY_CONFIG` sets: file-layer values by setting key, the names
/// the user wrote them under (for errors), and the fields left unused.
#[derive(Debug, Default)]
pub(crate) struct ProxyLayer {
    pub(crate) values: toml::Table,
    /// Setting key → the field as written (`PROXY_CONFIG terminationDrainDuration`).
    pub(crate) fields: BTreeMap<String, String>,
    pub(crate) unused: Vec<String>,
}

/// The settings' env variables, for `proxyMetadata`: env name → setting key.
pub(crate) type EnvNames = BTreeMap<String, String>;

impl ProxyLayer {
    /// Reads `text` against `base`, the settings as the lower layers have
    /// them (the type of each value, and the addresses the ports go into).
    pub(crate) fn parse(text: &str, base: &toml::Table, env: &EnvNames) -> Result<ProxyLayer, ProxyConfigError> {
        let config = ProxyConfig::parse(text)?;
        let mut layer = ProxyLayer::default();
        let field = |name: &str| format!("PROXY_CONFIG {name}");
        if let Some(d) = config.termination_drain_duration {
            layer.set(
                "termination_drain_duration",
                &field("terminationDrainDuration"),
                d.into(),
            );
        }
        if let Some(d) = config.drain_duration {
            layer.set("envoy_drain_time", &field("drainDuration"), d.into());
        }
        if let Some(port) = config.status_port {
            let addr = base
                .get("status_addr")
                .and_then(toml::Value::as_str)
                .unwrap_or("0.0.0.0:15020");
            let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
            layer.set("status_addr", &field("statusPort"), format!("{host}:{port}").into());
        }
        if let Some(port) = config.proxy_admin_port {
            let url = base.get("admin_url").and_then(toml::Value::as_str).unwrap_or("");
            match url.starts_with("http://") {
                true => layer.set(
                    "admin_url",
                    &field("proxyAdminPort"),
                    format!("http://127.0.0.1:{port}").into(),
                ),
                false => layer.unused.push("proxyAdminPort (admin_url is a Unix socket)".into()),
            }
        }
        layer.unused.extend(config.other);
        for (name, text) in &config.proxy_metadata {
            layer.metadata(name, text, base, env)?;
        }
        Ok(layer)
    }

    fn set(&mut self, key: &str, field: &str, value: toml::Value) {
        self.values.insert(key.to_owned(), value);
        self.fields.insert(key.to_owned(), field.to_owned());
    }

    /// A `proxyMetadata` entry: a setting when it names one's env variable.
    fn metadata(&mut self, name: &str, text: &str, base: &toml::Table, env: &EnvNames) -> Result<(), ProxyConfigError> {
        let field = format!("PROXY_CONFIG proxyMetadata.{name}");
        let Some(key) = env.get(name) else {
            self.unused.push(format!("proxyMetadata.{name}"));
            return Ok(());
        };
        let invalid = |why: String| ProxyConfigError {
            field: field.clone(),
            why,
        };
        let typed = match base.get(key) {
            Some(toml::Value::Boolean(_)) => {
                toml::Value::Boolean(lifeguard_base::settings::go_bool(text).map_err(|e| invalid(e.to_string()))?)
            }
            Some(toml::Value::Array(_)) => {
                let ports: Result<Vec<toml::Value>, _> = text
                    .split(',')
                    .filter(|p| !p.trim().is_empty())
                    .map(|p| p.trim().parse::<i64>().map(toml::Value::Integer))
                    .collect();
                toml::Value::Array(ports.map_err(|_| invalid(format!("{text:?} is not a list of ports")))?)
            }
            _ => toml::Value::String(text.to_owned()),
        };
        self.set(key, &field, typed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> toml::Table {
        toml::toml! {
            status_addr = "0.0.0.0:15020"
            admin_url = "http://127.0.0.1:15000"
            exit_on_zero_active_connections = false
            ignore_app_ports = []
            minimum_drain_duration = "5s"
        }
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
            &base(),
            &env(),
        )
        .unwrap();
        let v = &layer.values;
        assert_eq!(v["termination_drain_duration"].as_str(), Some("30s"));
        assert_eq!(v["envoy_drain_time"].as_str(), Some("23s"));
        assert_eq!(v["status_addr"].as_str(), Some("0.0.0.0:15120"));
        assert_eq!(v["admin_url"].as_str(), Some("http://127.0.0.1:15100"));
        assert_eq!(v["exit_on_zero_active_connections"].as_bool(), Some(true));
        assert_eq!(v["ignore_app_ports"].as_array().unwrap().len(), 2);
        assert_eq!(v["minimum_drain_duration"].as_str(), Some("10s"));
        assert_eq!(layer.unused, ["discoveryAddress", "proxyMetadata.FOO"]);
        assert_eq!(layer.fields["status_addr"], "PROXY_CONFIG statusPort");
    }

    #[test]
    fn yaml_as_istio_also_accepts_and_empty_is_nothing() {
        let layer = ProxyLayer::parse(
            "terminationDrainDuration: 45s\nholdApplicationUntilProxyStarts: true\n",
            &base(),
            &env(),
        )
        .unwrap();
        assert_eq!(layer.values["termination_drain_duration"].as_str(), Some("45s"));
        assert_eq!(layer.unused, ["holdApplicationUntilProxyStarts"]);
        assert!(ProxyLayer::parse("{}\n", &base(), &env()).unwrap().values.is_empty());
        assert!(ProxyLayer::parse("", &base(), &env()).unwrap().values.is_empty());
    }

    #[test]
    fn malformed_values_name_the_field() {
        // Istio's own fields are named by istio::proxy_config (its tests);
        // here, that its errors pass through, and a setting's value.
        for (text, field) in [
            ("{not json", "PROXY_CONFIG"),
            (
                r#"{"proxyMetadata":{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS":"maybe"}}"#,
                "PROXY_CONFIG proxyMetadata.EXIT_ON_ZERO_ACTIVE_CONNECTIONS",
            ),
        ] {
            let e = ProxyLayer::parse(text, &base(), &env()).unwrap_err();
            assert_eq!(e.field, field, "{text}");
        }
    }
}
