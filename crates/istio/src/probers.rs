//! The app probes as Istio's injector hands them over: the JSON of
//! `ISTIO_KUBE_APP_PROBERS`, a map from a status-port path
//! (`/app-health/<container>/livez|readyz|startupz`,
//! `/app-lifecycle/<container>/prestopz|poststartz`) to the container's
//! original probe or hook: one of `httpGet`, `tcpSocket`, `grpc`, and
//! `timeoutSeconds`. Fields are the Kubernetes API's; others are ignored,
//! as Istio's agent ignores them.
//!
//! `lifeguard inject` writes this form and the agent reads it, through the
//! same types.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Every app probe, by its path on the status port: read from the JSON
/// of `ISTIO_KUBE_APP_PROBERS` (`FromStr`, [`AppProbes::parse`]) and
/// written back as that JSON (`Display`, serde).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppProbes(pub BTreeMap<String, Probe>);

/// One probe or hook: exactly one handler, and its timeout.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Probe {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_get: Option<HttpGet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_socket: Option<TcpSocket>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc: Option<Grpc>,
    /// Seconds; absent or 0 means the Kubernetes default, 1 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i64>,
}

/// A Kubernetes `httpGet` action.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpGet {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub port: Port,
    /// Ignored by the prober, as by Istio's: the app is reached at the pod's address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// `HTTP` (default) or `HTTPS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http_headers: Vec<Header>,
}

/// One of a probe's `httpHeaders`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub name: String,
    #[serde(default)]
    pub value: String,
}

/// A Kubernetes `tcpSocket` action.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TcpSocket {
    pub port: Port,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// A Kubernetes `grpc` action.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Grpc {
    pub port: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
}

/// A port as Kubernetes writes it: a number, or a container port's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Port {
    Number(i64),
    Name(String),
}

impl Default for Port {
    fn default() -> Self {
        Port::Number(0)
    }
}

impl Port {
    /// The port number, or why there is none: a name (unresolved), or out of range.
    pub fn number(&self) -> Result<u16, ProbeSpecError> {
        let n = match self {
            Port::Number(n) => *n,
            Port::Name(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => s.parse().unwrap_or(-1),
            Port::Name(name) => return Err(ProbeSpecError::UnresolvedPort(name.clone())),
        };
        match u16::try_from(n) {
            Ok(p) if p > 0 => Ok(p),
            _ => Err(ProbeSpecError::PortRange(n)),
        }
    }
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Port::Number(n) => write!(f, "{n}"),
            Port::Name(s) => write!(f, "{s}"),
        }
    }
}

/// The pod's address as the settings give it (empty: not given).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodIp(pub Option<IpAddr>);

/// Why `INSTANCE_IP` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an IP address")]
pub struct PodIpError(#[from] std::net::AddrParseError);

impl FromStr for PodIp {
    type Err = PodIpError;

    fn from_str(s: &str) -> Result<Self, PodIpError> {
        match s.trim() {
            "" => Ok(PodIp(None)),
            s => Ok(PodIp(Some(s.parse()?))),
        }
    }
}

impl fmt::Display for PodIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(ip) => write!(f, "{ip}"),
            None => Ok(()),
        }
    }
}

/// As a user writes it (empty: not given).
impl Serialize for PodIp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl PodIp {
    /// Where the app probes go: loopback in the legacy mode or with no
    /// address, else the pod's address.
    pub fn probe_destination(self, legacy_localhost: bool) -> IpAddr {
        let loopback = |ip: Option<IpAddr>| match ip {
            Some(IpAddr::V6(_)) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            _ => IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        match self.0 {
            Some(ip) if !legacy_localhost => ip,
            other => loopback(other),
        }
    }
}

/// What a path probes, by its last segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Liveness,
    Readiness,
    Startup,
    PreStop,
    PostStart,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Liveness,
        Kind::Readiness,
        Kind::Startup,
        Kind::PreStop,
        Kind::PostStart,
    ];

    /// The path on the status port for `container`'s probe or hook of this kind.
    pub fn path(self, container: &str) -> String {
        let (group, name) = match self {
            Kind::Liveness => ("app-health", "livez"),
            Kind::Readiness => ("app-health", "readyz"),
            Kind::Startup => ("app-health", "startupz"),
            Kind::PreStop => ("app-lifecycle", "prestopz"),
            Kind::PostStart => ("app-lifecycle", "poststartz"),
        };
        format!("/{group}/{container}/{name}")
    }
}

/// Whether `path` has the form `/app-health|app-lifecycle/<container>/<kind>`.
pub(crate) fn is_probe_path(path: &str) -> bool {
    let mut parts = path.strip_prefix('/').unwrap_or("-").split('/');
    let (Some(group), Some(container), Some(kind), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    matches!(group, "app-health" | "app-lifecycle")
        && !container.is_empty()
        && matches!(kind, "livez" | "readyz" | "startupz" | "prestopz" | "poststartz")
}

/// One checked probe: its handler with a resolved port, and its timeout.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    pub action: Action,
    pub timeout: Duration,
}

/// A probe's handler, ready to run.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Http {
        port: u16,
        https: bool,
        /// Starts with `/` (and may carry a query).
        path: String,
        headers: Vec<(String, String)>,
    },
    Tcp {
        port: u16,
    },
    Grpc {
        port: u16,
        service: String,
    },
}

/// Why `ISTIO_KUBE_APP_PROBERS` was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProbersError {
    #[error("not the JSON of app probes: {0}")]
    Json(#[from] serde_json::Error),
    /// The entry of `path` cannot run.
    #[error("{path}: {fault}")]
    Entry {
        path: String,
        #[source]
        fault: ProbeSpecError,
    },
}

/// Why one probe or hook, as Istio writes it, cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeSpecError {
    #[error(
        "the path must be /app-health/<container>/livez|readyz|startupz or \
         /app-lifecycle/<container>/prestopz|poststartz"
    )]
    Path,
    #[error("no handler: one of httpGet, tcpSocket or grpc is needed")]
    NoHandler,
    #[error("more than one handler: give one of httpGet, tcpSocket or grpc")]
    Handlers,
    #[error("the named port {0:?} is left unresolved")]
    UnresolvedPort(String),
    #[error("port {0} is not between 1 and 65535")]
    PortRange(i64),
    #[error("timeoutSeconds {0} is negative")]
    NegativeTimeout(i64),
    #[error("scheme {0:?} is neither HTTP nor HTTPS")]
    Scheme(String),
    #[error("path {0:?} is not a valid request path")]
    RequestPath(String),
    /// An `httpHeaders` entry (its name) that is no valid header.
    #[error("httpHeaders entry {0:?} is not a valid header")]
    Header(String),
}

impl FromStr for AppProbes {
    type Err = ProbersError;
    fn from_str(json: &str) -> Result<AppProbes, ProbersError> {
        AppProbes::parse(json)
    }
}

impl fmt::Display for AppProbes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_json())
    }
}

/// As `ISTIO_KUBE_APP_PROBERS` carries it: its JSON, in a string.
impl Serialize for AppProbes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl AppProbes {
    /// The JSON form, as `ISTIO_KUBE_APP_PROBERS` carries it.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.0).expect("app probes serialize")
    }

    /// Parses `ISTIO_KUBE_APP_PROBERS`'s JSON (empty: no probes) and checks
    /// every entry; the error names the entry.
    pub fn parse(json: &str) -> Result<AppProbes, ProbersError> {
        if json.trim().is_empty() {
            return Ok(AppProbes::default());
        }
        let probes = AppProbes(serde_json::from_str(json)?);
        for (path, probe) in &probes.0 {
            probe.check(path).map_err(|fault| ProbersError::Entry {
                path: path.clone(),
                fault,
            })?;
        }
        Ok(probes)
    }

    /// Every probe, checked, by path.
    pub fn checked(&self) -> BTreeMap<String, Checked> {
        self.0
            .iter()
            .filter_map(|(path, probe)| Some((path.clone(), probe.check(path).ok()?)))
            .collect()
    }
}

impl Probe {
    /// The probe ready to run, or why it cannot be.
    pub fn check(&self, path: &str) -> Result<Checked, ProbeSpecError> {
        if !is_probe_path(path) {
            return Err(ProbeSpecError::Path);
        }
        let handlers = [self.http_get.is_some(), self.tcp_socket.is_some(), self.grpc.is_some()];
        let action = match (handlers.iter().filter(|h| **h).count(), self) {
            (0, _) => return Err(ProbeSpecError::NoHandler),
            (2.., _) => return Err(ProbeSpecError::Handlers),
            (_, Probe { http_get: Some(h), .. }) => h.action()?,
            (
                _,
                Probe {
                    tcp_socket: Some(t), ..
                },
            ) => Action::Tcp { port: t.port.number()? },
            (_, Probe { grpc: Some(g), .. }) => Action::Grpc {
                port: Port::Number(g.port).number()?,
                service: g.service.clone().unwrap_or_default(),
            },
            _ => unreachable!("one handler is set"),
        };
        let timeout = match self.timeout_seconds {
            None | Some(0) => Duration::from_secs(1),
            Some(s) if s > 0 => Duration::from_secs(s as u64),
            Some(s) => return Err(ProbeSpecError::NegativeTimeout(s)),
        };
        Ok(Checked { action, timeout })
    }
}

impl HttpGet {
    fn action(&self) -> Result<Action, ProbeSpecError> {
        let https = match self.scheme.as_deref().unwrap_or("HTTP") {
            s if s.eq_ignore_ascii_case("http") => false,
            s if s.eq_ignore_ascii_case("https") => true,
            other => return Err(ProbeSpecError::Scheme(other.to_owned())),
        };
        let path = self.path.as_deref().unwrap_or("");
        let path = if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("/{path}")
        };
        if path.parse::<hyper::Uri>().is_err() {
            return Err(ProbeSpecError::RequestPath(path));
        }
        let mut headers = Vec::with_capacity(self.http_headers.len());
        for h in &self.http_headers {
            let valid = hyper::header::HeaderName::from_bytes(h.name.as_bytes()).is_ok()
                && hyper::header::HeaderValue::from_str(&h.value).is_ok();
            if !valid {
                return Err(ProbeSpecError::Header(h.name.clone()));
            }
            headers.push((h.name.clone(), h.value.clone()));
        }
        Ok(Action::Http {
            port: self.port.number()?,
            https,
            path,
            headers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn istio_json_reads_as_the_agent_reads_it() {
        let probes = AppProbes::parse(
            r#"{"/app-health/hello/livez":{"httpGet":{"path":"live","port":8080,"scheme":"HTTPS",
                 "httpHeaders":[{"name":"X-A","value":"b"}]},"timeoutSeconds":3},
                "/app-health/hello/readyz":{"tcpSocket":{"port":"3333"}},
                "/app-health/grpc/livez":{"grpc":{"port":7070,"service":"x"},"timeoutSeconds":2,"periodSeconds":5}}"#,
        )
        .unwrap();
        let checked = probes.checked();
        assert_eq!(
            checked["/app-health/hello/livez"],
            Checked {
                action: Action::Http {
                    port: 8080,
                    https: true,
                    path: "/live".into(),
                    headers: vec![("X-A".into(), "b".into())]
                },
                timeout: Duration::from_secs(3)
            }
        );
        assert_eq!(checked["/app-health/hello/readyz"].action, Action::Tcp { port: 3333 });
        assert_eq!(checked["/app-health/hello/readyz"].timeout, Duration::from_secs(1));
        assert_eq!(
            checked["/app-health/grpc/livez"].action,
            Action::Grpc {
                port: 7070,
                service: "x".into()
            }
        );
        // What inject writes reads back the same, and so does the
        // setting as `lifeguard check` shows it.
        assert_eq!(AppProbes::parse(&probes.to_json()).unwrap(), probes);
        assert_eq!(probes.to_string().parse::<AppProbes>().unwrap(), probes);
        assert!(AppProbes::parse("").unwrap().0.is_empty());
    }

    #[test]
    fn a_bad_entry_is_named_with_its_fault() {
        for (json, want) in [
            (
                r#"{"/healthz/x":{"tcpSocket":{"port":1}}}"#,
                "/healthz/x: the path must be",
            ),
            (r#"{"/app-health/a/livez":{}}"#, "/app-health/a/livez: no handler"),
            (
                r#"{"/app-health/a/livez":{"tcpSocket":{"port":1},"grpc":{"port":2}}}"#,
                "more than one handler",
            ),
            (
                r#"{"/app-lifecycle/a/prestopz":{"httpGet":{"port":"http"}}}"#,
                r#"/app-lifecycle/a/prestopz: the named port "http" is left unresolved"#,
            ),
            (
                r#"{"/app-health/a/readyz":{"tcpSocket":{"port":70000}}}"#,
                "port 70000 is not between",
            ),
            (
                r#"{"/app-health/a/readyz":{"httpGet":{"port":1,"scheme":"FTP"}}}"#,
                "neither HTTP nor HTTPS",
            ),
            (r#"["x"]"#, "not the JSON of app probes"),
        ] {
            let err = AppProbes::parse(json).unwrap_err().to_string();
            assert!(err.contains(want), "{json}: {err}");
        }
    }

    #[test]
    fn paths() {
        assert_eq!(Kind::PreStop.path("web"), "/app-lifecycle/web/prestopz");
        for kind in Kind::ALL {
            assert!(is_probe_path(&kind.path("c")));
        }
        for bad in [
            "/app-health//livez",
            "/app-health/c/livez/x",
            "/app-health/c",
            "app-health/c/livez",
            "/other/c/livez",
        ] {
            assert!(!is_probe_path(bad), "{bad}");
        }
    }
}
