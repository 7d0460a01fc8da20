//! `ISTIO_PROMETHEUS_ANNOTATIONS`: the app's own metrics endpoints, as
//! Istio's injector hands them to the proxy.
//!
//! The injector points the pod's one `prometheus.io/port` at the status
//! port and hands the proxy the app's own settings, in one of two forms:
//! `{"scrape":"true","port":"8080","path":"/metrics"}`, or (since 2026) with
//! a list, `{"targets":[{"port":"8080","path":"/metrics"},...]}`. A list,
//! when given and not empty, wins over `port`/`path`. As Istio: `scrape`
//! `"false"` turns it off, a missing port is 80 and a missing path
//! `/metrics`; the app is read on 127.0.0.1.

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;
use serde_json::Value;

/// Ports of the proxy itself that an app target may not name: a read of
/// them would scrape the scrape, Envoy's admin or its traffic capture.
/// The status port and Envoy's admin port as configured are refused too
/// (see [`AppMetrics::check_ports`]).
const RESERVED: [(u16, &str); 9] = [
    (15000, "Envoy's admin"),
    (15001, "Envoy's outbound capture"),
    (15004, "the agent's debug port"),
    (15006, "Envoy's inbound capture"),
    (15008, "the HBONE tunnel"),
    (15020, "the status port (the merged scrape itself)"),
    (15021, "Envoy's health listener"),
    (15053, "the DNS proxy"),
    (15090, "Envoy's own Prometheus listener (already merged)"),
];

/// One endpoint of the app's metrics, on 127.0.0.1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsTarget {
    pub port: u16,
    pub path: String,
}

impl MetricsTarget {
    /// `port` and `path`, as logs and metric labels name the target.
    pub fn label(&self) -> String {
        format!("{}{}", self.port, self.path)
    }
}

/// The app's metrics endpoints, in the order their parts are served.
/// Empty: no app metrics. Read from the injector's JSON (`FromStr`,
/// [`AppMetrics::parse`]), written back as JSON (`Display`, serde).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppMetrics(pub Vec<MetricsTarget>);

impl FromStr for AppMetrics {
    type Err = AnnotationsError;
    fn from_str(json: &str) -> Result<AppMetrics, AnnotationsError> {
        AppMetrics::parse(json)
    }
}

impl fmt::Display for AppMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_json())
    }
}

/// As `lifeguard check` shows it: its JSON, in a string.
impl serde::Serialize for AppMetrics {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The injector's JSON; unknown fields are ignored, as Istio does.
#[derive(Deserialize, Default)]
struct Annotations {
    #[serde(default)]
    scrape: Option<Value>,
    #[serde(default)]
    port: Option<Value>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    targets: Vec<RawTarget>,
}

#[derive(Deserialize)]
struct RawTarget {
    #[serde(default)]
    port: Option<Value>,
    #[serde(default)]
    path: Option<String>,
}

/// Why `ISTIO_PROMETHEUS_ANNOTATIONS` was refused, naming the field
/// (`port`, `targets[1].path`), or why a target cannot be read here.
#[derive(Debug, thiserror::Error)]
pub enum AnnotationsError {
    #[error("not the JSON of prometheus annotations: {0}")]
    Json(#[from] serde_json::Error),
    /// A port that is neither a string nor a number (the JSON value).
    #[error("{field}: {value} is not a port")]
    PortType { field: String, value: Value },
    #[error("{field}: {text:?} is not a port (1-65535)")]
    Port { field: String, text: String },
    /// One of the proxy's own ports (and whose).
    #[error("{field}: {port} is {whose}, not the app")]
    Reserved {
        field: String,
        port: u16,
        whose: &'static str,
    },
    #[error("{field}: {path:?} does not start with /")]
    RelativePath { field: String, path: String },
    #[error("{field}: {path:?} has a space or a control character")]
    PathBytes { field: String, path: String },
    #[error("{field}: {path:?} is not a valid request path")]
    RequestPath { field: String, path: String },
    #[error("port {0} is the status port: the scrape would read itself")]
    StatusPort(u16),
    #[error("port {0} is Envoy's admin, not the app")]
    AdminPort(u16),
}

impl AppMetrics {
    /// Reads the injector's JSON. The empty string is off.
    pub fn parse(json: &str) -> Result<AppMetrics, AnnotationsError> {
        if json.trim().is_empty() {
            return Ok(AppMetrics::default());
        }
        let a: Annotations = serde_json::from_str(json)?;
        if matches!(&a.scrape, Some(Value::String(s)) if s == "false") || a.scrape == Some(Value::Bool(false)) {
            return Ok(AppMetrics::default());
        }
        let raw = match a.targets.is_empty() {
            true => vec![RawTarget {
                port: a.port,
                path: a.path,
            }],
            false => a.targets,
        };
        let field = |i: usize, name: &str| match raw.len() {
            1 if name == "port" || name == "path" => name.to_owned(),
            _ => format!("targets[{i}].{name}"),
        };
        let mut targets = Vec::with_capacity(raw.len());
        for (i, t) in raw.iter().enumerate() {
            let port = port_number(t.port.as_ref(), field(i, "port"))?;
            if let Some(&(_, whose)) = RESERVED.iter().find(|(p, _)| *p == port) {
                let field = field(i, "port");
                return Err(AnnotationsError::Reserved { field, port, whose });
            }
            let path = t
                .path
                .clone()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "/metrics".into());
            let path = check_path(path, field(i, "path"))?;
            targets.push(MetricsTarget { port, path });
        }
        Ok(AppMetrics(targets))
    }

    /// The setting as `lifeguard check` shows it (and reads it back).
    pub fn to_json(&self) -> String {
        if self.0.is_empty() {
            return String::new();
        }
        let targets: Vec<Value> = self
            .0
            .iter()
            .map(|t| serde_json::json!({"port": t.port.to_string(), "path": t.path}))
            .collect();
        serde_json::json!({ "scrape": "true", "targets": targets }).to_string()
    }

    /// Refuses a target on the status port or on Envoy's admin port as
    /// configured (tests and some pods move them off 15020 and 15000).
    pub fn check_ports(&self, status_port: u16, admin_port: Option<u16>) -> Result<(), AnnotationsError> {
        for t in &self.0 {
            if t.port == status_port {
                return Err(AnnotationsError::StatusPort(t.port));
            }
            if Some(t.port) == admin_port {
                return Err(AnnotationsError::AdminPort(t.port));
            }
        }
        Ok(())
    }
}

/// The port of `field` as the injector writes it (a string), or a JSON
/// number.
fn port_number(v: Option<&Value>, field: String) -> Result<u16, AnnotationsError> {
    let text = match v {
        None | Some(Value::Null) => return Ok(80),
        Some(Value::String(s)) if s.is_empty() => return Ok(80),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(other) => {
            let value = other.clone();
            return Err(AnnotationsError::PortType { field, value });
        }
    };
    match text.trim().parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(AnnotationsError::Port { field, text }),
    }
}

/// The path of `field`: absolute (a query allowed), without spaces or
/// control bytes, and one a request line can carry (it goes on one).
fn check_path(path: String, field: String) -> Result<String, AnnotationsError> {
    if !path.starts_with('/') {
        return Err(AnnotationsError::RelativePath { field, path });
    }
    if path.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(AnnotationsError::PathBytes { field, path });
    }
    if path.parse::<hyper::Uri>().is_err() {
        return Err(AnnotationsError::RequestPath { field, path });
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(port: u16, path: &str) -> MetricsTarget {
        MetricsTarget {
            port,
            path: path.into(),
        }
    }

    #[test]
    fn both_forms_of_the_injectors_json_are_read() {
        let one = AppMetrics::parse(r#"{"scrape":"true","path":"/metrics","port":"8080"}"#).unwrap();
        assert_eq!(one.0, [t(8080, "/metrics")]);
        let two = AppMetrics::parse(
            r#"{"scrape":"true","port":"8080","targets":[{"port":"8080","path":"/metrics"},{"port":"9090","path":"/q"}]}"#,
        )
        .unwrap();
        assert_eq!(two.0, [t(8080, "/metrics"), t(9090, "/q")]);
        // Istio's defaults: port 80, path /metrics; numbers too.
        assert_eq!(
            AppMetrics::parse(r#"{"scrape":"true"}"#).unwrap().0,
            [t(80, "/metrics")]
        );
        assert_eq!(AppMetrics::parse(r#"{"port":9100}"#).unwrap().0, [t(9100, "/metrics")]);
        // Off.
        for off in ["", "  ", r#"{"scrape":"false","port":"8080"}"#] {
            assert!(AppMetrics::parse(off).unwrap().0.is_empty(), "{off}");
        }
        // The shown form reads back the same.
        assert_eq!(AppMetrics::parse(&two.to_json()).unwrap(), two);
        assert_eq!(AppMetrics::default().to_json(), "");
    }

    #[test]
    fn reserved_ports_and_bad_values_are_refused_by_field() {
        for (json, want) in [
            (r#"{"port":"15020"}"#, "port: 15020 is the status port"),
            (r#"{"port":"15090"}"#, "port: 15090 is Envoy's own Prometheus"),
            (
                r#"{"targets":[{"port":"8080"},{"port":"15006"}]}"#,
                "targets[1].port: 15006",
            ),
            (r#"{"targets":[{"port":"15001"}]}"#, "port: 15001 is Envoy's outbound"),
            (r#"{"port":"0"}"#, "port: \"0\" is not a port"),
            (r#"{"port":"http"}"#, "port: \"http\" is not a port"),
            (
                r#"{"port":"8080","path":"metrics"}"#,
                "path: \"metrics\" does not start with /",
            ),
            (r#"{"port":"8080","path":"/m x"}"#, "path: \"/m x\" has a space"),
            (r#"{"port":"#, "not the JSON"),
            ("true", "not the JSON"),
        ] {
            let err = AppMetrics::parse(json).unwrap_err().to_string();
            assert!(err.starts_with(want), "{json}: {err}");
        }
        let m = AppMetrics(vec![t(8080, "/m"), t(21000, "/m")]);
        let refused = |status, admin| m.check_ports(status, admin).unwrap_err().to_string();
        assert!(refused(21000, Some(15000)).contains("status port"));
        assert!(refused(15020, Some(8080)).contains("admin"));
        assert!(m.check_ports(15020, None).is_ok());
    }

    /// Found by fuzzing (fuzz/fuzz_targets/prometheus_annotations.rs): a
    /// path with a byte a request line cannot carry (a backquote) was
    /// taken, and then every read of it failed.
    #[test]
    fn a_path_no_request_line_can_carry_is_refused() {
        for path in ["/met`rics", "/`"] {
            let json = format!(r#"{{"port":"8080","path":{}}}"#, serde_json::json!(path));
            let err = AppMetrics::parse(&json).unwrap_err().to_string();
            assert_eq!(err, format!("path: {path:?} is not a valid request path"));
        }
        assert!(AppMetrics::parse(r#"{"port":"8080","path":"/metrics?format=prometheus&x=%20"}"#).is_ok());
    }
}
