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
//! changes nothing. The proxy container is never rewritten. A pod that is
//! not meshed (`sidecar.istio.io/inject: "false"`), or whose rewrite is
//! off (`sidecar.istio.io/rewriteAppHTTPProbers: "false"`, as in Istio),
//! passes unchanged, as do other documents. Comments are not kept (the
//! YAML is written anew).
//!
//! - `proxy`: which container is the proxy, and its status port.
//! - `rewrite`: one container's probes and hooks.
//! - `error`: why inject stopped ([`InjectError`]: where, and what).
//! - `yaml`: reading the fields of a YAML value.

use std::io::Read;
use std::path::PathBuf;

use serde::Deserialize;
use serde_norway::Value;

use lifeguard_base::settings::GoBool;
use lifeguard_istio::probers::AppProbes;

mod error;
mod proxy;
mod rewrite;
mod yaml;

pub use error::{InjectError, ManifestFault, Place};
use yaml::{name_of, seq, text_of};

/// The env variable the proxy container reads the probes from.
const PROBERS_ENV: &str = "ISTIO_KUBE_APP_PROBERS";
/// The pod annotation that turns the rewrite off (Istio's).
const REWRITE_ANNOTATION: &str = "sidecar.istio.io/rewriteAppHTTPProbers";
/// The pod label (or annotation) that leaves a pod out of the mesh (Istio's).
const INJECT_LABEL: &str = "sidecar.istio.io/inject";
/// The pod annotation that gives (or not) the app containers the drain
/// wait's preStop hook, whatever `--drain-wait` says.
pub(crate) const DRAIN_WAIT_ANNOTATION: &str = "lifeguard.io/drain-wait";

/// `lifeguard inject`'s options, as the command line declares them.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct InjectOptions {
    /// The manifest (several documents allowed); stdin when absent or `-`.
    #[arg(value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// The proxy container, when it does not run `lifeguard` itself.
    #[arg(long, value_name = "NAME")]
    pub proxy_container: Option<String>,
    /// The status port probes are rewritten to (default: the proxy's
    /// own: its --status-addr, LIFEGUARD_STATUS_ADDR or PROXY_CONFIG
    /// statusPort, else 15020).
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub status_port: Option<u16>,
    /// Give every app container without a preStop hook one that waits
    /// until the pod is out of its load balancers' rotation
    /// (`httpGet /drain/wait` on the status port); a pod's annotation
    /// lifeguard.io/drain-wait ("true" or "false") decides for that pod.
    #[arg(long)]
    pub drain_wait: bool,
}

/// What to do to one pod.
#[derive(Debug, Clone, Copy)]
struct Todo {
    /// Rewrite the app's probes and hooks (Istio's annotation may say no).
    probes: bool,
    /// Add the drain wait's preStop hook where there is none.
    drain_wait: bool,
    /// The pod's annotation asked for the drain wait (so a pod without a
    /// proxy container is an error, not passed over).
    drain_wait_asked: bool,
}

/// Runs `lifeguard inject`: the rewritten manifest on stdout; or why not
/// (`lifeguard_exit` makes it the exit code, and the caller reports it).
pub fn run(opts: &InjectOptions) -> Result<(), InjectError> {
    let mut text = String::new();
    let path = opts.input.clone().filter(|p| p.as_os_str() != "-");
    let read = match &path {
        Some(path) => std::fs::read_to_string(path).map(|t| text = t),
        None => std::io::stdin().read_to_string(&mut text).map(drop),
    };
    read.map_err(|e| InjectError::from(ManifestFault::Read(e)).within(Place::Input(path)))?;
    print!("{}", inject(&text, opts)?);
    Ok(())
}

/// Rewrites every document of `input`; the documents, `---` between them.
/// An error names the document (from 1), the object and the fault.
pub fn inject(input: &str, opts: &InjectOptions) -> Result<String, InjectError> {
    let mut out = Vec::new();
    for (i, document) in serde_norway::Deserializer::from_str(input).enumerate() {
        let at = |e: InjectError| e.within(Place::Document(i + 1));
        let mut value = Value::deserialize(document).map_err(|e| at(ManifestFault::NotYaml(e).into()))?;
        if value.is_null() {
            continue;
        }
        rewrite_object(&mut value, opts).map_err(at)?;
        out.push(serde_norway::to_string(&value).map_err(|e| at(ManifestFault::Yaml(e).into()))?);
    }
    Ok(out.join("---\n"))
}

/// Where each kind keeps its pod (its metadata and spec).
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

fn rewrite_object(object: &mut Value, opts: &InjectOptions) -> Result<(), InjectError> {
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("").to_owned();
    if kind == "List" {
        if let Some(items) = object.get_mut("items").and_then(Value::as_sequence_mut) {
            for (i, item) in items.iter_mut().enumerate() {
                rewrite_object(item, opts).map_err(|e| e.within(Place::ListItem(i + 1)))?;
            }
        }
        return Ok(());
    }
    let Some(path) = pod_path(&kind) else {
        return Ok(());
    };
    let name = object
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str);
    let place = Place::Object {
        kind: kind.clone(),
        name: name.map(str::to_owned),
    };
    rewrite_pod_of(object, path, opts).map_err(|e| e.within(place))
}

/// Rewrites the pod an object keeps at `path`, as its labels and
/// annotations say.
fn rewrite_pod_of(object: &mut Value, path: &[&str], opts: &InjectOptions) -> Result<(), InjectError> {
    let pod = path
        .iter()
        .try_fold(&mut *object, |v, key| v.get_mut(*key))
        .ok_or_else(|| ManifestFault::NoPodTemplate(path.join(".")))?;
    let metadata = pod.get("metadata");
    let says = |section: &'static str, key: &'static str| -> Result<Option<bool>, ManifestFault> {
        let Some(value) = metadata.and_then(|m| m.get(section)).and_then(|s| s.get(key)) else {
            return Ok(None);
        };
        if let Some(b) = value.as_bool() {
            return Ok(Some(b));
        }
        let text = value.as_str().map_or_else(|| text_of(value), str::to_owned);
        match text.parse::<GoBool>() {
            Ok(b) => Ok(Some(b.get())),
            Err(why) => Err(ManifestFault::NotABool {
                section,
                key,
                text,
                why,
            }),
        }
    };
    let meshed = says("labels", INJECT_LABEL)?.or(says("annotations", INJECT_LABEL)?);
    let asked = says("annotations", DRAIN_WAIT_ANNOTATION)?;
    let todo = Todo {
        probes: says("annotations", REWRITE_ANNOTATION)? != Some(false),
        drain_wait: asked.unwrap_or(opts.drain_wait),
        drain_wait_asked: asked == Some(true),
    };
    if meshed == Some(false) || !(todo.probes || todo.drain_wait) {
        return Ok(());
    }
    let annotations = metadata.and_then(|m| m.get("annotations"));
    let status_annotation = annotations
        .and_then(|a| a.get(proxy::STATUS_PORT_ANNOTATION))
        .map(|v| v.as_str().map_or_else(|| text_of(v), str::to_owned));
    let spec = pod.get_mut("spec").ok_or(ManifestFault::NoSpec)?;
    rewrite_pod(spec, status_annotation.as_deref(), opts, todo)
}

/// Rewrites the app containers of one pod spec and hands their originals
/// to the proxy container; adds the drain wait's hook. A pod with no proxy
/// container is an error when it has something to rewrite or its
/// annotation asks for the drain wait, and passes unchanged otherwise.
fn rewrite_pod(
    spec: &mut Value,
    status_annotation: Option<&str>,
    opts: &InjectOptions,
    todo: Todo,
) -> Result<(), InjectError> {
    let name = opts.proxy_container.as_deref();
    let Some((list, index)) = proxy::find(spec, name)? else {
        let mut containers = proxy::LISTS.iter().flat_map(|l| seq(spec, l));
        let rewrites = todo.probes && containers.any(rewrite::has_handlers);
        return match rewrites || todo.drain_wait_asked {
            true => Err(proxy::missing(name).into()),
            false => Ok(()),
        };
    };
    let proxy = &spec[list][index];
    let status_port = proxy::status_port(proxy, opts.status_port, status_annotation)?;
    let mut probes = match proxy::env_value(proxy, PROBERS_ENV) {
        Some(json) => AppProbes::parse(json).map_err(|error| ManifestFault::Probers {
            env: PROBERS_ENV,
            error,
        })?,
        None => AppProbes::default(),
    };
    for l in proxy::LISTS {
        let Some(containers) = spec.get_mut(l).and_then(Value::as_sequence_mut) else {
            continue;
        };
        for (i, container) in containers.iter_mut().enumerate() {
            if (l, i) == (list, index) {
                continue;
            }
            if todo.probes {
                let name = name_of(container).to_owned();
                rewrite::container(container, status_port, &mut probes)
                    .map_err(|e| e.within(Place::Container(name)))?;
            }
            if todo.drain_wait && l == "containers" {
                rewrite::add_drain_wait(container, status_port);
            }
        }
    }
    if !probes.0.is_empty() {
        proxy::set_env(&mut spec[list][index], PROBERS_ENV, &probes.to_json());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use lifeguard_istio::probers::{Port, Probe};

    fn run(yaml: &str) -> Result<String, String> {
        inject(yaml, &InjectOptions::default()).map_err(|e| e.to_string())
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
        let json = proxy::env_value(proxy, PROBERS_ENV).unwrap();
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
        assert!(e.starts_with("document 1: Pod web: no proxy container"), "{e}");
        let unnamed = POD.replace("port: http", "port: web");
        let e = run(&unnamed).unwrap_err();
        assert!(
            e.contains("document 1: Pod web: container app: readinessProbe: the port \"web\" is not one"),
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

    fn with(yaml: &str, opts: InjectOptions) -> Result<String, InjectError> {
        inject(yaml, &opts)
    }

    /// The probes the proxy container of the first document is handed.
    fn handed(out: &str) -> BTreeMap<String, Probe> {
        let doc = out.split("---\n").next().unwrap();
        let pod: Value = serde_norway::from_str(doc).unwrap();
        let proxy = &pod["spec"]["containers"][0];
        AppProbes::parse(proxy::env_value(proxy, PROBERS_ENV).unwrap())
            .unwrap()
            .0
    }

    #[test]
    fn the_status_port_is_the_proxys_own_unless_the_flag_says_otherwise() {
        let plain = POD.replace(r#", "--status-addr", "0.0.0.0:15021""#, "");
        assert!(run(&plain).unwrap().contains("port: 15020\n"), "the default");
        let env = plain.replace(
            "    image: example/lifeguard-envoy:1\n",
            "    image: example/lifeguard-envoy:1\n    env:\n    - name: LIFEGUARD_STATUS_ADDR\n      value: 0.0.0.0:15030\n",
        );
        assert!(run(&env).unwrap().contains("port: 15030\n"), "LIFEGUARD_STATUS_ADDR");
        let proxy_config = env.replace(
            "LIFEGUARD_STATUS_ADDR\n      value: 0.0.0.0:15030",
            "PROXY_CONFIG\n      value: '{\"statusPort\": 15040}'",
        );
        assert!(run(&proxy_config).unwrap().contains("port: 15040\n"), "PROXY_CONFIG");
        let flag = InjectOptions {
            status_port: Some(15050),
            ..Default::default()
        };
        let out = with(POD, flag).unwrap();
        assert!(out.contains("port: 15050\n") && !out.contains("port: 15021\n"), "{out}");
    }

    #[test]
    fn istios_status_port_annotation_must_agree_with_the_proxy() {
        let annotated = |port: &str| {
            POD.replace(
                "  name: web\n",
                &format!("  name: web\n  annotations:\n    status.sidecar.istio.io/port: \"{port}\"\n"),
            )
        };
        assert!(run(&annotated("15021")).is_ok());
        let e = run(&annotated("15020")).unwrap_err();
        assert_eq!(
            e,
            "document 1: Pod web: the annotation status.sidecar.istio.io/port says 15020, but the proxy's status \
             port is 15021 (its --status-addr); make them agree, or pass --status-port"
        );
        assert!(run(&annotated("x")).unwrap_err().ends_with("\"x\" is not a port"));
        let flag = InjectOptions {
            status_port: Some(15020),
            ..Default::default()
        };
        assert!(with(&annotated("15020"), flag).is_ok(), "the flag decides");
    }

    #[test]
    fn a_probe_already_on_the_status_port_is_left_alone_and_its_entry_kept() {
        let first = run(POD).unwrap();
        let mut pod: Value = serde_norway::from_str(&first).unwrap();
        // The user adds a probe of their own on the status port, and a TCP
        // one written as a string.
        let app = &mut pod["spec"]["containers"][1];
        app["livenessProbe"] = serde_norway::from_str("tcpSocket: {port: \"15021\"}").unwrap();
        let edited = serde_norway::to_string(&pod).unwrap();
        let out = run(&edited).unwrap();
        assert_eq!(out, edited, "nothing to do");
        assert_eq!(handed(&out).len(), 4, "the earlier entries are kept");
    }

    #[test]
    fn named_ports_are_resolved_per_container_and_entries_merged() {
        let out = run(POD).unwrap();
        let probes = handed(&out);
        let ready = probes["/app-health/app/readyz"].http_get.as_ref().unwrap();
        assert_eq!(ready.port, Port::Number(8080), "`http` is the app's 8080");
        assert_eq!(
            ready.scheme.as_deref(),
            Some("HTTPS"),
            "the agent still speaks HTTPS to the app"
        );
        let stop = probes["/app-lifecycle/app/prestopz"].http_get.as_ref().unwrap();
        assert_eq!(stop.port, Port::Number(8080), "\"8080\" is a number");
        // A second app container, added later, is merged with what is there.
        let mut pod: Value = serde_norway::from_str(&out).unwrap();
        let second: Value = serde_norway::from_str(
            "{name: b, ports: [{name: http, containerPort: 9090}], readinessProbe: {httpGet: {port: http}}}",
        )
        .unwrap();
        pod["spec"]["containers"].as_sequence_mut().unwrap().push(second);
        let again = run(&serde_norway::to_string(&pod).unwrap()).unwrap();
        let probes = handed(&again);
        assert_eq!(probes.len(), 5, "{probes:?}");
        let b = probes["/app-health/b/readyz"].http_get.as_ref().unwrap();
        assert_eq!(b.port, Port::Number(9090), "`http` is b's own 9090");
    }

    #[test]
    fn a_native_sidecar_proxy_is_found_among_the_init_containers() {
        let native = POD.replace(
            "  containers:\n  - name: proxy\n",
            "  initContainers:\n  - name: proxy\n    restartPolicy: Always\n",
        );
        let native = native.replace("  - name: app\n", "  containers:\n  - name: app\n");
        let out = run(&native).unwrap();
        let pod: Value = serde_norway::from_str(&out).unwrap();
        let proxy = &pod["spec"]["initContainers"][0];
        assert!(proxy::env_value(proxy, PROBERS_ENV).is_some(), "{out}");
        let ready = &pod["spec"]["containers"][0]["readinessProbe"]["httpGet"];
        assert_eq!(ready["path"], "/app-health/app/readyz");
    }

    #[test]
    fn pods_out_of_the_mesh_or_with_nothing_to_rewrite_pass_unchanged() {
        let no_proxy = POD.replace("command: [\"/usr/local/bin/lifeguard\"", "command: [\"/bin/other\"");
        for (section, key, value) in [
            ("labels", "sidecar.istio.io/inject", "\"false\""),
            ("annotations", "sidecar.istio.io/inject", "\"false\""),
            ("annotations", "sidecar.istio.io/rewriteAppHTTPProbers", "\"False\""),
            ("annotations", "sidecar.istio.io/rewriteAppHTTPProbers", "\"0\""),
        ] {
            let yaml = no_proxy.replace(
                "  name: web\n",
                &format!("  name: web\n  {section}:\n    {key}: {value}\n"),
            );
            let out = run(&yaml).unwrap_or_else(|e| panic!("{key}: {e}"));
            assert_eq!(
                out,
                serde_norway::to_string(&serde_norway::from_str::<Value>(&yaml).unwrap()).unwrap()
            );
        }
        let bad = POD.replace(
            "  name: web\n",
            "  name: web\n  annotations:\n    sidecar.istio.io/rewriteAppHTTPProbers: \"nope\"\n",
        );
        let e = run(&bad).unwrap_err();
        assert!(e.starts_with("document 1: Pod web: the annotations sidecar.istio.io/rewriteAppHTTPProbers: \"nope\": expected true or false"), "{e}");
        let exec_only = "kind: Pod\nmetadata: {name: db}\nspec:\n  containers:\n  - name: db\n    livenessProbe: {exec: {command: [\"true\"]}}\n";
        assert!(run(exec_only).is_ok(), "no proxy, nothing to rewrite");
    }

    #[test]
    fn list_items_are_rewritten_and_errors_name_the_item() {
        let item = POD.replace('\n', "\n  ");
        let list = format!("apiVersion: v1\nkind: List\nitems:\n- {}", item.trim_start());
        let out = run(&list).unwrap();
        assert!(out.contains("/app-health/app/readyz"), "{out}");
        let broken = list.replace("port: http", "port: nope");
        let e = run(&broken).unwrap_err();
        assert!(
            e.starts_with("document 1: List item 1: Pod web: container app: readinessProbe:"),
            "{e}"
        );
    }

    /// The preStop hook of container `name` in the first document's pod.
    fn pre_stop(out: &str, name: &str) -> Option<Value> {
        let pod: Value = serde_norway::from_str(out.split("---\n").next().unwrap()).unwrap();
        let containers = pod["spec"]["containers"].as_sequence().unwrap().clone();
        let c = containers
            .into_iter()
            .find(|c| c["name"].as_str() == Some(name))
            .unwrap();
        c.get("lifecycle").and_then(|l| l.get("preStop")).cloned()
    }

    const TWO_APPS: &str = r#"
kind: Pod
metadata:
  name: web
spec:
  initContainers:
  - name: migrate
    image: example/migrate
  containers:
  - name: proxy
    command: ["lifeguard", "run", "--"]
  - name: app
    image: example/app
  - name: worker
    image: example/worker
    lifecycle:
      preStop:
        exec: {command: ["sleep", "3"]}
"#;

    #[test]
    fn the_drain_wait_hook_goes_to_app_containers_without_one_by_flag_or_annotation() {
        let opts = InjectOptions {
            drain_wait: true,
            ..Default::default()
        };
        let out = with(TWO_APPS, opts.clone()).unwrap();
        let hook: Value = serde_norway::from_str("httpGet: {path: /drain/wait, port: 15020, scheme: HTTP}").unwrap();
        assert_eq!(pre_stop(&out, "app"), Some(hook.clone()));
        assert!(
            pre_stop(&out, "worker").unwrap().get("exec").is_some(),
            "its own hook is kept"
        );
        assert_eq!(pre_stop(&out, "proxy"), None, "the proxy is never given one");
        assert!(
            !out.contains("migrate\n  lifecycle"),
            "init containers are left alone: {out}"
        );
        assert_eq!(with(&out, opts.clone()).unwrap(), out, "a second run changes nothing");
        // The pod's annotation decides for the pod, either way.
        let annotated = |v: &str| {
            TWO_APPS.replace(
                "  name: web\n",
                &format!("  name: web\n  annotations:\n    lifeguard.io/drain-wait: \"{v}\"\n"),
            )
        };
        assert_eq!(pre_stop(&run(&annotated("true")).unwrap(), "app"), Some(hook));
        assert_eq!(pre_stop(&with(&annotated("false"), opts.clone()).unwrap(), "app"), None);
        assert_eq!(pre_stop(&run(TWO_APPS).unwrap(), "app"), None, "off unless asked");
        // On the proxy's own status port.
        let moved = TWO_APPS.replace(
            "\"run\", \"--\"",
            "\"run\", \"--status-addr\", \"0.0.0.0:16020\", \"--\"",
        );
        assert!(with(&moved, opts).unwrap().contains("port: 16020"));
    }

    #[test]
    fn the_drain_wait_asked_of_a_pod_without_a_proxy_is_an_error_and_istios_rewrite_opt_out_keeps_it() {
        let no_proxy = "kind: Pod\nmetadata:\n  name: db\n  annotations: {lifeguard.io/drain-wait: \"true\"}\nspec:\n  containers:\n  - name: db\n";
        let e = run(no_proxy).unwrap_err();
        assert!(e.starts_with("document 1: Pod db: no proxy container"), "{e}");
        let flag = InjectOptions {
            drain_wait: true,
            ..Default::default()
        };
        let plain = "kind: Pod\nmetadata:\n  name: db\nspec:\n  containers:\n  - name: db\n";
        assert!(
            with(plain, flag.clone()).is_ok(),
            "the flag passes over pods without a proxy"
        );
        // Istio's opt-out of the probe rewrite leaves the probes, not the hook.
        let no_rewrite = POD
            .replace(
                "  name: web\n",
                "  name: web\n  annotations:\n    sidecar.istio.io/rewriteAppHTTPProbers: \"false\"\n",
            )
            .replace(
                "    lifecycle:\n      preStop:\n        httpGet:\n          path: /stop\n          port: \"8080\"\n",
                "",
            );
        let out = with(&no_rewrite, flag).unwrap();
        assert!(out.contains("path: /ready"), "probes left as written: {out}");
        assert!(out.contains("path: /drain/wait"), "{out}");
    }
}
