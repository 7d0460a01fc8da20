//! `lifeguard inject`: rewrites a pod's probes and hooks the way Istio's
//! injector does, for clusters without a mutating webhook (kustomize, Helm
//! post-render, CI). It reads Kubernetes YAML (several documents; `Pod`,
//! the workloads with a pod template, `List`), and in each pod:
//!
//! - every app container's `httpGet`, `tcpSocket` and `grpc` probe
//!   (readiness, liveness, startup) and `httpGet`/`tcpSocket` hook
//!   (postStart, preStop) becomes an `httpGet` on the status port, path
//!   `/app-health/<container>/readyz|livez|startupz` or
//!   `/app-lifecycle/<container>/poststartz|prestopz` (the probe's other
//!   fields, and an `httpGet`'s `httpHeaders`, are kept);
//! - the original, its named port resolved from the container's ports,
//!   goes into `ISTIO_KUBE_APP_PROBERS` on the proxy container (the one
//!   that runs `lifeguard`, or `--proxy-container`), merged with what is
//!   there already.
//!
//! A probe already on the status port is left alone, so a second run
//! changes nothing. The proxy container is never rewritten; the pod
//! annotation `sidecar.istio.io/rewriteAppHTTPProbers: "false"` turns the
//! rewrite off for that pod, as in Istio. Other documents pass through.
//! Comments are not kept (the YAML is re-serialized).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;

use serde::Deserialize;
use serde_norway::{Mapping, Value};

use crate::status::app_probe::spec::{AppProbes, Kind, Probe};

/// The status port when neither `--status-port` nor the proxy's
/// `--status-addr` says otherwise.
const DEFAULT_STATUS_PORT: u16 = 15020;
/// The env variable the proxy container reads the probes from.
const PROBERS_ENV: &str = "ISTIO_KUBE_APP_PROBERS";
/// The pod annotation that turns the rewrite off (Istio's).
const REWRITE_ANNOTATION: &str = "sidecar.istio.io/rewriteAppHTTPProbers";

/// `lifeguard inject`'s options.
#[derive(Debug, Clone, Default)]
pub struct InjectOptions {
    /// The manifest; stdin when absent or `-`.
    pub input: Option<PathBuf>,
    /// The proxy container's name, when it does not run `lifeguard` itself.
    pub proxy_container: Option<String>,
    /// The status port the probes are rewritten to.
    pub status_port: Option<u16>,
}

/// Runs `lifeguard inject`: the rewritten manifest on stdout, exit 0; or
/// the reason on stderr, exit 2.
pub fn run(opts: &InjectOptions) -> u8 {
    let mut text = String::new();
    let read = match opts.input.as_deref().filter(|p| p.as_os_str() != "-") {
        Some(path) => std::fs::read_to_string(path)
            .map(|t| text = t)
            .map_err(|e| format!("{}: {e}", path.display())),
        None => std::io::stdin()
            .read_to_string(&mut text)
            .map(drop)
            .map_err(|e| format!("stdin: {e}")),
    };
    match read.and_then(|()| inject(&text, opts)) {
        Ok(out) => {
            print!("{out}");
            0
        }
        Err(e) => {
            eprintln!("lifeguard inject: {e}");
            crate::drain::exit_code::CONFIG
        }
    }
}

/// Rewrites every document of `input`; the documents, `---` between them.
pub fn inject(input: &str, opts: &InjectOptions) -> Result<String, String> {
    let mut out = Vec::new();
    for (i, document) in serde_norway::Deserializer::from_str(input).enumerate() {
        let mut value = Value::deserialize(document).map_err(|e| format!("document {}: not YAML: {e}", i + 1))?;
        if value.is_null() {
            continue;
        }
        rewrite_object(&mut value, opts)?;
        out.push(serde_norway::to_string(&value).map_err(|e| format!("document {}: {e}", i + 1))?);
    }
    Ok(out.join("---\n"))
}

/// Where each kind keeps its pod: the spec, and the metadata beside it.
fn pod_path(kind: &str) -> Option<&'static [&'static str]> {
    Some(match kind {
        "Pod" => &[],
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" | "ReplicationController" => {
            &["spec", "template"]
        }
        "CronJob" => &["spec", "jobTemplate", "spec", "template"],
        _ => return None,
    })
}

fn rewrite_object(object: &mut Value, opts: &InjectOptions) -> Result<(), String> {
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("").to_owned();
    if kind == "List" {
        if let Some(items) = object.get_mut("items").and_then(Value::as_sequence_mut) {
            for item in items {
                rewrite_object(item, opts)?;
            }
        }
        return Ok(());
    }
    let Some(path) = pod_path(&kind) else {
        return Ok(());
    };
    let metadata = object.get("metadata");
    let name = metadata.and_then(|m| m.get("name")).and_then(Value::as_str);
    let name = format!("{kind} {}", name.unwrap_or("(no name)"));
    let pod = path
        .iter()
        .try_fold(&mut *object, |v, key| v.get_mut(*key))
        .ok_or_else(|| format!("{name}: no pod template at {}", path.join(".")))?;
    let annotations = pod.get("metadata").and_then(|m| m.get("annotations"));
    let off = annotations
        .and_then(|a| a.get(REWRITE_ANNOTATION))
        .and_then(Value::as_str)
        .is_some_and(|v| v.eq_ignore_ascii_case("false"));
    let spec = pod
        .get_mut("spec")
        .ok_or_else(|| format!("{name}: the pod has no spec"))?;
    rewrite_pod(spec, !off, opts).map_err(|e| format!("{name}: {e}"))
}

/// The container lists of a pod spec, init containers first.
const LISTS: [&str; 2] = ["initContainers", "containers"];

fn rewrite_pod(spec: &mut Value, rewrite: bool, opts: &InjectOptions) -> Result<(), String> {
    let (list, index) = find_proxy(spec, opts.proxy_container.as_deref())?;
    let proxy = &spec[list][index];
    let status_port = match opts.status_port {
        Some(port) => port,
        None => status_port_of(proxy)?,
    };
    let mut probes = match env_value(proxy, PROBERS_ENV) {
        Some(json) => AppProbes::parse(json).map_err(|e| format!("the proxy container's {PROBERS_ENV}: {e}"))?,
        None => AppProbes::default(),
    };
    if !rewrite {
        return Ok(());
    }
    for l in LISTS {
        let Some(containers) = spec.get_mut(l).and_then(Value::as_sequence_mut) else {
            continue;
        };
        for (i, container) in containers.iter_mut().enumerate() {
            if (l, i) != (list, index) {
                let name = container.get("name").and_then(Value::as_str).unwrap_or("").to_owned();
                rewrite_container(container, status_port, &mut probes).map_err(|e| format!("container {name}: {e}"))?;
            }
        }
    }
    if !probes.0.is_empty() {
        set_env(&mut spec[list][index], PROBERS_ENV, &probes.to_json());
    }
    Ok(())
}

/// The proxy container: the one named `name`, else the one that runs
/// `lifeguard`; (its list, its index).
fn find_proxy(spec: &Value, name: Option<&str>) -> Result<(&'static str, usize), String> {
    let mut found = Vec::new();
    for list in LISTS {
        let containers = spec
            .get(list)
            .and_then(Value::as_sequence)
            .map_or(&[][..], |c| c.as_slice());
        for (i, c) in containers.iter().enumerate() {
            let matches = match name {
                Some(name) => c.get("name").and_then(Value::as_str) == Some(name),
                None => runs_lifeguard(c),
            };
            if matches {
                found.push((list, i, c.get("name").and_then(Value::as_str).unwrap_or("")));
            }
        }
    }
    match (found.as_slice(), name) {
        ([(list, i, _)], _) => Ok((list, *i)),
        ([], Some(name)) => Err(format!("no proxy container: no container is named {name:?}")),
        ([], None) => {
            Err("no proxy container: no container runs lifeguard; add one, or name it with --proxy-container".into())
        }
        (many, _) => {
            let names: Vec<_> = many.iter().map(|(_, _, n)| *n).collect();
            Err(format!(
                "several containers could be the proxy ({}): name it with --proxy-container",
                names.join(", ")
            ))
        }
    }
}

/// Whether a container runs lifeguard: its command is `lifeguard` (any
/// directory), or it has no command and its image is named `lifeguard…`.
fn runs_lifeguard(container: &Value) -> bool {
    let basename = |s: &str| s.rsplit('/').next().unwrap_or(s).to_owned();
    match container.get("command").and_then(Value::as_sequence) {
        Some(command) => command
            .first()
            .and_then(Value::as_str)
            .is_some_and(|c| basename(c) == "lifeguard"),
        None => {
            let image = container.get("image").and_then(Value::as_str).unwrap_or("");
            let repository = image.split(['@']).next().unwrap_or(image);
            let name = basename(repository);
            name.split(':').next().unwrap_or(&name).starts_with("lifeguard")
        }
    }
}

/// The status port the proxy listens on: from its `--status-addr` flag or
/// `LIFEGUARD_STATUS_ADDR` env, else 15020.
fn status_port_of(proxy: &Value) -> Result<u16, String> {
    let words: Vec<&str> = ["command", "args"]
        .iter()
        .filter_map(|k| proxy.get(*k).and_then(Value::as_sequence))
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let from_flag = words
        .iter()
        .enumerate()
        .find_map(|(i, w)| match w.strip_prefix("--status-addr") {
            Some("") => words.get(i + 1).copied(),
            Some(rest) => rest.strip_prefix('='),
            None => None,
        });
    let Some(addr) = from_flag.or_else(|| env_value(proxy, "LIFEGUARD_STATUS_ADDR")) else {
        return Ok(DEFAULT_STATUS_PORT);
    };
    let port = addr.rsplit_once(':').map_or(addr, |(_, p)| p);
    port.parse()
        .map_err(|_| format!("the proxy's status address {addr:?} has no port; pass --status-port"))
}

fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    let env = container.get("env").and_then(Value::as_sequence)?;
    let entry = env
        .iter()
        .find(|e| e.get("name").and_then(Value::as_str) == Some(name))?;
    entry.get("value").and_then(Value::as_str)
}

/// Sets `name=value` in the container's env, in place when it is there.
fn set_env(container: &mut Value, name: &str, value: &str) {
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

/// The probes and hooks of one container, by field, with what they become.
const FIELDS: [(&str, Kind); 3] = [
    ("readinessProbe", Kind::Readiness),
    ("livenessProbe", Kind::Liveness),
    ("startupProbe", Kind::Startup),
];
const HOOKS: [(&str, Kind); 2] = [("postStart", Kind::PostStart), ("preStop", Kind::PreStop)];

fn rewrite_container(container: &mut Value, status_port: u16, probes: &mut AppProbes) -> Result<(), String> {
    let name = container.get("name").and_then(Value::as_str).unwrap_or("").to_owned();
    let ports: BTreeMap<String, i64> = container
        .get("ports")
        .and_then(Value::as_sequence)
        .map_or(&[][..], |p| p.as_slice())
        .iter()
        .filter_map(|p| Some((p.get("name")?.as_str()?.to_owned(), p.get("containerPort")?.as_i64()?)))
        .collect();
    let rewrite = Rewrite {
        status_port,
        ports: &ports,
    };
    for (field, kind) in FIELDS {
        if let Some(probe) = container.get_mut(field) {
            rewrite
                .handler(probe, &kind.path(&name), true, probes)
                .map_err(|e| format!("{field}: {e}"))?;
        }
    }
    for (field, kind) in HOOKS {
        if let Some(hook) = container.get_mut("lifecycle").and_then(|l| l.get_mut(field)) {
            rewrite
                .handler(hook, &kind.path(&name), false, probes)
                .map_err(|e| format!("lifecycle.{field}: {e}"))?;
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
    /// port at `path`, and records the original in `probes`.
    fn handler(&self, handler: &mut Value, path: &str, is_probe: bool, probes: &mut AppProbes) -> Result<(), String> {
        let Some(map) = handler.as_mapping_mut() else {
            return Ok(());
        };
        let on_status_port = map.get("httpGet").and_then(|h| h.get("port")).and_then(Value::as_i64);
        if on_status_port == Some(i64::from(self.status_port)) {
            return Ok(());
        }
        let kinds: &[&str] = if is_probe {
            &["httpGet", "tcpSocket", "grpc"]
        } else {
            &["httpGet", "tcpSocket"]
        };
        let Some(kind) = kinds.iter().copied().find(|k| map.contains_key(*k)) else {
            return Ok(()); // exec, sleep: nothing to rewrite
        };
        let mut action = map.get(kind).cloned().unwrap_or(Value::Null);
        if kind != "grpc" {
            self.resolve_port(&mut action)?;
        }
        let mut original = Mapping::new();
        original.insert(kind.into(), action.clone());
        if let Some(timeout) = map.get("timeoutSeconds").filter(|_| is_probe) {
            original.insert("timeoutSeconds".into(), timeout.clone());
        }
        let probe: Probe = serde_norway::from_value(Value::Mapping(original)).map_err(|e| format!("{kind}: {e}"))?;
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
                Some("httpGet" | "tcpSocket" | "grpc") => None,
                _ => Some((k, v)),
            })
            .collect();
        Ok(())
    }

    /// A named port made a number, from the container's ports.
    fn resolve_port(&self, action: &mut Value) -> Result<(), String> {
        let Some(port) = action.get_mut("port") else {
            return Err("no port".into());
        };
        if let Some(name) = port.as_str().map(str::to_owned) {
            let number = match name.parse::<i64>() {
                Ok(n) => n,
                Err(_) => *self
                    .ports
                    .get(&name)
                    .ok_or_else(|| format!("the port {name:?} is not one of the container's named ports"))?,
            };
            *port = Value::from(number);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(yaml: &str) -> Result<String, String> {
        inject(yaml, &InjectOptions::default())
    }

    const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: proxy
    image: example/lifeguard-envoy:1
    command: ["/usr/local/bin/lifeguard", "run", "--status-addr", "0.0.0.0:15021", "--"]
  - name: app
    image: example/app
    ports:
    - name: http
      containerPort: 8080
    readinessProbe:
      httpGet:
        path: /ready
        port: http
        scheme: HTTPS
        httpHeaders:
        - name: X-A
          value: b
      periodSeconds: 5
      timeoutSeconds: 3
    livenessProbe:
      tcpSocket:
        port: 8080
    startupProbe:
      grpc:
        port: 7070
        service: x
    lifecycle:
      preStop:
        httpGet:
          path: /stop
          port: "8080"
      postStart:
        exec:
          command: ["true"]
"#;

    #[test]
    fn a_pod_is_rewritten_as_istio_does_and_a_second_run_changes_nothing() {
        let out = run(POD).unwrap();
        let pod: Value = serde_norway::from_str(&out).unwrap();
        let app = &pod["spec"]["containers"][1];
        let ready = &app["readinessProbe"];
        assert_eq!(ready["httpGet"]["path"], "/app-health/app/readyz");
        assert_eq!(ready["httpGet"]["port"], 15021, "the proxy's own status port");
        assert_eq!(ready["httpGet"]["scheme"], "HTTP");
        assert_eq!(ready["httpGet"]["httpHeaders"][0]["name"], "X-A");
        assert_eq!(ready["periodSeconds"], 5);
        assert_eq!(app["livenessProbe"]["httpGet"]["path"], "/app-health/app/livez");
        assert!(app["livenessProbe"].get("tcpSocket").is_none());
        assert_eq!(app["startupProbe"]["httpGet"]["path"], "/app-health/app/startupz");
        assert_eq!(
            app["lifecycle"]["preStop"]["httpGet"]["path"],
            "/app-lifecycle/app/prestopz"
        );
        assert!(app["lifecycle"]["postStart"].get("exec").is_some(), "exec hooks stay");
        let proxy = &pod["spec"]["containers"][0];
        assert!(proxy.get("readinessProbe").is_none());
        let json = env_value(proxy, PROBERS_ENV).unwrap();
        let probes = AppProbes::parse(json).unwrap().checked();
        assert_eq!(probes.len(), 4);
        let ready = &probes["/app-health/app/readyz"];
        assert_eq!(ready.timeout, std::time::Duration::from_secs(3));
        assert!(
            format!("{:?}", ready.action).contains("port: 8080, https: true"),
            "{ready:?}"
        );
        assert_eq!(run(&out).unwrap(), out, "idempotent");
    }

    #[test]
    fn workloads_of_every_kind_have_their_template_rewritten() {
        let template = POD.replace("apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:", "");
        let indent = |n: usize| {
            template
                .lines()
                .map(|l| format!("{}{l}\n", " ".repeat(n)))
                .collect::<String>()
        };
        for (kind, head, depth) in [
            ("Deployment", "spec:\n  template:\n    spec:", 4),
            ("StatefulSet", "spec:\n  template:\n    spec:", 4),
            ("DaemonSet", "spec:\n  template:\n    spec:", 4),
            ("ReplicaSet", "spec:\n  template:\n    spec:", 4),
            ("Job", "spec:\n  template:\n    spec:", 4),
            (
                "CronJob",
                "spec:\n  jobTemplate:\n    spec:\n      template:\n        spec:",
                8,
            ),
        ] {
            let yaml = format!("kind: {kind}\nmetadata:\n  name: w\n{head}{}", indent(depth));
            let out = run(&yaml).unwrap_or_else(|e| panic!("{kind}: {e}\n{yaml}"));
            assert!(out.contains("/app-health/app/readyz"), "{kind}: {out}");
            assert!(out.contains(PROBERS_ENV), "{kind}");
        }
    }

    #[test]
    fn errors_name_the_object_and_the_fault() {
        let no_proxy = POD.replace("command: [\"/usr/local/bin/lifeguard\"", "command: [\"/bin/other\"");
        let e = run(&no_proxy).unwrap_err();
        assert!(e.starts_with("Pod web: no proxy container"), "{e}");
        let unnamed = POD.replace("port: http", "port: web");
        let e = run(&unnamed).unwrap_err();
        assert!(
            e.contains("Pod web: container app: readinessProbe: the port \"web\" is not one"),
            "{e}"
        );
        assert!(run("kind: [").unwrap_err().starts_with("document 1: not YAML"));
        let named = inject(
            &no_proxy,
            &InjectOptions {
                proxy_container: Some("proxy".into()),
                ..Default::default()
            },
        );
        assert!(named.is_ok(), "{named:?}");
    }

    #[test]
    fn other_documents_pass_through_and_the_annotation_turns_it_off() {
        let yaml = format!("kind: Service\nmetadata:\n  name: s\n---\n{POD}");
        let out = run(&yaml).unwrap();
        assert!(out.starts_with("kind: Service\n"), "{out}");
        assert_eq!(out.matches("\n---\n").count(), 1);
        let off = POD.replace(
            "  name: web\n",
            "  name: web\n  annotations:\n    sidecar.istio.io/rewriteAppHTTPProbers: \"false\"\n",
        );
        let out = run(&off).unwrap();
        assert!(!out.contains("/app-health/"), "{out}");
    }
}
