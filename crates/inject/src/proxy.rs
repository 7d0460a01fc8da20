//! The pod's proxy container: which one it is, the status port it listens
//! on (read from its command line and env the way `lifeguard run` reads
//! them), and its env variables.

use serde_norway::{Mapping, Value};

use super::error::ManifestFault;
use super::yaml::{name_of, seq};
use lifeguard_istio::proxy_config::ProxyConfig;

/// The status port when nothing says otherwise (`lifeguard run`'s default).
const DEFAULT_STATUS_PORT: u16 = 15020;
/// Istio's pod annotation for the status port. lifeguard does not read it
/// at run time, so here it must agree with the proxy's own setting.
pub(super) const STATUS_PORT_ANNOTATION: &str = "status.sidecar.istio.io/port";

/// The container lists of a pod spec, init containers (native sidecars)
/// first.
pub(super) const LISTS: [&str; 2] = ["initContainers", "containers"];

/// Where the proxy container is in the pod spec: its list and index.
pub(super) type At = (&'static str, usize);

/// The proxy container: the one named `name`, else the one that runs
/// `lifeguard`; `None` when there is none.
pub(super) fn find(spec: &Value, name: Option<&str>) -> Result<Option<At>, ManifestFault> {
    let mut found = Vec::new();
    for list in LISTS {
        for (i, c) in seq(spec, list).iter().enumerate() {
            let matches = match name {
                Some(name) => name_of(c) == name,
                None => runs_lifeguard(c),
            };
            if matches {
                found.push((list, i, name_of(c)));
            }
        }
    }
    match found.as_slice() {
        [] => Ok(None),
        [(list, i, _)] => Ok(Some((list, *i))),
        many => Err(ManifestFault::SeveralProxies(
            many.iter().map(|(_, _, n)| (*n).to_owned()).collect(),
        )),
    }
}

/// Why there is no proxy container, for the error.
pub(super) fn missing(name: Option<&str>) -> ManifestFault {
    match name {
        Some(name) => ManifestFault::NoContainerNamed(name.to_owned()),
        None => ManifestFault::NoProxy,
    }
}

/// Whether a container runs lifeguard: its command's program is named
/// `lifeguard` (any directory), or it has no command and its image is
/// named `lifeguard…` (`registry/lifeguard-envoy:1.40`).
fn runs_lifeguard(container: &Value) -> bool {
    let basename = |s: &str| s.rsplit('/').next().unwrap_or(s).to_owned();
    match container.get("command").and_then(Value::as_sequence) {
        Some(command) => command
            .first()
            .and_then(Value::as_str)
            .is_some_and(|c| basename(c) == "lifeguard"),
        None => {
            let image = container.get("image").and_then(Value::as_str).unwrap_or("");
            let repository = image.split('@').next().unwrap_or(image);
            let name = basename(repository);
            name.split(':').next().unwrap_or(&name).starts_with("lifeguard")
        }
    }
}

/// The status port the probes go to: `--status-port`, else the proxy's
/// own (below). Istio's annotation, when the pod has it, must agree: the
/// agent would not listen where it points.
pub(super) fn status_port(proxy: &Value, flag: Option<u16>, annotation: Option<&str>) -> Result<u16, ManifestFault> {
    if let Some(port) = flag {
        return Ok(port);
    }
    let (port, from) = proxy_status_port(proxy)?;
    let Some(annotated) = annotation else {
        return Ok(port);
    };
    match annotated.trim().parse::<u16>() {
        Ok(p) if p == port => Ok(port),
        Ok(annotated) if annotated > 0 => Err(ManifestFault::StatusPortDisagrees {
            annotation: STATUS_PORT_ANNOTATION,
            annotated,
            port,
            from,
        }),
        _ => Err(ManifestFault::StatusAnnotation {
            annotation: STATUS_PORT_ANNOTATION,
            text: annotated.to_owned(),
        }),
    }
}

/// The port `lifeguard run` in this container listens on, and where that
/// came from: its `--status-addr` flag, else `LIFEGUARD_STATUS_ADDR`, else
/// `PROXY_CONFIG`'s `statusPort`, else 15020 (a `--config` file is not
/// read: pass `--status-port` then).
fn proxy_status_port(proxy: &Value) -> Result<(u16, &'static str), ManifestFault> {
    let words: Vec<&str> = ["command", "args"]
        .iter()
        .filter_map(|k| proxy.get(*k).and_then(Value::as_sequence))
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let flag = words
        .iter()
        .enumerate()
        .find_map(|(i, w)| match w.strip_prefix("--status-addr") {
            Some("") => words.get(i + 1).copied(),
            Some(rest) => rest.strip_prefix('='),
            None => None,
        });
    let proxy_config = |text: &str| {
        let config = ProxyConfig::parse(text).map_err(ManifestFault::ProxyConfig)?;
        Ok(config.status_port.map(|port| format!("0.0.0.0:{port}")))
    };
    let (addr, from) = match (flag, env_value(proxy, "LIFEGUARD_STATUS_ADDR")) {
        (Some(addr), _) => (addr.to_owned(), "its --status-addr"),
        (None, Some(addr)) => (addr.to_owned(), "its LIFEGUARD_STATUS_ADDR"),
        (None, None) => match env_value(proxy, "PROXY_CONFIG")
            .map(proxy_config)
            .transpose()?
            .flatten()
        {
            Some(addr) => (addr, "its PROXY_CONFIG statusPort"),
            None => return Ok((DEFAULT_STATUS_PORT, "lifeguard's default")),
        },
    };
    let port = addr.rsplit_once(':').map_or(addr.as_str(), |(_, p)| p);
    match port.parse() {
        Ok(port) if port > 0 => Ok((port, from)),
        _ => Err(ManifestFault::StatusAddr { addr, from }),
    }
}

/// The value of the container's env variable `name`, when it is a literal.
pub(super) fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    let env = container.get("env").and_then(Value::as_sequence)?;
    let entry = env
        .iter()
        .find(|e| e.get("name").and_then(Value::as_str) == Some(name))?;
    entry.get("value").and_then(Value::as_str)
}

/// Sets `name=value` in the container's env: in place when it is there
/// (whatever its source was), else last.
pub(super) fn set_env(container: &mut Value, name: &str, value: &str) {
    let Some(map) = container.as_mapping_mut() else {
        return;
    };
    let env = map
        .entry(Value::from("env"))
        .or_insert_with(|| Value::Sequence(Vec::new()));
    if !env.is_sequence() {
        *env = Value::Sequence(Vec::new());
    }
    let list = env.as_sequence_mut().expect("a sequence");
    let mut entry = Mapping::new();
    entry.insert("name".into(), name.into());
    entry.insert("value".into(), value.into());
    match list
        .iter_mut()
        .find(|e| e.get("name").and_then(Value::as_str) == Some(name))
    {
        Some(existing) => *existing = Value::Mapping(entry),
        None => list.push(Value::Mapping(entry)),
    }
}
