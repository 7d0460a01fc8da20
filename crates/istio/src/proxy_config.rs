//! `PROXY_CONFIG`: the proxy's settings as Istio's injector writes them
//! into the pod, from the mesh config and the pod's
//! `proxy.istio.io/config` annotation. JSON as the injector writes it, or
//! YAML as the mesh config is written (JSON is YAML). Read here as Istio's
//! fields; `lifeguard_config` turns the ones lifeguard acts on into settings.

use std::collections::BTreeMap;

use serde_norway::Value;

/// The fields of `PROXY_CONFIG` lifeguard reads, as text as written, and
/// the names of the others.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyConfig {
    /// `terminationDrainDuration`: a Go duration.
    pub termination_drain_duration: Option<String>,
    /// `drainDuration`: a Go duration (Envoy's `--drain-time-s`).
    pub drain_duration: Option<String>,
    pub status_port: Option<u16>,
    pub proxy_admin_port: Option<u16>,
    /// `proxyMetadata`: env variables for the proxy, name → value.
    pub proxy_metadata: BTreeMap<String, String>,
    /// Every other field, by name, in order.
    pub other: Vec<String>,
}

/// A `PROXY_CONFIG` that cannot be read: the field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {why}")]
pub struct ProxyConfigError {
    /// `PROXY_CONFIG`, or `PROXY_CONFIG <field>` as Istio names it.
    pub field: String,
    pub why: String,
}

impl ProxyConfig {
    /// Reads `text`; empty or `{}` is no field at all.
    pub fn parse(text: &str) -> Result<ProxyConfig, ProxyConfigError> {
        let value: Value =
            serde_norway::from_str(text).map_err(|e| error("", format!("neither JSON nor YAML: {e}")))?;
        let map = match value {
            Value::Null => return Ok(ProxyConfig::default()),
            Value::Mapping(map) => map,
            _ => return Err(error("", "expected an object of proxy settings".into())),
        };
        let mut config = ProxyConfig::default();
        for (key, value) in map {
            let key = key.as_str().unwrap_or("").to_owned();
            match key.as_str() {
                "terminationDrainDuration" => config.termination_drain_duration = Some(text_of(&value, &key)?),
                "drainDuration" => config.drain_duration = Some(text_of(&value, &key)?),
                "statusPort" => config.status_port = Some(port_of(&value, &key)?),
                "proxyAdminPort" => config.proxy_admin_port = Some(port_of(&value, &key)?),
                "proxyMetadata" => {
                    let Value::Mapping(entries) = value else {
                        return Err(error("proxyMetadata", "expected an object".into()));
                    };
                    for (name, value) in entries {
                        let name = name.as_str().unwrap_or("").to_owned();
                        let text = text_of(&value, &format!("proxyMetadata.{name}"))?;
                        config.proxy_metadata.insert(name, text);
                    }
                }
                _ => config.other.push(key),
            }
        }
        Ok(config)
    }
}

fn error(field: &str, why: String) -> ProxyConfigError {
    let field = match field {
        "" => "PROXY_CONFIG".to_owned(),
        f => format!("PROXY_CONFIG {f}"),
    };
    ProxyConfigError { field, why }
}

/// A scalar as text (Istio writes durations as strings, some numbers bare).
fn text_of(value: &Value, field: &str) -> Result<String, ProxyConfigError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        _ => Err(error(field, "expected a string".into())),
    }
}

fn port_of(value: &Value, field: &str) -> Result<u16, ProxyConfigError> {
    let n = match value {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    };
    match n.and_then(|n| u16::try_from(n).ok()).filter(|p| *p > 0) {
        Some(port) => Ok(port),
        None => Err(error(field, "expected a port between 1 and 65535".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn istios_fields_are_read_as_written_and_the_rest_named() {
        let c = ProxyConfig::parse(
            r#"{"terminationDrainDuration":"30s","drainDuration":"23s","statusPort":15120,"proxyAdminPort":"15100",
                "discoveryAddress":"istiod:15012","proxyMetadata":{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS":true,"N":5}}"#,
        )
        .unwrap();
        assert_eq!(c.termination_drain_duration.as_deref(), Some("30s"));
        assert_eq!(c.drain_duration.as_deref(), Some("23s"));
        assert_eq!((c.status_port, c.proxy_admin_port), (Some(15120), Some(15100)));
        assert_eq!(c.proxy_metadata["EXIT_ON_ZERO_ACTIVE_CONNECTIONS"], "true");
        assert_eq!(c.proxy_metadata["N"], "5");
        assert_eq!(c.other, ["discoveryAddress"]);
        let yaml =
            ProxyConfig::parse("terminationDrainDuration: 45s\nholdApplicationUntilProxyStarts: true\n").unwrap();
        assert_eq!(yaml.termination_drain_duration.as_deref(), Some("45s"));
        assert_eq!(ProxyConfig::parse("").unwrap(), ProxyConfig::default());
    }

    #[test]
    fn what_cannot_be_read_names_the_field() {
        for (text, field) in [
            ("{not json", "PROXY_CONFIG"),
            ("[1, 2]", "PROXY_CONFIG"),
            (r#"{"statusPort":70000}"#, "PROXY_CONFIG statusPort"),
            (
                r#"{"terminationDrainDuration":{"seconds":3}}"#,
                "PROXY_CONFIG terminationDrainDuration",
            ),
            (r#"{"proxyMetadata":[1]}"#, "PROXY_CONFIG proxyMetadata"),
            (r#"{"proxyMetadata":{"A":[1]}}"#, "PROXY_CONFIG proxyMetadata.A"),
        ] {
            assert_eq!(ProxyConfig::parse(text).unwrap_err().field, field, "{text}");
        }
    }
}
