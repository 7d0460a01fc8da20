//! One app container's probes and hooks, rewritten to `httpGet` on the
//! status port; each original, its named port made a number, recorded for
//! `ISTIO_KUBE_APP_PROBERS`.

use std::collections::BTreeMap;

use serde_norway::{Mapping, Value};

use super::error::{InjectError, ManifestFault, Place};
use super::yaml::{name_of, seq};
use lifeguard_istio::probers::{AppProbes, Kind, Probe};

/// The probes of a container, by field, with what they become.
const PROBES: [(&str, Kind); 3] = [
    ("readinessProbe", Kind::Readiness),
    ("livenessProbe", Kind::Liveness),
    ("startupProbe", Kind::Startup),
];
/// The hooks (under `lifecycle`), by field.
const HOOKS: [(&str, Kind); 2] = [("postStart", Kind::PostStart), ("preStop", Kind::PreStop)];
/// The handlers a probe may have that the agent serves; a hook has the
/// first two (Kubernetes has no gRPC hook).
const HANDLERS: [&str; 3] = ["httpGet", "tcpSocket", "grpc"];

/// Whether the container has a probe or hook that [`container`] would
/// look at (an `exec` or `sleep` one is not).
pub(super) fn has_handlers(container: &Value) -> bool {
    let probes = PROBES.iter().filter_map(|(field, _)| container.get(*field));
    let lifecycle = container.get("lifecycle");
    let hooks = HOOKS
        .iter()
        .filter_map(|(field, _)| lifecycle.and_then(|l| l.get(*field)));
    probes
        .chain(hooks)
        .any(|h| HANDLERS.iter().any(|k| h.get(*k).is_some()))
}

/// Gives an app container the drain wait's preStop hook (`httpGet
/// /drain/wait` on the status port: the kubelet holds the app's SIGTERM
/// until the pod is out of its load balancers' rotation), unless it has a
/// preStop hook of its own.
pub(super) fn add_drain_wait(container: &mut Value, status_port: u16) {
    let Some(container) = container.as_mapping_mut() else {
        return;
    };
    let lifecycle = container
        .entry("lifecycle".into())
        .or_insert_with(|| Value::Mapping(Mapping::new()));
    let Some(lifecycle) = lifecycle.as_mapping_mut() else {
        return;
    };
    if lifecycle.contains_key("preStop") {
        return;
    }
    let mut get = Mapping::new();
    get.insert("path".into(), "/drain/wait".into());
    get.insert("port".into(), u64::from(status_port).into());
    get.insert("scheme".into(), "HTTP".into());
    let mut hook = Mapping::new();
    hook.insert("httpGet".into(), Value::Mapping(get));
    lifecycle.insert("preStop".into(), Value::Mapping(hook));
}

/// Rewrites the probes and hooks of one app container; each original goes
/// into `probes`. Errors name the field.
pub(super) fn container(container: &mut Value, status_port: u16, probes: &mut AppProbes) -> Result<(), InjectError> {
    let name = name_of(container).to_owned();
    let ports: BTreeMap<String, i64> = seq(container, "ports")
        .iter()
        .filter_map(|p| Some((p.get("name")?.as_str()?.to_owned(), p.get("containerPort")?.as_i64()?)))
        .collect();
    let rewrite = Rewrite {
        status_port,
        ports: &ports,
    };
    for (field, kind) in PROBES {
        if let Some(probe) = container.get_mut(field) {
            rewrite
                .handler(probe, &kind.path(&name), true, probes)
                .map_err(|e| e.within(Place::Field(field.into())))?;
        }
    }
    for (field, kind) in HOOKS {
        if let Some(hook) = container.get_mut("lifecycle").and_then(|l| l.get_mut(field)) {
            rewrite
                .handler(hook, &kind.path(&name), false, probes)
                .map_err(|e| e.within(Place::Field(format!("lifecycle.{field}"))))?;
        }
    }
    Ok(())
}

/// How one container's probes are rewritten.
struct Rewrite<'a> {
    status_port: u16,
    /// The container's named ports.
    ports: &'a BTreeMap<String, i64>,
}

impl Rewrite<'_> {
    /// Rewrites one probe (`is_probe`) or hook to `httpGet` on the status
    /// port at `path`, and records the original in `probes`. One already on
    /// the status port (rewritten before, or the agent's own) is left as it
    /// is.
    fn handler(
        &self,
        handler: &mut Value,
        path: &str,
        is_probe: bool,
        probes: &mut AppProbes,
    ) -> Result<(), InjectError> {
        let Some(map) = handler.as_mapping_mut() else {
            return Ok(());
        };
        let kinds = if is_probe { &HANDLERS[..] } else { &HANDLERS[..2] };
        let Some(kind) = kinds.iter().copied().find(|k| map.contains_key(*k)) else {
            return Ok(()); // exec, sleep: nothing to rewrite
        };
        let mut action = map.get(kind).cloned().unwrap_or(Value::Null);
        if kind != "grpc" {
            self.resolve_port(&mut action)?;
        }
        if action.get("port").and_then(Value::as_i64) == Some(i64::from(self.status_port)) {
            return Ok(());
        }
        let mut original = Mapping::new();
        original.insert(kind.into(), action.clone());
        if let Some(timeout) = map.get("timeoutSeconds").filter(|_| is_probe) {
            original.insert("timeoutSeconds".into(), timeout.clone());
        }
        let probe: Probe = serde_norway::from_value(Value::Mapping(original))
            .map_err(|e| InjectError::from(ManifestFault::Yaml(e)).within(Place::Field(kind.into())))?;
        probe.check(path)?;
        probes.0.insert(path.to_owned(), probe);
        let mut get = Mapping::new();
        get.insert("path".into(), path.into());
        get.insert("port".into(), Value::from(self.status_port));
        get.insert("scheme".into(), "HTTP".into());
        if let Some(headers) = action.get("httpHeaders").filter(|_| kind == "httpGet") {
            get.insert("httpHeaders".into(), headers.clone());
        }
        // The handler replaced where it was: the other fields keep their order.
        let mut get = Some(Value::Mapping(get));
        *map = std::mem::take(map)
            .into_iter()
            .filter_map(|(k, v)| match k.as_str() {
                Some(h) if h == kind => Some(("httpGet".into(), get.take()?)),
                Some(h) if HANDLERS.contains(&h) => None,
                _ => Some((k, v)),
            })
            .collect();
        Ok(())
    }

    /// A named port (or a number written as a string) made a number, from
    /// the container's ports.
    fn resolve_port(&self, action: &mut Value) -> Result<(), ManifestFault> {
        let Some(port) = action.get_mut("port") else {
            return Err(ManifestFault::NoPort);
        };
        if let Some(name) = port.as_str().map(str::to_owned) {
            let number = match name.parse::<i64>() {
                Ok(n) => n,
                Err(_) => *self
                    .ports
                    .get(&name)
                    .ok_or_else(|| ManifestFault::UnknownPort(name.clone()))?,
            };
            *port = Value::from(number);
        }
        Ok(())
    }
}
